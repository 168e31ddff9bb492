"""What a search costs when it fans out over every shard of a Citus cluster, against the same
search routed to one shard: the price of distributing one tenant within itself.

    python benchmarks/citus_fanout.py [--chunks 20000] [--queries 300] [--workers 2]
        [--dimension 384] [--citus-installer ../shared/citus/install]

The store is distributed by tenant, so a tenant's search is one task on one worker. A tenant too
large for one node would have to be split within itself (by collection or by document), and its
searches would then run on every shard and be merged on the coordinator. This measures that on a
fresh cluster of the embedded PostgreSQL (`ragservice.dev.citus.CitusCluster`, a coordinator
and `--workers` workers, the store migrated and distributed):

- the same `--chunks` vectors (unit length, `--dimension`, around 200 random centres; one
  chunk a document, written through the store's own write path under an embedding model of
  that dimension with its partial HNSW index) are stored twice: as one tenant ("routed": one
  shard), and split evenly over one tenant per shard ("fan-out": every shard of every worker
  holds a part); then analyzed;
- each query (a stored vector plus noise) is a dense search (k = 10, `hnsw.ef_search` 100) by
  the service's own `Searcher` with the query's vector given: as the one tenant (one task on
  its worker), and across all the split tenants' collections (as the system role, so the
  statement names no tenant and Citus runs it on every shard, pushing the ORDER BY and LIMIT
  down and merging the rows on the coordinator; the service's connections to a coordinator run
  multi-shard statements one connection a worker, `citus.multi_shard_modify_mode =
  'sequential'`, ragservice/db/engine.py);
- the two alternate query by query (which goes first alternates) after an untimed pass; p50 /
  p95 of each and the ratio to the routed search, and recall@10 of each against an exact
  search of the vectors in numpy.

Everything runs on this one machine (the nodes share its cores), so the figure is the
coordination's cost, not the speed-up more machines would bring. Prints a table and a final
JSON line; the cluster is destroyed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]

from citus import _ensure_citus, add_cluster_arguments  # noqa: E402

from ragservice import store  # noqa: E402
from ragservice.config import Settings  # noqa: E402
from ragservice.db import Database, open_database, tenancy  # noqa: E402
from ragservice.db.distribution import distribute  # noqa: E402
from ragservice.dev.citus import CitusCluster  # noqa: E402
from ragservice.retrieval.options import Mode, SearchOptions  # noqa: E402
from ragservice.retrieval.search import FixedModel, Searcher  # noqa: E402
from ragservice.types import TextChunk  # noqa: E402

Vector = npt.NDArray[np.float32]
SIDES = ("routed", "fanout")
BATCH = 500
K = 10
EF_SEARCH = 100
CLUSTERS = 200
SPREAD = 0.8


def main() -> None:
    args = _parse_args()
    _ensure_citus(args.citus_installer)
    rng = np.random.default_rng(7)
    vectors = _clustered(rng, args.chunks, args.dimension)
    picked = rng.choice(args.chunks, size=args.queries, replace=args.queries > args.chunks)
    noise = 0.3 * rng.standard_normal((args.queries, args.dimension)).astype(np.float32)
    queries = _unit(vectors[picked] + noise / np.sqrt(args.dimension))
    root = Path(tempfile.mkdtemp(prefix="rs-fanout-"))
    cluster = CitusCluster(root, workers=args.workers)
    try:
        started = time.perf_counter()
        cluster.start()
        cluster.prepare_store()
        with cluster.coordinator_connection() as conn:
            distribute(conn)
            shards = _shard_count(conn)
        _log(f"cluster ready and distributed in {time.perf_counter() - started:.1f} s")
        with _database(cluster, root) as db:
            model_id = _model(db, args.dimension)
            whole = _tenant_on_new_shard(db, cluster, "whole", set())[0]
            parts = _tenants_one_per_shard(db, cluster, shards)
            started = time.perf_counter()
            everything = np.arange(args.chunks)
            whole_collection = _write(db, whole, model_id, vectors, everything, "routed")
            part_collections = []
            for index, (tenant, _) in enumerate(parts):
                share = everything[index :: len(parts)]
                collection = _write(db, tenant, model_id, vectors[share], share, "part")
                part_collections.append((tenant, collection))
            load_s = time.perf_counter() - started
            with cluster.coordinator_connection() as conn:
                # Statistics on every shard before the searches (the planner picks the HNSW
                # index by them; autovacuum would get there on its own later).
                conn.execute("ANALYZE collections, documents, chunks, chunk_embeddings")
            figures = _measure(
                db,
                model_id,
                args.dimension,
                (whole, whole_collection),
                part_collections,
                queries,
            )
        expected = _exact_top(vectors, queries)
        _log(f"loaded {2 * args.chunks} chunks in {load_s:.1f} s")
    finally:
        cluster.destroy()
        shutil.rmtree(root, ignore_errors=True)
    _report(args, figures, expected, shards, len(parts), load_s)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--dimension", type=int, default=384)
    add_cluster_arguments(parser)
    args = parser.parse_args()
    if args.chunks < 1 or args.queries < 1 or args.dimension < 2:
        parser.error("--chunks and --queries must be at least 1, --dimension at least 2")
    return args


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _clustered(rng: np.random.Generator, count: int, dimension: int) -> Vector:
    """Unit vectors around CLUSTERS random centres, as embeddings of texts on a few hundred
    topics are (uniformly random vectors leave HNSW nothing to navigate by)."""
    centres = _unit(rng.standard_normal((CLUSTERS, dimension)).astype(np.float32))
    labels = rng.integers(0, CLUSTERS, size=count)
    noise = rng.standard_normal((count, dimension)).astype(np.float32) / np.sqrt(dimension)
    return _unit(centres[labels] + SPREAD * noise)


def _unit(vectors: Vector) -> Vector:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def _shard_count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'public.collections'::regclass"
    ).fetchone()
    assert row is not None
    return int(row[0])


def _model(db: Database, dimension: int) -> int:
    """An embedding model of `dimension` with its partial HNSW index (its own transaction)."""
    with tenancy.as_system(), db.write() as session:
        model = store.embedding_models.ensure_model(
            session,
            name=f"random-{dimension}",
            dimension=dimension,
            path=None,
            hnsw_m=16,
            hnsw_ef_construction=64,
        )
        return int(model.id)


def _shard_of(cluster: CitusCluster, tenant: uuid.UUID) -> int:
    with cluster.coordinator_connection() as conn:
        row = conn.execute(
            "SELECT get_shard_id_for_distribution_column('public.collections', %s)", (tenant,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _tenant_on_new_shard(
    db: Database, cluster: CitusCluster, name: str, taken: set[int]
) -> tuple[uuid.UUID, int]:
    """A tenant named `name` whose shard is none of `taken` (tenants are made until one is)."""
    for attempt in range(1000):
        with tenancy.as_system(), db.write() as session:
            tenant = store.tenants.ensure_tenant(session, f"{name}-{attempt}")
        shard = _shard_of(cluster, tenant)
        if shard not in taken:
            return tenant, shard
    raise SystemExit(f"no tenant landed on a new shard after 1000 tries ({name})")


def _tenants_one_per_shard(
    db: Database, cluster: CitusCluster, shards: int
) -> list[tuple[uuid.UUID, int]]:
    """One tenant on each shard (the routed tenant's shard too: every shard holds a part)."""
    found: list[tuple[uuid.UUID, int]] = []
    taken: set[int] = set()
    for index in range(shards):
        tenant, shard = _tenant_on_new_shard(db, cluster, f"part{index}", taken)
        taken.add(shard)
        found.append((tenant, shard))
    return found


def _write(
    db: Database,
    tenant: uuid.UUID,
    model_id: int,
    vectors: Vector,
    indices: npt.NDArray[np.int64],
    name: str,
) -> uuid.UUID:
    """`vectors` as one-chunk documents of a collection `name` of `tenant`, in batches; each
    document's external id is `v<its index in the whole set>`. The collection's id."""
    with tenancy.as_tenant(tenant), db.write() as session:
        collection = store.collections.ensure_collection(session, tenant, name)
    for start in range(0, len(vectors), BATCH):
        batch = vectors[start : start + BATCH]
        numbers = [int(i) for i in indices[start : start + BATCH]]
        with tenancy.as_tenant(tenant), db.write() as session:
            store.documents.write_documents(
                session,
                tenant_id=tenant,
                collection_id=collection,
                model_id=model_id,
                documents=[
                    store.documents.DocumentWrite(
                        external_id=f"v{number}",
                        title=None,
                        source="benchmark",
                        metadata={},
                        content_hash=f"v{number}",
                        char_count=8,
                        chunks=[TextChunk(0, f"chunk {number}", 0, 8, 2)],
                        chunk_hashes=[f"v{number}"],
                        embeddings=vector.reshape(1, -1),
                    )
                    for number, vector in zip(numbers, batch, strict=True)
                ],
            )
    return collection


@contextmanager
def _database(cluster: CitusCluster, root: Path) -> Iterator[Database]:
    db = open_database(
        Settings(
            database_url=cluster.service_url,
            owner_database_url=cluster.url,
            data_dir=root / "app",
        ),
        route_reads=False,
    )
    try:
        yield db
    finally:
        db.dispose()


def _measure(
    db: Database,
    model_id: int,
    dimension: int,
    whole: tuple[uuid.UUID, uuid.UUID],
    parts: list[tuple[uuid.UUID, uuid.UUID]],
    queries: Vector,
) -> dict[str, dict[str, Any]]:
    """Per side: the query times (ms) and the vectors found (their indexes), query by query.
    Both through the service's own `Searcher` (dense, k = 10): the routed one as its tenant,
    the fan-out one across the split tenants' collections (as the system role: no tenant
    condition, so every shard)."""
    model = FixedModel(id=model_id, dimension=dimension, embed=_no_text)
    options = SearchOptions(mode=Mode.DENSE, k=K, ef_search=EF_SEARCH)
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    found: dict[str, list[list[int]]] = {side: [] for side in SIDES}
    with Searcher(db, models=lambda: model) as searcher:

        def run(side: str, query: Vector) -> tuple[float, list[int]]:
            scope = tenancy.as_tenant(whole[0]) if side == "routed" else tenancy.as_system()
            collections = [whole[1]] if side == "routed" else [c for _, c in parts]
            started = time.perf_counter()
            with scope:
                result = searcher.search(
                    collection_ids=collections, query="", options=options, vector=query
                )
            elapsed = (time.perf_counter() - started) * 1000
            return elapsed, [int(hit.external_id[1:]) for hit in result.hits]

        for query in queries[: min(20, len(queries))]:  # untimed: caches and connections warm
            for side in SIDES:
                run(side, query)
        for number, query in enumerate(queries):
            order = SIDES if number % 2 == 0 else tuple(reversed(SIDES))
            for side in order:
                elapsed, ids = run(side, query)
                times[side].append(elapsed)
                found[side].append(ids)
    return {side: {"times": times[side], "found": found[side]} for side in SIDES}


def _no_text(text: str) -> Vector:
    raise AssertionError("the benchmark passes every query's vector")


def _exact_top(vectors: Vector, queries: Vector) -> list[set[int]]:
    """Each query's true 10 nearest chunks (cosine), by index into `vectors`."""
    scores = queries @ vectors.T
    top = np.argpartition(-scores, K, axis=1)[:, :K]
    return [set(int(i) for i in row) for row in top]


def _recall(found: list[list[int]], expected: list[set[int]]) -> float:
    """recall@10 against exact search."""
    hits = sum(len(set(ids) & truth) for ids, truth in zip(found, expected, strict=True))
    return hits / (K * len(expected))


def _summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "p50": round(statistics.median(ordered), 2),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
    }


def _report(
    args: argparse.Namespace,
    figures: dict[str, dict[str, Any]],
    expected: list[set[int]],
    shards: int,
    parts: int,
    load_s: float,
) -> None:
    """A table and the final JSON line."""
    latency = {side: _summary(figures[side]["times"]) for side in SIDES}
    routed = latency["routed"]["p50"]
    ratios = {side: round(latency[side]["p50"] / routed, 3) for side in SIDES[1:]}
    recall = {side: round(_recall(figures[side]["found"], expected), 4) for side in SIDES}
    print(f"{'side':<18} {'p50 ms':>8} {'p95 ms':>8} {'p50 ratio':>10} {'recall@10':>10}")
    for side in SIDES:
        ratio = ratios.get(side, 1.0)
        print(
            f"{side:<18} {latency[side]['p50']:>8} {latency[side]['p95']:>8} {ratio:>10} "
            f"{recall[side]:>10}"
        )
    print(
        json.dumps(
            {
                "chunks": args.chunks,
                "dimension": args.dimension,
                "queries": args.queries,
                "workers": args.workers,
                "shards": shards,
                "fanout_tenants": parts,
                "ef_search": EF_SEARCH,
                "p50_ms": {side: latency[side]["p50"] for side in SIDES},
                "p95_ms": {side: latency[side]["p95"] for side in SIDES},
                "p50_ratio_to_routed": ratios,
                "recall_at_10": recall,
                "load_s": round(load_s, 1),
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            }
        )
    )


if __name__ == "__main__":
    main()
