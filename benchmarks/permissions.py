"""What per-document permissions cost a search: the same queries over HTTP as an admin (every
document) and as a user who may read a tenth of them, and how close the user's hits come to
exact search over what the user may read.

    python benchmarks/permissions.py [--chunks 100000] [--groups 1000] [--rounds 2]
                                     [--data ../shared/data/scifact] [--data-dir DIR]
                                     [--stats-only]

1. The store: `benchmarks/scale.py`'s collection, built by its own functions (SciFact ingested
   the ordinary way, synthetic distractors shaped like SciFact to `--chunks` by the Parquet bulk
   import, then the HNSW build and `db optimize`), cached in `--data-dir` between runs.
2. Permissions: every document of the collection gets exactly one group as its readers
   (`group:g0000`…, round-robin over the documents in a seeded pseudo-random order), set as the
   tables' owner in SQL (documents, then chunks from their documents). `--user` belongs to
   `--share` of the groups (seeded; `store.tenants.add_group_members`). Two API keys: an admin
   key of no user (reads every document: the search "without permissions") and a reader key
   acting for the user.
3. Over HTTP (a `ragservice serve` on the store, authentication on, rate limit off): every
   test query as `/v1/search` k=10 per mode, the two keys alternating query by query (the
   first of each pair alternating too) so both see the same machine; round 0 warms up and
   keeps the hits, `--rounds` more are timed. p50 / p95 per key, the ratio user / admin, and
   the server's own stage timings (`timings_ms`: embed, fulltext, fuse…) per key.
4. Recall@10 against exact search, per key: dense by brute force over the vectors the key may
   read (numpy, cosine as the service scores it), BM25 by every posting of the query's lexemes
   (numpy, N / avgdl / df of the whole collection, as the service scores them), restricted to
   the chunks the key may read; the hybrid top 10 is those two exact candidate lists (as deep as
   the service's, `dense_candidates` / `text_candidates`) fused by `retrieval.fusion.fuse` with
   the service's `FusionSpec`. Dense-only recall isolates the HNSW iterative scan under the
   row-level security filter; full-text-only recall the budgeted BM25 of a restricted asker.

5. BM25 statistics per asker (`per_asker_stats_ms`): what scoring over what the asker may read
   would add to each full-text search. The service scores with the whole collection's N,
   average length and df (`collection_text_stats` and the blocks' sizes: a few index reads,
   `global`); over the user's visible chunks instead, in SQL under the user's
   row-level security, per test query: N and total length of the visible chunks (`totals`;
   `token_count` stands in for a per-chunk BM25 length column, which the schema does not
   have), and each query lexeme's df counted over its postings whose chunk is visible, either
   by hashing the visible chunks' seqs (`df_hash`) or by looking each posting's chunk up by
   seq (`df_lookup`); `stats` is totals and df_hash in one statement, the whole per-asker
   figure. The admin's N and df (every document) are checked to equal the collection's own.
   A full run times `global` and `stats`; `--stats-only` times all five (and checks that both
   df ways agree) on a store already built, with no server and no recall.

Prints progress on stderr, the whole report as JSON on stderr, and a final JSON line:
`{"chunks", "groups", "hybrid_p95_ratio", "recall@10", …, "per_asker_stats_ms"}` (recall@10: the
user's hybrid; per_asker_stats_ms: p50 / p95 of `stats` for the user).
Search settings in the environment (`RAGSERVICE_BM25_POSTINGS_PER_TERM=20000`, …) apply to the
server it starts and to the exact search's fusion alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

_HERE = Path(__file__).resolve().parent
# This folder last on the path: `benchmarks/ingest.py` would shadow the `ingest` package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402
import scale  # noqa: E402
from harness import connect, free_port, percentile, wait_ready  # noqa: E402
from psycopg import sql  # noqa: E402
from scale_support import bm25_scores  # noqa: E402

from ragservice import store  # noqa: E402
from ragservice.auth.keys import Role, new_key  # noqa: E402
from ragservice.client import Mode as ApiMode  # noqa: E402
from ragservice.client import RagserviceClient  # noqa: E402
from ragservice.config import Settings  # noqa: E402
from ragservice.db import tenancy  # noqa: E402
from ragservice.db.engine import driver_connection  # noqa: E402
from ragservice.embedding.evaluation import load_beir_queries, mean  # noqa: E402
from ragservice.readers import principal_set  # noqa: E402
from ragservice.retrieval import statements  # noqa: E402
from ragservice.retrieval.filters import parse_and_compile  # noqa: E402
from ragservice.retrieval.fusion import fuse  # noqa: E402
from ragservice.retrieval.search import Mode, Searcher, SearchOptions  # noqa: E402
from ragservice.runtime import Runtime, open_runtime  # noqa: E402

K = 10
SIDES = ("admin", "user")
Ranked = list[tuple[uuid.UUID, float]]


def main() -> None:
    args = _parse_args()
    started = time.perf_counter()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    texts = list(load_beir_queries(args.data, args.split).texts.values())[: args.queries]
    report: dict[str, Any] = {"chunks_requested": args.chunks, "queries": len(texts)}
    if not (args.data_dir / "load.json").exists():
        scale._log(f"real corpus into {args.collection!r}")
        scale._cli(args, "ingest", str(args.data / "corpus.jsonl"), "-c", args.collection)
    runtime = open_runtime(Settings(data_dir=args.data_dir))
    try:
        with tenancy.as_system():
            scale._build(args, runtime, report)
            collection = scale._collection_id(runtime, args.collection)
            report["permissions"] = _assign_readers(runtime, collection, args)
            principals = _join_groups(runtime, args)
            report["permissions"] |= _visible(runtime, collection, principals)
            admin = _key(runtime, Role.ADMIN, None)
            keys = {"admin": admin, "user": _key(runtime, Role.READER, args.user)}
            if args.filter:
                report["labels"] = _label_documents(runtime, collection, args)
                args.filters = _group_filter(principals)
                keys["user"] = admin
        if not args.stats_only:
            report["http"], found = _http(args, keys, texts)
            with tenancy.as_system():
                report["recall@10"] = _recall(runtime, collection, principals, texts, found)
            report["sql_ms"] = _sql(runtime, collection, principals, texts, args)
        if not args.filter:
            names = list(_STATEMENTS) if args.stats_only else ["global", "stats"]
            report["stats_ms"] = _stats(runtime, collection, principals, texts, names)
    finally:
        runtime.close()
    report["seconds"] = round(time.perf_counter() - started, 1)
    _print(args, report)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=100_000, help="chunks in all (N)")
    parser.add_argument("--groups", type=int, default=1000, help="one per document, round-robin")
    parser.add_argument("--share", type=float, default=0.1, help="of the groups the user is in")
    parser.add_argument("--user", default="u", help="the user the reader key acts for")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/scifact"))
    parser.add_argument("--split", default="test")
    parser.add_argument("--queries", type=int, default=None, help="the first N only")
    parser.add_argument("--data-dir", type=Path, default=Path(".ragservice-permissions"))
    parser.add_argument("--collection", default="permissions")
    parser.add_argument(
        "--modes", type=lambda s: s.split(","), default=["hybrid", "dense", "fulltext"]
    )
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (after a warm-up)")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument(
        "--explain", action="store_true", help="EXPLAIN ANALYZE the first query's statements"
    )
    parser.add_argument(
        "--stats-only",
        action="store_true",
        help="measure per-asker BM25 statistics only (no server, no recall)",
    )
    # scale.py's build reads these too
    parser.add_argument(
        "--filter",
        action="store_true",
        help="the second side: the admin key with a metadata filter naming the user's groups",
    )
    parser.add_argument("--check-sample", type=int, default=500)
    parser.set_defaults(filters=None)
    parser.add_argument("--batch-chunks", type=int, default=32768)
    return parser.parse_args()


# -- permissions -----------------------------------------------------------------------------


def _assign_readers(
    runtime: Runtime, collection: uuid.UUID, args: argparse.Namespace
) -> dict[str, Any]:
    """Each document of the collection readable by one group, round-robin over the documents
    in a seeded pseudo-random order; chunks follow their documents. Done once per store (a
    marker file in the data folder), as the tables' owner, then vacuumed and analyzed."""
    marker = args.data_dir / f"readers-{args.groups}-{args.seed}.json"
    if marker.exists():
        scale._log(f"readers already set ({marker.name})")
        return cast(dict[str, Any], json.loads(marker.read_text()))
    scale._log(f"readers: one of {args.groups} groups per document")
    started = time.perf_counter()
    width = _name_width(args.groups)
    params = {"c": collection, "groups": args.groups, "seed": str(args.seed), "width": width}
    with runtime.db.owner() as session:
        conn = driver_connection(session)
        documents = conn.execute(
            "UPDATE documents d SET readers = ARRAY['group:g' || lpad((o.n %% %(groups)s)::text, "
            "%(width)s, '0')] FROM (SELECT id, row_number() OVER (ORDER BY md5(external_id || "
            "%(seed)s)) - 1 AS n FROM documents WHERE collection_id = %(c)s) AS o "
            "WHERE d.id = o.id",
            params,
        ).rowcount
        chunks = conn.execute(
            "UPDATE chunks c SET readers = d.readers FROM documents d "
            "WHERE c.document_id = d.id AND c.collection_id = %(c)s",
            params,
        ).rowcount
    set_s = time.perf_counter() - started
    _vacuum(runtime, "documents", "chunks")
    figures = {
        "documents": documents,
        "chunks": chunks,
        "set_readers_s": round(set_s, 1),
        "vacuum_s": round(time.perf_counter() - started - set_s, 1),
    }
    marker.write_text(json.dumps(figures))
    scale._log(f"  {figures}")
    return figures


def _vacuum(runtime: Runtime, *tables: str) -> None:
    """VACUUM (ANALYZE) each table, as the owner (outside a transaction)."""
    with runtime.db.owner_engine() as engine, engine.connect() as owner:
        autocommit = owner.execution_options(isolation_level="AUTOCOMMIT")
        for table in tables:
            autocommit.exec_driver_sql(f"VACUUM (ANALYZE) {table}")


def _name_width(groups: int) -> int:
    """Digits in a group's number (`g0000`…): at least 4."""
    return max(4, len(str(groups - 1)))


def _label_documents(
    runtime: Runtime, collection: uuid.UUID, args: argparse.Namespace
) -> dict[str, Any]:
    """`--filter`: each document's metadata names its readers' group (`{"group": "g0042"}`),
    so a filter on the user's groups selects the chunks the user may read. Done once per store
    (a marker file), as the tables' owner, then analyzed."""
    marker = args.data_dir / f"labels-{args.groups}-{args.seed}.json"
    if marker.exists():
        return cast(dict[str, Any], json.loads(marker.read_text()))
    scale._log("labels: each document's group in its metadata")
    started = time.perf_counter()
    with runtime.db.owner() as session:
        documents = (
            driver_connection(session)
            .execute(
                "UPDATE documents SET metadata = metadata || jsonb_build_object('group', "
                "substr(readers[1], 7)) WHERE collection_id = %s AND readers IS NOT NULL",
                (collection,),
            )
            .rowcount
        )
    _vacuum(runtime, "documents")
    figures = {"labelled": documents, "label_s": round(time.perf_counter() - started, 1)}
    marker.write_text(json.dumps(figures))
    return figures


def _group_filter(principals: frozenset[str]) -> dict[str, Any]:
    """The metadata filter that selects the documents of the user's groups."""
    groups = sorted(p.removeprefix("group:") for p in principals if p.startswith("group:"))
    return {"group": {"$in": groups}}


def _join_groups(runtime: Runtime, args: argparse.Namespace) -> frozenset[str]:
    """`args.user` made a member of `args.share` of the groups (seeded) and of no other; the
    user's principal set."""
    width = _name_width(args.groups)
    rng = np.random.default_rng(args.seed + 3)
    count = max(1, round(args.groups * args.share))
    chosen = sorted(f"g{int(i):0{width}d}" for i in rng.choice(args.groups, count, replace=False))
    tenant = runtime.default_tenant_id
    with runtime.db.write() as session:
        old = store.tenants.user_groups(session, tenant, args.user)
        for group in sorted(set(old) - set(chosen)):
            store.tenants.remove_group_members(session, tenant, group, [args.user])
        for group in chosen:
            store.tenants.add_group_members(session, tenant, group, [args.user])
    return principal_set(args.user, chosen)


def _visible(runtime: Runtime, collection: uuid.UUID, principals: frozenset[str]) -> dict[str, Any]:
    with runtime.db.read() as session:
        row = (
            driver_connection(session)
            .execute(
                "SELECT count(*), count(*) FILTER (WHERE readers IS NULL OR readers && %s) "
                "FROM chunks WHERE collection_id = %s",
                (sorted(principals), collection),
            )
            .fetchone()
        )
    total, mine = row if row else (0, 0)
    return {
        "user_groups": len(principals) - 1,
        "user_chunks": int(mine),
        "user_share": round(int(mine) / max(int(total), 1), 4),
    }


def _key(runtime: Runtime, role: Role, user: str | None) -> str:
    key = new_key()
    with runtime.db.write() as session:
        store.tenants.create_api_key(
            session,
            tenant_id=runtime.default_tenant_id,
            role=role,
            prefix=key.prefix,
            key_hash=key.hash,
            name="benchmarks/permissions.py",
            user_name=user,
        )
    return key.secret


# -- over HTTP -------------------------------------------------------------------------------


def _http(
    args: argparse.Namespace, keys: dict[str, str], texts: list[str]
) -> tuple[dict[str, Any], dict[str, dict[str, list[list[uuid.UUID]]]]]:
    """Latency per mode and key (authentication on, no rate limit), and each key's hits per
    mode and query (from the warm-up round)."""
    env = {
        **os.environ,
        "RAGSERVICE_DATA_DIR": str(args.data_dir),
        "RAGSERVICE_HOST": "127.0.0.1",
        "RAGSERVICE_RATE_LIMIT_PER_SECOND": "0",
    }
    for name in ("RAGSERVICE_DATABASE_URL", "RAGSERVICE_AUTH_DISABLED"):
        env.pop(name, None)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [str(Path(sys.executable).parent / "ragservice"), "serve", "--port", str(port)]
    log = (args.data_dir / "serve.log").open("w+")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    clients: dict[str, RagserviceClient] = {}
    try:
        wait_ready(base, process, log)
        for side, secret in keys.items():
            clients[side] = connect(base, {"Authorization": f"Bearer {secret}"}, timeout=120)
        latency, found = {}, {}
        for mode in args.modes:
            scale._log(f"over HTTP: {mode}, {len(texts)} queries per key, {args.rounds} rounds")
            latency[mode], found[mode] = _compare(clients, args, texts, mode)
            scale._log(f"  {_brief(latency[mode])}")
    finally:
        for client in clients.values():
            client.close()
        process.terminate()
        process.wait(timeout=60)
        log.close()
    by_side = {side: {mode: found[mode][side] for mode in found} for side in SIDES}
    return latency, by_side


def _compare(
    clients: dict[str, RagserviceClient], args: argparse.Namespace, texts: list[str], mode: str
) -> tuple[dict[str, Any], dict[str, list[list[uuid.UUID]]]]:
    """Every query by each key in turn (who goes first alternates); round 0 untimed."""
    walls: dict[str, list[float]] = {side: [] for side in SIDES}
    stages: dict[str, dict[str, list[float]]] = {side: {} for side in SIDES}
    found: dict[str, list[list[uuid.UUID]]] = {side: [] for side in SIDES}
    for round_ in range(args.rounds + 1):
        for i, text in enumerate(texts):
            for side in SIDES if (i + round_) % 2 == 0 else SIDES[::-1]:
                started = time.perf_counter()
                response = clients[side].search(
                    text,
                    collections=[args.collection],
                    mode=cast(ApiMode, mode),
                    k=K,
                    filters=args.filters if side == "user" else None,
                )
                wall = (time.perf_counter() - started) * 1000
                if not round_:
                    found[side].append([uuid.UUID(h["chunk_id"]) for h in response["results"]])
                    continue
                walls[side].append(wall)
                for stage, ms in response["timings_ms"].items():
                    stages[side].setdefault(stage, []).append(ms)
    figures: dict[str, Any] = {
        side: {**scale._summary(walls[side]), "server_ms": _stage_summary(stages[side])}
        for side in SIDES
    }
    figures["p95_ratio"] = round(figures["user"]["p95"] / figures["admin"]["p95"], 3)
    figures["p50_ratio"] = round(figures["user"]["p50"] / figures["admin"]["p50"], 3)
    return figures, found


def _stage_summary(stages: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {
        stage: {"p50": round(statistics.median(v), 2), "p95": round(percentile(v, 0.95), 2)}
        for stage, v in sorted(stages.items())
    }


def _brief(figures: dict[str, Any]) -> str:
    admin, user = figures["admin"], figures["user"]
    return (
        f"admin p50 {admin['p50']} p95 {admin['p95']} ms; user p50 {user['p50']} "
        f"p95 {user['p95']} ms; p95 ratio {figures['p95_ratio']}"
    )


# -- in SQL: where the time goes ------------------------------------------------------------


def _sql(
    runtime: Runtime,
    collection: uuid.UUID,
    principals: frozenset[str],
    texts: list[str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The two statements of a hybrid search (dense candidates, full-text candidates), in
    process as the service role, under each key's principal set (admin: every document),
    alternating query by query: p50 / p95 per statement and side; with `--explain`, the
    EXPLAIN (ANALYZE, BUFFERS) of both for the first query, per side, on stderr."""
    scale._log("in SQL: the hybrid search's two statements per side")
    vectors = dict(zip(texts, (runtime.embedder.embed_query(t) for t in texts), strict=True))
    options = SearchOptions.from_settings(runtime.settings.search, mode=Mode.HYBRID, k=K)
    readers: dict[str, frozenset[str] | None] = {"admin": None, "user": principals}
    side_options = {"admin": options, "user": options}
    if args.filter:  # the admin, filtered to the user's groups
        readers["user"] = None
        side_options["user"] = replace(options, filters=parse_and_compile(args.filters))
    walls: dict[str, list[float]] = {f"{s}_{p}": [] for s in SIDES for p in ("dense", "text")}
    model = scale._query_model(runtime, vectors.__getitem__)
    with scale._searcher(runtime, vectors) as searcher:
        for round_ in range(2):  # round 0 warms up
            for i, text in enumerate(texts):
                for side in SIDES if i % 2 == 0 else SIDES[::-1]:
                    with tenancy.as_tenant(runtime.default_tenant_id, readers[side]):
                        for part, statement in _statements(
                            searcher, model, collection, text, side_options[side]
                        ).items():
                            started = time.perf_counter()
                            searcher._run(statement)
                            if round_:
                                walls[f"{side}_{part}"].append(
                                    (time.perf_counter() - started) * 1000
                                )
        if args.explain:
            for side in SIDES:
                with tenancy.as_tenant(runtime.default_tenant_id, readers[side]):
                    for part, statement in _statements(
                        searcher, model, collection, texts[0], side_options[side]
                    ).items():
                        plan = searcher._run(
                            replace(
                                statement,
                                query=sql.SQL("EXPLAIN (ANALYZE, BUFFERS) {}").format(
                                    statement.query
                                ),
                                exact=None,
                            )
                        )
                        lines = "\n".join(str(row[0]) for row in plan)
                        print(f"-- {side}, {part}: {texts[0]!r}\n{lines}", file=sys.stderr)
    return {name: scale._summary(values) for name, values in walls.items()}


def _statements(
    searcher: Searcher, model: Any, collection: uuid.UUID, text: str, options: SearchOptions
) -> dict[str, Any]:
    """The dense and the full-text candidates' statements of a hybrid search, as the searcher
    builds them for the transaction's principal set."""
    vector = model.embed_query(text)
    text_side = searcher._text_statement([collection], text, options, options.text_limit)
    return {
        "dense": searcher._dense_candidates(model, [collection], options, vector),
        "text": replace(
            text_side,
            query=statements.with_ctes(text_side.query, select=statements.TEXT_CANDIDATES),
        ),
    }


# -- BM25 statistics per asker --------------------------------------------------------------

_TERMS = "tsvector_to_array(to_tsvector('english'::regconfig, %(query)s))"

# What the service reads now: the collections' totals, and df as the sum of the term's blocks'
# sizes (the primary key's index alone).
GLOBAL_STATS = f"""
SELECT (SELECT sum(chunk_count) FROM collection_text_stats
        WHERE collection_id = ANY(%(collections)s::uuid[])) AS n,
       (SELECT sum(token_count) FROM collection_text_stats
        WHERE collection_id = ANY(%(collections)s::uuid[])) AS tokens,
       (SELECT array_agg(lexeme || '=' || df ORDER BY lexeme) FROM (
            SELECT p.lexeme, sum(p.n) AS df FROM chunk_postings p
            WHERE p.collection_id = ANY(%(collections)s::uuid[]) AND p.lexeme = ANY({_TERMS})
            GROUP BY p.lexeme) AS d) AS dfs"""

# Over what the transaction may read (row-level security hides the other chunks).
TOTALS = """
SELECT count(*) AS n, coalesce(sum(token_count), 0) AS tokens FROM chunks
WHERE collection_id = ANY(%(collections)s::uuid[])"""

DF_HASH = f"""
WITH visible AS MATERIALIZED (
    SELECT seq FROM chunks WHERE collection_id = ANY(%(collections)s::uuid[])
)
SELECT array_agg(lexeme || '=' || df ORDER BY lexeme) FROM (
    SELECT p.lexeme, count(*) AS df
    FROM chunk_postings p CROSS JOIN LATERAL unnest(p.seqs) AS u(seq)
    WHERE p.collection_id = ANY(%(collections)s::uuid[]) AND p.lexeme = ANY({_TERMS})
      AND u.seq IN (SELECT seq FROM visible)
    GROUP BY p.lexeme) AS d"""

DF_LOOKUP = f"""
SELECT array_agg(lexeme || '=' || df ORDER BY lexeme) FROM (
    SELECT p.lexeme, count(*) AS df
    FROM chunk_postings p CROSS JOIN LATERAL unnest(p.seqs) AS u(seq)
    WHERE p.collection_id = ANY(%(collections)s::uuid[]) AND p.lexeme = ANY({_TERMS})
      AND EXISTS (SELECT 1 FROM chunks c WHERE c.seq = u.seq)
    GROUP BY p.lexeme) AS d"""

STATS = f"""
WITH visible AS MATERIALIZED (
    SELECT seq, token_count FROM chunks WHERE collection_id = ANY(%(collections)s::uuid[])
)
SELECT (SELECT count(*) FROM visible) AS n,
       (SELECT coalesce(sum(token_count), 0) FROM visible) AS tokens,
       (SELECT array_agg(lexeme || '=' || df ORDER BY lexeme) FROM (
            SELECT p.lexeme, count(*) AS df
            FROM chunk_postings p CROSS JOIN LATERAL unnest(p.seqs) AS u(seq)
            WHERE p.collection_id = ANY(%(collections)s::uuid[]) AND p.lexeme = ANY({_TERMS})
              AND u.seq IN (SELECT seq FROM visible)
            GROUP BY p.lexeme) AS d) AS dfs"""

_STATEMENTS = {
    "global": GLOBAL_STATS,
    "totals": TOTALS,
    "df_hash": DF_HASH,
    "df_lookup": DF_LOOKUP,
    "stats": STATS,
}


def _stats(
    runtime: Runtime,
    collection: uuid.UUID,
    principals: frozenset[str],
    texts: list[str],
    names: list[str],
) -> dict[str, Any]:
    """Per test query and side (admin: every document; user: its principal set), the
    `_STATEMENTS` named in one transaction as the service role, the sides alternating query
    by query; round 0 warms up. p50 / p95 per side and statement, the postings the queries'
    terms hold, and the checks that fail (`mismatches`: the admin's N and df are the
    collection's own; df_hash = df_lookup and stats = totals + df_hash where all are timed)."""
    scale._log("BM25 statistics: the whole collection's, and per asker over what it may read")
    readers = {"admin": None, "user": principals}
    walls: dict[str, list[float]] = {f"{s}_{name}": [] for s in SIDES for name in names}
    postings: list[int] = []
    mismatches = 0
    for round_ in range(2):
        for i, text in enumerate(texts):
            for side in SIDES if i % 2 == 0 else SIDES[::-1]:
                params = {"collections": [collection], "query": text}
                rows: dict[str, tuple[Any, ...]] = {}
                with (
                    tenancy.as_tenant(runtime.default_tenant_id, readers[side]),
                    runtime.db.read() as session,
                ):
                    conn = driver_connection(session)
                    for name in names:
                        statement = _STATEMENTS[name]
                        started = time.perf_counter()
                        row = conn.execute(statement, params).fetchone()
                        wall = (time.perf_counter() - started) * 1000
                        rows[name] = tuple(row) if row else ()
                        if round_:
                            walls[f"{side}_{name}"].append(wall)
                if round_:
                    continue
                stats, whole = rows["stats"], rows["global"]
                # token_count is not BM25's length: N and df only
                checks = [side == "user" or (int(stats[0]), stats[2]) == (int(whole[0]), whole[2])]
                if "df_lookup" in rows:
                    checks += [
                        rows["df_hash"][0] == rows["df_lookup"][0],
                        stats == (*rows["totals"], rows["df_hash"][0]),
                    ]
                mismatches += not all(checks)
                if side == "admin":
                    postings.append(sum(int(t.rsplit("=", 1)[1]) for t in rows["global"][2] or []))
    figures: dict[str, Any] = {name: scale._summary(values) for name, values in walls.items()}
    figures["query_postings"] = {
        "p50": statistics.median(postings),
        "p95": percentile([float(p) for p in postings], 0.95),
        "max": max(postings),
    }
    figures["mismatches"] = mismatches
    scale._log(
        f"  user stats p50 {figures['user_stats']['p50']} p95 {figures['user_stats']['p95']} ms; "
        f"global p95 {figures['user_global']['p95']} ms; mismatches {mismatches}"
    )
    return figures


# -- recall against exact search -------------------------------------------------------------


class _Corpus:
    """The collection as exact search sees it: chunk ids, numbers (`seq`), unit vectors, which
    chunks the user may read, and BM25's N and average length."""

    def __init__(self, runtime: Runtime, collection: uuid.UUID, principals: frozenset[str]) -> None:
        ids, matrix = scale._all_vectors(runtime)
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        self.ids = np.array(ids, dtype=object)
        self.vectors = matrix / np.where(norms == 0, 1, norms)
        with runtime.db.read() as session:
            conn = driver_connection(session)
            rows = conn.execute(
                "SELECT id, seq, readers IS NULL OR readers && %s FROM chunks "
                "WHERE collection_id = %s",
                (sorted(principals), collection),
            ).fetchall()
            chunks, tokens = conn.execute(
                "SELECT sum(chunk_count), sum(token_count) FROM collection_text_stats "
                "WHERE collection_id = %s",
                (collection,),
            ).fetchone()  # type: ignore[misc]
        row_of = {chunk_id: i for i, chunk_id in enumerate(ids)}
        self.user = np.zeros(len(ids), dtype=bool)
        self.row_of_seq = np.full(max(int(row[1]) for row in rows) + 1, -1, dtype=np.int64)
        for chunk_id, seq, readable in rows:
            self.row_of_seq[int(seq)] = row_of[chunk_id]
            self.user[row_of[chunk_id]] = bool(readable)
        self.n, self.avgdl = float(chunks), float(tokens) / max(float(chunks), 1.0)

    def mask(self, side: str) -> npt.NDArray[np.bool_]:
        return self.user if side == "user" else np.ones(len(self.ids), dtype=bool)


def _recall(
    runtime: Runtime,
    collection: uuid.UUID,
    principals: frozenset[str],
    texts: list[str],
    found: dict[str, dict[str, list[list[uuid.UUID]]]],
) -> dict[str, dict[str, float]]:
    """Mean recall@10 per key and mode of the service's hits against exact search over the
    chunks the key may read (see the module's docstring)."""
    scale._log("exact search: brute-force dense, exhaustive BM25, fused")
    options = SearchOptions.from_settings(runtime.settings.search, mode=Mode.HYBRID, k=K)
    corpus = _Corpus(runtime, collection, principals)
    recalls: dict[str, dict[str, list[float]]] = {side: {} for side in SIDES}
    for i, text in enumerate(texts):
        vector = np.asarray(runtime.embedder.embed_query(text), dtype=np.float32)
        scores = corpus.vectors @ (vector / max(float(np.linalg.norm(vector)), 1e-12))
        postings = _postings(runtime, collection, text)
        for side in SIDES:
            mask = corpus.mask(side)
            exact = {
                "dense": _top(corpus.ids[mask], scores[mask], options.dense_limit),
                "fulltext": _text_top(corpus, postings, mask, options),
            }
            exact["hybrid"] = fuse(exact["dense"], exact["fulltext"], options.fusion_spec)
            for mode, hits in found[side].items():
                truth = [chunk for chunk, _ in exact[mode][:K]]
                recalls[side].setdefault(mode, []).append(_overlap(hits[i], truth))
    return {
        side: {mode: round(mean(values), 4) for mode, values in by_mode.items()}
        for side, by_mode in recalls.items()
    }


def _postings(runtime: Runtime, collection: uuid.UUID, text: str) -> list[Any]:
    with runtime.db.read() as session:
        return cast(list[Any], scale._all_postings(driver_connection(session), collection, text))


def _text_top(
    corpus: _Corpus, postings: list[Any], mask: npt.NDArray[np.bool_], options: SearchOptions
) -> Ranked:
    """Exhaustive BM25 (the whole collection's statistics) over the chunks in `mask`."""
    seqs, scores = bm25_scores(postings, corpus.n, corpus.avgdl, options.bm25_k1, options.bm25_b)
    rows = corpus.row_of_seq[seqs]
    keep = mask[rows]
    return _top(corpus.ids[rows[keep]], scores[keep], options.text_limit)


def _top(ids: npt.NDArray[Any], scores: npt.NDArray[Any], limit: int) -> Ranked:
    """The best `limit`, ties by chunk id (as the service's statements order them)."""
    if len(scores) > limit * 4:
        cut = np.argpartition(-scores, limit * 4)[: limit * 4]
        ids, scores = ids[cut], scores[cut]
    ranked = sorted(
        zip(ids.tolist(), scores.tolist(), strict=True), key=lambda p: (-p[1], str(p[0]))
    )
    return ranked[:limit]


def _overlap(found: Sequence[uuid.UUID], truth: Sequence[uuid.UUID]) -> float:
    if not truth:
        return 1.0
    return len(set(found) & set(truth)) / len(truth)


# -- report ----------------------------------------------------------------------------------


def _print(args: argparse.Namespace, report: dict[str, Any]) -> None:
    print(json.dumps(report, indent=1, default=str), file=sys.stderr)
    per_asker = _per_asker(report["stats_ms"]) if "stats_ms" in report else {}
    if args.stats_only:
        print(
            json.dumps(
                {
                    "chunks": report["chunks"],
                    "groups": args.groups,
                    "user_share": report["permissions"]["user_share"],
                    **per_asker,
                    "seconds": report["seconds"],
                }
            )
        )
        return
    http = report["http"]
    recall = report["recall@10"]
    # --filter: the second side is a filtered search, named so (`filtered_p95_ratio`: hybrid).
    prefix = "filtered_" if args.filter else ""
    summary: dict[str, Any] = {
        "chunks": report["chunks"],
        "groups": args.groups,
        "user_share": report["permissions"]["user_share"],
        **({"filter_values": len(args.filters["group"]["$in"])} if args.filter else {}),
        **{_key_of(prefix, mode, "p95_ratio"): http[mode]["p95_ratio"] for mode in http},
        **{_key_of(prefix, mode, "p50_ratio"): http[mode]["p50_ratio"] for mode in http},
        **{f"{mode}_p95_ms": {side: http[mode][side]["p95"] for side in SIDES} for mode in http},
        f"{prefix}recall@10": recall["user"].get("hybrid"),
        **{
            f"{prefix}{mode}_recall@10": recall["user"][mode]
            for mode in recall["user"]
            if mode != "hybrid"
        },
        "admin_recall@10": recall["admin"],
        "sql_p95_ms": {name: figures["p95"] for name, figures in report["sql_ms"].items()},
        **per_asker,
        "seconds": report["seconds"],
    }
    print(json.dumps(summary))


def _per_asker(stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "per_asker_stats_ms": {k: stats["user_stats"][k] for k in ("p50", "p95")},
        "stats_p95_ms": {
            name.removeprefix("user_"): figures["p95"]
            for name, figures in stats.items()
            if name.startswith("user_")
        },
        "query_postings_p95": stats["query_postings"]["p95"],
        "stats_mismatches": stats["mismatches"],
    }


def _key_of(prefix: str, mode: str, figure: str) -> str:
    """`hybrid_p95_ratio`, or with `--filter` `filtered_p95_ratio` (hybrid) and
    `filtered_dense_p95_ratio`."""
    if prefix and mode == "hybrid":
        return f"{prefix}{figure}"
    return f"{prefix}{mode}_{figure}"


if __name__ == "__main__":
    main()
