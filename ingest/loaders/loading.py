"""Loading: files, uploads and sent text become `LoadedDocument`s or `LoadFailure`s, and the
files skipped on purpose `SkippedFile`s.

The parser is chosen by the file's suffix; JSONL yields one result per line, Parquet one per
document (its rows grouped by document id). A file with files embedded in it (an e-mail's
attachments, an mbox's messages) yields its own document, then one per embedded file, each
parsed by its own suffix in the sandbox and linked to its parent (`_embedded`). An embedded
file no loader reads, or one nested deeper than `MAX_EMBEDDING_DEPTH`, is skipped: named in
its parent's metadata (`skipped_attachments`) and yielded as a `SkippedFile`.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from ingest.loaders.cleaning import clean_json, clean_text, clean_title, collapse
from ingest.loaders.formats import file_type
from ingest.loaders.jsonl_files import JsonlFields, jsonl_results, load_jsonl
from ingest.loaders.parquet_files import ParquetColumns, batch_documents
from ingest.loaders.parsing import Child, LoadResult, ParseError
from ingest.loaders.readers import Sidecars, with_readers
from ingest.loaders.sandbox import PARSERS, parse_isolated, stream_isolated
from ingest.loaders.walking import walk_files
from ragservice.errors import InvalidInputError
from ragservice.limits.documents import (
    ID_TOO_LONG,
    NO_TEXT,
    TOO_DEEP,
    DocumentLimits,
    resolve_limits,
    too_long,
)
from ragservice.limits.shape import external_id_too_long, too_deep
from ragservice.types import LoadedDocument, LoadFailure, SkippedFile

# The defaults read BEIR `corpus.jsonl`; frozen, so one shared instance is safe.
_BEIR_FIELDS = JsonlFields()
_PARQUET_COLUMNS = ParquetColumns()


def load_documents(
    paths: Sequence[Path],
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    jsonl_fields: JsonlFields = _BEIR_FIELDS,
    limits: DocumentLimits | None = None,
    parquet_columns: ParquetColumns = _PARQUET_COLUMNS,
    readers: tuple[str, ...] | None = None,
) -> Iterator[LoadResult]:
    """Load every file `walk_files` selects, and say which it skips (`SkippedFile`: a type no
    loader reads inside a folder); raises FileNotFoundError at once for a bad path.

    Documents get the readers their JSONL row names, else those of the nearest `.readers`
    sidecar (`ingest.loaders.readers`), else `readers` (None: not said)."""
    files = walk_files(paths, include, exclude)
    resolved = resolve_limits(limits)
    sidecars = Sidecars()

    def loaded() -> Iterator[LoadResult]:
        for entry in files:
            path, external_id = entry.path, entry.external_id
            if entry.skipped:
                yield SkippedFile(str(path), entry.skipped)
                continue
            try:
                found = sidecars.readers_for(path, external_id)
            except InvalidInputError as exc:
                yield LoadFailure(str(path), str(exc))
                continue
            results = load_file(
                path,
                external_id,
                jsonl_fields=jsonl_fields,
                parquet_columns=parquet_columns,
                limits=resolved,
            )
            yield from with_readers(results, readers if found is None else found)

    return loaded()


def load_file(
    path: Path,
    external_id: str,
    *,
    jsonl_fields: JsonlFields = _BEIR_FIELDS,
    parquet_columns: ParquetColumns = _PARQUET_COLUMNS,
    limits: DocumentLimits | None = None,
) -> Iterator[LoadResult]:
    """Load one file: one document (or failure), or one per line for JSONL, one per document
    for Parquet (read by the sandbox from the file's path).

    File documents get `source=str(path)` and metadata `source_path` (= `external_id`) and
    `file_type`. JSONL rows take their external id from the row's id field. `limits`
    (default: from the settings) bound each document's pages and characters.
    """
    suffix = file_type(path.name)
    if suffix == ".jsonl":
        return load_jsonl(path, external_id, jsonl_fields, resolve_limits(limits))
    if suffix == ".parquet":
        where = (str(path), external_id)
        return _parquet(path, where, parquet_columns, {}, resolve_limits(limits))
    return _load_single(path, external_id, suffix, resolve_limits(limits))


def load_bytes(
    name: str,
    data: bytes,
    *,
    jsonl_fields: JsonlFields = _BEIR_FIELDS,
    parquet_columns: ParquetColumns = _PARQUET_COLUMNS,
    metadata: Mapping[str, Any] | None = None,
    limits: DocumentLimits | None = None,
) -> Iterator[LoadResult]:
    """Load an uploaded file from its bytes, by the suffix of its `name`, as `load_file` does.

    The external id (and `source`, and metadata `source_path`) is `upload_name(name)`.
    `metadata`, the upload's own, is merged into every document's metadata and wins over the
    loader's keys (`file_type`, `source_path`, `pages`); a JSONL row's own keys win over it.
    """
    external_id = upload_name(name)
    problem = _upload_problem(external_id, metadata)
    if problem:
        return iter((LoadFailure(clean_text(name)[:200] or "(no name)", problem),))
    extra: dict[str, Any] = clean_json(dict(metadata or {}))
    suffix = file_type(external_id)
    resolved = resolve_limits(limits)
    if suffix == ".jsonl":
        return jsonl_results(
            io.BytesIO(data), external_id, external_id, jsonl_fields, extra, resolved
        )
    if suffix == ".parquet":
        return _parquet(data, (external_id, external_id), parquet_columns, extra, resolved)
    return _parse_single(data, suffix, (external_id, external_id), extra, resolved)


def load_fetched(
    external_id: str,
    name: str,
    data: bytes,
    *,
    metadata: Mapping[str, Any] | None = None,
    limits: DocumentLimits | None = None,
) -> Iterator[LoadResult]:
    """Load a document a source fetched (`ingest.sources`), parsed by the suffix of `name`,
    under its source's own `external_id` (a URL, `s3://bucket/key`, a relative path), which
    is also its `source`. `metadata` (its origin) is merged as an upload's is."""
    if external_id_too_long(external_id):
        return iter((LoadFailure(clean_text(external_id)[:200], ID_TOO_LONG),))
    extra: dict[str, Any] = clean_json(dict(metadata or {}))
    suffix = file_type(name)
    resolved = resolve_limits(limits)
    if suffix == ".jsonl":
        return jsonl_results(
            io.BytesIO(data), external_id, external_id, _BEIR_FIELDS, extra, resolved
        )
    return _parse_single(data, suffix, (external_id, external_id), extra, resolved)


def _upload_problem(external_id: str, metadata: Mapping[str, Any] | None) -> str:
    if not external_id:
        return "the file has no usable name"
    if external_id_too_long(external_id):
        return ID_TOO_LONG
    return TOO_DEEP if too_deep(metadata) else ""


def load_text(
    external_id: str,
    text: str,
    *,
    title: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    limits: DocumentLimits | None = None,
) -> LoadResult:
    """A document sent as text (not as a file), cleaned like file contents are."""
    clean_id = clean_text(external_id).strip()
    if not clean_id:
        return LoadFailure("(no id)", "the document has an empty external id")
    if external_id_too_long(clean_id):
        return LoadFailure(clean_id[:200], ID_TOO_LONG)
    body = clean_text(text)
    problem = _text_problem(body, metadata, resolve_limits(limits))
    if problem:
        return LoadFailure(clean_id, problem)
    cleaned: dict[str, Any] = clean_json(dict(metadata or {}))
    return LoadedDocument(
        external_id=clean_id, text=body, title=clean_title(title), metadata=cleaned
    )


def _text_problem(text: str, metadata: object, limits: DocumentLimits) -> str:
    if not text.strip():
        return NO_TEXT
    return TOO_DEEP if too_deep(metadata) else too_long(text, limits)


_DRIVE = re.compile(r"[A-Za-z]:")


def upload_name(name: str) -> str:
    """A safe, path-like external id for an uploaded file's name.

    Backslashes count as `/`; a leading drive letter and empty, `.` and `..` segments are
    dropped, and whitespace within a segment collapses: `C:\\docs\\..\\my  a.txt` becomes
    `docs/my a.txt`. The result is empty when nothing usable is left.
    """
    parts = [collapse(part) for part in clean_text(name).replace("\\", "/").split("/")]
    if parts and _DRIVE.fullmatch(parts[0]):
        parts = parts[1:]
    return "/".join(part for part in parts if part not in ("", ".", ".."))


def _load_single(
    path: Path, external_id: str, suffix: str, limits: DocumentLimits
) -> Iterator[LoadResult]:
    if suffix not in PARSERS:
        return iter((_unsupported(str(path), suffix),))
    if external_id_too_long(external_id):
        return iter((LoadFailure(str(path), ID_TOO_LONG),))
    try:
        data = _read(path)
    except ParseError as exc:
        return iter((LoadFailure(str(path), str(exc)),))
    return _parse_single(data, suffix, (external_id, str(path)), {}, limits)


def _parse_single(
    data: bytes,
    suffix: str,
    where: tuple[str, str],
    extra: dict[str, Any],
    limits: DocumentLimits,
    embedded: tuple[int, dict[str, Any]] = (0, {}),
) -> Iterator[LoadResult]:
    """The document in `data` (its external id and source in `where`), then the documents
    embedded in it (`_embedded`). A file with no text of its own but embedded files (an mbox)
    yields only those; one with neither fails with NO_TEXT. `embedded` is how deep the file is
    embedded, and its own metadata there (its `parent`)."""
    depth, own = embedded
    external_id, source = where
    parser = PARSERS.get(suffix)
    if parser is None:
        yield _unsupported(source, suffix)
        return
    try:
        parsed = parse_isolated(suffix, data, limits)
    except ParseError as exc:
        yield LoadFailure(source, str(exc))
        return
    children = _named_children(parsed.children, where)
    read, skipped = _sorted_children(children, depth + 1)
    if parsed.text or not children:
        problem = too_long(parsed.text, limits) if parsed.text else NO_TEXT
        if problem:
            yield LoadFailure(source, problem)
        else:
            provenance = {"source_path": external_id, "file_type": parser[0]}
            yield LoadedDocument(
                external_id=external_id,
                text=parsed.text,
                title=parsed.title,
                metadata={**parsed.metadata, **own, **_children_metadata(read, skipped)}
                | provenance
                | extra,
                source=source,
                format=parsed.format,
                page_starts=parsed.page_starts,
                page_unit=parsed.page_unit,
                page_names=parsed.page_names,
                row_starts=parsed.row_starts,
            )
    yield from (SkippedFile(source, reason) for (_, source, _), reason in skipped)
    yield from _embedded(read, external_id, extra, limits, depth + 1)


MAX_EMBEDDING_DEPTH = 2
"""How deep embedded files are loaded: an mbox's messages (1) and their attachments (2)."""

_Named = tuple[str, str, Child]  # (external id, source, the embedded file)


def _named_children(children: tuple[Child, ...], where: tuple[str, str]) -> list[_Named]:
    """Each embedded file with its external id and source, `<parent's>/<name>`; a name met
    again becomes `name (2).ext`, `name (3).ext`, ..."""
    external_id, source = where
    seen: set[str] = set()
    named: list[_Named] = []
    for child in children:
        name = child.name
        stem, dot, ext = name.rpartition(".") if "." in name.lstrip(".") else (name, "", "")
        copy = 1
        while name in seen:
            copy += 1
            name = f"{stem} ({copy}){dot}{ext}"
        seen.add(name)
        named.append((f"{external_id}/{name}", f"{source}/{name}", child))
    return named


def _sorted_children(
    children: list[_Named], depth: int
) -> tuple[list[_Named], list[tuple[_Named, str]]]:
    """The embedded files to read, and those skipped with the reason: of a type no loader
    reads (a GIF, a PGP signature), or nested deeper than `MAX_EMBEDDING_DEPTH`."""
    read: list[_Named] = []
    skipped: list[tuple[_Named, str]] = []
    for named in children:
        reason = _skip_reason(named[2].name, depth)
        if reason:
            skipped.append((named, reason))
        else:
            read.append(named)
    return read, skipped


def _skip_reason(name: str, depth: int) -> str:
    if depth > MAX_EMBEDDING_DEPTH:
        return f"embedded files nested more than {MAX_EMBEDDING_DEPTH} deep are not read"
    suffix = file_type(name)
    if suffix in PARSERS:
        return ""
    if suffix:  # JSONL and Parquet are read from whole files, not from inside others
        return f"a {suffix} file inside another file is not read"
    return _unsupported(name, suffix).reason


def _children_metadata(read: list[_Named], skipped: list[tuple[_Named, str]]) -> dict[str, Any]:
    """What a parent says of its embedded files: the ids of those read (`attachments`), the
    names of those skipped (`skipped_attachments`)."""
    metadata: dict[str, Any] = {}
    if read:
        metadata["attachments"] = [child_id for child_id, _, _ in read]
    if skipped:
        metadata["skipped_attachments"] = [
            child_id.rsplit("/", 1)[-1] for (child_id, _, _), _ in skipped
        ]
    return metadata


def _embedded(
    children: list[_Named],
    parent_id: str,
    extra: dict[str, Any],
    limits: DocumentLimits,
    depth: int,
) -> Iterator[LoadResult]:
    """The embedded files' documents, linked to their parent (metadata `parent`); one that
    cannot be loaded fails alone, naming its parent and itself (its source)."""
    for child_id, source, child in children:
        if external_id_too_long(child_id):
            yield LoadFailure(source, ID_TOO_LONG)
        elif too_deep(child.metadata):
            yield LoadFailure(source, TOO_DEEP)
        else:
            own = {**child.metadata, "parent": parent_id}
            where = (child_id, source)
            suffix = file_type(child.name)
            yield from _parse_single(child.data, suffix, where, extra, limits, (depth, own))


def _parquet(
    data: bytes | Path,
    where: tuple[str, str],
    columns: ParquetColumns,
    extra: dict[str, Any],
    limits: DocumentLimits,
) -> Iterator[LoadResult]:
    """The documents of a Parquet file; a file the sandbox cannot read fails whole (after the
    documents of the batches read before the problem)."""
    source, file_id = where
    try:
        for frame in stream_isolated(data, columns, limits):
            yield from batch_documents(
                frame, source=source, file_id=file_id, extra=extra, limits=limits
            )
    except ParseError as exc:
        yield LoadFailure(source, str(exc))


def _unsupported(source: str, suffix: str) -> LoadFailure:
    # `suffix` is "" for every type no loader reads: name the file's own suffix.
    named = suffix or PurePosixPath(source).suffix.lower()
    return LoadFailure(source, f"unsupported file type {named or '(no suffix)'}")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ParseError(f"could not read file: {exc.strerror or exc}") from exc
