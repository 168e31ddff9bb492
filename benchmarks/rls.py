"""What row-level security costs a search: the same searches with and without the policies.

    python benchmarks/rls.py --data ../shared/data/scifact [--data-dir DIR] [--rounds 3]

The corpus must already be ingested into `--collection` (default: the dataset folder's name):

    RAGSERVICE_DATA_DIR=DIR ragservice ingest ../shared/data/scifact/corpus.jsonl -c scifact

Two handles on the same database: the service's own (role `ragservice_service`, bound by the
policies, each transaction naming the tenant, as a request does) and one as the connecting user
(the tables' owner: no policy applies). Every judged query is searched with each, alternating
in rounds so both see the same machine; query vectors are computed once up front, so the
first three rows are SQL plus Python; `hybrid+embed` embeds each query as the API does (the
full-text side then runs while the query is embedded). Prints p50 / p95 per mode and side,
the ratio, and whether both sides returned the same hits. Read-only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

# Keep this folder off the import path: `benchmarks/ingest.py` would shadow the `ingest` package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from sqlalchemy.orm import sessionmaker  # noqa: E402

from ragservice import store  # noqa: E402
from ragservice.config import Settings  # noqa: E402
from ragservice.db import Database, tenancy  # noqa: E402
from ragservice.db.engine import make_engine  # noqa: E402
from ragservice.embedding.evaluation import load_beir_queries  # noqa: E402
from ragservice.retrieval.search import Mode, Searcher, SearchOptions  # noqa: E402
from ragservice.runtime import Runtime, open_runtime  # noqa: E402

K = 10


def main() -> None:
    args = _parse_args()
    queries = list(load_beir_queries(args.data, args.split).texts.values())
    runtime = open_runtime(Settings(database_url=args.database_url, data_dir=args.data_dir))
    owner = _owner_database(runtime.db)
    try:
        if runtime.db.role is None:
            raise SystemExit("row-level security is not enforced on this database")
        collection = _collection(runtime, args.collection)
        vectors = dict(zip(queries, runtime.embedder.embed(queries), strict=True))
        embed = {
            "precomputed": vectors.__getitem__,
            "embedded": runtime.embedder.embed_query,  # as the API does, text side overlapping
        }
        results = {
            mode.value: _compare(
                runtime, owner, collection, queries, embed["precomputed"], mode, args
            )
            for mode in Mode
        }
        results["hybrid+embed"] = _compare(
            runtime, owner, collection, queries, embed["embedded"], Mode.HYBRID, args
        )
    finally:
        owner.dispose()
        runtime.close()
    _print(results, len(queries))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a BEIR dataset folder")
    parser.add_argument("--split", default="test")
    parser.add_argument("--data-dir", type=Path, default=Path(".ragservice"))
    parser.add_argument("--database-url", default=os.environ.get("RAGSERVICE_DATABASE_URL"))
    parser.add_argument("--collection", default=None, help="default: the dataset folder's name")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per side")
    args = parser.parse_args()
    args.collection = args.collection or args.data.resolve().name
    return args


def _owner_database(db: Database) -> Database:
    """The same database as the connecting user: no `SET ROLE`, so no policy applies."""
    write, read = make_engine(db.url), make_engine(db.url)
    return Database(
        url=db.url,
        write_engine=write,
        read_engine=read,
        write_sessions=sessionmaker(write, expire_on_commit=False),
        read_sessions=sessionmaker(read, expire_on_commit=False),
    )


def _collection(runtime: Runtime, name: str) -> uuid.UUID:
    with runtime.db.read() as session:
        found = store.collections.find_collection_id(session, runtime.default_tenant_id, name)
    if found is None:
        raise SystemExit(f"collection {name!r} not found; ingest it first (see --help)")
    return found


def _compare(
    runtime: Runtime,
    owner: Database,
    collection: uuid.UUID,
    queries: list[str],
    embed: Callable[[str], Any],
    mode: Mode,
    args: argparse.Namespace,
) -> dict[str, object]:
    options = replace(SearchOptions.from_settings(runtime.settings.search, k=K), mode=mode)
    sides = {"rls": runtime.db, "owner": owner}
    walls: dict[str, list[float]] = {name: [] for name in sides}
    hits: dict[str, list[list[uuid.UUID]]] = {name: [] for name in sides}
    searchers = {
        name: Searcher(
            db,
            embed,
            model_id=runtime.model_id,
            dimension=runtime.embedder.dimension,
        )
        for name, db in sides.items()
    }
    try:
        with tenancy.as_tenant(runtime.default_tenant_id):
            for round_ in range(args.rounds + 1):  # round 0 warms both up, untimed
                for name, searcher in searchers.items():
                    for text in queries:
                        started = time.perf_counter()
                        found = searcher.search(
                            collection_ids=[collection], query=text, options=options
                        )
                        if round_:
                            walls[name].append((time.perf_counter() - started) * 1000)
                        else:
                            hits[name].append([hit.chunk_id for hit in found.hits])
    finally:
        for searcher in searchers.values():
            searcher.close()
    p50 = {name: statistics.median(values) for name, values in walls.items()}
    return {
        **{f"{name}_p50_ms": round(value, 2) for name, value in p50.items()},
        **{
            f"{name}_p95_ms": round(sorted(values)[int(0.95 * (len(values) - 1))], 2)
            for name, values in walls.items()
        },
        "ratio_p50": round(p50["rls"] / p50["owner"], 3),
        "same_hits": hits["rls"] == hits["owner"],
    }


def _print(results: dict[str, dict[str, object]], queries: int) -> None:
    print(f"{queries} queries, k={K}; rls = service role under the policies, owner = none")
    header = (
        f"{'mode':<10} {'rls p50':>8} {'owner p50':>10} {'ratio':>6} {'rls p95':>8} "
        f"{'owner p95':>10} {'same hits':>10}"
    )
    print(header)
    print("-" * len(header))
    for mode, r in results.items():
        print(
            f"{mode:<10} {r['rls_p50_ms']:>8} {r['owner_p50_ms']:>10} {r['ratio_p50']:>6} "
            f"{r['rls_p95_ms']:>8} {r['owner_p95_ms']:>10} {r['same_hits']!s:>10}"
        )
    print(json.dumps({"queries": queries, "k": K, "modes": results}))


if __name__ == "__main__":
    main()
