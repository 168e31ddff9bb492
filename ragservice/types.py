"""Plain value types shared by ingestion, chunking and the store. Imports nothing internal."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

if TYPE_CHECKING:  # only annotations: the CLI's --help imports this module, numpy stays unloaded
    import numpy as np
    import numpy.typing as npt


class JobStatus(StrEnum):
    """Where an ingest job is: waiting for a worker, being run, or ended, well or not. The one
    list of them: the store, the workers, the API, the CLI and the client use it, and the
    console's `js/jobs.js` mirrors it (a test holds the two equal)."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


ACTIVE_JOB_STATUSES: tuple[JobStatus, ...] = (JobStatus.QUEUED, JobStatus.RUNNING)
"""A job not yet ended: a source has at most one such run at a time."""

FINISHED_JOB_STATUSES: tuple[JobStatus, ...] = (JobStatus.DONE, JobStatus.FAILED)
"""A job that has ended."""


Scale = Literal["thumbs", "stars"]
"""A rating's scale: thumbs are +1/-1, stars 1 to 5."""

PageUnit = Literal["page", "slide", "sheet"]
"""What a paged document's pages are: PDF pages, a deck's slides, a workbook's sheets."""

TextFormat = Literal["text", "markdown"]
"""How a loaded text is structured: `markdown` texts carry `#` headings the chunker follows."""


PAGE_SEPARATOR = "\n\n"
"""What joins the pages' texts of a paged document (a PDF) into its text."""

CHUNK_SEPARATOR = "\n\n"
"""What joins a document's precomputed chunks into its text (and so sets their offsets)."""


@dataclass(frozen=True, slots=True)
class PageSpan:
    """Where in a paged document a piece lies: its pages, 1-based and inclusive (PDF pages, a
    deck's slides, a workbook's sheets, as `unit` says), and for a sheet its name and the
    rows the piece holds."""

    first: int
    last: int
    unit: PageUnit = "page"
    name: str | None = None
    """The sheet's name (a workbook's page), when the piece lies on one named sheet."""
    rows: tuple[int, int] | None = None
    """The first and last spreadsheet row the piece holds (its header row aside)."""

    @property
    def numbers(self) -> list[int]:
        """Every page from the first to the last."""
        return list(range(self.first, self.last + 1))

    @property
    def label(self) -> str:
        """How a citation names the place: `p. 3`, `pp. 3\u20134`, `slide 4`, `slides 4\u20135`,
        `sheet "Q3", rows 12\u201340` (`rows 12\u201340` for a sheet without a name)."""
        if self.unit == "sheet":
            return self._sheet_label()
        single, plural = ("slide ", "slides ") if self.unit == "slide" else ("p. ", "pp. ")
        if self.first == self.last:
            return f"{single}{self.first}"
        return f"{plural}{self.first}\u2013{self.last}"

    def _sheet_label(self) -> str:
        if self.first != self.last:
            return f"sheets {self.first}\u2013{self.last}"
        parts = [f'sheet "{self.name}"'] if self.name else []
        if self.rows is not None:
            low, high = self.rows
            parts.append(f"row {low}" if low == high else f"rows {low}\u2013{high}")
        return ", ".join(parts) or f"sheet {self.first}"

    @classmethod
    def covering(cls, spans: Iterable[PageSpan | None]) -> PageSpan | None:
        """From the first page of `spans` to their last (None among them left out); None
        when none is known. Rows and a sheet's name are kept where every span has the same
        name, and rows."""
        known = [span for span in spans if span is not None]
        if not known:
            return None
        first, last = min(s.first for s in known), max(s.last for s in known)
        names = {s.name for s in known}
        name = known[0].name if len(names) == 1 and first == last else None
        rows: tuple[int, int] | None = None
        if name is not None or (first == last and names == {None}):
            row_spans = [s.rows for s in known]
            if all(r is not None for r in row_spans):
                rows = (min(r[0] for r in row_spans if r), max(r[1] for r in row_spans if r))
        return cls(first, last, known[0].unit, name, rows)

    def as_json(self) -> dict[str, Any]:
        """What the span says beyond its page numbers, in the keys chunk metadata uses
        (`of_chunk` reads them back): for a cached answer's sources."""
        rows = None if self.rows is None else list(self.rows)
        return {"page_unit": self.unit, "sheet": self.name, "rows": rows}

    @classmethod
    def from_json(cls, numbers: Sequence[int], place: Mapping[str, Any] | None) -> PageSpan | None:
        """The span of `numbers` (pages) and `place` (`as_json`; None: plain pages)."""
        if not numbers:
            return None
        return cls.of_chunk(min(numbers), max(numbers), place or {})

    @classmethod
    def of_chunk(cls, first: int, last: int, metadata: Mapping[str, Any]) -> PageSpan:
        """A stored chunk's span: its pages and what its metadata says of them (`page_unit`,
        `sheet`, `rows`)."""
        unit: PageUnit = "slide" if metadata.get("page_unit") == "slide" else "page"
        if metadata.get("page_unit") == "sheet":
            unit = "sheet"
        rows = metadata.get("rows")
        return cls(
            first,
            last,
            unit,
            metadata.get("sheet") if isinstance(metadata.get("sheet"), str) else None,
            (int(rows[0]), int(rows[1])) if isinstance(rows, list) and len(rows) == 2 else None,
        )


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
    page_unit: PageUnit = "page"
    """What `page_starts` counts: PDF pages, slides of a deck, sheets of a workbook."""
    page_names: tuple[str, ...] = ()
    """A name per page where pages have names (a workbook's sheets); empty otherwise."""
    row_starts: tuple[tuple[int, int], ...] = ()
    """(offset in `text`, row number) of each table row that has a number of its own (a
    spreadsheet's rows), in text order; chunks of such rows are cited by their rows."""


@dataclass(frozen=True, slots=True)
class LoadFailure:
    """A file (or JSONL line) that could not be parsed, with a reason a person can act on."""

    source: str
    reason: str


@dataclass(frozen=True, slots=True)
class SkippedFile:
    """A file found but not read, on purpose: a type no loader reads inside a folder given,
    an e-mail's attachment no loader reads. Not a failure (the ingest still succeeds), but
    counted and listed, so that no file is left out without a word."""

    source: str
    reason: str


LoadResult: TypeAlias = LoadedDocument | LoadFailure | SkippedFile
"""What loading gives per document, per file that failed, and per file skipped on purpose."""


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
