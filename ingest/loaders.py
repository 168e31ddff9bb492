"""Loaders: turn files, folders and JSONL exports into `LoadedDocument`s.

Bad content never raises. A file (or JSONL line) that cannot be parsed becomes a `LoadFailure`
with a short reason, so one broken file does not stop a batch. Every text, title and string
metadata value passes through `clean_text`: PostgreSQL rejects NUL bytes and invalid UTF-8, and
one such value would fail a whole COPY batch.
"""

from __future__ import annotations

import codecs
import errno
import io
import json
import math
import re
import unicodedata
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, TypeAlias

import docx
from bs4 import BeautifulSoup, Tag
from bs4.element import NavigableString, PageElement, PreformattedString
from charset_normalizer import from_bytes
from docx.document import Document as DocxDocument
from docx.table import Table, _Row
from docx.text.paragraph import Paragraph
from pypdf import PasswordType, PdfReader
from pypdf.errors import DependencyError

from ragservice.config import Settings, get_settings
from ragservice.limits import (
    MAX_EXTERNAL_ID_BYTES,
    MAX_JSON_DEPTH,
    external_id_too_long,
    too_deep,
)
from ragservice.types import SUPPORTED_SUFFIXES as SUPPORTED_SUFFIXES  # re-exported
from ragservice.types import LoadedDocument, LoadFailure, TextFormat

LoadResult: TypeAlias = LoadedDocument | LoadFailure

NO_TEXT = "no text could be extracted"


# --------------------------------------------------------------------------- limits


@dataclass(frozen=True)
class DocumentLimits:
    """The most pages (PDF) and extracted characters one document may have; more is a failure."""

    max_pages: int
    max_chars: int

    @classmethod
    def from_settings(cls, settings: Settings) -> DocumentLimits:
        return cls(max_pages=settings.max_document_pages, max_chars=settings.max_document_chars)


def _limits(limits: DocumentLimits | None) -> DocumentLimits:
    # None: the process's own settings, which is what the server and the CLI run with.
    return limits or DocumentLimits.from_settings(get_settings())


def _too_long(text: str, limits: DocumentLimits) -> str:
    if len(text) <= limits.max_chars:
        return ""
    return (
        f"the text has {len(text)} characters; the limit is {limits.max_chars} "
        "(RAGSERVICE_MAX_DOCUMENT_CHARS)"
    )


_ID_TOO_LONG = f"the external id is longer than {MAX_EXTERNAL_ID_BYTES} bytes"
_TOO_DEEP = f"the metadata is nested deeper than {MAX_JSON_DEPTH} levels"


# --------------------------------------------------------------------------- JSONL field mapping


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
        )


_SPEC_KEYS = ("id", "title", "text", "metadata")


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
        return f"unknown key {key!r} (expected id, title, text or metadata)"
    if key in seen:
        return f"key {key!r} is given twice"
    if not value.strip("|").strip():
        return f"key {key!r} names no field"
    return ""


# --------------------------------------------------------------------------- text cleaning

_LINE_BREAKS = re.compile("\r\n?|[\x0b\x0c]")
# All C0 controls but \t and \n; \r, \v and \f are already line breaks by then.
_CONTROL_CHARS = re.compile("[\x00-\x08\x0e-\x1f]")
# A str can only hold surrogates unpaired; they cannot be encoded as UTF-8.
_SURROGATES = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Make `text` safe to store: no NUL or other control characters, valid UTF-8, NFC.

    Line breaks become `\\n` (vertical tab and form feed too, since they separate lines and
    pages); trailing whitespace of the whole text is removed.
    """
    text = _LINE_BREAKS.sub("\n", text)
    text = _CONTROL_CHARS.sub("", text)
    text = _SURROGATES.sub("\ufffd", text)
    return unicodedata.normalize("NFC", text).rstrip()


# UTF-32-LE's BOM starts with UTF-16-LE's, so it must be tried first.
_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def decode_bytes(data: bytes) -> str:
    """Decode file bytes to clean text: BOM, else strict UTF-8, else a detected encoding."""
    return clean_text(_decode(data))


def _decode(data: bytes) -> str:
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return data[len(bom) :].decode(encoding, errors="replace")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode(_guess_encoding(data) or "utf-8", errors="replace")


def _guess_encoding(data: bytes) -> str | None:
    # Stray NUL bytes make charset-normalizer answer UTF-16; they are dropped later anyway.
    # Text that is mostly NUL bytes, though, may really be BOM-less UTF-16.
    sample = data.replace(b"\x00", b"") if data.count(0) * 4 < len(data) else data
    matches = from_bytes(sample)
    best = matches.best()
    if best is None:
        return None
    # Short texts tie between many code pages and the alphabetically first one wins (cp1006
    # for b"caf\xe9"). Windows-1252 is by far the most common legacy encoding, so when one of
    # the tied guesses reads the bytes exactly as cp1252 does, say cp1252.
    western = sample.decode("cp1252", errors="replace")
    tied = (m for m in matches if (m.chaos, m.coherence) == (best.chaos, best.coherence))
    return "cp1252" if any(str(m) == western for m in tied) else best.encoding


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _clean_title(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    return clean_text(_collapse(str(value))) or None


def _clean_json(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(key)): _clean_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_clean_json(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON allows NaN and Infinity in practice; jsonb does not
    return value


# --------------------------------------------------------------------------- walking folders


@dataclass(frozen=True)
class _Filters:
    include: tuple[re.Pattern[str], ...]
    exclude: tuple[re.Pattern[str], ...]


def iter_files(
    paths: Sequence[Path],
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> Iterator[tuple[Path, str]]:
    """Yield `(file, external id base)` for the files under `paths`, in a stable order.

    Folders are walked recursively in sorted order; the id base is the path relative to the
    folder given (posix), or the file name for a file given directly. Globs (`*`, `?`, `[..]`,
    `**`) match the relative path or the bare file name; `exclude` also prunes folders. With no
    `include`, a folder yields only files with a supported suffix; a file given directly is
    taken whatever its suffix, so an unsupported one is reported instead of silently skipped.
    Names starting with "." are skipped inside folders.

    Raises FileNotFoundError, before yielding anything, when a path does not exist.
    """
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(errno.ENOENT, "no such file or directory", str(path))
    filters = _Filters(_compile_globs(include), _compile_globs(exclude))
    return _iter_paths(paths, filters)


def _iter_paths(paths: Sequence[Path], filters: _Filters) -> Iterator[tuple[Path, str]]:
    for path in paths:
        if path.is_dir():
            yield from _walk(path, path, filters, frozenset())
        elif _passes(path.name, filters):
            yield path, path.name


def _walk(
    root: Path, folder: Path, filters: _Filters, ancestors: frozenset[Path]
) -> Iterator[tuple[Path, str]]:
    real = folder.resolve()
    if real in ancestors:
        return  # a symlink back up the tree; following it would never end
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.startswith("."):
            continue
        relative = entry.relative_to(root).as_posix()
        if entry.is_dir():
            if not _matches(filters.exclude, relative):
                yield from _walk(root, entry, filters, ancestors | {real})
        elif entry.is_file() and _wanted(relative, filters):
            yield entry, relative


def _wanted(relative: str, filters: _Filters) -> bool:
    # An include list is the user's own choice of files; without one, take what we can parse.
    chosen = bool(filters.include) or relative.lower().endswith(SUPPORTED_SUFFIXES)
    return chosen and _passes(relative, filters)


def _passes(relative: str, filters: _Filters) -> bool:
    if _matches(filters.exclude, relative):
        return False
    return not filters.include or _matches(filters.include, relative)


def _matches(globs: Sequence[re.Pattern[str]], relative: str) -> bool:
    name = relative.rsplit("/", 1)[-1]
    return any(glob.fullmatch(relative) or glob.fullmatch(name) for glob in globs)


_GLOB_TOKENS = re.compile(r"(\*\*/|\*\*|\*|\?|\[!?\]?[^\]]*\])")
_GLOB_REGEX = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}


def _compile_globs(patterns: Sequence[str]) -> tuple[re.Pattern[str], ...]:
    return tuple(_glob_to_regex(pattern) for pattern in patterns)


def _glob_to_regex(pattern: str) -> re.Pattern[str]:
    """Translate a path glob: `*` and `?` stay inside one folder, `**` crosses folders."""
    pieces = _GLOB_TOKENS.split(pattern.removeprefix("./"))
    # re.split with a group alternates literal text (even indexes) and glob tokens (odd).
    regex = "".join(
        _glob_token(piece) if index % 2 else re.escape(piece) for index, piece in enumerate(pieces)
    )
    return re.compile(regex)


def _glob_token(token: str) -> str:
    if token in _GLOB_REGEX:
        return _GLOB_REGEX[token]
    body = token[1:-1].replace("\\", "\\\\").replace("[", "\\[")
    if body.startswith("^"):
        body = "\\" + body
    return "[^" + body[1:] + "]" if body.startswith("!") else "[" + body + "]"


# --------------------------------------------------------------------------- loading files


def load_documents(
    paths: Sequence[Path],
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    jsonl_fields: JsonlFields = JsonlFields(),
    limits: DocumentLimits | None = None,
) -> Iterator[LoadResult]:
    """Load every file `iter_files` selects; raises FileNotFoundError at once for a bad path."""
    files = iter_files(paths, include, exclude)
    resolved = _limits(limits)
    return (
        result
        for path, external_id in files
        for result in load_file(path, external_id, jsonl_fields=jsonl_fields, limits=resolved)
    )


def load_file(
    path: Path,
    external_id: str,
    *,
    jsonl_fields: JsonlFields = JsonlFields(),
    limits: DocumentLimits | None = None,
) -> Iterator[LoadResult]:
    """Load one file: one document (or failure), or one per line for JSONL.

    File documents get `source=str(path)` and metadata `source_path` (= `external_id`) and
    `file_type`. JSONL rows take their external id from the row's id field. `limits`
    (default: from the settings) bound each document's pages and characters.
    """
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _load_jsonl(path, external_id, jsonl_fields, _limits(limits))
    return iter((_load_single(path, external_id, suffix, _limits(limits)),))


def load_bytes(
    name: str,
    data: bytes,
    *,
    jsonl_fields: JsonlFields = JsonlFields(),
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
    extra: dict[str, Any] = _clean_json(dict(metadata or {}))
    suffix = PurePosixPath(external_id).suffix.lower()
    resolved = _limits(limits)
    if suffix == ".jsonl":
        return _jsonl_results(
            io.BytesIO(data), external_id, external_id, jsonl_fields, extra, resolved
        )
    return iter((_parse_single(data, suffix, external_id, external_id, extra, resolved),))


def _upload_problem(external_id: str, metadata: Mapping[str, Any] | None) -> str:
    if not external_id:
        return "the file has no usable name"
    if external_id_too_long(external_id):
        return _ID_TOO_LONG
    return _TOO_DEEP if too_deep(metadata) else ""


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
        return LoadFailure(clean_id[:200], _ID_TOO_LONG)
    body = clean_text(text)
    problem = _text_problem(body, metadata, _limits(limits))
    if problem:
        return LoadFailure(clean_id, problem)
    cleaned: dict[str, Any] = _clean_json(dict(metadata or {}))
    return LoadedDocument(
        external_id=clean_id, text=body, title=_clean_title(title), metadata=cleaned
    )


def _text_problem(text: str, metadata: object, limits: DocumentLimits) -> str:
    if not text.strip():
        return NO_TEXT
    return _TOO_DEEP if too_deep(metadata) else _too_long(text, limits)


_DRIVE = re.compile(r"[A-Za-z]:")


def upload_name(name: str) -> str:
    """A safe, path-like external id for an uploaded file's name.

    Backslashes count as `/`; a leading drive letter and empty, `.` and `..` segments are
    dropped, and whitespace within a segment collapses: `C:\\docs\\..\\my  a.txt` becomes
    `docs/my a.txt`. The result is empty when nothing usable is left.
    """
    parts = [_collapse(part) for part in clean_text(name).replace("\\", "/").split("/")]
    if parts and _DRIVE.fullmatch(parts[0]):
        parts = parts[1:]
    return "/".join(part for part in parts if part not in ("", ".", ".."))


@dataclass(frozen=True)
class _Parsed:
    text: str
    title: str | None
    format: TextFormat
    metadata: dict[str, Any] = field(default_factory=dict)


class _ParseError(Exception):
    """Bad content; the message is the reason a person reads."""


def _load_single(path: Path, external_id: str, suffix: str, limits: DocumentLimits) -> LoadResult:
    if suffix not in _PARSERS:
        return _unsupported(str(path), suffix)
    if external_id_too_long(external_id):
        return LoadFailure(str(path), _ID_TOO_LONG)
    try:
        data = _read(path)
    except _ParseError as exc:
        return LoadFailure(str(path), str(exc))
    return _parse_single(data, suffix, external_id, str(path), {}, limits)


def _parse_single(
    data: bytes,
    suffix: str,
    external_id: str,
    source: str,
    extra: dict[str, Any],
    limits: DocumentLimits,
) -> LoadResult:
    parser = _PARSERS.get(suffix)
    if parser is None:
        return _unsupported(source, suffix)
    file_type, parse = parser
    try:
        parsed = parse(data, limits)
    except _ParseError as exc:
        return LoadFailure(source, str(exc))
    problem = _too_long(parsed.text, limits) if parsed.text else NO_TEXT
    if problem:
        return LoadFailure(source, problem)
    provenance = {"source_path": external_id, "file_type": file_type}
    return LoadedDocument(
        external_id=external_id,
        text=parsed.text,
        title=parsed.title,
        metadata={**parsed.metadata, **provenance, **extra},
        source=source,
        format=parsed.format,
    )


def _unsupported(source: str, suffix: str) -> LoadFailure:
    return LoadFailure(source, f"unsupported file type {suffix or '(no suffix)'}")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _ParseError(f"could not read file: {exc.strerror or exc}") from exc


@contextmanager
def _bad_content(what: str) -> Iterator[None]:
    """Turn any library error into a `_ParseError("what: detail")`.

    Parsers for PDF, DOCX and HTML raise many exception types on damaged input (ValueError,
    KeyError, zipfile errors, their own), so only a broad catch keeps a batch going.
    """
    try:
        yield
    except _ParseError:
        raise
    except Exception as exc:
        raise _ParseError(f"{what}: {_describe(exc)}") from exc


def _describe(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    detail = lines[0] if lines else type(exc).__name__
    return clean_text(detail[:200])


# --------------------------------------------------------------------------- text and markdown


def _parse_text(data: bytes, _limits: DocumentLimits) -> _Parsed:
    return _Parsed(decode_bytes(data), None, "text")


def _parse_markdown(data: bytes, _limits: DocumentLimits) -> _Parsed:
    text = decode_bytes(data)
    return _Parsed(text, _markdown_title(text), "markdown")


_FENCE = re.compile(r" {0,3}(```|~~~)")
_ATX_H1 = re.compile(r" {0,3}#[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*")


def _markdown_title(text: str) -> str | None:
    """The first `# ` heading, not counting `# comments` inside fenced code."""
    fenced = False
    for line in text.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := _ATX_H1.fullmatch(line)):
            return _clean_title(match.group(1))
    return None


# --------------------------------------------------------------------------- HTML

_DROPPED = (
    "script, style, noscript, nav, header, footer, aside, form, template, iframe, svg, "
    '[role="navigation"], [role="banner"], [role="contentinfo"]'
)
_HEADING_LEVELS = {f"h{level}": level for level in range(1, 7)}
# Tags that flow inside a line of text; any other tag starts a block of its own.
# fmt: off
_INLINE_TAGS = frozenset({
    "a", "abbr", "b", "bdi", "bdo", "big", "button", "cite", "code", "data", "del", "dfn", "em",
    "font", "i", "img", "input", "ins", "kbd", "label", "mark", "output", "q", "s", "samp",
    "select", "small", "span", "strike", "strong", "sub", "sup", "time", "tt", "u", "var", "wbr",
})
# fmt: on
_UNRENDERED_TAGS = frozenset({"head", "title", "meta", "link", "base"})
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.I)


def _parse_html(data: bytes, _limits: DocumentLimits) -> _Parsed:
    with _bad_content("not a valid HTML file"):
        soup = BeautifulSoup(_decode_html(data), "lxml")
        _drop_boilerplate(soup)
        text = "\n\n".join(_html_blocks(_content_root(soup)))
        title = _html_title(soup)
    return _Parsed(clean_text(text), title, "markdown")


def _decode_html(data: bytes) -> str:
    declared = _declared_charset(data[:4096])
    if declared is None or data.startswith(tuple(bom for bom, _ in _BOMS)):
        return decode_bytes(data)
    try:
        # Valid UTF-8 beats a stale declaration left over from a conversion.
        return clean_text(data.decode("utf-8"))
    except UnicodeDecodeError:
        return clean_text(data.decode(declared, errors="replace"))


def _declared_charset(head: bytes) -> str | None:
    match = _META_CHARSET.search(head)
    if match is None:
        return None
    try:
        name = codecs.lookup(match.group(1).decode("ascii")).name
    except LookupError:
        return None
    if name == "utf-8":
        return None  # declared UTF-8 that is not valid UTF-8: let detection have a go
    # Browsers read Latin-1 and ASCII labels as windows-1252 (WHATWG Encoding Standard).
    return "cp1252" if name in {"iso8859-1", "ascii"} else name


def _drop_boilerplate(soup: BeautifulSoup) -> None:
    for tag in soup.select(_DROPPED):
        # Select returns parents before children; a child of a dropped tag is gone already.
        # A <header> inside <article> or <main> holds the article's own heading: keep it.
        keep = tag.name == "header" and tag.find_parent(["article", "main"]) is not None
        if not tag.decomposed and not keep:
            tag.decompose()
    for br in soup.find_all("br"):
        br.replace_with("\n")


def _content_root(soup: BeautifulSoup) -> Tag:
    articles = soup.find_all("article")
    candidates = (soup.find("main"), articles[0] if len(articles) == 1 else None, soup.body)
    return next((tag for tag in candidates if isinstance(tag, Tag)), soup)


def _html_title(soup: BeautifulSoup) -> str | None:
    for tag in (soup.title, soup.find("h1")):
        if isinstance(tag, Tag) and (title := _clean_title(tag.get_text())):
            return title
    return None


def _html_blocks(node: Tag) -> Iterator[str]:
    """Yield the Markdown blocks under `node`; each run of inline content is one paragraph."""
    run: list[str] = []
    for child in node.children:
        if isinstance(child, Tag) and child.name not in _INLINE_TAGS:
            yield from _paragraph(run)
            run = []
            yield from _html_block(child)
        else:
            run.append(_inline_text(child))
    yield from _paragraph(run)


def _html_block(tag: Tag) -> Iterator[str]:
    level = _HEADING_LEVELS.get(tag.name)
    if tag.name in _UNRENDERED_TAGS:
        return
    if level is not None:
        yield from _prefixed("#" * level + " ", list(_paragraph([tag.get_text()])))
    elif tag.name == "li":
        yield from _prefixed("- ", list(_html_blocks(tag)))
    elif tag.name == "tr":
        cells = (_collapse(cell.get_text()) for cell in tag.find_all(["td", "th"]))
        yield from _paragraph([" | ".join(cell for cell in cells if cell)])
    elif tag.name == "pre":
        # Code keeps its lines; the fence stops `# comments` from reading as headings.
        code = tag.get_text().strip("\n")
        if code.strip():
            yield f"```\n{code}\n```"
    else:
        yield from _html_blocks(tag)


def _inline_text(node: PageElement) -> str:
    if isinstance(node, Tag):
        return node.get_text()
    if isinstance(node, NavigableString) and not isinstance(node, PreformattedString):
        return str(node)
    return ""  # comments, doctype, CDATA


def _paragraph(run: Sequence[str]) -> Iterator[str]:
    text = _collapse("".join(run))
    if text:
        yield text


def _prefixed(prefix: str, blocks: Sequence[str]) -> Iterator[str]:
    if blocks:
        yield prefix + blocks[0]
        yield from blocks[1:]


# --------------------------------------------------------------------------- PDF


def _parse_pdf(data: bytes, limits: DocumentLimits) -> _Parsed:
    if b"%PDF-" not in data[:1024]:  # where the PDF specification allows the header
        raise _ParseError("not a valid PDF: it has no %PDF- header")
    with _bad_content("not a valid PDF"):
        reader = PdfReader(io.BytesIO(data))
        _unlock(reader)
        _check_page_count(len(reader.pages), limits)
        pages = list(_pdf_pages(reader, limits))
        title = _clean_title(reader.metadata.title if reader.metadata else None)
    text = "\n\n".join(page for page in pages if page)
    return _Parsed(text, title, "text", {"pages": len(pages)})


def _check_page_count(count: int, limits: DocumentLimits) -> None:
    if count > limits.max_pages:
        raise _ParseError(
            f"the PDF has {count} pages; the limit is {limits.max_pages} "
            "(RAGSERVICE_MAX_DOCUMENT_PAGES)"
        )


def _pdf_pages(reader: PdfReader, limits: DocumentLimits) -> Iterator[str]:
    """Each page's clean text; stops, failing, as soon as the text is over the limit."""
    total = 0
    for page in reader.pages:
        text = clean_text(page.extract_text())
        total += len(text)
        if total > limits.max_chars:
            raise _ParseError(
                f"the text is over {limits.max_chars} characters (RAGSERVICE_MAX_DOCUMENT_CHARS)"
            )
        yield text


def _unlock(reader: PdfReader) -> None:
    """Open an encrypted PDF that has an empty user password (copy/print-protected PDFs)."""
    if not reader.is_encrypted:
        return
    try:
        opened = reader.decrypt("") != PasswordType.NOT_DECRYPTED
    except DependencyError as exc:  # AES needs the optional `cryptography` package
        raise _ParseError(f"PDF is encrypted: {_describe(exc)}") from exc
    if not opened:
        raise _ParseError("PDF is encrypted")


# --------------------------------------------------------------------------- DOCX

_HEADING_STYLE = re.compile(r"heading ([1-9])", re.I)
# A DOCX is a zip archive: refuse one that would unpack into far more than any real document.
# zipfile never reads past a member's declared size, so checking the declared sizes suffices.
_DOCX_MAX_MEMBERS = 10_000
_DOCX_MAX_UNPACKED = 256 * 2**20
_DOCX_MAX_RATIO = 200  # Deflate reaches about 1000:1 on zip bombs; XML rarely passes 20:1
_DOCX_RATIO_FROM = 2**20  # small members may compress however well they like


def _check_archive(archive: zipfile.ZipFile) -> None:
    members = archive.infolist()
    if len(members) > _DOCX_MAX_MEMBERS:
        raise _ParseError(f"refused: the archive has {len(members)} members (a zip bomb?)")
    unpacked = sum(member.file_size for member in members)
    if unpacked > _DOCX_MAX_UNPACKED:
        raise _ParseError(f"refused: the archive unpacks to {unpacked} bytes (a zip bomb?)")
    for member in members:
        ratio = member.file_size / max(member.compress_size, 1)
        if member.file_size > _DOCX_RATIO_FROM and ratio > _DOCX_MAX_RATIO:
            raise _ParseError(
                f"refused: {clean_text(member.filename)[:100]!r} is compressed {ratio:.0f}:1 "
                "(a zip bomb?)"
            )


def _parse_docx(data: bytes, _limits: DocumentLimits) -> _Parsed:
    with _bad_content("not a valid DOCX file"):
        _check_archive(zipfile.ZipFile(io.BytesIO(data)))
        document = docx.Document(io.BytesIO(data))
        blocks = [_docx_block(item) for item in document.iter_inner_content()]
        title = _clean_title(document.core_properties.title) or _docx_title(document)
    return _Parsed(clean_text("\n\n".join(b for b in blocks if b)), title, "markdown")


def _docx_block(item: Paragraph | Table) -> str:
    if isinstance(item, Table):
        return "\n\n".join(row for row in map(_docx_row, item.rows) if row)
    text = item.text.strip()
    style = _style_name(item)
    level = _docx_heading_level(style)
    if not text:
        return ""
    if level:
        return "#" * level + " " + _collapse(text)
    return "- " + text if style.startswith("List") else text


def _docx_row(row: _Row) -> str:
    texts: list[str] = []
    previous: object = None
    for cell in row.cells:
        # A merged cell comes back once per grid column it spans.
        if cell._tc is not previous and (text := _collapse(cell.text)):
            texts.append(text)
        previous = cell._tc
    return " | ".join(texts)


def _style_name(paragraph: Paragraph) -> str:
    style = paragraph.style
    return (style.name or "") if style is not None else ""


def _docx_heading_level(style: str) -> int:
    if style == "Title":
        return 1
    match = _HEADING_STYLE.fullmatch(style)
    return min(int(match.group(1)), 6) if match else 0


def _docx_title(document: DocxDocument) -> str | None:
    titles = (p.text for p in document.paragraphs if _style_name(p) == "Title")
    return next((title for text in titles if (title := _clean_title(text))), None)


# --------------------------------------------------------------------------- JSONL


def _load_jsonl(
    path: Path, file_id: str, fields: JsonlFields, limits: DocumentLimits
) -> Iterator[LoadResult]:
    """One result per non-blank line; reads line by line so huge corpora stream."""
    try:
        with path.open("rb") as lines:
            yield from _jsonl_results(lines, str(path), file_id, fields, {}, limits)
    except OSError as exc:
        yield LoadFailure(str(path), f"could not read file: {exc.strerror or exc}")


def _jsonl_results(
    lines: Iterable[bytes],
    source: str,
    file_id: str,
    fields: JsonlFields,
    extra: dict[str, Any],
    limits: DocumentLimits,
) -> Iterator[LoadResult]:
    for lineno, raw in enumerate(lines, start=1):
        if raw.strip():
            yield _jsonl_row(raw, (source, lineno), file_id, fields, extra, limits)


def _jsonl_row(
    raw: bytes,
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
        row = _parse_row(raw)
        external_id, text = _row_id(row, fields), _row_text(row, fields, limits)
        metadata = _row_metadata(row, fields, {**provenance, **extra})
    except _ParseError as exc:
        return LoadFailure(line, str(exc))
    title = _clean_title(row.get(fields.title))
    return LoadedDocument(
        external_id=external_id,
        # The title is part of what is searched (as in BEIR's own evaluation), so it leads the text.
        text=f"{title}\n\n{text}" if title and not text.startswith(title) else text,
        title=title,
        metadata=metadata,
        source=source,
    )


def _parse_row(raw: bytes) -> dict[str, Any]:
    try:
        row = json.loads(_decode_line(raw))
    except RecursionError:  # the json module's own guard against deep nesting
        raise _ParseError("invalid JSON: nested too deeply") from None
    except ValueError as exc:
        raise _ParseError(f"invalid JSON: {_describe(exc)}") from exc
    if not isinstance(row, dict):
        raise _ParseError("line is not a JSON object")
    return row


def _decode_line(raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")  # -sig: the first line may carry a BOM
    except UnicodeDecodeError:
        return decode_bytes(raw)


def _row_id(row: dict[str, Any], fields: JsonlFields) -> str:
    value = row.get(fields.id)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise _ParseError(f"missing id field {fields.id!r} (a string or number)")
    external_id = clean_text(str(value))
    if not external_id:
        raise _ParseError(f"empty id field {fields.id!r}")
    if external_id_too_long(external_id):
        raise _ParseError(_ID_TOO_LONG)
    return external_id


def _row_text(row: dict[str, Any], fields: JsonlFields, limits: DocumentLimits) -> str:
    value = row.get(fields.text)
    if not isinstance(value, str):
        raise _ParseError(f"missing text field {fields.text!r} (a string)")
    text = clean_text(value)
    problem = _too_long(text, limits) if text else NO_TEXT
    if problem:
        raise _ParseError(problem)
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
        raise _ParseError(_TOO_DEEP)
    cleaned: dict[str, Any] = _clean_json(metadata)
    return cleaned


_Parser = Callable[[bytes, DocumentLimits], _Parsed]
# suffix -> (metadata file_type, parser); .jsonl is handled apart since it yields many documents
_PARSERS: dict[str, tuple[str, _Parser]] = {
    ".txt": ("text", _parse_text),
    ".md": ("markdown", _parse_markdown),
    ".markdown": ("markdown", _parse_markdown),
    ".html": ("html", _parse_html),
    ".htm": ("html", _parse_html),
    ".pdf": ("pdf", _parse_pdf),
    ".docx": ("docx", _parse_docx),
}
