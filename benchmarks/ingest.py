"""Ingest throughput: the pipeline against the model's raw `encode`, or three embedders compared.

    python benchmarks/ingest.py --corpus ../shared/data/scifact [--limit N] [--database-url URL]
    python benchmarks/ingest.py --corpus ../shared/data/scifact --compare [--limit N]

`--compare` ingests the corpus three times in one run, each into a tenant of its own (so no
vector is reused from another run), with the null embedder (fixed vectors, no model: what the
pipeline itself sustains, database writes and HNSW upkeep included), the int8 ONNX embedder and
the float torch model; then it scores dense retrieval (exact search, documents ranked by their
best chunk) on the BEIR test queries for int8 and float, and times single int8 queries. See
`ingest_compare.py` beside this file.

Ingests `corpus.jsonl` (BEIR layout) into a fresh database with the real pipeline, and times
plain `SentenceTransformer.encode` of the same model on exactly the chunk texts the pipeline
embeds, once before and once after the pipeline (the median of the two is the reference for
`ratio`). `ratio_vs_adapter` compares the pipeline with the service's own embedder called on all
texts at once (it batches by token length, which plain `encode` does not), i.e. what ingestion
costs beside the model work it has to do. Prints a table and a
final JSON line with docs_per_s, chunks_per_s, encode_chunks_per_s and ratio (pipeline / encode).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

# This file is named like the `ingest` package it measures: keep its folder off the import path
# (until `ingest` is imported; `--compare` then imports its module from here).
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from ingest.loaders import load_documents  # noqa: E402
from ingest.pipeline import IngestPipeline, text_hash  # noqa: E402
from ragservice.chunking import chunk_text  # noqa: E402
from ragservice.config import Settings  # noqa: E402
from ragservice.runtime import Runtime, open_runtime  # noqa: E402
from ragservice.types import LoadedDocument  # noqa: E402


def main() -> None:
    args = _parse_args()
    corpus = args.corpus / "corpus.jsonl" if args.corpus.is_dir() else args.corpus
    if args.compare:
        sys.path.append(str(_HERE))
        from ingest_compare import compare

        _print(compare(args, corpus))
        return
    with tempfile.TemporaryDirectory(prefix="rs-bench-") as tmp:
        settings = Settings(
            database_url=args.database_url,
            data_dir=Path(tmp),
            device=args.device,
            embed_batch_size=args.batch_size,
        )
        runtime = open_runtime(settings)
        try:
            runtime.embedder.embed(["warm-up so that lazy initialisation is not timed"] * 8)
            figures = _measure(runtime, corpus, args.limit)
        finally:
            runtime.close()
    _print(figures)


def _measure(runtime: Runtime, corpus: Path, limit: int | None) -> dict[str, object]:
    texts = _chunk_texts(runtime, corpus, limit)
    # The raw encode runs before and after the pipeline; its median is the reference, so a
    # machine that speeds up or slows down during the run does not favour either side.
    encode_first = _time_encode(runtime, texts)
    pipeline = IngestPipeline(
        runtime.db,
        runtime.embedder,
        model_id=runtime.model_id,
        tenant_id=runtime.default_tenant_id,
        chunking=runtime.chunking_options(),
        batch_chunks=runtime.settings.ingest.batch_chunks,
    )
    started = time.perf_counter()
    report = pipeline.run(islice(load_documents([corpus]), limit), collection="bench")
    seconds = time.perf_counter() - started
    if report.failed:
        raise SystemExit(f"{len(report.failed)} documents failed: {report.failed[:3]}")
    if report.chunks_embedded != len(texts):
        raise SystemExit(f"pipeline embedded {report.chunks_embedded} texts, expected {len(texts)}")
    encode_second = _time_encode(runtime, texts)
    encode_seconds = statistics.median([encode_first, encode_second])
    adapter_started = time.perf_counter()
    runtime.embedder.embed(texts)  # the service's own batching, all texts in one window
    adapter_seconds = time.perf_counter() - adapter_started

    docs = len(report.new)
    chunks_per_s = report.chunks_embedded / seconds
    encode_chunks_per_s = len(texts) / encode_seconds
    return {
        "docs": docs,
        "chunks": report.chunks_written,
        "chunks_embedded": report.chunks_embedded,
        "seconds": round(seconds, 2),
        "docs_per_s": round(docs / seconds, 2),
        "chunks_per_s": round(chunks_per_s, 2),
        "encode_seconds_runs": [round(encode_first, 2), round(encode_second, 2)],
        "encode_docs_per_s": round(docs / encode_seconds, 2),
        "encode_chunks_per_s": round(encode_chunks_per_s, 2),
        "ratio": round(chunks_per_s / encode_chunks_per_s, 3),
        "adapter_embed_seconds": round(adapter_seconds, 2),
        "ratio_vs_adapter": round(adapter_seconds / seconds, 3),
        "device": runtime.embedder.device,
        "batch_size": runtime.settings.embedding.batch_size,
        "batch_chunks": runtime.settings.ingest.batch_chunks,
        "chunk_max_tokens": runtime.chunking_options().max_tokens,
        "chunk_overlap_tokens": runtime.chunking_options().overlap_tokens,
    }


def _chunk_texts(runtime: Runtime, corpus: Path, limit: int | None) -> list[str]:
    """The distinct chunk texts the pipeline will embed, cut by the same chunker."""
    tokenizer, options = runtime.embedder.tokenizer, runtime.chunking_options()
    texts: dict[str, str] = {}
    for item in islice(load_documents([corpus]), limit):
        if isinstance(item, LoadedDocument):
            for chunk in chunk_text(
                item.text, tokenizer=tokenizer, options=options, format=item.format
            ):
                texts.setdefault(text_hash(chunk.text), chunk.text)
    return list(texts.values())


def _time_encode(runtime: Runtime, texts: list[str]) -> float:
    """Plain `SentenceTransformer.encode` on all texts at once: the reference throughput."""
    model = runtime.embedder.model
    started = time.perf_counter()
    model.encode(texts, batch_size=runtime.settings.embedding.batch_size, normalize_embeddings=True)
    return time.perf_counter() - started


def _print(figures: dict[str, object]) -> None:
    width = max(map(len, figures))
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")
    print(json.dumps(figures))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, required=True, help="BEIR folder or corpus.jsonl")
    parser.add_argument("--limit", type=int, default=None, help="only the first N documents")
    parser.add_argument("--database-url", default=None, help="default: a fresh embedded server")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--compare", action="store_true", help="null, int8 and torch embedders side by side"
    )
    parser.add_argument("--split", default="test", help="BEIR queries split for --compare")
    return parser.parse_args()


if __name__ == "__main__":
    main()
