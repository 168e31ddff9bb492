"""Bulk import of precomputed embeddings: chunks/s end to end, and where the time goes.

    python benchmarks/bulk_import.py [--chunks 50000] [--format parquet|jsonl]
                                     [--chunks-per-doc 5] [--batch-chunks N] [--database-url URL]
                                     [--without-hnsw]

Writes N synthetic chunks (short texts from a small Zipf vocabulary, 384-d random unit vectors)
as Parquet or JSONL, then imports them into a fresh database by the path `ragservice ingest`
takes (`open_runtime(warm=False)`, `ingest.targets.ingest_pipeline`, `load_documents`, the
pipeline with its writer thread) and reports chunks/s with a split of the time: reading the
file alone (a separate pass), the binary COPY into the staging tables, the INSERTs that fire
the BM25 postings trigger and keep the chunks' indexes (chunks), the INSERT that keeps the HNSW
index (chunk_embeddings), the rest of the write transactions (document upserts, commits), and
the injection detector on the main thread (which overlaps the writes).
Final line: JSON.

`write_parquet(path, rows)` and `write_jsonl(path, rows)` are the reusable writers: `rows` are
`ChunkRow`s, one per chunk, grouped by document id (see docs/ingest.md for the layouts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# This folder has a file named like the `ingest` package: keep it off the import path.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402
from sqlalchemy import text  # noqa: E402

from ingest import pipeline as pipeline_module  # noqa: E402
from ingest.loaders import load_documents  # noqa: E402
from ingest.targets import ingest_pipeline  # noqa: E402
from ragservice.config import Settings  # noqa: E402
from ragservice.db import tenancy  # noqa: E402
from ragservice.runtime import open_runtime  # noqa: E402
from ragservice.store import bulk  # noqa: E402


@dataclass(frozen=True, slots=True)
class ChunkRow:
    """One chunk of the synthetic corpus (a Parquet row; a JSONL line holds a document's)."""

    doc_id: str
    ordinal: int
    text: str
    embedding: npt.NDArray[np.float32]
    title: str | None = None


def synthetic_rows(
    chunks: int, *, chunks_per_doc: int = 5, dim: int = 384, seed: int = 0
) -> Iterator[ChunkRow]:
    """`chunks` rows: texts of 20-60 words from a 5,000-word Zipf vocabulary, unit vectors."""
    rng = np.random.default_rng(seed)
    vocabulary = [f"w{i}" for i in range(5000)]
    for start in range(0, chunks, 10_000):
        n = min(10_000, chunks - start)
        vectors = rng.standard_normal((n, dim)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        words = np.minimum(rng.zipf(1.3, size=(n, 60)), 5000) - 1
        lengths = rng.integers(20, 61, size=n)
        for i in range(n):
            row = start + i
            text = " ".join(vocabulary[w] for w in words[i, : lengths[i]])
            doc, ordinal = divmod(row, chunks_per_doc)
            title = f"Document {doc}" if ordinal == 0 else None
            yield ChunkRow(f"doc-{doc:08d}", ordinal, text, vectors[i], title)


def write_parquet(path: Path, rows: Iterable[ChunkRow], *, rows_per_group: int = 50_000) -> None:
    """Rows as Parquet (columns id, title, text, ordinal, embedding), written a group at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer: Any = None
    for group in _groups(rows, rows_per_group):
        dim = len(group[0].embedding)
        flat = pa.array(np.concatenate([r.embedding for r in group]), pa.float32())
        table = pa.table(
            {
                "id": [r.doc_id for r in group],
                "title": [r.title for r in group],
                "text": [r.text for r in group],
                "ordinal": pa.array([r.ordinal for r in group], pa.int32()),
                "embedding": pa.FixedSizeListArray.from_arrays(flat, dim),
            }
        )
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    if writer is not None:
        writer.close()


def write_jsonl(path: Path, rows: Iterable[ChunkRow]) -> None:
    """Rows as JSONL, one line per document with its `chunks` (rows grouped by document id)."""
    with path.open("w") as out:
        doc: dict[str, Any] | None = None
        for row in rows:
            if doc is None or doc["_id"] != row.doc_id:
                if doc is not None:
                    out.write(json.dumps(doc) + "\n")
                doc = {"_id": row.doc_id, "title": row.title, "chunks": []}
            doc["chunks"].append({"text": row.text, "embedding": row.embedding.tolist()})
        if doc is not None:
            out.write(json.dumps(doc) + "\n")


def _groups(rows: Iterable[ChunkRow], size: int) -> Iterator[list[ChunkRow]]:
    group: list[ChunkRow] = []
    for row in rows:
        group.append(row)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


class _Timer:
    """Wraps the COPY and INSERT helpers of `store.bulk` to add up their time per table, and
    the pipeline's injection detector."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._copy, self._insert = bulk.copy_rows, bulk.insert_rows
        self._flag = pipeline_module.flag_injection

    def __enter__(self) -> _Timer:
        bulk.copy_rows = self._wrap(self._copy, "copy")  # type: ignore[assignment]
        bulk.insert_rows = self._wrap(self._insert, "insert")  # type: ignore[assignment]
        pipeline_module.flag_injection = self._flagging  # type: ignore[assignment]
        return self

    def __exit__(self, *_exc: object) -> None:
        bulk.copy_rows, bulk.insert_rows = self._copy, self._insert  # type: ignore[assignment]
        pipeline_module.flag_injection = self._flag  # type: ignore[assignment]

    def _flagging(self, chunk: Any) -> Any:
        started = time.perf_counter()
        flagged = self._flag(chunk)
        self.seconds["injection_scan"] = (
            self.seconds.get("injection_scan", 0.0) + time.perf_counter() - started
        )
        return flagged

    def _wrap(self, inner: Callable[..., None], kind: str) -> Callable[..., None]:
        def timed(conn: Any, table: str, *args: Any) -> None:
            started = time.perf_counter()
            inner(conn, table, *args)
            key = f"{kind}:{table.removeprefix('copy_')}"
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - started

        return timed


def main() -> None:
    args = _parse_args()
    with tempfile.TemporaryDirectory(prefix="rs-bulk-") as tmp:
        path = Path(tmp) / f"chunks.{args.format}"
        started = time.perf_counter()
        rows = synthetic_rows(args.chunks, chunks_per_doc=args.chunks_per_doc)
        (write_parquet if args.format == "parquet" else write_jsonl)(path, rows)
        print(
            f"wrote {path.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - started:.1f} s"
        )
        figures = _import(path, Path(tmp), args)
    print(json.dumps(figures))


def _import(path: Path, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings(
        database_url=args.database_url,
        data_dir=tmp / "data",
        ingest_batch_chunks=args.batch_chunks,
    )
    open_runtime(settings).close()  # registers the model in the fresh database (loads it)
    runtime = open_runtime(settings, warm=False)  # as the CLI opens it: the model not loaded
    try:
        started = time.perf_counter()
        parsed = sum(1 for _ in load_documents([path]))
        parse_s = time.perf_counter() - started
        pipeline = ingest_pipeline(runtime, tenant_id=runtime.default_tenant_id)
        if args.without_hnsw:
            _hnsw(runtime, "SELECT ragservice_drop_embedding_index(:id)")
        with tenancy.as_tenant(runtime.default_tenant_id), _Timer() as timer:
            started = time.perf_counter()
            report = pipeline.run(load_documents([path]), collection="bulk")
            total_s = time.perf_counter() - started
        started = time.perf_counter()
        if args.without_hnsw:  # built after the load, as the server would (default settings)
            _hnsw(runtime, "SELECT ragservice_ensure_embedding_index(:id, 384, 16, 64)")
        build_s = time.perf_counter() - started
    finally:
        runtime.close()
    if report.failed or report.chunks_written != args.chunks:
        raise SystemExit(f"import incomplete: {report.counts()} {report.failed[:3]}")
    split = {key: round(value, 2) for key, value in sorted(timer.seconds.items())}
    copy_s = sum(v for k, v in timer.seconds.items() if k.startswith("copy:"))
    insert_s = {k: v for k, v in timer.seconds.items() if k.startswith("insert:")}
    return {
        "chunks": report.chunks_written,
        "documents": parsed,
        "format": args.format,
        "batch_chunks": args.batch_chunks,
        "seconds": round(total_s, 2),
        "chunks_per_s": round(report.chunks_written / total_s, 1),
        "read_only_chunks_per_s": round(args.chunks / parse_s, 1),
        "write_transactions_s": round(report.write_seconds, 2),
        "copy_s": round(copy_s, 2),
        "insert_chunks_s (BM25 trigger, chunk indexes)": round(
            insert_s.get("insert:chunks", 0.0) - timer.seconds.get("copy:chunks", 0.0), 2
        ),
        "insert_embeddings_s (HNSW upkeep)": round(
            insert_s.get("insert:chunk_embeddings", 0.0)
            - timer.seconds.get("copy:chunk_embeddings", 0.0),
            2,
        ),
        "injection_scan_s (main thread)": round(timer.seconds.get("injection_scan", 0.0), 2),
        "hnsw_built_after_s": round(build_s, 2) if args.without_hnsw else None,
        "split_s": split,
        "model_loaded": runtime.models.current().embedder._model is not None,
    }


def _hnsw(runtime: Any, statement: str) -> None:
    with tenancy.as_system(), runtime.db.write() as session:
        session.execute(text(statement), {"id": runtime.models.current().id})


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=50_000)
    parser.add_argument("--chunks-per-doc", type=int, default=5)
    parser.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")
    parser.add_argument("--batch-chunks", type=int, default=2048)
    parser.add_argument("--database-url", default=None)
    parser.add_argument(
        "--without-hnsw",
        action="store_true",
        help="drop the model's HNSW index before the import and build it after (timed apart)",
    )
    return parser.parse_args()


if __name__ == "__main__":
    main()
