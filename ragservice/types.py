"""Plain value types shared by ingestion, chunking and the store. Imports nothing internal."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

SUPPORTED_SUFFIXES: tuple[str, ...] = (
    ".txt",
    ".md",
    ".markdown",
    ".html",
    ".htm",
    ".pdf",
    ".docx",
    ".jsonl",
    ".parquet",
)
"""File types the loaders read; the API refuses other uploads with 415 before queueing them."""


def file_type(name: str) -> str:
    """The suffix of the file `name` that picks its loader (`.pdf`), lower case; "" when it has
    none or one no loader reads. The one test of a file's type, at upload and in the job alike:
    a name such as `.txt` has no suffix (it is a hidden file's name), as for `pathlib`."""
    suffix = PurePosixPath(name).suffix.lower()
    return suffix if suffix in SUPPORTED_SUFFIXES else ""


Scale = Literal["thumbs", "stars"]
"""A rating's scale: thumbs are +1/-1, stars 1 to 5."""

TextFormat = Literal["text", "markdown"]
"""How a loaded text is structured: `markdown` texts carry `#` headings the chunker follows."""


PAGE_SEPARATOR = "\n\n"
"""What joins the pages' texts of a paged document (a PDF) into its text."""

CHUNK_SEPARATOR = "\n\n"
"""What joins a document's precomputed chunks into its text (and so sets their offsets)."""


@dataclass(frozen=True, slots=True)
class PageSpan:
    """The pages, 1-based and inclusive, a piece of a paged document (a PDF) lies on."""

    first: int
    last: int

    @property
    def numbers(self) -> list[int]:
        """Every page from the first to the last."""
        return list(range(self.first, self.last + 1))

    @property
    def label(self) -> str:
        """How a citation names the pages: `p. 3`, or `pp. 3\u20134` for more than one."""
        if self.first == self.last:
            return f"p. {self.first}"
        return f"pp. {self.first}\u2013{self.last}"

    @classmethod
    def covering(cls, spans: Iterable[PageSpan | None]) -> PageSpan | None:
        """From the first page of `spans` to their last (None among them left out); None
        when none is known."""
        known = [span for span in spans if span is not None]
        if not known:
            return None
        return cls(min(span.first for span in known), max(span.last for span in known))


@dataclass(frozen=True, slots=True)
class PrecomputedChunks:
    """A document's own chunks with their vectors, embedded elsewhere (a bulk import).

    `vectors` has one float32 row per text; `where` names the input (`file:line`, `file rows
    a-b`) so that a refusal (a dimension the model does not have) can point at it.
    """

    texts: tuple[str, ...]
    metadata: tuple[dict[str, Any], ...]
    vectors: npt.NDArray[np.float32]
    where: str


@dataclass(frozen=True, slots=True)
class LoadedDocument:
    """One document as a loader produced it, before chunking.

    `text` is clean UTF-8 with no NUL bytes. HTML and DOCX loaders render headings as
    Markdown `#` lines and set `format="markdown"` so chunking can follow the headings.
    """

    external_id: str
    text: str
    title: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    format: TextFormat = "text"
    precomputed: PrecomputedChunks | None = None
    """The chunks and vectors the document came with; None: chunk and embed `text` here."""
    page_starts: tuple[int, ...] = ()
    """Where each page starts in `text` (page n at index n - 1), for a paged document (a
    PDF); empty for a document without pages. An empty page starts where the text before it
    ends."""
    readers: tuple[str, ...] | None = None
    """Who may read it (`user:…`, `group:…`, checked); None: not said (a stored document keeps
    its readers, a new one is the whole tenant's); empty: the whole tenant."""


@dataclass(frozen=True, slots=True)
class LoadFailure:
    """A file (or JSONL line) that could not be parsed, with a reason a person can act on."""

    source: str
    reason: str


@dataclass(frozen=True, slots=True)
class TextChunk:
    """A piece of a document's text: `text == document_text[start_char:end_char]`."""

    ordinal: int
    text: str
    start_char: int
    end_char: int
    token_count: int
    metadata: dict[str, Any] = field(default_factory=dict)
    pages: PageSpan | None = None
    """The pages the chunk lies on; None for a document without pages."""


class Tokenizer(Protocol):
    """The slice of a tokenizer that chunking needs: token character spans, no special tokens."""

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """Return the (start, end) character offsets of each token of `text`."""
        ...
