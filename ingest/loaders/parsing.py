"""What a format's parser returns and raises, shared by the format modules and `loading`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ingest.loaders.cleaning import clean_text
from ragservice.types import LoadResult, PageUnit, TextFormat

__all__ = ["Child", "LoadResult", "ParseError", "Parsed", "bad_content", "describe"]


@dataclass(frozen=True)
class Child:
    """A file inside a parsed file that is a document of its own: an e-mail's attachment, a
    message of an mbox. It is parsed by the suffix of `name`, linked to its parent."""

    name: str
    data: bytes
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Parsed:
    text: str
    title: str | None
    format: TextFormat
    metadata: dict[str, Any] = field(default_factory=dict)
    page_starts: tuple[int, ...] = ()
    """Where each page starts in `text` (see `LoadedDocument.page_starts`)."""
    page_unit: PageUnit = "page"
    page_names: tuple[str, ...] = ()
    row_starts: tuple[tuple[int, int], ...] = ()
    """See `LoadedDocument`: what the pages are, their names, and numbered table rows."""
    children: tuple[Child, ...] = ()
    """Files inside this one to load as documents of their own."""


class ParseError(Exception):
    """Bad content; the message is the reason a person reads."""


@contextmanager
def bad_content(what: str) -> Iterator[None]:
    """Turn any library error into a `ParseError("what: detail")`.

    Parsers for PDF, DOCX and HTML raise many exception types on damaged input (ValueError,
    KeyError, zipfile errors, their own), so only a broad catch keeps a batch going.
    """
    try:
        yield
    except (ParseError, MemoryError):
        raise  # a MemoryError is the sandbox's to report ("used more than N MiB")
    except Exception as exc:
        raise ParseError(f"{what}: {describe(exc)}") from exc


def describe(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    detail = lines[0] if lines else type(exc).__name__
    return clean_text(detail[:200])
