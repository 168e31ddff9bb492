"""Dense search for an asker who may not read every document, and under a metadata filter,
against a real PostgreSQL: the vectors carry their chunk's readers and collection (migration
0034), the planner reads only the visible vectors when there are few, the search returns k
whenever k visible chunks exist, and the copies follow the documents' readers."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
import pytest
from psycopg import sql
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from ingest.pipeline import text_hash
from ragservice import store
from ragservice.config import Settings
from ragservice.db import tenancy
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from ragservice.readers import principal_set
from ragservice.retrieval import dense, statements
from ragservice.retrieval.filters import parse_and_compile
from ragservice.retrieval.search import Mode, Searcher, SearchOptions
from ragservice.runtime import Runtime, open_runtime
from ragservice.types import TextChunk
from tests.conftest import as_service_login

DIMENSION = 8
DOCUMENTS = 2000
GROUPS = 200  # document i is read by group g{i % GROUPS}: one group is 0.5 % of them
K = 10


class Store:
    def __init__(self, runtime: Runtime, model_id: int, collection: uuid.UUID) -> None:
        self.runtime = runtime
        self.model_id = model_id
        self.collection = collection
        rng = np.random.default_rng(11)
        vectors = rng.standard_normal((DOCUMENTS, DIMENSION)).astype(np.float32)
        self.vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _document(i: int, vector: npt.NDArray[np.float32]) -> store.documents.DocumentWrite:
    body = f"Record {i} of group {i % GROUPS}."
    chunk = TextChunk(ordinal=0, text=body, start_char=0, end_char=len(body), token_count=6)
    return store.documents.DocumentWrite(
        external_id=f"doc-{i}",
        title=None,
        source="",
        metadata={"group": f"g{i % GROUPS}"},
        content_hash=text_hash(body),
        char_count=len(body),
        chunks=[chunk],
        chunk_hashes=[text_hash(body)],
        embeddings=vector[None, :],
        readers=[f"group:g{i % GROUPS}"],
    )


def _write(runtime: Runtime) -> Store:
    with runtime.db.write() as session:
        model = store.embedding_models.ensure_model(
            session, name="random-8d", dimension=DIMENSION, path=None, hnsw_m=16,
            hnsw_ef_construction=64,
        )  # fmt: skip
        collection = store.collections.ensure_collection(
            session, runtime.default_tenant_id, "restricted"
        )
    written = Store(runtime, model.id, collection)
    with runtime.db.write() as session:
        store.documents.write_documents(
            session,
            tenant_id=runtime.default_tenant_id,
            collection_id=collection,
            model_id=model.id,
            documents=[_document(i, written.vectors[i]) for i in range(DOCUMENTS)],
        )
    with runtime.db.owner() as session:
        session.execute(text("ANALYZE chunk_embeddings"))
        session.execute(text("ANALYZE documents"))
    return written


@pytest.fixture(scope="module")
def module_runtime(
    pg_admin_url: str,
    template_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    embedder: SentenceTransformerEmbedder,
) -> Iterator[Runtime]:
    """A migrated database of its own for this module's read-only tests."""
    name = f"rs_restricted_{uuid.uuid4().hex[:12]}"
    template = make_url(template_url).database
    _admin(pg_admin_url, "CREATE DATABASE {} TEMPLATE {}", name, str(template))
    url = make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    settings = Settings(
        database_url=as_service_login(url),
        owner_database_url=url,
        data_dir=tmp_path_factory.mktemp("restricted"),
    )
    runtime = open_runtime(settings, embedder=embedder)
    try:
        yield runtime
    finally:
        runtime.close()
        _admin(pg_admin_url, "DROP DATABASE {} WITH (FORCE)", name)


def _admin(admin_url: str, statement: str, *names: str) -> None:
    url = make_url(admin_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL(statement).format(*(sql.Identifier(n) for n in names)))


@pytest.fixture(scope="module")
def written(module_runtime: Runtime) -> Store:
    with tenancy.as_system():
        return _write(module_runtime)


def _groups(count: int) -> frozenset[str]:
    return principal_set("u", [f"g{i}" for i in range(count)])


def _search(
    written: Store, readers: frozenset[str] | None, target: int, **options: Any
) -> tuple[list[str], str]:
    """Dense search with document `target`'s vector as the query, as an asker of `readers`:
    the hits' external ids and the plan of the dense statement."""
    searcher = Searcher(
        written.runtime.db,
        lambda _query: written.vectors[target],
        model_id=written.model_id,
        dimension=DIMENSION,
    )
    filters = parse_and_compile(options.pop("filters", None))
    args: dict[str, Any] = {
        "collection_ids": [written.collection],
        "query": "",
        "options": SearchOptions(mode=Mode.DENSE, k=K, filters=filters, **options),
    }
    with searcher, tenancy.as_tenant(written.runtime.default_tenant_id, readers):
        hits = searcher.search(**args).hits
        plan = searcher.explain(**args)
    return [hit.external_id for hit in hits], plan


def _exact(written: Store, groups: int, target: int) -> list[str]:
    """The nearest K documents of the first `groups` groups, by brute force."""
    visible = np.array([i % GROUPS < groups for i in range(DOCUMENTS)])
    scores = written.vectors @ written.vectors[target]
    order = [i for i in np.argsort(-scores, kind="stable") if visible[i]]
    return [f"doc-{i}" for i in order[:K]]


HNSW = "Index Scan using chunk_embeddings_hnsw_model_"
# `statements.SET_DENSE`, to which the tests below add settings that force the HNSW walk.
DENSE = "SET LOCAL hnsw.ef_search = {ef_search}; SET LOCAL hnsw.iterative_scan = relaxed_order"


@pytest.mark.parametrize("groups", [1, 2, 20, GROUPS])
def test_a_restricted_search_returns_the_exact_k_nearest_it_may_read(
    written: Store, groups: int
) -> None:
    """At any share of the documents (0.5 % to all of them) the asker gets the k nearest of
    those it may read: k whenever k exist, and only those."""
    target = 0  # group g0: every asker below may read it
    found, _ = _search(written, _groups(groups), target)
    assert found == _exact(written, groups, target)


def test_the_visible_vectors_are_ranked_exactly_when_they_are_few(
    written: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The choice follows the estimate of the visible vectors: ten of 2,000 are ranked exactly
    (no HNSW walk in the plan); all 2,000 are left to the planner's index walk."""
    choices: list[bool] = []
    choose = dense.exact_is_cheaper

    def spy(*args: Any) -> bool:
        choices.append(choose(*args))
        return choices[-1]

    monkeypatch.setattr(dense, "exact_is_cheaper", spy)
    few, few_plan = _search(written, _groups(1), 0)
    assert HNSW not in few_plan and len(few) == K
    assert choices == [True, True]  # the search, then its plan
    _search(written, _groups(GROUPS), 0)
    assert choices[2:] == [False, False]


def test_a_scan_the_index_cuts_short_falls_back_to_the_exact_ranking(
    written: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The HNSW walk forced, and stopped after 30 tuples (`hnsw.max_scan_tuples`): too few
    visible rows come back, and the search ranks the visible rows exactly instead."""
    forced = sql.SQL(f"{DENSE}; SET LOCAL enable_sort = off; SET LOCAL hnsw.max_scan_tuples = 30")
    monkeypatch.setattr(statements, "SET_DENSE", forced)
    monkeypatch.setattr(dense, "exact_is_cheaper", lambda *_args: False)
    found, plan = _search(written, _groups(2), 0)
    assert HNSW in plan, plan
    assert found == _exact(written, 2, 0)


def test_a_filtered_search_returns_k_at_a_small_share(
    written: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A metadata filter of 1 % (four groups' documents) with the HNSW walk cut short: k
    come back, the exact nearest of the filtered documents."""
    forced = sql.SQL(f"{DENSE}; SET LOCAL hnsw.max_scan_tuples = 30")
    monkeypatch.setattr(statements, "SET_DENSE", forced)
    monkeypatch.setattr(dense, "exact_is_cheaper", lambda *_args: False)
    filters = {"group": {"$in": ["g0", "g1"]}}
    found, _ = _search(written, None, 0, filters=filters)
    assert found == _exact(written, 2, 0)


def test_a_restricted_asker_sees_no_vector_of_a_chunk_it_may_not_read(written: Store) -> None:
    with (
        tenancy.as_tenant(written.runtime.default_tenant_id, _groups(3)),
        written.runtime.db.read() as session,
    ):
        count = session.scalar(text("SELECT count(*) FROM chunk_embeddings"))
    assert count == 3 * DOCUMENTS // GROUPS


def test_vectors_carry_their_chunks_collection_and_readers(written: Store) -> None:
    with written.runtime.db.owner() as session:
        mismatched = session.scalar(
            text(
                "SELECT count(*) FROM chunk_embeddings e JOIN chunks c ON c.id = e.chunk_id "
                "WHERE e.collection_id IS DISTINCT FROM c.collection_id "
                "OR e.readers IS DISTINCT FROM c.readers"
            )
        )
        total = session.scalar(text("SELECT count(*) FROM chunk_embeddings"))
    assert mismatched == 0 and total == DOCUMENTS


def test_the_vectors_follow_their_documents_readers(runtime: Runtime) -> None:
    """A document's readers changed (plain SQL here: the trigger holds whatever the path): its
    vectors follow, and the new reader finds it by dense search at once."""
    written = _write(runtime)
    assert _search(written, _groups(1), 1)[0][0] != "doc-1"  # g1's document: not for g0
    with runtime.db.owner() as session:
        session.execute(
            text("UPDATE documents SET readers = ARRAY['group:g0'] WHERE external_id = 'doc-1'")
        )
        stale = session.scalar(
            text(
                "SELECT count(*) FROM chunk_embeddings e JOIN chunks c ON c.id = e.chunk_id "
                "WHERE e.readers IS DISTINCT FROM c.readers"
            )
        )
    assert stale == 0
    assert _search(written, _groups(1), 1)[0][0] == "doc-1"


def test_the_migration_fills_the_columns_of_the_vectors_stored_before_it(
    runtime: Runtime, database_url: str
) -> None:
    """Downgraded to 0033 with vectors stored, upgraded again: every vector has its chunk's
    collection and readers, and the models' HNSW indexes are back."""
    from tests.integration.test_tenant_keys_migration import _migrate

    _write(runtime)
    runtime.close()
    url = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    engine = create_engine(database_url)
    with engine.begin() as conn:
        _migrate(conn, "downgrade", "0033")
    with engine.begin() as conn:
        _migrate(conn, "upgrade", "head")
    engine.dispose()
    with psycopg.connect(url) as conn:
        mismatched = conn.execute(
            "SELECT count(*) FROM chunk_embeddings e JOIN chunks c ON c.id = e.chunk_id "
            "WHERE e.collection_id IS DISTINCT FROM c.collection_id "
            "OR e.readers IS DISTINCT FROM c.readers"
        ).fetchone()
        indexes = conn.execute(
            "SELECT count(*) FROM pg_indexes WHERE tablename = 'chunk_embeddings' "
            "AND indexdef LIKE '%USING hnsw%'"
        ).fetchone()
    assert mismatched == (0,)
    assert indexes is not None and indexes[0] >= 1


def test_the_exact_ranking_function_returns_only_what_the_session_may_read(
    written: Store,
) -> None:
    """`ragservice_nearest_visible` runs as the tables' owner, but takes the tenant and the
    principal set from the session as the policies do: asked for every vector, it returns the
    asker's group's ten, and nothing for another tenant."""
    call = text(
        "SELECT chunk_id FROM ragservice_nearest_visible(:model, ARRAY[:collection]::uuid[], "
        "CAST(:vector AS vector), 5000)"
    )
    args = {
        "model": written.model_id,
        "collection": written.collection,
        "vector": str(written.vectors[0].tolist()),
    }
    with (
        tenancy.as_tenant(written.runtime.default_tenant_id, _groups(1)),
        written.runtime.db.read() as session,
    ):
        mine = session.scalars(call, args).all()
        readable = session.scalar(text("SELECT count(*) FROM chunks"))
    assert len(mine) == readable == DOCUMENTS // GROUPS
    with tenancy.as_tenant(uuid.uuid4(), _groups(GROUPS)), written.runtime.db.read() as session:
        assert session.scalars(call, args).all() == []
