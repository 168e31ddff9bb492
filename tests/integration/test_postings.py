"""The BM25 postings in blocks (`chunk_postings`): kept exact by the triggers through bulk
writes, small writes merging into open blocks, deletes, replacements and collection deletes;
searches exact within the per-term budget; and the migration that converts `chunk_terms`."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Sequence

import numpy as np
import pytest
from sqlalchemy import Engine, create_engine, text

from ingest.pipeline import text_hash
from ragservice import store
from ragservice.db import migrate
from ragservice.retrieval.search import Mode, Searcher, SearchHit, SearchOptions
from ragservice.runtime import Runtime
from ragservice.types import TextChunk
from tests.integration.test_search import postings_mismatches, reference_bm25

RARE = ("zebrafish", "quinine", "tungsten", "saffron", "glacier")


def body(i: int) -> str:
    """'protein' in every chunk (tf 1-3), 'membrane' in every other, a rare word in every
    37th, and a filler of 0-6 words so lengths vary."""
    words = ["protein"] * (1 + i % 3) + ["sample", f"record{i}"]
    words += ["membrane"] * (i % 2) + ["study result"] * (i % 7)
    if i % 37 == 0:
        words.append(RARE[(i // 37) % len(RARE)])
    return " ".join(words) + "."


def document(name: str, numbers: Sequence[int]) -> store.documents.DocumentWrite:
    return document_of(name, [body(i) for i in numbers])


def document_of(name: str, texts: Sequence[str]) -> store.documents.DocumentWrite:
    """A document of the given chunk texts (flat 4-d vectors)."""
    chunks = [
        TextChunk(ordinal=o, text=t, start_char=0, end_char=len(t), token_count=len(t.split()))
        for o, t in enumerate(texts)
    ]
    return store.documents.DocumentWrite(
        external_id=name,
        title=None,
        source="",
        metadata={},
        content_hash=text_hash("\n".join(texts)),
        char_count=sum(map(len, texts)),
        chunks=chunks,
        chunk_hashes=[text_hash(t) for t in texts],
        embeddings=np.ones((len(texts), 4), dtype=np.float32),
    )


def write(
    runtime: Runtime, collection: str, docs: Sequence[store.documents.DocumentWrite]
) -> uuid.UUID:
    """One statement per call: all the documents' chunks go in one INSERT."""
    with runtime.db.write() as session:
        model = store.embedding_models.ensure_model(
            session, name="flat-4d", dimension=4, path=None, hnsw_m=8, hnsw_ef_construction=16
        )
        found = store.collections.ensure_collection(session, runtime.default_tenant_id, collection)
        store.documents.write_documents(
            session,
            tenant_id=runtime.default_tenant_id,
            collection_id=found,
            model_id=model.id,
            documents=docs,
        )
    return found


def fill(runtime: Runtime) -> uuid.UUID:
    """A bulk statement (300 chunks: blocks of 128), a medium one and single chunks that merge
    into the open blocks, then deletes and a replacement that rewrite blocks."""
    write(runtime, "big", [document("bulk", range(300))])
    write(runtime, "big", [document("medium", range(300, 360))])
    for i in range(360, 380):
        papers = write(runtime, "big", [document(f"one-{i}", [i])])
    write(runtime, "big", [document("medium", range(1000, 1040))])  # replaced
    with runtime.db.write() as session:
        store.documents.delete_documents(session, papers, [f"one-{i}" for i in range(360, 380, 3)])
    return papers


def assert_equal_scores(hits: list[SearchHit], expected: dict[uuid.UUID, float]) -> None:
    """Every match, best first, each with its reference score. (Many chunks here tie, and
    ties may differ in the last bit by the order of a sum, so the order is checked by score.)"""
    assert len(hits) == len(expected) > 100
    for hit in hits:
        assert hit.score == pytest.approx(expected[hit.chunk_id], rel=1e-9)
    assert all(a.score >= b.score for a, b in itertools.pairwise(hits))


def fulltext(runtime: Runtime, collection: uuid.UUID, query: str, budget: int) -> list[uuid.UUID]:
    """The SQL statement's ranking within a per-term budget (not the exact extension's)."""
    searcher = Searcher(
        runtime.db, lambda _: np.zeros(4, np.float32), model_id=0, dimension=4, exact_bm25=False
    )
    with searcher as s:
        options = SearchOptions(mode=Mode.FULLTEXT, k=1000, bm25_postings_per_term=budget)
        hits = s.search(collection_ids=[collection], query=query, options=options).hits
    return [h.chunk_id for h in hits]


def test_blocks_stay_exact_through_bulk_and_small_writes_and_deletes(runtime: Runtime) -> None:
    papers = fill(runtime)
    assert postings_mismatches(runtime) == []
    with runtime.db.read() as session:
        blocks, postings, fullest = session.execute(
            text(
                "SELECT count(*), sum(n), max(n) FROM chunk_postings "
                "WHERE lexeme NOT LIKE 'record%'"
            )
        ).one()
    # Blocks, not one row per posting (the one-chunk 'recordN' words aside).
    assert fullest == 128 and blocks * 20 < postings
    with Searcher(runtime.db, lambda _: np.zeros(4, np.float32), model_id=0, dimension=4) as s:
        query = "protein membrane study zebrafish"
        options = SearchOptions(mode=Mode.FULLTEXT, k=500)
        hits = s.search(collection_ids=[papers], query=query, options=options).hits
    assert_equal_scores(hits, reference_bm25(runtime, papers, query, k1=0.9, b=0.4))


def test_a_small_budget_cuts_the_frequent_term_by_impact_and_keeps_rare_terms_exact(
    runtime: Runtime,
) -> None:
    papers = fill(runtime)
    reference = reference_bm25(runtime, papers, "zebrafish quinine", k1=0.9, b=0.4)
    ranked = sorted(reference, key=lambda c: (-reference[c], c))
    assert fulltext(runtime, papers, "zebrafish quinine", budget=1) == ranked

    everything = reference_bm25(runtime, papers, "protein", k1=0.9, b=0.4)
    cut = fulltext(runtime, papers, "protein", budget=50)
    assert 50 <= len(cut) < 128 + 50 < len(everything)
    # The postings read are those of the highest impact tiers.
    with runtime.db.read() as session:
        tiers = dict(
            session.execute(
                text(
                    "SELECT c.id, p.tier FROM chunk_postings p "
                    "CROSS JOIN LATERAL unnest(p.seqs) AS u(seq) JOIN chunks c ON c.seq = u.seq "
                    "WHERE p.lexeme = 'protein'"
                )
            ).all()
        )
    kept = [tiers[c] for c in cut]
    dropped = [tiers[c] for c in everything if c not in set(cut)]
    assert min(kept) >= max(dropped)


def test_collection_delete_leaves_no_postings_or_totals(runtime: Runtime) -> None:
    papers = fill(runtime)
    other = write(runtime, "other", [document("kept", range(40))])
    with runtime.db.write() as session:
        assert store.collections.delete_collection(session, runtime.default_tenant_id, "big")
    with runtime.db.read() as session:
        left = session.execute(
            text(
                "SELECT (SELECT count(*) FROM chunk_postings WHERE collection_id = :c) "
                "+ (SELECT count(*) FROM collection_text_stats WHERE collection_id = :c)"
            ),
            {"c": papers},
        ).scalar_one()
    assert left == 0
    assert postings_mismatches(runtime) == []
    assert len(fulltext(runtime, other, "protein", budget=1000)) == 40


def test_migration_converts_the_postings_and_downgrades(
    runtime: Runtime, database_url: str
) -> None:
    papers = fill(runtime)
    query = "protein membrane zebrafish"
    before = fulltext(runtime, papers, query, budget=10_000)
    engine = create_engine(database_url)
    try:
        _downgrade(engine, "0013")
        with engine.connect() as conn:
            old = conn.execute(text("SELECT count(*) FROM chunk_terms")).scalar_one()
            assert (
                old == conn.execute(text("SELECT count(*) FROM chunks, unnest(tsv)")).scalar_one()
            )
            conn.execute(text("DELETE FROM collection_text_stats"))  # rebuilt by the upgrade
            conn.commit()
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    runtime.db.dispose()
    assert postings_mismatches(runtime) == []
    assert fulltext(runtime, papers, query, budget=10_000) == before


def _downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    config = migrate.alembic_config()
    with engine.connect() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, revision)
        conn.commit()
