"""Vector storage per model version (float32, halfvec, binary) against a real PostgreSQL:
dense search ranks as exact search does for each, with filters and in hybrid mode;
converting between them keeps every row and the results; an index build reports its
progress; `models list` shows the storage."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from ingest.pipeline import text_hash
from ragservice import store
from ragservice.config import Settings, get_settings
from ragservice.db import Database, open_database
from ragservice.db.models import EmbeddingModel
from ragservice.embedding import indexing
from ragservice.errors import InvalidInputError
from ragservice.retrieval.filters import parse_and_compile
from ragservice.retrieval.search import FixedModel, Mode, Searcher, SearchOptions
from ragservice.store.indexes import BuildProgress
from ragservice.types import TextChunk

N, DIMENSION, K = 2000, 32, 10
WORDS = ("apple", "river", "music", "engine", "garden", "winter")


@dataclass
class Corpus:
    db: Database
    model: EmbeddingModel
    collection: uuid.UUID
    vectors: npt.NDArray[np.float32]
    external_ids: list[str]

    def search(self, vector: npt.NDArray[np.float32], **options: Any) -> list[str]:
        with self.db.read() as session:
            row = store.embedding_models.get_model(session, self.model.id)
        assert row is not None
        model = FixedModel(row.id, row.dimension, lambda _q: vector, storage=row.storage)
        query = options.pop("query", "")
        with Searcher(self.db, models=lambda: model) as searcher:
            result = searcher.search(
                collection_ids=[self.collection],
                query=query,
                options=SearchOptions(**{"mode": Mode.DENSE, "k": K, **options}),
                vector=vector,
            )
        return [hit.external_id for hit in result.hits]

    def exact(
        self, vector: npt.NDArray[np.float32], *, half: bool = False, where: Any = None
    ) -> list[str]:
        """Brute-force cosine top K (over float16-rounded vectors when `half`)."""
        stored, query = self.vectors, vector
        if half:
            stored = stored.astype(np.float16).astype(np.float32)
            query = query.astype(np.float16).astype(np.float32)
        scores = stored @ query / np.linalg.norm(stored, axis=1) / np.linalg.norm(query)
        order = [i for i in np.argsort(-scores, kind="stable") if where is None or where(i)]
        return [self.external_ids[i] for i in order[:K]]


@pytest.fixture
def corpus(settings: Settings) -> Iterator[Corpus]:
    """N one-chunk documents with random unit vectors of a float32 model of DIMENSION. The
    planner is kept off sequential scans, so searches go through the HNSW indexes even on
    so small a table."""
    _as_owner(
        settings,
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET enable_seqscan = off', "
        "current_database()); END $$",
    )
    db = open_database(settings)
    rng = np.random.default_rng(11)
    vectors = rng.standard_normal((N, DIMENSION)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    writes = [_document(i, vectors[i : i + 1]) for i in range(N)]
    with db.write() as session:
        model = store.embedding_models.register_model_version(
            session,
            name="random-32d",
            version=1,
            dimension=DIMENSION,
            path=None,
            base_model_id=None,
            details={},
            hnsw_m=16,
            hnsw_ef_construction=64,
        )
        store.indexes.drop_index(session, model.id)  # built once after the load: faster
        tenant = uuid.UUID("00000000-0000-0000-0000-000000000001")
        collection = store.collections.ensure_collection(session, tenant, "vectors")
        store.documents.write_documents(
            session, tenant_id=tenant, collection_id=collection, model_id=model.id, documents=writes
        )
    indexing.build_embedding_index(db, model)
    _as_owner(settings, "ANALYZE")  # the tables' owner: the service's login may not
    yield Corpus(db, model, collection, vectors, [f"doc-{i}" for i in range(N)])
    db.dispose()


def _as_owner(settings: Settings, statement: str) -> None:
    owner = create_engine(settings.database.owner_url.get_secret_value())  # type: ignore[union-attr]
    with owner.begin() as conn:
        conn.execute(text(statement))
    owner.dispose()


def _document(i: int, vector: npt.NDArray[np.float32]) -> store.documents.DocumentWrite:
    body = f"Record {i} about the {WORDS[i % len(WORDS)]}."
    chunk = TextChunk(ordinal=0, text=body, start_char=0, end_char=len(body), token_count=8)
    return store.documents.DocumentWrite(
        external_id=f"doc-{i}",
        title=None,
        source="",
        metadata={"group": i % 3},
        content_hash=text_hash(body),
        char_count=len(body),
        chunks=[chunk],
        chunk_hashes=[text_hash(body)],
        embeddings=vector,
    )


def queries(corpus: Corpus, count: int = 5) -> list[npt.NDArray[np.float32]]:
    rng = np.random.default_rng(5)
    picked = corpus.vectors[rng.choice(N, count, replace=False)]
    noisy = picked + 0.3 * rng.standard_normal(picked.shape).astype(np.float32)
    return [q / np.linalg.norm(q) for q in noisy.astype(np.float32)]


def convert(corpus: Corpus, storage: str) -> indexing.Conversion:
    return indexing.convert_storage(corpus.db, corpus.model, storage)


def stored_as(corpus: Corpus) -> tuple[str, int, int]:
    """The model's recorded storage, and its rows with a float32 / a halfvec vector."""
    with corpus.db.read() as session:
        return session.execute(
            text(
                "SELECT m.storage, count(e.embedding), count(e.embedding_half) "
                "FROM embedding_models m JOIN chunk_embeddings e ON e.model_id = m.id "
                "WHERE m.id = :id GROUP BY m.storage"
            ),
            {"id": corpus.model.id},
        ).one()


def plan(corpus: Corpus, vector: npt.NDArray[np.float32]) -> str:
    with corpus.db.read() as session:
        row = store.embedding_models.get_model(session, corpus.model.id)
    assert row is not None
    model = FixedModel(row.id, row.dimension, lambda _q: vector, storage=row.storage)
    with Searcher(corpus.db, models=lambda: model) as searcher:
        return searcher.explain(
            collection_ids=[corpus.collection], query="", options=SearchOptions(mode=Mode.DENSE)
        )


@pytest.mark.parametrize("storage", ["float32", "halfvec", "binary"])
def test_dense_search_ranks_as_exact_search_for_each_storage(corpus: Corpus, storage: str) -> None:
    convert(corpus, storage)
    # Binary: enough candidates from the bit index (half the corpus) that re-scoring them
    # finds the exact top K.
    factor = {"binary": 100}.get(storage, 4)
    for vector in queries(corpus):
        expected = corpus.exact(vector, half=storage == "halfvec")
        assert corpus.search(vector, rescore_factor=factor) == expected
    explained = plan(corpus, queries(corpus)[0])
    # float32: ranking these 2,000 vectors of 32 dimensions exactly costs the planner less
    # than the index's walk (the vectors' rows are ranked alone, unjoined: migration 0034).
    if storage != "float32":
        assert f"chunk_embeddings_hnsw_model_{corpus.model.id}" in explained, explained


@pytest.mark.parametrize("storage", ["halfvec", "binary"])
def test_filters_and_hybrid_work_for_each_storage(corpus: Corpus, storage: str) -> None:
    convert(corpus, storage)
    vector = queries(corpus)[0]
    group_one = parse_and_compile({"group": 1})
    filtered = corpus.search(vector, filters=group_one, rescore_factor=100)
    assert filtered == corpus.exact(vector, half=storage == "halfvec", where=lambda i: i % 3 == 1)
    nearest = corpus.exact(vector, half=storage == "halfvec")[0]
    hybrid = corpus.search(vector, mode=Mode.HYBRID, query="garden", rescore_factor=100)
    assert len(hybrid) == K
    assert nearest in hybrid  # the dense side's first
    assert any(int(e.split("-")[1]) % len(WORDS) == WORDS.index("garden") for e in hybrid)


def test_binary_with_few_candidates_still_rescores_by_the_full_vectors(corpus: Corpus) -> None:
    convert(corpus, "binary")
    vector = queries(corpus)[1]
    found = corpus.search(vector)  # the default factor: 40 candidates for 10 rows
    scores = [float(corpus.vectors[int(e.split("-")[1])] @ vector) for e in found]
    assert scores == sorted(scores, reverse=True)
    assert len(found) == K


def test_conversion_round_trip_keeps_every_row_and_the_results(corpus: Corpus) -> None:
    vectors = queries(corpus)
    before = [corpus.search(v) for v in vectors]
    assert stored_as(corpus) == ("float32", N, 0)
    done = convert(corpus, "halfvec")
    assert (done.previous, done.rows) == ("float32", N)
    assert done.build is not None and done.build.rows == N
    assert stored_as(corpus) == ("halfvec", 0, N)
    assert [corpus.search(v) for v in vectors] == before
    convert(corpus, "binary")
    assert stored_as(corpus) == ("binary", N, 0)
    assert [corpus.search(v, rescore_factor=100) for v in vectors] == before
    convert(corpus, "float32")
    assert stored_as(corpus) == ("float32", N, 0)
    assert [corpus.search(v) for v in vectors] == before
    assert convert(corpus, "float32").build is None  # already so: nothing done


def test_conversion_refuses_an_unknown_storage_and_leaves_the_model(corpus: Corpus) -> None:
    with pytest.raises(InvalidInputError, match="float32, halfvec, binary"):
        convert(corpus, "int8")
    assert stored_as(corpus) == ("float32", N, 0)


def test_index_build_reports_progress_and_the_rows(corpus: Corpus) -> None:
    seen: list[BuildProgress] = []
    indexing.drop_embedding_index(corpus.db, corpus.model)
    with corpus.db.read() as session:
        assert not store.indexes.has_index(session, corpus.model.id)
    build = indexing.build_embedding_index(corpus.db, corpus.model, progress=seen.append)
    assert seen[-1] == BuildProgress("done", tuples_done=N, tuples_total=N)
    assert (build.rows, build.storage) == (N, "float32")
    assert build.index_bytes > 0
    with corpus.db.read() as session:
        assert store.indexes.has_index(session, corpus.model.id)
    assert corpus.search(queries(corpus)[0]) == corpus.exact(queries(corpus)[0])


def test_build_resources_come_from_the_settings_or_the_machine() -> None:
    assert indexing.build_memory_mb(Settings(index_build_memory_mb=300).indexing) == 300
    assert indexing.build_memory_mb(Settings().indexing) >= 64
    assert indexing.build_workers(Settings(index_build_workers=0).indexing) == 0
    assert indexing.build_workers(Settings().indexing) >= 0


def test_writes_go_to_the_column_of_the_storage(corpus: Corpus) -> None:
    convert(corpus, "halfvec")
    extra = [_document(N + i, corpus.vectors[i : i + 1]) for i in range(3)]
    with corpus.db.write() as session:
        tenant = uuid.UUID("00000000-0000-0000-0000-000000000001")
        store.documents.write_documents(
            session,
            tenant_id=tenant,
            collection_id=corpus.collection,
            model_id=corpus.model.id,
            documents=extra,
        )
        hashes = [text_hash(f"Record {N} about the {WORDS[N % len(WORDS)]}.")]
        reused = store.embedding_models.stored_embeddings(
            session, tenant_id=tenant, model_id=corpus.model.id, hashes=hashes
        )
    assert stored_as(corpus) == ("halfvec", 0, N + 3)
    np.testing.assert_allclose(reused[hashes[0]], corpus.vectors[0], atol=1e-3)


@pytest.fixture
def cli(corpus: Corpus, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", corpus.db.url)
    monkeypatch.setenv("RAGSERVICE_DATA_DIR", str(settings.database.data_dir))
    monkeypatch.setenv("COLUMNS", "200")
    get_settings.cache_clear()
    yield CliRunner()
    get_settings.cache_clear()


def test_cli_convert_reindex_and_list_show_the_storage(cli: CliRunner, corpus: Corpus) -> None:
    from ragservice.cli import app

    converted = cli.invoke(app, ["models", "convert", "random-32d:1", "--storage", "halfvec"])
    assert converted.exit_code == 0, converted.output
    assert f"{N} rows rewritten from float32 to halfvec" in converted.output
    listed = cli.invoke(app, ["models", "list", "--json"])
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["random-32d"]["storage"] == "halfvec"
    table = cli.invoke(app, ["models", "list"])
    assert "halfvec" in table.output
    reindexed = cli.invoke(app, ["models", "reindex", "random-32d:1"])
    assert reindexed.exit_code == 0, reindexed.output
    assert f"built the halfvec HNSW index of random-32d:1 over {N} rows" in reindexed.output
    wrong = cli.invoke(app, ["models", "convert", "random-32d:1", "--storage", "int8"])
    assert wrong.exit_code == 1
    assert "vector storage must be one of" in wrong.output


def test_downgrade_keeps_halfvec_rows_as_float32_and_upgrade_comes_back(
    corpus: Corpus, settings: Settings
) -> None:
    from alembic import command

    from ragservice.db import migrate

    convert(corpus, "halfvec")
    corpus.db.dispose()
    engine = create_engine(settings.database.owner_url.get_secret_value())  # type: ignore[union-attr]
    config = migrate.alembic_config()
    with engine.connect() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0013")
        conn.commit()
        kept = conn.execute(text("SELECT count(embedding) FROM chunk_embeddings")).scalar()
        command.upgrade(config, "head")
        conn.commit()
        storage = conn.execute(text("SELECT storage FROM embedding_models")).scalar()
    engine.dispose()
    assert (kept, storage) == (N, "float32")
