"""The store's write path alone: a corpus loaded with the null embedder (no model work), so what
is timed is preparation (parsing, chunking) and the database writes — COPY, the BM25 postings
trigger, the pack at the end and the WAL they write.

    python benchmarks/write_path.py --corpus ../shared/data/scifact [--repeat 10]
        [--index deferred|kept] [--batch-chunks 2048] [--no-postings | --postings-in-sql]

`--repeat R` loads the corpus R times under new document ids (one collection of R times its
chunks: the vocabulary of a real corpus at a larger size). `--index deferred` drops the model's
HNSW index before the load and builds it after (`hnsw_build_s`), as `ingest --index deferred`
does; `kept` keeps it up to date row by row. `--no-postings` disables the postings insert trigger
(as the database owner) to show what the rest of the write costs; `--postings-in-sql` takes the
`ragservice_bm25` extension back to 1.0, so that bulk batches build their postings blocks with the
trigger's SQL instead of the extension's C function (migration 0025), as on a server without the
extension. The store is thrown away either way.

The final JSON line: `chunks`, `load_chunks_per_s` (the whole load, HNSW build excluded),
`store_chunks_per_s` (chunks over the seconds spent inside write transactions),
`wal_bytes_per_chunk` (from `pg_current_wal_insert_lsn`, the pack included), `write_seconds`,
`prepare_wait_seconds` (the writer idle, waiting for chunking), `pack_seconds`, `hnsw_build_s`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

# This folder holds `ingest.py`: keep it off the import path before `ingest` is imported.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from sqlalchemy import text  # noqa: E402

from ingest.loaders import LoadResult, load_documents  # noqa: E402
from ingest.pipeline import IngestPipeline  # noqa: E402
from ragservice import store  # noqa: E402
from ragservice.config import Settings  # noqa: E402
from ragservice.db import tenancy  # noqa: E402
from ragservice.embedding import indexing  # noqa: E402
from ragservice.embedding.null import null_embedder  # noqa: E402
from ragservice.runtime import Runtime, open_runtime  # noqa: E402
from ragservice.types import LoadedDocument  # noqa: E402


def main() -> None:
    args = _parse_args()
    corpus = args.corpus / "corpus.jsonl" if args.corpus.is_dir() else args.corpus
    with tempfile.TemporaryDirectory(prefix="rs-write-") as tmp:
        settings = Settings(data_dir=Path(tmp), ingest_batch_chunks=args.batch_chunks)
        runtime = open_runtime(settings, warm=False)
        try:
            figures = _load(runtime, settings, corpus, args)
        finally:
            runtime.close()
    print(json.dumps(figures))


def _load(
    runtime: Runtime, settings: Settings, corpus: Path, args: argparse.Namespace
) -> dict[str, object]:
    if args.no_postings:
        with runtime.db.owner_engine() as engine, engine.begin() as conn:
            conn.execute(text("ALTER TABLE chunks DISABLE TRIGGER chunks_postings_insert"))
    if args.postings_in_sql:
        with runtime.db.owner_engine() as engine, engine.begin() as conn:
            conn.execute(text("ALTER EXTENSION ragservice_bm25 UPDATE TO '1.0'"))
    with tenancy.as_system(), runtime.db.write() as session:
        tenant_id = store.tenants.ensure_tenant(session, f"write-{uuid.uuid4().hex[:6]}")
        model = store.embedding_models.get_model(session, runtime.model_id)
    assert model is not None
    if args.index == "deferred":
        indexing.drop_embedding_index(runtime.db, model)
    pipeline = IngestPipeline(
        runtime.db,
        null_embedder(settings.embedding),
        model_id=runtime.model_id,
        tenant_id=tenant_id,
        chunking=runtime.chunking_options(),
        batch_chunks=settings.ingest.batch_chunks,
    )
    before = _wal_position(runtime)
    started = time.perf_counter()
    report = pipeline.run(_repeated(corpus, args.repeat), collection="bench")
    seconds = time.perf_counter() - started
    wal = _wal_bytes_since(runtime, before)
    hnsw = 0.0
    if args.index == "deferred":
        hnsw = indexing.build_embedding_index(runtime.db, model, index=settings.indexing).seconds
    chunks = report.chunks_written
    _log(f"{chunks} chunks in {seconds:.1f} s, {wal / max(chunks, 1):.0f} WAL bytes a chunk")
    return {
        "docs": len(report.new),
        "chunks": chunks,
        "batch_chunks": settings.ingest.batch_chunks,
        "index": args.index,
        "postings": _postings(runtime, args),
        "load_chunks_per_s": round(chunks / seconds, 1),
        "store_chunks_per_s": round(chunks / max(report.write_seconds, 1e-9), 1),
        "wal_bytes_per_chunk": round(wal / max(chunks, 1)),
        "seconds": round(seconds, 2),
        "write_seconds": round(report.write_seconds, 2),
        "prepare_wait_seconds": round(report.prepare_wait_seconds, 2),
        "pack_seconds": round(report.pack_seconds, 2),
        "hnsw_build_s": round(hnsw, 2),
    }


def _postings(runtime: Runtime, args: argparse.Namespace) -> str:
    """Who built the bulk batches' postings blocks: nobody (`off`), the extension's C function
    (`c`), or the trigger's SQL (`sql`)."""
    if args.no_postings:
        return "off"
    with runtime.db.read() as session:
        found = session.execute(
            text("SELECT to_regprocedure('ragservice_bm25_blocks(bigint[],tsvector[])')")
        ).scalar()
    return "c" if found is not None else "sql"


def _repeated(corpus: Path, repeat: int) -> Iterator[LoadResult]:
    """The corpus `repeat` times, each copy under ids of its own (`ID~r`)."""
    for r in range(repeat):
        for doc in load_documents([corpus]):
            if isinstance(doc, LoadedDocument):
                yield doc if r == 0 else _renamed(doc, f"{doc.external_id}~{r}")
            else:
                yield doc


def _renamed(doc: LoadedDocument, external_id: str) -> LoadedDocument:
    return replace(doc, external_id=external_id)


def _wal_position(runtime: Runtime) -> str:
    with runtime.db.read() as session:
        return str(session.execute(text("SELECT pg_current_wal_insert_lsn()::text")).scalar())


def _wal_bytes_since(runtime: Runtime, before: str) -> int:
    with runtime.db.read() as session:
        found = session.execute(
            text("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), CAST(:b AS pg_lsn))"),
            {"b": before},
        ).scalar()
    return int(found or 0)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="BEIR folder or a JSONL file")
    parser.add_argument("--repeat", type=int, default=1, help="load the corpus this many times")
    parser.add_argument("--index", choices=("deferred", "kept"), default="deferred")
    parser.add_argument("--batch-chunks", type=int, default=Settings().ingest.batch_chunks)
    postings = parser.add_mutually_exclusive_group()
    postings.add_argument(
        "--no-postings", action="store_true", help="disable the postings trigger (diagnosis)"
    )
    postings.add_argument(
        "--postings-in-sql",
        action="store_true",
        help="build bulk postings blocks in SQL, not in the extension's C (diagnosis)",
    )
    args = parser.parse_args()
    if args.repeat < 1 or args.batch_chunks < 1:
        parser.error("--repeat and --batch-chunks must be at least 1")
    return args


if __name__ == "__main__":
    main()
