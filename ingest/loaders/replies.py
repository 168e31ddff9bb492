"""A parse's result across the sandbox's pipe: `Parsed` as JSON, and the parent's checks of it.

The parent trusts nothing a parser's process sends: a parser that misbehaves on a hostile file
(or a bug) must not give the parent a page map past the end of its text, a million sheet names
or gigabytes of "attachments". So every structural field is checked against the text and the
limits before a `Parsed` is built, and a reply that does not fit is a per-file ParseError.
Children's bytes travel base64-encoded inside the JSON reply (small next to the text they hold).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Mapping
from typing import Any

from ingest.loaders.cleaning import clean_json, clean_text, collapse
from ingest.loaders.parsing import Child, Parsed, ParseError
from ragservice.limits.documents import DocumentLimits
from ragservice.types import PageUnit, TextFormat

MAX_CHILDREN = 10_000
"""The most embedded files (attachments, an mbox's messages) one file may hold."""
MAX_CHILDREN_BYTES = 256 * 2**20
"""Their total size: an e-mail's attachments are no larger than the message that carries them,
and a zip-based container unpacks to no more than `archives.MAX_UNPACKED`."""
MAX_NAME_CHARS = 255
"""The longest page name (Excel allows 31 characters) or embedded file's name."""

_UNITS: tuple[PageUnit, ...] = ("page", "slide", "sheet")
_FORMATS: tuple[TextFormat, ...] = ("text", "markdown")


def encode_parsed(parsed: Parsed) -> dict[str, Any]:
    """`parsed` as JSON-ready values (the child's side); children's bytes as base64."""
    fields = {f.name: getattr(parsed, f.name) for f in dataclasses.fields(parsed)}
    fields["children"] = [
        {"name": c.name, "data": base64.b64encode(c.data).decode("ascii"), "metadata": c.metadata}
        for c in parsed.children
    ]
    return fields


def decode_parsed(reply: Mapping[str, Any], limits: DocumentLimits) -> Parsed:
    """The child's `ok` reply as a `Parsed`, every field checked (the parent's side)."""
    text = reply.get("text")
    if not isinstance(text, str) or reply.get("format") not in _FORMATS:
        raise ParseError("the parser's reply is not a document")
    title = reply.get("title")
    metadata = reply.get("metadata")
    starts = checked_page_starts(reply.get("page_starts"), len(text), limits.max_pages)
    return Parsed(
        text,
        title if isinstance(title, str) else None,
        reply["format"],
        metadata if isinstance(metadata, dict) else {},
        starts,
        _page_unit(reply.get("page_unit")),
        _page_names(reply.get("page_names"), len(starts)),
        _row_starts(reply.get("row_starts"), len(text)),
        _children(reply.get("children")),
    )


def checked_page_starts(value: object, length: int, max_pages: int) -> tuple[int, ...]:
    """The child's page map, checked: at most one start per page the limits allow, in order,
    within the text."""
    if not value:
        return ()
    starts = tuple(value) if isinstance(value, list) else ()
    fits = 0 < len(starts) <= max_pages and all(type(s) is int for s in starts)
    if not fits or list(starts) != sorted(starts) or starts[0] < 0 or starts[-1] > length:
        raise ParseError("the parser's page map does not fit its text")
    return starts


def _page_unit(value: object) -> PageUnit:
    for unit in _UNITS:
        if value == unit:
            return unit
    raise ParseError("the parser's page unit is not one of page, slide, sheet")


def _page_names(value: object, pages: int) -> tuple[str, ...]:
    """One short name per page, or none at all."""
    if not value:
        return ()
    names = tuple(value) if isinstance(value, list) else ()
    if len(names) != pages or not all(isinstance(n, str) for n in names):
        raise ParseError("the parser's page names do not match its pages")
    return tuple(clean_text(collapse(name))[:MAX_NAME_CHARS] for name in names)


def _row_starts(value: object, length: int) -> tuple[tuple[int, int], ...]:
    """(offset, row number) pairs: offsets strictly increasing within the text (so at most one
    row per character), row numbers positive."""
    if not value:
        return ()
    if not isinstance(value, list):
        raise ParseError("the parser's row map does not fit its text")
    rows: list[tuple[int, int]] = []
    previous = -1
    for pair in value:
        fits = isinstance(pair, list) and len(pair) == 2 and all(type(n) is int for n in pair)
        if not fits or not previous < pair[0] <= length or pair[1] < 1:
            raise ParseError("the parser's row map does not fit its text")
        rows.append((pair[0], pair[1]))
        previous = pair[0]
    return tuple(rows)


def _children(value: object) -> tuple[Child, ...]:
    """The embedded files: bounded in number and in total size, each with a usable name."""
    if not value:
        return ()
    if not isinstance(value, list):
        raise ParseError("the parser's embedded files are malformed")
    if len(value) > MAX_CHILDREN:
        raise ParseError(f"the file holds more than {MAX_CHILDREN} embedded files")
    children: list[Child] = []
    total = 0
    for item in value:
        child = _child(item)
        total += len(child.data)
        if total > MAX_CHILDREN_BYTES:
            raise ParseError(
                f"the file's embedded files come to more than {MAX_CHILDREN_BYTES // 2**20} MiB"
            )
        children.append(child)
    return tuple(children)


def _child(item: object) -> Child:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise ParseError("the parser's embedded file is malformed")
    encoded, metadata = item.get("data"), item.get("metadata")
    if not isinstance(encoded, str) or len(encoded) > MAX_CHILDREN_BYTES * 4 // 3 + 4:
        raise ParseError("the parser's embedded file is malformed")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ParseError("the parser's embedded file is malformed") from None
    meta = clean_json(metadata) if isinstance(metadata, dict) else {}
    return Child(child_name(item["name"]), data, meta)


def child_name(name: str) -> str:
    """A name fit for the last segment of an external id: clean, one line, no `/` or `\\`,
    not `.` or `..`, at most `MAX_NAME_CHARS` (the suffix kept)."""
    cleaned = collapse(clean_text(name)).replace("/", "_").replace("\\", "_")
    if cleaned in ("", ".", ".."):
        return "attachment"
    if len(cleaned) <= MAX_NAME_CHARS:
        return cleaned
    stem, dot, suffix = cleaned.rpartition(".")
    if not dot or len(suffix) > 16:
        return cleaned[:MAX_NAME_CHARS]
    return stem[: MAX_NAME_CHARS - len(suffix) - 1] + "." + suffix
