"""Vector storage options side by side: bytes per chunk, HNSW build time, recall and latency.

    python benchmarks/vector_storage.py --chunks 50000 [--dimension 384] [--data-dir DIR]

Writes `--chunks` one-chunk documents with synthetic unit vectors (clustered: 1,000 centres,
each vector a centre plus noise, so neighbours mean something, as with real embeddings) to a
fresh collection of a model of its own, then for float32, halfvec and binary in turn: converts
the model (rows rewritten, index built with the sized memory and workers), measures table and
index bytes per chunk (after VACUUM FULL, as the owner), rebuilds the index with PostgreSQL's
defaults (64 MB, no parallel workers) for comparison, and searches `--queries` held-out
vectors densely (k = 10, ef_search 100, the searcher's SQL): recall@10 against exact search
over the float32 vectors, and p50 / p95 of the search. Prints a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from ragservice import store  # noqa: E402
from ragservice.config import Settings  # noqa: E402
from ragservice.db import Database, open_database, tenancy  # noqa: E402
from ragservice.db.models import EmbeddingModel  # noqa: E402
from ragservice.embedding import indexing  # noqa: E402
from ragservice.retrieval.search import FixedModel, Mode, Searcher, SearchOptions  # noqa: E402
from ragservice.types import TextChunk  # noqa: E402

K = 10
TENANT = uuid.UUID("00000000-0000-0000-0000-000000000001")
Vectors = npt.NDArray[np.float32]


def vectors(n: int, dimension: int, seed: int) -> Vectors:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((1000, dimension)).astype(np.float32)
    picked = centres[rng.integers(0, len(centres), n)]
    out = picked + 0.8 * rng.standard_normal((n, dimension)).astype(np.float32)
    normed: Vectors = (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)
    return normed


def load(db: Database, model: EmbeddingModel, data: Vectors, batch: int = 5000) -> float:
    started = time.perf_counter()
    with db.write() as session:
        collection = store.collections.ensure_collection(session, TENANT, f"bench-{model.id}")
    for start in range(0, len(data), batch):
        docs = [_doc(i, data[i : i + 1]) for i in range(start, min(start + batch, len(data)))]
        with db.write() as session:
            store.documents.write_documents(
                session,
                tenant_id=TENANT,
                collection_id=collection,
                model_id=model.id,
                documents=docs,
            )
    return time.perf_counter() - started


def _doc(i: int, vector: Vectors) -> store.documents.DocumentWrite:
    body = f"record {i}"
    chunk = TextChunk(ordinal=0, text=body, start_char=0, end_char=len(body), token_count=2)
    return store.documents.DocumentWrite(
        external_id=str(i),
        title=None,
        source="",
        metadata={},
        content_hash=str(i),
        char_count=len(body),
        chunks=[chunk],
        chunk_hashes=[str(i)],
        embeddings=vector,
    )


def owner_sql(db: Database, statement: str) -> float:
    engine = create_engine(db.owner_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        result = conn.execute(text(statement))
        value = result.scalar() if result.returns_rows else 0
    engine.dispose()
    return float(value or 0)


def measure(
    db: Database, settings: Settings, model: EmbeddingModel, data: Vectors, queries: Vectors
) -> dict[str, object]:
    n = len(data)
    plain = settings.model_copy(update={"index_build_memory_mb": 64, "index_build_workers": 0})
    indexing.drop_embedding_index(db, model)
    default = indexing.build_embedding_index(db, model, index=plain.indexing)
    indexing.drop_embedding_index(db, model)
    sized = indexing.build_embedding_index(db, model, index=settings.indexing)
    owner_sql(db, "VACUUM FULL chunk_embeddings")  # the conversions' dead rows out
    owner_sql(db, "ANALYZE")
    table = owner_sql(db, "SELECT pg_table_size('chunk_embeddings')") / n
    with db.read() as session:
        index = store.indexes.index_bytes(session, model.id) / n
    out: dict[str, object] = {
        "table_bytes_per_chunk": round(table, 1),
        "hnsw_bytes_per_chunk": round(index, 1),
        "bytes_per_chunk": round(table + index, 1),
        "hnsw_build_s": round(sized.seconds, 2),
        "hnsw_build_default_s": round(default.seconds, 2),
        "build_memory_mb": sized.memory_mb,
        "build_workers": sized.workers,
    }
    factors = (2, 4, 10) if model.storage == "binary" else (1,)
    for factor in factors:
        stats = search_stats(db, model, data, queries, factor)
        out.update(stats if len(factors) == 1 else {f"factor_{factor}": stats})
    return out


def search_stats(
    db: Database, model: EmbeddingModel, data: Vectors, queries: Vectors, factor: int
) -> dict[str, float]:
    exact = np.argsort(-(queries @ data.T), axis=1)[:, :K]
    fixed = FixedModel(model.id, model.dimension, lambda _q: queries[0], storage=model.storage)
    options = SearchOptions(mode=Mode.DENSE, k=K, ef_search=100, rescore_factor=factor)
    hits, times = 0, []
    with db.read() as session:
        collection = store.collections.find_collection_id(session, TENANT, f"bench-{model.id}")
    assert collection is not None
    with Searcher(db, models=lambda: fixed) as searcher:
        for q, truth in zip(queries, exact, strict=True):
            started = time.perf_counter()
            result = searcher.search(
                collection_ids=[collection], query="", options=options, vector=q
            )
            times.append((time.perf_counter() - started) * 1000)
            found = {int(h.external_id) for h in result.hits}
            hits += len(found & {int(i) for i in truth})
    times.sort()
    return {
        "recall@10": round(hits / (K * len(queries)), 4),
        "dense_p50_sql_ms": round(statistics.median(times), 2),
        "dense_p95_sql_ms": round(times[int(0.95 * (len(times) - 1))], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chunks", type=int, default=50_000)
    parser.add_argument("--dimension", type=int, default=384)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--data-dir", type=Path, default=Path(".ragservice-bench-storage"))
    parser.add_argument("--storages", default="float32,halfvec,binary")
    args = parser.parse_args()
    settings = Settings(data_dir=args.data_dir)
    db = open_database(settings)
    data = vectors(args.chunks, args.dimension, seed=1)
    queries = vectors(args.queries, args.dimension, seed=2)
    report: dict[str, object] = {"chunks": args.chunks, "dimension": args.dimension}
    with tenancy.as_system():
        with db.write() as session:
            name = f"bench-{uuid.uuid4().hex[:6]}"
            model = store.embedding_models.register_model_version(
                session,
                name=name,
                version=1,
                dimension=args.dimension,
                path=None,
                base_model_id=None,
                details={},
                hnsw_m=settings.indexing.hnsw_m,
                hnsw_ef_construction=settings.indexing.hnsw_ef_construction,
            )
            store.indexes.drop_index(session, model.id)
        report["load_s"] = round(load(db, model, data), 1)
        results: dict[str, object] = {}
        for storage in args.storages.split(","):
            indexing.convert_storage(db, model, storage, index=settings.indexing)
            with db.read() as session:
                model = store.embedding_models.get_model(session, model.id)  # type: ignore[assignment]
            results[storage] = measure(db, settings, model, data, queries)
            print(storage, json.dumps(results[storage]), file=sys.stderr, flush=True)
        report["storage"] = results
    print(json.dumps(report))


if __name__ == "__main__":
    main()
