"""The bulk write path of the BM25 postings (migration 0021): large batches append their blocks
without merging or taking turns (built in C by the extension's `ragservice_bm25_blocks` where it
is installed, migration 0025), `pack_postings` merges them once, and the result is, posting for
posting, what the ordinary (merging) trigger path builds for the same writes."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.orm import Session

from ragservice import store
from ragservice.db import migrate
from ragservice.runtime import Runtime
from tests.integration.test_postings import _downgrade, document, document_of
from tests.integration.test_search import postings_mismatches

# Each posting by its chunk's (document, ordinal): seqs differ between collections.
_POSTINGS = """
    SELECT d.external_id, k.ordinal, p.lexeme, p.tier, u.tf, u.len
    FROM chunk_postings p
    CROSS JOIN LATERAL unnest(p.seqs, p.tfs, p.lengths) AS u(seq, tf, len)
    JOIN chunks k ON k.seq = u.seq JOIN documents d ON d.id = k.document_id
    WHERE p.collection_id = :c ORDER BY 1, 2, 3, 4
"""
_TOTALS = (
    "SELECT sum(chunk_count), sum(token_count) FROM collection_text_stats WHERE collection_id = :c"
)
_SHORT_BLOCKS = (
    "SELECT max(c) FROM (SELECT count(*) AS c FROM chunk_postings WHERE collection_id = :c "
    "AND n < 128 GROUP BY lexeme, tier) AS s"
)


def write_in(
    session: Session,
    runtime: Runtime,
    collection: str,
    docs: Sequence[store.documents.DocumentWrite],
    *,
    append: bool,
) -> uuid.UUID:
    """One batch of documents into `collection`, in append mode or the ordinary way."""
    model = store.embedding_models.ensure_model(
        session, name="flat-4d", dimension=4, path=None, hnsw_m=8, hnsw_ef_construction=16
    )
    found = store.collections.ensure_collection(session, runtime.default_tenant_id, collection)
    write_to(session, runtime, (found, model.id), docs, append=append)
    return found


def write_to(
    session: Session,
    runtime: Runtime,
    target: tuple[uuid.UUID, int],
    docs: Sequence[store.documents.DocumentWrite],
    *,
    append: bool,
) -> None:
    """One batch into an existing collection (`target`: its id and the model's): no other
    lock taken than the write's own."""
    store.documents.write_documents(
        session,
        tenant_id=runtime.default_tenant_id,
        collection_id=target[0],
        model_id=target[1],
        documents=docs,
        append=append,
    )


def load(runtime: Runtime, collection: str, *, append: bool) -> uuid.UUID:
    """Batches, a replacement and deletes in between, then more batches."""
    batches = [
        [document("a", range(0, 150)), document("b", range(150, 200))],
        [document("c", range(200, 330))],
        [document("a", range(400, 470))],  # replaces a
        [document("d", range(500, 520)), document("e", range(520, 521))],
    ]
    for i, batch in enumerate(batches):
        with runtime.db.write() as session:
            found = write_in(session, runtime, collection, batch, append=append)
        if i == 1:
            with runtime.db.write() as session:
                store.documents.delete_documents(session, found, ["b"])
    return found


def query(runtime: Runtime, sql: str, collection: uuid.UUID) -> Any:
    with runtime.db.read() as session:
        return session.execute(text(sql), {"c": collection}).all()


def listed_chunks(runtime: Runtime, collection: uuid.UUID) -> int:
    """The chunk count that listing the collections reports (it sums the writers' rows)."""
    with runtime.db.read() as session:
        listed = store.collections.list_collections(session, runtime.default_tenant_id)
    return next(info.chunk_count for info in listed if info.id == collection)


def test_appended_then_packed_postings_equal_the_merged_ones(runtime: Runtime) -> None:
    merged = load(runtime, "merged", append=False)
    appended = load(runtime, "appended", append=True)
    assert postings_mismatches(runtime) == []
    assert query(runtime, _SHORT_BLOCKS, merged) == [(1,)]
    assert query(runtime, _SHORT_BLOCKS, appended)[0][0] > 1  # a key's blocks, one per batch

    with runtime.db.write() as session:
        packed = store.postings.pack_postings(session, appended)
    assert packed.collections == 1 and packed.blocks_after < packed.blocks_before
    assert postings_mismatches(runtime) == []
    assert query(runtime, _SHORT_BLOCKS, appended) == [(1,)]
    assert query(runtime, _POSTINGS, appended) == query(runtime, _POSTINGS, merged)
    assert query(runtime, _TOTALS, appended) == query(runtime, _TOTALS, merged)
    with runtime.db.read() as session:
        slots = session.execute(
            text("SELECT slot FROM collection_text_stats WHERE collection_id = :c"),
            {"c": appended},
        ).all()
    assert slots == [(0,)]  # the pack folded the writers' rows


def test_bulk_loaders_do_not_take_turns_and_small_writes_stay_exact(runtime: Runtime) -> None:
    """Two uncommitted bulk batches into one collection, and an ordinary write and delete
    beside them: none waits (a wait would fail at once: lock_timeout). Two ordinary writers
    of one collection still take turns on its lock."""
    collection = load(runtime, "shared", append=False)
    with runtime.db.read() as session:
        model = store.embedding_models.get_model_by_name(session, "flat-4d")
    assert model is not None
    target = (collection, model.id)

    def no_waiting(session: Session, timeout: str = "2s") -> None:
        session.execute(text(f"SET LOCAL lock_timeout = '{timeout}'"))

    with runtime.db.write() as first, runtime.db.write() as second:
        no_waiting(first)
        no_waiting(second)
        write_to(first, runtime, target, [document("bulk-1", range(600, 900))], append=True)
        write_to(second, runtime, target, [document("bulk-2", range(900, 1200))], append=True)
        with runtime.db.write() as small:
            no_waiting(small)
            write_to(small, runtime, target, [document("one", [1300])], append=False)
            store.documents.delete_documents(small, collection, ["c"])
            with pytest.raises(psycopg.errors.LockNotAvailable), runtime.db.write() as other:
                no_waiting(other, "200ms")  # it would wait for `small` to commit
                write_to(other, runtime, target, [document("two", [1301])], append=False)
    assert postings_mismatches(runtime) == []
    assert (
        len(
            query(
                runtime,
                "SELECT slot FROM collection_text_stats WHERE collection_id = :c",
                collection,
            )
        )
        > 1
    )
    listed_before_pack = listed_chunks(runtime, collection)
    with runtime.db.write() as session:
        store.postings.pack_postings(session, None)
    assert listed_before_pack == query(runtime, _TOTALS, collection)[0][0]
    assert listed_chunks(runtime, collection) == listed_before_pack
    assert postings_mismatches(runtime) == []
    assert query(runtime, _SHORT_BLOCKS, collection) == [(1,)]


def test_the_pack_plans_no_nested_loops(runtime: Runtime) -> None:
    """The pack runs before the new blocks are analyzed; with the old statistics a nested loop
    made it quadratic in the collection's short blocks (migration 0022)."""
    with runtime.db.read() as session:
        config = session.execute(
            text("SELECT proconfig FROM pg_proc WHERE proname = 'ragservice_pack_postings'")
        ).scalar_one()
    assert "enable_nestloop=off" in config and "plan_cache_mode=force_custom_plan" in config


def test_a_pack_in_many_lexeme_ranges_equals_the_merged_postings(runtime: Runtime) -> None:
    """Ranges of 3 short blocks instead of 200,000: every range boundary of a real pack."""
    merged = load(runtime, "merged-r", append=False)
    appended = load(runtime, "ranges", append=True)
    with runtime.db.write() as session:
        before, after = session.execute(
            text("SELECT * FROM ragservice_pack_postings(:c, 3)"), {"c": appended}
        ).one()
    assert before > 3 * 10 and after < before  # blocks taken over ten ranges and more
    assert postings_mismatches(runtime) == []
    assert query(runtime, _SHORT_BLOCKS, appended) == [(1,)]
    assert query(runtime, _POSTINGS, appended) == query(runtime, _POSTINGS, merged)


# Each block with its chunks by ordinal: seqs differ between collections.
_BLOCKS = """
    SELECT p.lexeme, p.tier, p.n, p.tfs, p.lengths, p.max_tf, p.min_len,
           ARRAY(SELECT k.ordinal FROM unnest(p.seqs) WITH ORDINALITY AS u(seq, i)
                 JOIN chunks k ON k.seq = u.seq ORDER BY u.i) AS ordinals
    FROM chunk_postings p WHERE p.collection_id = :c ORDER BY 1, 2, 8
"""


def extreme_texts() -> list[str]:
    """Chunks whose shared word has tf 1 to 256 (a tsvector keeps at most 256 positions) in
    lengths of 1 to ~1,500 lexemes, a chunk of stop words only (no postings, length 0), and
    more than 128 chunks per (lexeme, tier) for the commonest keys."""
    texts: list[str] = []
    for tf in (1, 2, 3, 5, 8, 13, 40, 100, 256, 300):
        for length in (1, 2, 7, 20, 60, 99, 100, 101, 180, 400, 1500):
            filler = " ".join(f"w{i}" for i in range(max(length - tf, 0)))
            texts.append(f"{'common ' * min(tf, length)}{filler} rare{tf}x{length}")
    texts += ["the of and to a", "common"] * 150
    return texts


def test_bulk_blocks_built_in_c_equal_those_built_in_sql(
    runtime: Runtime, database_url: str
) -> None:
    """Append mode through the extension's C function, and through the trigger's SQL branch
    (the extension at 1.0, as where its files are older): the same blocks, row for row."""
    with runtime.db.read() as session:
        found = session.execute(
            text("SELECT to_regprocedure('ragservice_bm25_blocks(bigint[],tsvector[])')")
        ).scalar()
    assert found is not None  # the trigger takes the C branch
    texts = extreme_texts()
    with runtime.db.write() as session:
        in_c = write_in(session, runtime, "in-c", [document_of("x", texts)], append=True)
    owner_url = make_url(database_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(owner_url, autocommit=True) as owner:
        owner.execute("ALTER EXTENSION ragservice_bm25 UPDATE TO '1.0'")
    try:
        with runtime.db.write() as session:
            in_sql = write_in(session, runtime, "in-sql", [document_of("x", texts)], append=True)
    finally:
        with psycopg.connect(owner_url, autocommit=True) as owner:
            owner.execute("ALTER EXTENSION ragservice_bm25 UPDATE TO '1.1'")
    built_in_c = query(runtime, _BLOCKS, in_c)
    assert len(built_in_c) > len(texts)  # many keys, and keys of several blocks
    assert max(row.n for row in built_in_c) == 128
    assert built_in_c == query(runtime, _BLOCKS, in_sql)
    assert query(runtime, _TOTALS, in_c) == query(runtime, _TOTALS, in_sql)
    assert postings_mismatches(runtime) == []


# Today's writes name the readers columns of 0026 and the documents' unique key of 0030 in their
# ON CONFLICT: stand-ins while the schema is older.
_STAND_INS = (
    "ALTER TABLE documents ADD COLUMN readers text[]; "
    "ALTER TABLE chunks ADD COLUMN readers text[]; "
    "ALTER TABLE chunk_embeddings ADD COLUMN readers text[], ADD COLUMN collection_id uuid; "
    "CREATE UNIQUE INDEX documents_key_stand_in "
    "ON documents (collection_id, external_id, tenant_id)"
)
_STAND_INS_GONE = (
    "DROP INDEX documents_key_stand_in; "
    "ALTER TABLE documents DROP COLUMN readers; ALTER TABLE chunks DROP COLUMN readers; "
    "ALTER TABLE chunk_embeddings DROP COLUMN readers, DROP COLUMN collection_id"
)


def test_the_migration_updates_the_extension_and_the_trigger_both_ways(
    runtime: Runtime, database_url: str
) -> None:
    """0025 takes a store whose extension is at 1.0 (made before it) to 1.1 and gives its
    append-mode trigger the C branch (0032 then takes the extension on to 1.2); the downgrades
    take both back."""

    def state() -> tuple[str, bool]:
        with runtime.db.read() as session:
            version = session.execute(
                text("SELECT extversion FROM pg_extension WHERE extname = 'ragservice_bm25'")
            ).scalar_one()
            source = session.execute(
                text(
                    "SELECT prosrc FROM pg_proc WHERE proname = 'ragservice_chunk_postings_insert'"
                )
            ).scalar_one()
        return version, "ragservice_bm25_blocks" in source

    assert state() == ("1.2", True)
    engine = create_engine(database_url)
    try:
        _downgrade(engine, "0024")
        runtime.db.dispose()
        assert state() == ("1.0", False)
        with engine.begin() as owner:
            owner.execute(text(_STAND_INS))
        with runtime.db.write() as session:  # the SQL branch, as before 0025
            before = write_in(session, runtime, "before", [document("x", range(600))], append=True)
        with engine.begin() as owner:
            owner.execute(text(_STAND_INS_GONE))
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    runtime.db.dispose()
    assert state() == ("1.2", True)
    with runtime.db.write() as session:
        after = write_in(session, runtime, "after", [document("x", range(600))], append=True)
    assert query(runtime, _BLOCKS, after) == query(runtime, _BLOCKS, before)
    assert postings_mismatches(runtime) == []
