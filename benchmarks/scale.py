"""A million chunks on one machine: an N-chunk collection built through the bulk import, measured.

    python benchmarks/scale.py --chunks 1000000 [--data ../shared/data/scifact] [--data-dir DIR]

1. The real corpus: SciFact is ingested into `--collection` (default `scale`) the ordinary way
   (chunked and embedded by the serving model), so its test queries keep judged answers.
2. Distractors, N minus SciFact's chunks: text that is synthetic but shaped like SciFact's
   (words drawn from a Zipf law over SciFact's own vocabulary, ranked by frequency, extended with
   made-up words for a long tail; sentence and chunk lengths drawn from SciFact's), vectors
   drawn from a model of the real chunk embeddings (`scale_support.DistractorModel`: k-means
   clusters, Gaussian residuals with the real covariance, the noise scale calibrated so that a
   real chunk's 10 nearest distractors are as close as its 10 nearest real chunks; the check
   is printed: `distractor_neighbour_cosine` beside `scifact_neighbour_cosine`). Written as
   Parquet files (cached in DIR/parts-* between runs).
3. The bulk import (`ragservice ingest DIR/parts --model ... --index deferred`): chunks per
   second, BM25 postings included, and WAL bytes per chunk, then the HNSW build, timed on its
   own.
4. Bytes per chunk (whole database; chunks, embeddings, HNSW, postings), PostgreSQL's resident
   memory (proportional set size of its processes, so shared buffers count once).
5. Over HTTP (a `ragservice serve` on the same store): p50 / p95 per mode at 1 and 4 clients,
   query embedding included; SciFact nDCG@10 per mode with the distractors present.
6. In SQL (the service's own `Searcher`, query vectors computed up front): full-text p95 for the
   SciFact test queries and for queries made of the most frequent terms, and whether each of
   their top 10 equals exhaustive BM25 (`fulltext_exact`, every posting read in numpy), by the
   exact BM25 extension where the store has it (`fulltext_path`); the per-term budgets of the SQL
   statement compared (`--budgets`, always the SQL statement); per
   storage option
   (float32; binary, the same rows with a bit index; then halfvec, the rows rewritten; each
   converted with `ragservice models convert`, so the store ends as halfvec): bytes
   per chunk, HNSW build time, dense recall@10 against exact search over the same float32
   vectors (numpy), dense p95, and both at ef_search 40, 100 and 200 (`recall_vs_ef`).

Prints progress on stderr, a table, and a final JSON line with the keys the scaling docs use.
`--only sql` or `--only http` measures one part again on a store already built (the final JSON
line then holds that part's keys): e.g. after a change to the search code, without the hour of
building, converting and recall checks.
`--keep` leaves the store (for `benchmarks/soak.py`); by default it is kept too, since building
it is the slow part: delete DIR to start over.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402
import psutil  # noqa: E402
import psycopg  # noqa: E402
from harness import connect, free_port, percentile, wait_ready  # noqa: E402
from scale_support import (  # noqa: E402
    DistractorModel,
    Postings,
    bm25_scores,
    calibrate,
    distribution,
    merge_top,
    real_neighbour_cosines,
    same_top,
    top_cosines,
    unit,
)

from ragservice import store  # noqa: E402
from ragservice.client import Mode as ApiMode  # noqa: E402
from ragservice.client import RagserviceClient, SearchResponse  # noqa: E402
from ragservice.config import Settings  # noqa: E402
from ragservice.db import tenancy  # noqa: E402
from ragservice.db.engine import driver_connection  # noqa: E402
from ragservice.embedding import indexing  # noqa: E402
from ragservice.embedding.evaluation import (  # noqa: E402
    BeirQueries,
    load_beir_queries,
    mean,
    ndcg_at_k,
    rank_documents,
)
from ragservice.retrieval import statements  # noqa: E402
from ragservice.retrieval.search import Mode, Searcher, SearchOptions  # noqa: E402
from ragservice.runtime import Runtime, open_runtime  # noqa: E402

Vector = npt.NDArray[np.float32]
MODES = ("dense", "fulltext", "hybrid")
STORAGES = ("float32", "binary", "halfvec")
EF_SEARCH = (40, 100, 200)
# The neighbour-cosine medians of distractors and of the real corpus may differ by this much.
NEIGHBOUR_TOLERANCE = 0.05
_PART_CHUNKS = 50_000
_WORD = re.compile(r"[A-Za-z][A-Za-z\-]{1,20}")


def main() -> None:
    args = _parse_args()
    started = time.perf_counter()
    settings = Settings(data_dir=args.data_dir)
    queries = load_beir_queries(args.data, args.split)
    report: dict[str, Any] = {"chunks_requested": args.chunks}
    if args.only:
        _measure_again(args, settings, queries, report)
        return
    _log(f"real corpus into {args.collection!r}")
    _cli(args, "ingest", str(args.data / "corpus.jsonl"), "-c", args.collection)
    runtime = open_runtime(settings)
    try:
        with tenancy.as_system():
            _build(args, runtime, report)
            vectors = _query_vectors(runtime, queries)
            report["sizes"] = _sizes(runtime)
            report["postgres_pss_mb"] = _postgres_memory_mb(args.data_dir)
        report["http"] = _http(args, queries)
        with tenancy.as_system():
            report["sql"] = _sql(args, runtime, queries, vectors)
            report["storage"] = _storages(args, runtime, vectors)
    finally:
        runtime.close()
    report["seconds"] = round(time.perf_counter() - started, 1)
    _print(report)


def _measure_again(
    args: argparse.Namespace, settings: Settings, queries: BeirQueries, report: dict[str, Any]
) -> None:
    """`--only`: one part measured again on the store as it is."""
    started = time.perf_counter()
    if args.only == "http":
        report["http"] = _http(args, queries)
    runtime = open_runtime(settings)
    try:
        with tenancy.as_system():
            report["chunks"] = _chunk_count(runtime, _collection_id(runtime, args.collection))
            if report["chunks"] < args.chunks:
                raise SystemExit(
                    f"--only needs a store of {args.chunks} chunks in {args.data_dir}: "
                    f"it holds {report['chunks']} (run without --only to build it)"
                )
            if args.only == "sql":
                vectors = _query_vectors(runtime, queries)
                report["sql"] = _sql(args, runtime, queries, vectors)
    finally:
        runtime.close()
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=1), file=sys.stderr)
    print(json.dumps(_part_summary(report, args.only)))


def _part_summary(report: dict[str, Any], part: str) -> dict[str, Any]:
    summary: dict[str, Any] = {"chunks": report["chunks"], "only": part}
    if part == "sql":
        sql_figures = report["sql"]
        summary |= {
            "fulltext_p50_sql_ms": sql_figures["fulltext_scifact_ms"]["p50"],
            "fulltext_p95_sql_ms": sql_figures["fulltext_scifact_ms"]["p95"],
            "fulltext_frequent_p50_sql_ms": sql_figures["fulltext_frequent_ms"]["p50"],
            "fulltext_frequent_p95_sql_ms": sql_figures["fulltext_frequent_ms"]["p95"],
            "fulltext_exact": sql_figures["fulltext_exact"],
            "fulltext_path": sql_figures["fulltext_path"],
        }
    else:
        latency = report["http"]["latency_ms"]
        summary |= {
            "hybrid_p50_http_ms": latency["hybrid@1"]["p50"],
            "hybrid_p95_http_ms": latency["hybrid@1"]["p95"],
            "hybrid_qps_4_clients": latency["hybrid@4"]["qps"],
            "fulltext_p95_http_ms": latency["fulltext@1"]["p95"],
            "scifact_hybrid_ndcg@10": report["http"]["ndcg@10"]["hybrid"],
        }
    return summary | {"seconds": report["seconds"]}


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=100_000, help="chunks in all (N)")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/scifact"))
    parser.add_argument("--split", default="test")
    parser.add_argument("--data-dir", type=Path, default=Path(".ragservice-scale"))
    parser.add_argument("--collection", default="scale")
    parser.add_argument(
        "--check-sample", type=int, default=500, help="real chunks the neighbour check measures"
    )
    parser.add_argument("--storages", type=lambda s: s.split(","), default=list(STORAGES))
    parser.add_argument("--frequent-queries", type=int, default=50)
    parser.add_argument("--depth", type=int, default=100, help="chunks fetched for nDCG")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--batch-chunks", type=int, default=32768, help="chunks per import batch")
    parser.add_argument(
        "--budgets",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1000, 2000, 5000, 10000],
        help="BM25 postings per term compared in SQL (quality and latency)",
    )
    parser.add_argument(
        "--only",
        choices=("sql", "http"),
        help="measure this part again on a store already built (nothing is loaded)",
    )
    return parser.parse_args()


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _cli(args: argparse.Namespace, *argv: str) -> float:
    """Run `ragservice ARGV` on the benchmark's store; its wall-clock seconds."""
    env = {
        **os.environ,
        "RAGSERVICE_DATA_DIR": str(args.data_dir),
        "RAGSERVICE_INGEST_BATCH_CHUNKS": str(args.batch_chunks),
    }
    env.pop("RAGSERVICE_DATABASE_URL", None)
    command = [str(Path(sys.executable).parent / "ragservice"), *argv]
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True)
    return time.perf_counter() - started


# -- the collection --------------------------------------------------------------------------


def _build(args: argparse.Namespace, runtime: Runtime, report: dict[str, Any]) -> None:
    collection = _collection_id(runtime, args.collection)
    model = _model(runtime)
    present = _chunk_count(runtime, collection)
    report["model"] = f"{model.name}:{model.version}"
    if present >= args.chunks:
        _log(f"{present} chunks already stored: reusing them (delete {args.data_dir} to rebuild)")
        report["chunks"] = present
        report["load"] = json.loads((args.data_dir / "load.json").read_text())
        return
    real = _real_chunks(runtime, collection, model.id)
    parts = _write_parts(args, real, args.chunks - present)
    distractors = _neighbour_check(args, real.vectors, parts)
    _log(f"bulk import of {args.chunks - present} chunks from {parts}")
    if getattr(model, "storage", "float32") != "float32":
        _cli(args, "models", "convert", report["model"], "--storage", "float32", "--force")
        model = _model(runtime)
    indexing.drop_embedding_index(runtime.db, model)  # built once after the load, below
    wal_before = _wal_lsn(runtime)
    import_s = _cli(
        args,
        "ingest",
        str(parts),
        "-c",
        args.collection,
        "--model",
        report["model"],
        "--index",
        "kept",
    )
    wal_bytes = _wal_lsn(runtime) - wal_before
    _log("HNSW build")
    build_s = _cli(args, "models", "reindex", report["model"])
    report["chunks"] = _chunk_count(runtime, collection)
    loaded = report["chunks"] - present
    vacuum = _vacuum_postings(runtime)
    report["load"] = {
        "chunks": loaded,
        "import_s": round(import_s, 1),
        "load_chunks_per_s": round(loaded / import_s, 1),
        "load_seconds_excluding_index": round(import_s, 1),
        "wal_bytes_per_chunk": round(wal_bytes / max(loaded, 1)),
        "hnsw_build_s": round(build_s, 1),
        **vacuum,
        "distractors": distractors,
    }
    (args.data_dir / "load.json").write_text(json.dumps(report["load"]))


def _wal_lsn(runtime: Runtime) -> int:
    """The server's WAL insert position, in bytes since the start of the WAL."""
    with runtime.db.read() as session:
        row = (
            driver_connection(session)
            .execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
            .fetchone()
        )
    return int(row[0]) if row else 0


def _vacuum_postings(runtime: Runtime) -> dict[str, Any]:
    """`ragservice db optimize`'s steps as the database owner, as an operator runs them after
    a large import (short postings blocks merged, the postings table rewritten in key order,
    the other big tables vacuumed and analyzed). Returns the postings' bytes per chunk before
    and after, the seconds the postings' steps took and the whole optimize's."""
    from ragservice.db import maintenance

    chunks = max(_chunk_count_all(runtime), 1)
    with runtime.db.owner_engine() as engine:
        results = maintenance.run_optimize(
            engine, on_done=lambda r: _log(f"{r.step.label}: {r.seconds:.1f} s")
        )
    postings = [r for r in results if r.step.table == "chunk_postings"]
    return {
        "postings_bytes_per_chunk_before_vacuum": round(postings[0].bytes_before / chunks),
        "postings_bytes_per_chunk": round(postings[-1].bytes_after / chunks),
        "vacuum_full_postings_s": round(sum(r.seconds for r in postings), 1),
        "optimize_s": round(sum(r.seconds for r in results), 1),
    }


def _chunk_count_all(runtime: Runtime) -> int:
    with runtime.db.read() as session:
        row = driver_connection(session).execute("SELECT count(*) FROM chunks").fetchone()
    return int(row[0]) if row else 0


class _RealChunks:
    """What the distractors imitate: the real chunks' vectors, word counts and vocabulary."""

    def __init__(self, texts: list[str], vectors: Vector, doc_chunks: list[int]) -> None:
        self.vectors = vectors
        self.chunk_words = np.array([len(t.split()) for t in texts])
        self.doc_chunks = np.array(doc_chunks)
        sentences = [s for t in texts for s in re.split(r"(?<=[.!?])\s+", t) if s.strip()]
        self.sentence_words = np.array([max(3, len(s.split())) for s in sentences])
        counts = Counter(w.lower() for t in texts for w in _WORD.findall(t))
        self.vocabulary = [w for w, _ in counts.most_common()]


def _real_chunks(runtime: Runtime, collection: uuid.UUID, model_id: int) -> _RealChunks:
    with runtime.db.read() as session:
        rows = (
            driver_connection(session)
            .execute(
                "SELECT c.text, coalesce(e.embedding, e.embedding_half::vector), c.document_id "
                "FROM chunks c JOIN documents d ON d.id = c.document_id "
                "JOIN chunk_embeddings e ON e.chunk_id = c.id AND e.model_id = %s "
                "WHERE c.collection_id = %s AND d.external_id NOT LIKE 'synthetic-%%' "
                "ORDER BY c.document_id, c.ordinal",
                (model_id, collection),
            )
            .fetchall()
        )
    texts = [row[0] for row in rows]
    vectors = np.stack([row[1].to_numpy() for row in rows]).astype(np.float32)
    per_doc = Counter(row[2] for row in rows)
    return _RealChunks(texts, vectors, list(per_doc.values()))


def _write_parts(args: argparse.Namespace, real: _RealChunks, chunks: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = args.data_dir / f"parts-model-{chunks}-{args.seed}"
    done = folder / "complete"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    model = _distractor_model(args, real.vectors, chunks)
    words = _Words(real.vocabulary, rng)
    written, part = 0, 0
    _log(f"writing {chunks} synthetic chunks to {folder}")
    while written < chunks:
        size = min(_PART_CHUNKS, chunks - written)
        table = pa.table(_part(rng, words, real, f"{chunks}-{part:04d}", size, model))
        pq.write_table(table, folder / f"part-{part:04d}.parquet")
        written += size
        part += 1
        _log(f"  {written}/{chunks}")
    done.touch()
    return folder


def _distractor_model(args: argparse.Namespace, real: Vector, count: int) -> DistractorModel:
    """The distractor model fitted to the real vectors, its scale calibrated for `count`
    distractors against the real corpus's own neighbour-cosine median."""
    rng = np.random.default_rng(args.seed + 1)
    _log(f"fitting the distractor model to {len(real)} real vectors")
    model = DistractorModel.fit(real, rng)
    sample = rng.choice(len(real), min(200, len(real)), replace=False)
    target = float(np.median(real_neighbour_cosines(real, sample)))
    model.scale = calibrate(model, unit(real[sample]), target, count, rng)
    _log(f"  {len(model.centres)} clusters; scale {model.scale:.3f} for a median of {target:.4f}")
    return model


def _neighbour_check(args: argparse.Namespace, real: Vector, parts: Path) -> dict[str, Any]:
    """For a sample of real chunks, the cosines to their 10 nearest distractors (read back
    from the Parquet parts) and to their 10 nearest other real chunks: the two distributions
    and whether their medians are within `NEIGHBOUR_TOLERANCE`."""
    import pyarrow.parquet as pq

    rng = np.random.default_rng(args.seed + 2)
    sample = rng.choice(len(real), min(args.check_sample, len(real)), replace=False)
    queries = unit(real[sample])
    best = None
    for path in sorted(parts.glob("part-*.parquet")):
        column = pq.read_table(path, columns=["embedding"]).column("embedding").combine_chunks()
        flat = column.values.to_numpy(zero_copy_only=False).astype(np.float32)
        best = merge_top(best, top_cosines(queries, unit(flat.reshape(len(column), -1))))
    assert best is not None
    distractor = distribution(best)
    scifact = distribution(real_neighbour_cosines(real, sample))
    close = abs(distractor["median"] - scifact["median"]) <= NEIGHBOUR_TOLERANCE
    _log(f"neighbour cosine: distractors {distractor}, SciFact {scifact}, within: {close}")
    if not close:
        _log(f"WARNING: the medians differ by more than {NEIGHBOUR_TOLERANCE}")
    return {
        "distractor_neighbour_cosine": distractor,
        "scifact_neighbour_cosine": scifact,
        "neighbour_medians_within_0.05": close,
        "sample": len(sample),
    }


class _Words:
    """Zipf-distributed words: SciFact's vocabulary by frequency, then a made-up long tail."""

    def __init__(self, vocabulary: list[str], rng: np.random.Generator, size: int = 200_000):
        tail = ["".join(rng.choice(list("bcdfghklmnprstvz"), 3)) + str(i) for i in range(size)]
        self.words = np.array((vocabulary + tail)[:size])
        weights = 1.0 / np.arange(1, size + 1) ** 1.07
        self.cdf = np.cumsum(weights / weights.sum())
        self.rng = rng

    def draw(self, count: int) -> npt.NDArray[np.str_]:
        return self.words[np.searchsorted(self.cdf, self.rng.random(count))]


def _part(
    rng: np.random.Generator,
    words: _Words,
    real: _RealChunks,
    part: str,
    size: int,
    model: DistractorModel,
) -> dict[str, Any]:
    lengths = rng.choice(real.chunk_words, size)
    drawn = words.draw(int(lengths.sum()))
    texts, cursor = [], 0
    for length in lengths:
        texts.append(_sentences(rng, real, drawn[cursor : cursor + length]))
        cursor += length
    doc_ids, ordinals = _documents(rng, real, part, size)
    vectors = model.draw(rng, size)
    titles = [" ".join(words.draw(6)).capitalize() for _ in range(size)]
    return {
        "id": doc_ids,
        "title": titles,
        "ordinal": ordinals,
        "text": texts,
        "embedding": list(vectors),
    }


def _sentences(rng: np.random.Generator, real: _RealChunks, drawn: Sequence[str]) -> str:
    out, cursor = [], 0
    while cursor < len(drawn):
        n = int(rng.choice(real.sentence_words))
        sentence = " ".join(drawn[cursor : cursor + n])
        out.append(sentence[:1].upper() + sentence[1:] + ".")
        cursor += n
    return " ".join(out)


def _documents(
    rng: np.random.Generator, real: _RealChunks, part: str, size: int
) -> tuple[list[str], list[int]]:
    doc_ids: list[str] = []
    ordinals: list[int] = []
    doc = 0
    while len(doc_ids) < size:
        count = min(int(rng.choice(real.doc_chunks)), size - len(doc_ids))
        doc_ids += [f"synthetic-{part}-{doc:06d}"] * count
        ordinals += list(range(count))
        doc += 1
    return doc_ids, ordinals


# -- what it costs ---------------------------------------------------------------------------


def _sizes(runtime: Runtime) -> dict[str, Any]:
    with runtime.db.read() as session:
        conn = driver_connection(session)
        chunks = int(conn.execute("SELECT count(*) FROM chunks").fetchone()[0])  # type: ignore[index]
        database = int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])  # type: ignore[index]
        rows = conn.execute(
            "SELECT c.relname, pg_table_size(c.oid), pg_indexes_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind = 'r' "
            "ORDER BY pg_total_relation_size(c.oid) DESC"
        ).fetchall()
        indexes = conn.execute(
            "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indrelid WHERE c.relname = 'chunk_embeddings'"
        ).fetchall()
    per = max(chunks, 1)
    return {
        "chunks": chunks,
        "db_bytes": database,
        "db_bytes_per_chunk": round(database / per),
        "tables_bytes_per_chunk": {
            name: {"table": round(t / per), "indexes": round(i / per)}
            for name, t, i in rows
            if t + i > 1_000_000
        },
        "embedding_indexes_bytes_per_chunk": {name: round(size / per) for name, size in indexes},
    }


def _postgres_memory_mb(data_dir: Path) -> float:
    """Proportional set size of the PostgreSQL processes of this store, in MiB."""
    pgdata = str((data_dir / "pgdata").resolve())
    total = 0
    for process in psutil.process_iter(["name", "cmdline"]):
        try:
            if process.info["name"] != "postgres":
                continue
            if not _serves(process, pgdata):
                continue
            total += process.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return round(total / 2**20, 1)


def _serves(process: psutil.Process, pgdata: str) -> bool:
    root = process
    while root.parent() is not None and root.parent().name() == "postgres":
        root = root.parent()
    return pgdata in " ".join(root.cmdline())


# -- over HTTP -------------------------------------------------------------------------------


def _http(args: argparse.Namespace, queries: BeirQueries) -> dict[str, Any]:
    texts = list(queries.texts.values())
    env = {
        **os.environ,
        "RAGSERVICE_DATA_DIR": str(args.data_dir),
        "RAGSERVICE_AUTH_DISABLED": "1",
        "RAGSERVICE_HOST": "127.0.0.1",
    }
    env.pop("RAGSERVICE_DATABASE_URL", None)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [str(Path(sys.executable).parent / "ragservice"), "serve", "--port", str(port)]
    log = (args.data_dir / "serve.log").open("w+")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(base, process, log)
        _log("over HTTP: quality and latency per mode")
        with connect(base, {}, timeout=120) as client:
            quality = {mode: _ndcg(client, args, queries, mode) for mode in MODES}
        latency = {
            f"{mode}@{clients}": _latency(base, args.collection, texts, mode, clients)
            for mode in MODES
            for clients in (1, 4)
        }
        rss = psutil.Process(process.pid).memory_info().rss / 2**20
    finally:
        process.terminate()
        process.wait(timeout=60)
        log.close()
    return {"ndcg@10": quality, "latency_ms": latency, "server_rss_mb": round(rss, 1)}


def _search(
    client: RagserviceClient, collection: str, query: str, mode: str, k: int
) -> SearchResponse:
    return client.search(query, collections=[collection], mode=cast(ApiMode, mode), k=k)


def _ndcg(
    client: RagserviceClient, args: argparse.Namespace, queries: BeirQueries, mode: str
) -> float:
    scores = []
    for query_id, text in queries.texts.items():
        hits = _search(client, args.collection, text, mode, args.depth)["results"]
        ranked = rank_documents(hit["document"]["external_id"] for hit in hits)
        scores.append(ndcg_at_k(ranked, queries.qrels[query_id], 10))
    return round(mean(scores), 4)


def _latency(base: str, collection: str, texts: list[str], mode: str, clients: int) -> Any:
    def worker(share: list[str]) -> list[float]:
        timings = []
        with connect(base, {}, timeout=120) as client:
            for text in share[:5]:
                _search(client, collection, text, mode, 10)
            for text in share:
                started = time.perf_counter()
                _search(client, collection, text, mode, 10)
                timings.append((time.perf_counter() - started) * 1000)
        return timings

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        shares = [texts[i::clients] for i in range(clients)]
        measured = [t for ts in pool.map(worker, shares) for t in ts]
    seconds = time.perf_counter() - started
    return {**_summary(measured), "qps": round(len(measured) / seconds, 1)}


def _summary(timings: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(timings), 2),
        "p95": round(percentile(timings, 0.95), 2),
        "n": len(timings),
    }


# -- in SQL ----------------------------------------------------------------------------------


def _query_vectors(runtime: Runtime, queries: BeirQueries) -> dict[str, Vector]:
    texts = list(queries.texts.values())
    return dict(zip(texts, runtime.embedder.embed(texts), strict=True))


def _searcher(
    runtime: Runtime, vectors: dict[str, Vector], *, exact_bm25: bool | None = None
) -> Searcher:
    """A searcher on the model as it is stored now, with the query vectors computed up front
    (`exact_bm25=False`: full text by the SQL statement and its per-term budget)."""
    model = _query_model(runtime, vectors.__getitem__)
    return Searcher(runtime.db, models=lambda: model, exact_bm25=exact_bm25)


def _query_model(runtime: Runtime, embed: Callable[[str], Vector]) -> Any:
    from ragservice.retrieval.search import FixedModel

    model = _model(runtime)
    return FixedModel(
        id=model.id,
        dimension=model.dimension,
        embed=embed,
        storage=getattr(model, "storage", "float32"),
    )


def _sql(
    args: argparse.Namespace, runtime: Runtime, queries: BeirQueries, vectors: dict[str, Vector]
) -> dict[str, Any]:
    collection = _collection_id(runtime, args.collection)
    frequent = _frequent_queries(runtime, args)
    options = SearchOptions.from_settings(runtime.settings.search, mode=Mode.FULLTEXT, k=10)
    texts = list(queries.texts.values())
    with runtime.db.read() as session:
        found = driver_connection(session).execute(statements.HAS_EXACT_BM25).fetchone()
    extension = bool(found and found[0])
    with (
        _searcher(runtime, vectors) as searcher,
        _searcher(runtime, vectors, exact_bm25=False) as budgeted,
    ):
        scifact = _timed_searches(searcher, collection, texts, options)
        common = _timed_searches(searcher, collection, frequent, options)
        exact = _fulltext_exact(runtime, searcher, collection, texts + frequent, options)
        budgets = {
            str(budget): _budget_figures(
                budgeted,
                collection,
                queries,
                frequent,
                replace(options, bm25_postings_per_term=budget),
            )
            for budget in args.budgets
        }
    return {
        "fulltext_scifact_ms": scifact,
        "fulltext_frequent_ms": common,
        "fulltext_exact": exact["exact"],
        "fulltext_exact_queries": exact,
        "fulltext_path": "extension" if extension else "sql-budget",
        "postings_per_term": options.bm25_postings_per_term,
        "budgets": budgets,
        "frequent_queries_sample": frequent[:5],
    }


def _fulltext_exact(
    runtime: Runtime,
    searcher: Searcher,
    collection: uuid.UUID,
    texts: list[str],
    options: SearchOptions,
) -> dict[str, Any]:
    """Whether the service's full-text top 10 equals exhaustive BM25 on every query: every
    posting of the query's lexemes read from `chunk_postings`, scored in numpy with the same
    formula, N and avgdl (`collection_text_stats`), k1 and b; ties at the cut allowed."""
    _log(f"full text against exhaustive BM25 ({len(texts)} queries)")
    differ: list[str] = []
    with runtime.db.read() as session:
        conn = driver_connection(session)
        chunks, tokens = conn.execute(
            "SELECT coalesce(sum(chunk_count), 0), coalesce(sum(token_count), 0) "
            "FROM collection_text_stats WHERE collection_id = %s",
            (collection,),
        ).fetchone()  # type: ignore[misc]
    n, avgdl = float(chunks), float(tokens) / max(float(chunks), 1.0)
    for text in texts:
        hits = searcher.search(collection_ids=[collection], query=text, options=options).hits
        with runtime.db.read() as session:
            conn = driver_connection(session)
            found = _seqs(conn, [hit.chunk_id for hit in hits])
            postings = _all_postings(conn, collection, text)
        seqs, scores = bm25_scores(postings, n, avgdl, options.bm25_k1, options.bm25_b)
        if not same_top(found, seqs, scores, options.k):
            differ.append(text)
    return {"exact": not differ, "queries": len(texts), "differ": len(differ), "first": differ[:3]}


def _seqs(conn: psycopg.Connection[Any], ids: list[uuid.UUID]) -> list[int]:
    rows = conn.execute("SELECT id, seq FROM chunks WHERE id = ANY(%s)", (ids,)).fetchall()
    seq_of = {row[0]: int(row[1]) for row in rows}
    return [seq_of[i] for i in ids]


def _all_postings(
    conn: psycopg.Connection[Any], collection: uuid.UUID, text: str
) -> list[Postings]:
    """Every posting of the query's lexemes in the collection (blocks of migration 0014)."""
    rows = conn.execute(
        "SELECT p.lexeme, array_agg(u.seq), array_agg(u.tf), array_agg(u.len) "
        "FROM chunk_postings p "
        "CROSS JOIN LATERAL unnest(p.seqs, p.tfs, p.lengths) AS u(seq, tf, len) "
        "WHERE p.collection_id = %s AND p.lexeme = ANY("
        "tsvector_to_array(to_tsvector('english'::regconfig, %s))) GROUP BY p.lexeme",
        (collection, text),
    ).fetchall()
    return [
        Postings(
            np.array(row[1], dtype=np.int64),
            np.array(row[2], dtype=np.float64),
            np.array(row[3], dtype=np.float64),
        )
        for row in rows
    ]


def _budget_figures(
    searcher: Searcher,
    collection: uuid.UUID,
    queries: BeirQueries,
    frequent: list[str],
    options: SearchOptions,
) -> dict[str, Any]:
    """Full-text quality (SciFact nDCG@10, documents by their best chunk) and latency at one
    postings budget."""
    deep = replace(options, k=100)
    scores = []
    for query_id, text in queries.texts.items():
        hits = searcher.search(collection_ids=[collection], query=text, options=deep).hits
        ranked = rank_documents(hit.external_id for hit in hits)
        scores.append(ndcg_at_k(ranked, queries.qrels[query_id], 10))
    texts = list(queries.texts.values())
    return {
        "ndcg@10": round(mean(scores), 4),
        "scifact_ms": _timed_searches(searcher, collection, texts, options),
        "frequent_ms": _timed_searches(searcher, collection, frequent, options),
    }


def _frequent_queries(runtime: Runtime, args: argparse.Namespace) -> list[str]:
    """Queries of 3 to 5 lexemes drawn from the 30 most frequent ones (df in a 1% sample)."""
    with runtime.db.read() as session:
        rows = (
            driver_connection(session)
            .execute(
                "SELECT word FROM ts_stat($$SELECT to_tsvector('english', text) FROM chunks "
                "TABLESAMPLE SYSTEM (1)$$) ORDER BY ndoc DESC LIMIT 30"
            )
            .fetchall()
        )
    top = [row[0] for row in rows]
    rng = np.random.default_rng(args.seed)
    return [
        " ".join(rng.choice(top, int(rng.integers(3, 6)), replace=False))
        for _ in range(args.frequent_queries)
    ]


def _timed_searches(
    searcher: Searcher, collection: uuid.UUID, texts: list[str], options: SearchOptions
) -> dict[str, float]:
    for text in texts[:10]:
        searcher.search(collection_ids=[collection], query=text, options=options)
    timings = []
    for text in texts:
        started = time.perf_counter()
        searcher.search(collection_ids=[collection], query=text, options=options)
        timings.append((time.perf_counter() - started) * 1000)
    return _summary(timings)


def _storages(
    args: argparse.Namespace, runtime: Runtime, vectors: dict[str, Vector]
) -> dict[str, Any]:
    collection = _collection_id(runtime, args.collection)
    ids, matrix = _all_vectors(runtime)
    texts = list(vectors)
    exact = _exact_top10(matrix, np.stack([vectors[t] for t in texts]), ids)
    results: dict[str, Any] = {}
    model = _model(runtime)
    name = f"{model.name}:{model.version}"
    for storage in args.storages:
        build_s = None
        if getattr(_model(runtime), "storage", "float32") != storage:
            _log(f"converting to {storage}")
            build_s = round(
                _cli(args, "models", "convert", name, "--storage", storage, "--force"), 1
            )
        results[storage] = _storage_figures(runtime, collection, vectors, texts, exact, build_s)
        results[storage]["recall_vs_ef"] = {
            str(ef): _dense_figures(runtime, collection, vectors, texts, exact, ef)
            for ef in EF_SEARCH
        }
        _log(f"{storage}: {results[storage]}")
    return results


def _storage_figures(
    runtime: Runtime,
    collection: uuid.UUID,
    vectors: dict[str, Vector],
    texts: list[str],
    exact: list[set[uuid.UUID]],
    build_s: float | None,
) -> dict[str, Any]:
    figures = _dense_figures(runtime, collection, vectors, texts, exact, None)
    sizes = _embedding_bytes(runtime)
    return {
        "bytes_per_chunk": sizes["table"] + sizes["index"],
        "table_bytes_per_chunk": sizes["table"],
        "index_bytes_per_chunk": sizes["index"],
        "recall@10": figures["recall@10"],
        "ef_search": figures["ef_search"],
        "dense_p50_sql_ms": figures["p50_ms"],
        "dense_p95_sql_ms": figures["p95_ms"],
        "convert_and_build_s": build_s,
    }


def _dense_figures(
    runtime: Runtime,
    collection: uuid.UUID,
    vectors: dict[str, Vector],
    texts: list[str],
    exact: list[set[uuid.UUID]],
    ef_search: int | None,
) -> dict[str, Any]:
    """Dense recall@10 against exact search and latency at one ef_search (None: the default
    of the model's storage, from the settings)."""
    options = SearchOptions.from_settings(runtime.settings.search, mode=Mode.DENSE, k=10)
    options = replace(options, ef_search=ef_search)
    recalls, timings = [], []
    with _searcher(runtime, vectors) as searcher:
        for text in texts[:10]:
            searcher.search(collection_ids=[collection], query=text, options=options)
        for text, truth in zip(texts, exact, strict=True):
            started = time.perf_counter()
            hits = searcher.search(collection_ids=[collection], query=text, options=options).hits
            timings.append((time.perf_counter() - started) * 1000)
            recalls.append(len({h.chunk_id for h in hits} & truth) / 10)
    summary = _summary(timings)
    storage = getattr(_model(runtime), "storage", "float32")
    return {
        "recall@10": round(mean(recalls), 4),
        "p50_ms": summary["p50"],
        "p95_ms": summary["p95"],
        "ef_search": options.ef_search_for(storage),
    }


def _embedding_bytes(runtime: Runtime) -> dict[str, int]:
    """The model's vectors as stored (live tuples, with the 24-byte header and 4-byte line
    pointer each; a conversion leaves dead tuples behind until vacuum, which `pg_table_size`
    would count) and its HNSW index, per chunk."""
    model = _model(runtime)
    with runtime.db.read() as session:
        conn = driver_connection(session)
        rows, table = conn.execute(
            "SELECT count(*), coalesce(sum(pg_column_size(e.*) + 28), 0) "
            "FROM chunk_embeddings e WHERE model_id = %s",
            (model.id,),
        ).fetchone()  # type: ignore[misc]
        index = conn.execute(
            "SELECT coalesce(sum(pg_relation_size(indexrelid)), 0) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = 'chunk_embeddings'::regclass AND c.relname LIKE %s",
            (f"%model_{model.id}",),
        ).fetchone()[0]  # type: ignore[index]
    per = max(int(rows), 1)
    return {"table": round(int(table) / per), "index": round(int(index) / per)}


def _all_vectors(runtime: Runtime) -> tuple[list[uuid.UUID], Vector]:
    model = _model(runtime)
    ids: list[uuid.UUID] = []
    rows: list[Vector] = []
    with runtime.db.read() as session:
        conn = driver_connection(session)
        with conn.cursor(name="vectors") as cursor:
            cursor.itersize = 20_000
            cursor.execute(
                "SELECT chunk_id, coalesce(embedding, embedding_half::vector) "
                "FROM chunk_embeddings WHERE model_id = %s",
                (model.id,),
            )
            for chunk_id, vector in cursor:
                ids.append(chunk_id)
                rows.append(vector.to_numpy())
    return ids, np.stack(rows).astype(np.float32)


def _exact_top10(matrix: Vector, queries: Vector, ids: list[uuid.UUID]) -> list[set[uuid.UUID]]:
    norms = np.linalg.norm(matrix, axis=1)
    norms[norms == 0] = 1
    unit = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    scores = np.zeros((len(queries), len(matrix)), dtype=np.float32)
    for start in range(0, len(matrix), 200_000):
        block = matrix[start : start + 200_000]
        scores[:, start : start + 200_000] = (unit @ block.T) / norms[start : start + 200_000]
    top = np.argpartition(-scores, 10, axis=1)[:, :10]
    return [{ids[i] for i in row} for row in top]


# -- lookups ---------------------------------------------------------------------------------


def _model(runtime: Runtime) -> Any:
    with runtime.db.read() as session:
        model = store.embedding_models.active_model(session)
        if model is None:
            raise SystemExit("no active embedding model")
        session.expunge(model)
        return model


def _collection_id(runtime: Runtime, name: str) -> uuid.UUID:
    with runtime.db.read() as session:
        found = store.collections.find_collection_id(session, runtime.default_tenant_id, name)
    if found is None:
        raise SystemExit(f"collection {name!r} not found")
    return found


def _chunk_count(runtime: Runtime, collection: uuid.UUID) -> int:
    with runtime.db.read() as session:
        row = (
            driver_connection(session)
            .execute("SELECT count(*) FROM chunks WHERE collection_id = %s", (collection,))
            .fetchone()
        )
    return int(row[0]) if row else 0


# -- report ----------------------------------------------------------------------------------


def _print(report: dict[str, Any]) -> None:
    print(json.dumps(report, indent=1), file=sys.stderr)
    http = report["http"]["latency_ms"]
    storage = report["storage"]
    distractors = report["load"].get("distractors", {})
    summary = {
        "chunks": report["sizes"]["chunks"],
        "load_chunks_per_s": report["load"]["load_chunks_per_s"],
        "load_seconds_excluding_index": report["load"].get("load_seconds_excluding_index"),
        "wal_bytes_per_chunk": report["load"].get("wal_bytes_per_chunk"),
        "hnsw_build_s": report["load"]["hnsw_build_s"],
        "db_bytes_per_chunk": report["sizes"]["db_bytes_per_chunk"],
        "hybrid_p95_http_ms": http["hybrid@1"]["p95"],
        "fulltext_p95_sql_ms": report["sql"]["fulltext_scifact_ms"]["p95"],
        "fulltext_frequent_p95_sql_ms": report["sql"]["fulltext_frequent_ms"]["p95"],
        "fulltext_exact": report["sql"]["fulltext_exact"],
        "fulltext_path": report["sql"]["fulltext_path"],
        "scifact_hybrid_ndcg@10": report["http"]["ndcg@10"]["hybrid"],
        "storage": {
            name: {
                "bytes_per_chunk": figures["bytes_per_chunk"],
                "recall@10": figures["recall@10"],
                "dense_p95_sql_ms": figures["dense_p95_sql_ms"],
            }
            for name, figures in storage.items()
        },
        "recall_vs_ef": {
            name: {
                ef: {"recall@10": f["recall@10"], "p95_ms": f["p95_ms"]}
                for ef, f in figures["recall_vs_ef"].items()
            }
            for name, figures in storage.items()
        },
        **{
            key: distractors.get(key)
            for key in ("distractor_neighbour_cosine", "scifact_neighbour_cosine")
        },
        "postgres_pss_mb": report["postgres_pss_mb"],
        "seconds": report["seconds"],
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
