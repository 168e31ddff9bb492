"""`benchmarks/ingest.py --compare`: null, int8 and torch embedders ingesting one corpus.

Each embedder ingests the whole corpus into a tenant of its own (vectors are reused by text
within a tenant only, so every run embeds everything), with the model's HNSW index kept up to
date row by row as a serving model's is. Then dense retrieval is scored by exact search (numpy
over the tenant's stored vectors; a document ranks where its best chunk ranks) on the BEIR
queries, and single queries are timed on the int8 and float encoders.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import text

from ingest.loaders import load_documents
from ingest.parallel import max_workers, run_parallel
from ingest.pipeline import IngestPipeline, IngestReport
from ragservice import store
from ragservice.config import Settings
from ragservice.db import tenancy
from ragservice.embedding.embedder import Embedder, make_embedder
from ragservice.embedding.evaluation import (
    BeirQueries,
    load_beir_queries,
    mean,
    ndcg_at_k,
    rank_documents,
)
from ragservice.embedding.null import null_embedder
from ragservice.runtime import Runtime, open_runtime

_COLLECTION = "bench"
_QUERY_REPEATS = 3  # each query is timed this many times; the p50 is over all of them


def compare(args: argparse.Namespace, corpus: Path) -> dict[str, object]:
    """Run the three ingests and the scoring; the figures of the final JSON line."""
    queries = load_beir_queries(corpus.parent, args.split)
    with tempfile.TemporaryDirectory(prefix="rs-bench-") as tmp:
        settings = Settings(
            database_url=args.database_url,
            data_dir=Path(tmp),
            device=args.device,
            embed_batch_size=args.batch_size,
        )
        runtime = open_runtime(settings)
        try:
            return _compare(runtime, settings, corpus, args.limit, queries)
        finally:
            runtime.close()


def _compare(
    runtime: Runtime, settings: Settings, corpus: Path, limit: int | None, queries: BeirQueries
) -> dict[str, object]:
    int8 = make_embedder(settings.model_copy(update={"embedding_precision": "int8"}))
    int8.warm_up()
    float_model = runtime.embedder
    embedders: dict[str, Callable[[], Embedder]] = {
        "null": lambda: null_embedder(settings.embedding),
        "int8": lambda: int8,
        "torch": lambda: float_model,
    }
    runs = {name: _ingest(runtime, name, make(), corpus, limit) for name, make in embedders.items()}
    workers = max_workers()
    runs["null_workers"] = _ingest_parallel(runtime, workers, corpus, limit)
    int8_vectors = _stored(runtime, runs["int8"]["tenant"])
    float_vectors = _stored(runtime, runs["torch"]["tenant"])
    int8_queries = _query_vectors(int8.embed_query, queries)
    float_queries = _query_vectors(float_model.embed_query, queries)
    figures: dict[str, object] = {
        "docs": runs["torch"]["docs"],
        "chunks": runs["torch"]["chunks"],
        "null_embedder_docs_per_s": runs["null"]["docs_per_s"],
        "null_embedder_workers": workers,
        "null_embedder_workers_docs_per_s": runs["null_workers"]["docs_per_s"],
        "int8_docs_per_s": runs["int8"]["docs_per_s"],
        "torch_docs_per_s": runs["torch"]["docs_per_s"],
        "int8_speedup": round(
            float(runs["int8"]["docs_per_s"]) / float(runs["torch"]["docs_per_s"]), 3
        ),
        "int8_ndcg@10": _ndcg(int8_vectors, int8_queries, queries),
        "float_ndcg@10": _ndcg(float_vectors, float_queries, queries),
        "int8_queries_on_float_docs_ndcg@10": _ndcg(float_vectors, int8_queries, queries),
        "float_queries_on_int8_docs_ndcg@10": _ndcg(int8_vectors, float_queries, queries),
        "int8_query_p50_ms": _query_p50(int8.embed_query, queries),
        "float_query_p50_ms": _query_p50(float_model.embed_query, queries),
        "int8_backend": int8.precision,
        "float_query_backend": float_model.query_backend,
    }
    for name, run in runs.items():
        figures[f"{name}_seconds"] = run["seconds"]
        figures[f"{name}_write_seconds"] = run["write_seconds"]
        if "model_busy" in run:  # the share of the run the model computed; the rest it waited
            figures[f"{name}_model_busy"] = run["model_busy"]
            figures[f"{name}_waits"] = run["waits"]
    return figures


def _ingest(
    runtime: Runtime, name: str, embedder: Embedder, corpus: Path, limit: int | None
) -> dict[str, Any]:
    tenant_id = _fresh_tenant(runtime, name)
    pipeline = IngestPipeline(
        runtime.db,
        embedder,
        model_id=runtime.model_id,
        tenant_id=tenant_id,
        chunking=runtime.chunking_options(),
        batch_chunks=runtime.settings.ingest.batch_chunks,
    )
    started = time.perf_counter()
    report = pipeline.run(islice(load_documents([corpus]), limit), collection=_COLLECTION)
    return _run_figures(name, tenant_id, report, time.perf_counter() - started)


def _ingest_parallel(
    runtime: Runtime, workers: int, corpus: Path, limit: int | None
) -> dict[str, Any]:
    """The null embedder again, with `ingest --workers N`'s worker processes (their model
    time is theirs: `model_busy` is left out)."""
    tenant_id = _fresh_tenant(runtime, "workers")
    started = time.perf_counter()
    report = run_parallel(
        runtime,
        islice(load_documents([corpus]), limit),
        workers=workers,
        model_id=runtime.model_id,
        tenant_id=tenant_id,
        collection=_COLLECTION,
        embedder_factory=null_embedder,
    )
    figures = _run_figures(
        f"null, {workers} workers", tenant_id, report, time.perf_counter() - started
    )
    del figures["model_busy"], figures["waits"]
    return figures


def _fresh_tenant(runtime: Runtime, name: str) -> uuid.UUID:
    with tenancy.as_system(), runtime.db.write() as session:
        return store.tenants.ensure_tenant(session, f"bench-{name}-{uuid.uuid4().hex[:6]}")


def _run_figures(
    name: str, tenant_id: uuid.UUID, report: IngestReport, seconds: float
) -> dict[str, Any]:
    if report.failed:
        raise SystemExit(f"{name}: {len(report.failed)} documents failed: {report.failed[:3]}")
    docs = len(report.new)
    print(f"{name:>5}: {docs} documents, {report.chunks_written} chunks in {seconds:.1f} s")
    return {
        "tenant": tenant_id,
        "docs": docs,
        "chunks": report.chunks_written,
        "seconds": round(seconds, 2),
        "write_seconds": round(report.write_seconds, 2),
        "docs_per_s": round(docs / seconds, 1),
        "model_busy": round(report.embed_seconds / seconds, 3),
        "waits": {
            "preparation_s": round(report.prepare_wait_seconds, 2),
            "writer_s": round(report.write_wait_seconds, 2),
        },
    }


def _stored(runtime: Runtime, tenant_id: uuid.UUID) -> tuple[list[str], np.ndarray]:
    """The tenant's chunk vectors and each chunk's document id."""
    query = text(
        "SELECT d.external_id, e.embedding FROM chunk_embeddings e "
        "JOIN chunks c ON c.id = e.chunk_id JOIN documents d ON d.id = c.document_id "
        "WHERE e.tenant_id = :tenant"
    )
    with tenancy.as_system(), runtime.db.read() as session:
        rows = session.execute(query, {"tenant": tenant_id}).all()
    return [r[0] for r in rows], np.stack([r[1].to_numpy() for r in rows])


def _query_vectors(embed: Callable[[str], np.ndarray], queries: BeirQueries) -> dict[str, Any]:
    return {qid: embed(query) for qid, query in queries.texts.items()}


def _ndcg(
    stored: tuple[list[str], np.ndarray], vectors: dict[str, Any], queries: BeirQueries
) -> float:
    document_ids, matrix = stored
    scores: list[float] = []
    for qid, vector in vectors.items():
        order = np.argsort(-(matrix @ vector), kind="stable")[:200]
        ranked = rank_documents(document_ids[i] for i in order)
        scores.append(ndcg_at_k(ranked, queries.qrels[qid], 10))
    return round(mean(scores), 4)


def _query_p50(embed: Callable[[str], np.ndarray], queries: BeirQueries) -> float:
    texts = list(queries.texts.values())
    for query in texts[:20]:
        embed(query)  # warm-up
    timings: list[float] = []
    for _ in range(_QUERY_REPEATS):
        for query in texts:
            started = time.perf_counter()
            embed(query)
            timings.append(time.perf_counter() - started)
    return round(statistics.median(timings) * 1000, 3)
