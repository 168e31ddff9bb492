"""JSONL: one document per line, its id, title, text and metadata read from the keys that
`JsonlFields` names (BEIR `corpus.jsonl` by default); a bad line fails alone.

A line with a `chunks` array brings its own chunks and vectors (a bulk import): each chunk is
`{"text": ..., "embedding": [floats], "metadata": {...}}`, and the line needs no text field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ingest.loaders.cleaning import clean_json, clean_text, clean_title, guess_encoding
from ingest.loaders.parsing import LoadResult, ParseError, describe
from ingest.loaders.vectors import (
    chunk_metadata,
    chunk_texts,
    precomputed_document,
    vector_matrix,
)
from ragservice.errors import InvalidInputError
from ragservice.limits.documents import ID_TOO_LONG, NO_TEXT, TOO_DEEP, DocumentLimits, too_long
from ragservice.limits.shape import external_id_too_long, too_deep
from ragservice.readers import parse_readers
from ragservice.types import LoadedDocument, LoadFailure, PrecomputedChunks


@dataclass(frozen=True)
class JsonlFields:
    """Which JSONL keys hold a row's id, title and text; defaults read BEIR `corpus.jsonl`.

    A row's `metadata` key, when it is a JSON object, is merged into the document metadata;
    the keys named in `metadata` are copied in as well.
    """

    id: str = "_id"
    title: str = "title"
    text: str = "text"
    metadata: tuple[str, ...] = ()
    chunks: str = "chunks"
    readers: str = "readers"
    """The key of who may read the row's document: a list of `user:…`/`group:…` or a
    comma-separated string (docs/permissions.md); a row without it keeps the upload's."""

    @classmethod
    def parse(cls, spec: str) -> JsonlFields:
        """Parse a CLI spec like `"id=doc_id,title=name,text=body,metadata=lang|year"`.

        Keys left out keep their defaults. Raises ValueError naming the bad part.
        """
        values = _parse_spec(spec)
        default = cls()
        metadata = tuple(n.strip() for n in values.get("metadata", "").split("|") if n.strip())
        return cls(
            id=values.get("id", default.id),
            title=values.get("title", default.title),
            text=values.get("text", default.text),
            metadata=metadata,
            chunks=values.get("chunks", default.chunks),
            readers=values.get("readers", default.readers),
        )


_SPEC_KEYS = ("id", "title", "text", "metadata", "chunks", "readers")


def _parse_spec(spec: str) -> dict[str, str]:
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    if not parts:
        raise ValueError(f"invalid JSONL field spec {spec!r}: it is empty")
    values: dict[str, str] = {}
    for part in parts:
        key, sep, value = (piece.strip() for piece in part.partition("="))
        problem = _spec_part_problem(part, key, sep, value, values)
        if problem:
            raise ValueError(f"invalid JSONL field spec {spec!r}: {problem}")
        values[key] = value
    return values


def _spec_part_problem(part: str, key: str, sep: str, value: str, seen: Mapping[str, str]) -> str:
    if not sep:
        return f"{part!r} is not key=value"
    if key not in _SPEC_KEYS:
        return f"unknown key {key!r} (expected id, title, text, metadata, chunks or readers)"
    if key in seen:
        return f"key {key!r} is given twice"
    if not value.strip("|").strip():
        return f"key {key!r} names no field"
    return ""


def load_jsonl(
    path: Path, file_id: str, fields: JsonlFields, limits: DocumentLimits
) -> Iterator[LoadResult]:
    """One result per non-blank line; reads line by line so huge corpora stream."""
    try:
        with path.open("rb") as lines:
            yield from jsonl_results(lines, str(path), file_id, fields, {}, limits)
    except OSError as exc:
        yield LoadFailure(str(path), f"could not read file: {exc.strerror or exc}")


def jsonl_results(
    lines: Iterable[bytes],
    source: str,
    file_id: str,
    fields: JsonlFields,
    extra: dict[str, Any],
    limits: DocumentLimits,
) -> Iterator[LoadResult]:
    decode = _LineDecoder()
    for lineno, raw in enumerate(lines, start=1):
        if raw.strip():
            yield _jsonl_row(raw, decode, (source, lineno), file_id, fields, extra, limits)


def _jsonl_row(
    raw: bytes,
    decode: _LineDecoder,
    where: tuple[str, int],
    file_id: str,
    fields: JsonlFields,
    extra: dict[str, Any],
    limits: DocumentLimits,
) -> LoadResult:
    source, lineno = where
    line = f"{source}:{lineno}"
    # No line number in the provenance: moving a row within the file must not make it a new
    # version.
    provenance = {"source_path": file_id, "file_type": "jsonl"}
    try:
        row = _parse_row(decode(raw))
        external_id = _row_id(row, fields)
        metadata = _row_metadata(row, fields, {**provenance, **extra})
        readers = _row_readers(row, fields)
        if fields.chunks in row:
            document = (external_id, metadata)
            return replace(_precomputed_row(row, fields, document, where, limits), readers=readers)
        text = _row_text(row, fields, limits)
    except ParseError as exc:
        return LoadFailure(line, str(exc))
    title = clean_title(row.get(fields.title))
    return LoadedDocument(
        external_id=external_id,
        # The title is part of what is searched (as in BEIR's own evaluation), so it leads the text.
        text=f"{title}\n\n{text}" if title and not text.startswith(title) else text,
        title=title,
        metadata=metadata,
        source=source,
        readers=readers,
    )


def _row_readers(row: dict[str, Any], fields: JsonlFields) -> tuple[str, ...] | None:
    """The row's readers, checked; None when it names none."""
    value = row.get(fields.readers)
    if value is None:
        return None
    if not isinstance(value, str) and not (
        isinstance(value, list) and all(isinstance(item, str) for item in value)
    ):
        raise ParseError(f"{fields.readers!r} must be a list of strings or one string")
    try:
        return parse_readers(value)
    except InvalidInputError as exc:
        raise ParseError(str(exc)) from None


def _precomputed_row(
    row: dict[str, Any],
    fields: JsonlFields,
    document: tuple[str, dict[str, Any]],
    where: tuple[str, int],
    limits: DocumentLimits,
) -> LoadedDocument:
    chunks = row[fields.chunks]
    if not isinstance(chunks, list) or not chunks:
        raise ParseError(f"{fields.chunks!r} must be a non-empty array of chunks")
    if not all(isinstance(chunk, dict) for chunk in chunks):
        raise ParseError(f"every item of {fields.chunks!r} must be a JSON object")
    precomputed = PrecomputedChunks(
        texts=chunk_texts([chunk.get("text") for chunk in chunks]),
        metadata=chunk_metadata([chunk.get("metadata") for chunk in chunks]),
        vectors=vector_matrix([chunk.get("embedding") for chunk in chunks]),
        where=f"{where[0]}:{where[1]}",
    )
    external_id, metadata = document
    return precomputed_document(
        external_id=external_id,
        title=clean_title(row.get(fields.title)),
        metadata=metadata,
        chunks=precomputed,
        source=where[0],
        limits=limits,
    )


def _parse_row(line: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except RecursionError:  # the json module's own guard against deep nesting
        raise ParseError("invalid JSON: nested too deeply") from None
    except ValueError as exc:
        raise ParseError(f"invalid JSON: {describe(exc)}") from exc
    if not isinstance(row, dict):
        raise ParseError("line is not a JSON object")
    return row


class _LineDecoder:
    """Lines are UTF-8 (the first may carry a BOM). A file whose lines are not gets its encoding
    guessed once, from its first such line, and that encoding reads the rest of them: charset
    detection costs about 0.1 ms a line, and JSONL is read in the server's process."""

    def __init__(self) -> None:
        self._fallback: str | None = None

    def __call__(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            pass
        if self._fallback is None:
            self._fallback = guess_encoding(raw) or "utf-8"
        return clean_text(raw.decode(self._fallback, errors="replace"))


def _row_id(row: dict[str, Any], fields: JsonlFields) -> str:
    value = row.get(fields.id)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ParseError(f"missing id field {fields.id!r} (a string or number)")
    external_id = clean_text(str(value))
    if not external_id:
        raise ParseError(f"empty id field {fields.id!r}")
    if external_id_too_long(external_id):
        raise ParseError(ID_TOO_LONG)
    return external_id


def _row_text(row: dict[str, Any], fields: JsonlFields, limits: DocumentLimits) -> str:
    value = row.get(fields.text)
    if not isinstance(value, str):
        raise ParseError(f"missing text field {fields.text!r} (a string)")
    text = clean_text(value)
    problem = too_long(text, limits) if text else NO_TEXT
    if problem:
        raise ParseError(problem)
    return text


def _row_metadata(
    row: dict[str, Any], fields: JsonlFields, provenance: dict[str, Any]
) -> dict[str, Any]:
    """Row `metadata` object, then the listed fields; the row's own keys beat provenance."""
    metadata: dict[str, Any] = {}
    nested = row.get("metadata")
    if isinstance(nested, dict):
        metadata.update(nested)
    metadata.update({name: row[name] for name in fields.metadata if name in row})
    for key, value in provenance.items():
        metadata.setdefault(key, value)
    if too_deep(metadata):
        raise ParseError(TOO_DEEP)
    cleaned: dict[str, Any] = clean_json(metadata)
    return cleaned
