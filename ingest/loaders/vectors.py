"""Chunks that arrive with their vectors (bulk import): the checks JSONL and Parquet share.

A document's vectors must all have one length and finite values; whether that length is the
model's is the pipeline's to check, since only it knows the model version.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ingest.loaders.cleaning import clean_json, clean_text
from ingest.loaders.parsing import ParseError
from ragservice.limits.documents import TOO_DEEP, DocumentLimits, too_long
from ragservice.limits.shape import too_deep
from ragservice.types import CHUNK_SEPARATOR, LoadedDocument, PrecomputedChunks


def vector_matrix(embeddings: Sequence[object]) -> npt.NDArray[np.float32]:
    """The chunks' embeddings (lists of numbers) as one float32 matrix; ParseError when they
    are not numbers, differ in length or hold a value that is not finite."""
    try:
        raw = np.asarray(embeddings)
    except ValueError:  # lists of different lengths
        raise ParseError(f"chunk embeddings differ in length ({_lengths(embeddings)})") from None
    if raw.ndim != 2 or raw.shape[1] == 0 or raw.dtype.kind not in "fiu":
        raise ParseError("every chunk needs an `embedding`: a non-empty array of numbers")
    return finite(raw)


def finite(raw: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    """`raw` as float32; ParseError naming the first chunk with a NaN or infinite value (or
    one beyond float32's range)."""
    with np.errstate(over="ignore"):
        matrix = raw.astype(np.float32, copy=False)
    bad = ~np.isfinite(matrix).all(axis=1)
    if bad.any():
        first = int(np.argmax(bad))
        raise ParseError(f"chunk {first + 1}'s embedding holds a value that is not finite")
    return matrix


def _lengths(embeddings: Sequence[object]) -> str:
    sizes = [len(e) if isinstance(e, list) else 0 for e in embeddings]
    return ", ".join(f"chunk {i}: {n}" for i, n in enumerate(sizes[:5], start=1))


def chunk_texts(texts: Sequence[object]) -> tuple[str, ...]:
    """Each chunk's text, cleaned; ParseError naming a chunk without any."""
    cleaned: list[str] = []
    for index, value in enumerate(texts, start=1):
        text = clean_text(value).strip() if isinstance(value, str) else ""
        if not text:
            raise ParseError(f"chunk {index} has no `text` (a non-empty string)")
        cleaned.append(text)
    return tuple(cleaned)


def chunk_metadata(values: Sequence[object]) -> tuple[dict[str, Any], ...]:
    """Each chunk's metadata (a JSON object, or nothing), cleaned like document metadata."""
    out: list[dict[str, Any]] = []
    for index, value in enumerate(values, start=1):
        if value is None:
            out.append({})
            continue
        if not isinstance(value, dict):
            raise ParseError(f"chunk {index}'s `metadata` is not a JSON object")
        if too_deep(value):
            raise ParseError(TOO_DEEP)
        out.append(clean_json(value))
    return tuple(out)


def precomputed_document(
    *,
    external_id: str,
    title: str | None,
    metadata: dict[str, Any],
    chunks: PrecomputedChunks,
    source: str,
    limits: DocumentLimits,
) -> LoadedDocument:
    """The document whose text is its chunks joined by `CHUNK_SEPARATOR`."""
    text = CHUNK_SEPARATOR.join(chunks.texts)
    problem = too_long(text, limits)
    if problem:
        raise ParseError(problem)
    return LoadedDocument(
        external_id=external_id,
        text=text,
        title=title,
        metadata=metadata,
        source=source,
        precomputed=chunks,
    )
