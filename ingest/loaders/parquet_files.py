"""Parquet (a bulk import of chunks embedded elsewhere): one row per chunk, grouped into documents.

Columns (names set by `ParquetColumns`): the document id, the chunk's text and its embedding
(a list of floats) are required; the document title, the chunk's ordinal (its place in the
document; row order otherwise), the chunk's metadata and the document's metadata (JSON object
strings) are optional. A document's rows must be next to each other (a file written sorted or
grouped by id); its title and document metadata are read from its first row.

The file is read in the parse sandbox (`sandbox.stream_isolated`), record batch by record
batch: `parquet_batches` runs in the child and sends documents with their vectors as raw
float32 bytes; `batch_documents` turns them back into `LoadedDocument`s in the parent.
pyarrow is an optional dependency (`pip install 'ragservice[parquet]'`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from ingest.loaders.cleaning import clean_json, clean_text, clean_title
from ingest.loaders.parsing import LoadResult, ParseError, describe
from ingest.loaders.vectors import chunk_texts, finite, precomputed_document
from ragservice.limits.documents import ID_TOO_LONG, TOO_DEEP, DocumentLimits
from ragservice.limits.shape import external_id_too_long, too_deep
from ragservice.types import LoadFailure, PrecomputedChunks

ROWS_PER_BATCH = 8192  # rows read at a time; the child sends the documents they complete


@dataclass(frozen=True)
class ParquetColumns:
    """Which columns hold what; `ParquetColumns.parse("id=doc,embedding=vec")` sets some."""

    id: str = "id"
    text: str = "text"
    embedding: str = "embedding"
    title: str = "title"
    ordinal: str = "ordinal"
    metadata: str = "metadata"
    document_metadata: str = "document_metadata"

    @classmethod
    def parse(cls, spec: str) -> ParquetColumns:
        """Parse `key=column,...` (keys: the field names); ValueError naming the bad part."""
        known = [f.name for f in fields(cls)]
        values: dict[str, str] = {}
        for part in (p.strip() for p in spec.split(",") if p.strip()):
            key, sep, value = (piece.strip() for piece in part.partition("="))
            problem = (
                f"{part!r} is not key=value"
                if not sep or not value
                else f"unknown key {key!r} (expected {', '.join(known)})"
                if key not in known
                else f"key {key!r} is given twice"
                if key in values
                else ""
            )
            if problem:
                raise ValueError(f"invalid Parquet column spec {spec!r}: {problem}")
            values[key] = value
        if not values:
            raise ValueError(f"invalid Parquet column spec {spec!r}: it is empty")
        return cls(**values)

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def _pyarrow() -> Any:
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        raise ParseError(
            "reading Parquet needs pyarrow, which is not installed "
            "(pip install 'ragservice[parquet]')"
        ) from None
    except ImportError as exc:  # its libraries would not load: in the sandbox, short of memory
        raise ParseError(
            f"pyarrow could not be loaded ({describe(exc)}); it needs more address space "
            "than RAGSERVICE_PARSE_MEMORY_MIB allows"
        ) from None
    return pq


# -- in the sandbox's child -----------------------------------------------------------------


@dataclass
class _Open:
    """The rows of the document being read, which may go on in the next record batch."""

    id: str
    first_row: int
    title: str | None
    document_metadata: object
    texts: list[object] = field(default_factory=list)
    metadata: list[object] = field(default_factory=list)
    ordinals: list[object] = field(default_factory=list)
    vectors: list[npt.NDArray[np.float32]] = field(default_factory=list)
    problem: str = ""


Frame = tuple[dict[str, Any], bytes]


def parquet_batches(
    source: Any, columns: ParquetColumns, limits: DocumentLimits
) -> Iterator[Frame]:
    """(header, vector bytes) per record batch: the documents it completed, and failures."""
    pq = _pyarrow()
    try:
        reader = pq.ParquetFile(source)
        names = _columns(reader.schema_arrow.names, columns)
        # No reader threads: each reserves address space the sandbox's limit counts.
        batches = reader.iter_batches(batch_size=ROWS_PER_BATCH, columns=names, use_threads=False)
    except ParseError:
        raise
    except Exception as exc:
        raise ParseError(f"not a readable Parquet file: {describe(exc)}") from exc
    grouper = _Grouper(columns, set(names), limits)
    row = 1
    while (batch := _next_batch(batches)) is not None:
        yield grouper.feed(batch, row)
        row += batch.num_rows
    yield grouper.finish()


def _next_batch(batches: Iterator[Any]) -> Any:
    """The next record batch, None at the end; a damaged page is a ParseError."""
    try:
        return next(batches, None)
    except MemoryError:
        raise
    except Exception as exc:
        raise ParseError(f"not a readable Parquet file: {describe(exc)}") from exc


def _columns(present: list[str], columns: ParquetColumns) -> list[str]:
    required = (columns.id, columns.text, columns.embedding)
    missing = [name for name in required if name not in present]
    if missing:
        raise ParseError(
            f"missing column(s) {', '.join(map(repr, missing))}; the file has "
            f"{', '.join(map(repr, present[:20]))} (set the names with --parquet-columns)"
        )
    optional = (columns.title, columns.ordinal, columns.metadata, columns.document_metadata)
    return [*required, *(name for name in optional if name in present)]


class _Grouper:
    def __init__(self, columns: ParquetColumns, present: set[str], limits: DocumentLimits):
        self._columns = columns
        self._present = present
        self._limits = limits
        self._open: _Open | None = None
        self._done: set[str] = set()
        self._out: list[_Open] = []
        self._failures: list[dict[str, str]] = []

    def feed(self, batch: Any, first_row: int) -> Frame:
        data = {name: batch.column(name) for name in batch.schema.names}
        c = self._columns
        ids = data[c.id].to_pylist()
        texts = data[c.text].to_pylist()
        vectors = _vectors(data[c.embedding])
        optional = {
            name: data[name].to_pylist() if name in data else [None] * len(ids)
            for name in (c.title, c.ordinal, c.metadata, c.document_metadata)
        }
        for i, raw_id in enumerate(ids):
            current = self._document(raw_id, first_row + i, optional, i)
            current.texts.append(texts[i])
            current.metadata.append(optional[c.metadata][i])
            current.ordinals.append(optional[c.ordinal][i])
            current.vectors.append(vectors[i])
        return self._frame()

    def finish(self) -> Frame:
        if self._open is not None:
            self._close(self._open)
            self._open = None
        return self._frame()

    def _document(self, raw_id: object, row: int, optional: dict[str, list[Any]], i: int) -> _Open:
        external_id = _external_id(raw_id)
        current = self._open
        if current is not None and current.id == external_id:
            return current
        if current is not None:
            self._close(current)
        c = self._columns
        opened = _Open(
            external_id, row, clean_title(optional[c.title][i]), optional[c.document_metadata][i]
        )
        if not external_id:
            opened.problem = f"no document id in column {c.id!r}"
        elif external_id_too_long(external_id):
            opened.problem = ID_TOO_LONG
        elif external_id in self._done:
            opened.problem = (
                f"the rows of document {external_id!r} are not next to each other (row {row} "
                "comes after other documents' rows); write the file sorted by document id"
            )
        self._open = opened
        return opened

    def _close(self, doc: _Open) -> None:
        self._done.add(doc.id)
        if not doc.problem:
            try:
                _check(doc, self._columns, self._limits)
            except ParseError as exc:
                doc.problem = str(exc)
        if doc.problem:
            last = doc.first_row + len(doc.texts) - 1
            self._failures.append({"rows": f"{doc.first_row}-{last}", "reason": doc.problem})
        else:
            self._out.append(doc)

    def _frame(self) -> Frame:
        docs, self._out = self._out, []
        failures, self._failures = self._failures, []
        header = {"documents": [_header(doc) for doc in docs], "failures": failures}
        payload = b"".join(np.concatenate(doc.vectors).tobytes() for doc in docs)
        return header, payload


def _vectors(column: Any) -> list[npt.NDArray[np.float32]]:
    """Each row's embedding as a float32 vector (empty for a null)."""
    try:
        lengths = column.value_lengths().fill_null(0).to_numpy()
        values = np.asarray(column.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
    except Exception as exc:
        raise ParseError(f"the embedding column is not a list of floats: {describe(exc)}") from exc
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    return [values[offsets[i] : offsets[i + 1]] for i in range(len(lengths))]


def _external_id(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return ""
    return clean_text(str(value)).strip()


def _check(doc: _Open, columns: ParquetColumns, limits: DocumentLimits) -> None:
    """Order the rows by ordinal, and check texts, vectors and metadata (ParseError)."""
    if any(o is not None for o in doc.ordinals):
        if any(not isinstance(o, int) for o in doc.ordinals):
            raise ParseError(f"column {columns.ordinal!r} must be an integer on every row")
        order = sorted(range(len(doc.ordinals)), key=lambda k: doc.ordinals[k])  # type: ignore[arg-type,return-value]
        doc.texts = [doc.texts[k] for k in order]
        doc.metadata = [doc.metadata[k] for k in order]
        doc.vectors = [doc.vectors[k] for k in order]
    doc.texts = list(chunk_texts(doc.texts))
    sizes = {len(v) for v in doc.vectors}
    if len(sizes) != 1 or 0 in sizes:
        raise ParseError(f"the embeddings differ in length or are missing ({sorted(sizes)})")
    finite(np.stack(doc.vectors))
    doc.metadata = [_json_object(m, columns.metadata) for m in doc.metadata]
    doc.document_metadata = _json_object(doc.document_metadata, columns.document_metadata)
    if sum(len(str(t)) for t in doc.texts) > limits.max_chars:
        raise ParseError(f"the text is longer than {limits.max_chars} characters")


def _json_object(value: object, column: str) -> dict[str, Any]:
    if value is None or value == "":
        return {}
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        raise ParseError(f"column {column!r} must hold a JSON object")
    if too_deep(parsed):
        raise ParseError(TOO_DEEP)
    cleaned: dict[str, Any] = clean_json(parsed)
    return cleaned


def _header(doc: _Open) -> dict[str, Any]:
    return {
        "id": doc.id,
        "title": doc.title,
        "metadata": doc.document_metadata,
        "texts": doc.texts,
        "chunk_metadata": doc.metadata,
        "dimension": len(doc.vectors[0]),
        "rows": f"{doc.first_row}-{doc.first_row + len(doc.texts) - 1}",
    }


# -- in the parent --------------------------------------------------------------------------


def batch_documents(
    frame: Frame,
    *,
    source: str,
    file_id: str,
    extra: dict[str, Any],
    limits: DocumentLimits,
) -> Iterator[LoadResult]:
    """The documents (and failures) of one frame the child sent."""
    header, payload = frame
    vectors = np.frombuffer(payload, dtype=np.float32)
    for failure in header["failures"]:
        yield LoadFailure(f"{source} rows {failure['rows']}", failure["reason"])
    offset = 0
    provenance = {"source_path": file_id, "file_type": "parquet"}
    for doc in header["documents"]:
        count, dimension = len(doc["texts"]), doc["dimension"]
        matrix = vectors[offset : offset + count * dimension].reshape(count, dimension)
        offset += count * dimension
        chunks = PrecomputedChunks(
            texts=tuple(doc["texts"]),
            metadata=tuple(doc["chunk_metadata"]),
            vectors=matrix,
            where=f"{source} rows {doc['rows']}",
        )
        try:
            yield precomputed_document(
                external_id=doc["id"],
                title=doc["title"],
                metadata={**provenance, **extra, **doc["metadata"]},
                chunks=chunks,
                source=source,
                limits=limits,
            )
        except ParseError as exc:
            yield LoadFailure(chunks.where, str(exc))
