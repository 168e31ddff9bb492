"""Context assembly: ranked search hits in, the numbered sources block a model reads out.

Pure functions: no database, no model. The caller passes the token counter of the model that
reads the prompt and any neighbouring chunks it fetched (same document, ordinal ± n).

1. Hits of one document that overlap or follow each other (consecutive ordinals) become one
   passage. The overlap the chunker left between chunks is written once, using the character
   offsets; consecutive chunks that do not overlap are joined with a newline, because the
   whitespace trimmed between them is not stored.
2. Passages are taken greedily, best rank first, while the whole formatted block fits the
   budget, counted on the exact text with its header lines. One that does not fit is skipped; a
   smaller later one may still fit. If not even the best fits alone, its best chunk onward is
   cut at the last word that fits, so a tight budget still yields a source.
3. Only then do neighbours extend the chosen passages, one chunk at a time, nearest first and
   every passage in turn, while the block still fits: they add continuity and never take the
   place of a hit.
4. Sources are numbered in prompt order, which is rank order: `[1]` is the most relevant
   passage, so the best evidence comes first in the prompt and an extractive answer reads the
   sources in order. (Document order would read better for passages of one document, but it
   would bury the best evidence behind whatever happens to come first.)

The block, one entry per source, entries separated by a blank line:

    [1] Title (external_id)
    passage text

    [2] external_id
    passage text

The header is `[n] external_id` when the document has no title or the title is the id. A
passage of a paged document (a PDF, a deck, a workbook) names its pages after the id: `[1]
Title (report.pdf, p. 3)`, `[2] report.pdf, pp. 3\u20134`, `[3] deck.pptx, slide 4`.

Those pages are the hits' (`Passage.pages`, `_cited`): from the first page of the passage's
strong hits to the last of them, never those of the chunks that only give context. Its best
hit is strong, and so is any other hit in it that scored about as well as the best hit of the
whole search (`_STRONG`); the neighbours added around them never count, and neither do
weak hits that joined the passage only because they are next to a strong one (a search for
the 8 best chunks of a 4-slide deck finds every slide). So a hit on slide 3 grown by its
neighbours on slides 2 and 4 is cited as `slide 3`, not `slides 2\u20134`: the citation points
at the evidence, and the passage's text, with its context, stays as it is.

Titles, ids and passage text are neutralised (`safety.sources`) as they are written into the
block: a document cannot close the block, open another or forge a `[n]` header. `Source.text`
keeps the text as stored.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from ragservice.chunking import TABLE_HEADER, own_text
from ragservice.safety.sources import neutralise
from ragservice.types import PageSpan

if TYPE_CHECKING:
    # Only the shape of a hit is needed; importing search at runtime would pull in the database.
    from ragservice.retrieval.search import SearchHit

TokenCounter: TypeAlias = Callable[[str], int]

# Chunks of one document, in ordinal order, each overlapping or following the one before.
_Run: TypeAlias = "list[SearchHit]"

_WORD = re.compile(r"\S+")
_STRONG = 0.25
"""A hit whose score is within this share of the best hit's (measured from zero) is strong, and
cited beside its passage's best hit (`_cited`). The scores of one search are on one scale,
whatever its mode; a quarter keeps a chunk that matches about as well as the best one, and
drops one that only came along (a 4-slide deck searched for its 8 best chunks: in a hybrid
search, the slides beside the one that answers score a fifth as well as it)."""
# `[3]` or `[1, 4]`: models often cite several sources in one bracket.
_MARKER = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)\s*\]")


@dataclass(frozen=True, slots=True)
class Passage:
    """A contiguous piece of one document, made of one or more chunks.

    `text == document[start_char:end_char]` when its chunks overlap (or it has one chunk);
    consecutive chunks that do not overlap are joined with a newline instead of the unknown
    whitespace between them. `score` is the best score and `rank` the best (0-based) position
    among the hits in it; neighbours add text but no score.
    """

    document_id: uuid.UUID
    external_id: str
    title: str | None
    collection: str
    document_metadata: dict[str, Any]
    chunk_ids: tuple[uuid.UUID, ...]
    start_char: int
    end_char: int
    text: str
    score: float
    rank: int
    flagged: bool = False  # a chunk in it was flagged as instruction-like at ingest
    pages: PageSpan | None = None
    """Where its strong hits lie (`_cited`): from the first page (slide, sheet and rows) of
    those chunks to the last; its other chunks add text, not pages."""


@dataclass(frozen=True, slots=True)
class Source:
    """A passage as the prompt cites it: `[number]`, 1-based, in prompt order."""

    number: int
    document_id: uuid.UUID
    external_id: str
    title: str | None
    chunk_ids: tuple[uuid.UUID, ...]
    start_char: int
    end_char: int
    text: str
    score: float
    flagged: bool = False
    pages: PageSpan | None = None
    """The pages of the passage's strong hits (`Passage.pages`), which its citation names."""

    @property
    def cited_as(self) -> str:
        """How a reader sees the source named: `Title (report.pdf, p. 12)`, or
        `report.pdf, pp. 12\u201313` when it has no title of its own."""
        return cite_as(self.external_id, self.title, self.pages)

    @classmethod
    def of(cls, number: int, passage: Passage) -> Source:
        return cls(
            number=number,
            document_id=passage.document_id,
            external_id=passage.external_id,
            title=passage.title,
            chunk_ids=passage.chunk_ids,
            start_char=passage.start_char,
            end_char=passage.end_char,
            text=passage.text,
            score=passage.score,
            flagged=passage.flagged,
            pages=passage.pages,
        )


@dataclass(frozen=True, slots=True)
class Context:
    """The sources block for the prompt, its sources, its token count and the hits left out."""

    sources: list[Source]
    text: str
    token_count: int
    dropped: int


def assemble_context(
    hits: Sequence[SearchHit],
    *,
    count_tokens: TokenCounter,
    budget_tokens: int,
    neighbours: Sequence[SearchHit] = (),
) -> Context:
    """The sources block for `hits` (best first) within `budget_tokens` of `count_tokens`.

    `neighbours` are chunks next to the hits, fetched by the caller; their scores are ignored,
    and one that is not (through other neighbours) next to a chosen hit is ignored. `dropped`
    counts the distinct hits that are in no source.
    """
    if budget_tokens < 1:
        raise ValueError(f"budget_tokens must be at least 1, got {budget_tokens}")
    found = _found(hits)
    budget = _Budget(count_tokens, budget_tokens)
    core = sorted(_runs(_unique(hits, found)), key=lambda run: _best_rank(run, found))
    passages, whole = _select(core, found, budget)
    # A cut passage already fills the budget, and growing it would need the text cut off.
    if neighbours and len(whole) == len(passages):
        passages = _Growth(whole, neighbours, found, budget).grow()
    passages = budget.within(passages)
    text = _format(passages)
    kept = {chunk_id for passage in passages for chunk_id in passage.chunk_ids}
    return Context(
        sources=[Source.of(number, passage) for number, passage in enumerate(passages, 1)],
        text=text,
        token_count=count_tokens(text),
        dropped=sum(chunk_id not in kept for chunk_id in found.ranks),
    )


def extractive_answer(context: Context, *, max_sources: int = 3) -> str:
    """The answer without a model: the best sources' text, each followed by its marker.

    `"<text of [1]> [1]\\n\\n<text of [2]> [2]"`, at most `max_sources` of them. Whitespace in
    a passage is collapsed so each source stays one paragraph; no sources, an empty answer.
    """
    if max_sources < 1:
        raise ValueError(f"max_sources must be at least 1, got {max_sources}")
    best = sorted(context.sources, key=lambda source: source.number)[:max_sources]
    return "\n\n".join(f"{' '.join(s.text.split())} [{s.number}]" for s in best)


def citation_markers(text: str, *, source_count: int | None = None) -> list[int]:
    """Source numbers cited in `text` as `[n]` or `[n, m]`: first use first, each once.

    Numbers that cannot be sources are left out: 0, and above `source_count` when it is given
    (a year in brackets, a model's invented source).
    """
    numbers = (int(n) for match in _MARKER.finditer(text) for n in match[1].split(","))
    valid = (n for n in numbers if n >= 1 and (source_count is None or n <= source_count))
    return list(dict.fromkeys(valid))


def source_to_json(source: Source) -> dict[str, Any]:
    return {
        "number": source.number,
        "document_id": str(source.document_id),
        "external_id": source.external_id,
        "title": source.title,
        "chunk_ids": [str(chunk_id) for chunk_id in source.chunk_ids],
        "start_char": source.start_char,
        "end_char": source.end_char,
        "text": source.text,
        "score": source.score,
        "flagged": source.flagged,
        "pages": None if source.pages is None else source.pages.numbers,
        "place": None if source.pages is None else source.pages.as_json(),
    }


def source_from_json(item: dict[str, Any]) -> Source:
    return Source(
        number=int(item["number"]),
        document_id=uuid.UUID(item["document_id"]),
        external_id=str(item["external_id"]),
        title=item.get("title"),
        chunk_ids=tuple(uuid.UUID(chunk_id) for chunk_id in item["chunk_ids"]),
        start_char=int(item["start_char"]),
        end_char=int(item["end_char"]),
        text=str(item["text"]),
        score=float(item["score"]),
        flagged=bool(item.get("flagged", False)),
        pages=PageSpan.from_json(item.get("pages") or (), item.get("place")),
    )


# -- budget and format ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Budget:
    count_tokens: TokenCounter
    limit: int
    _counted: dict[str, int] = field(default_factory=dict)

    def fits(self, passages: Sequence[Passage]) -> bool:
        # Each entry is counted once and the counts summed: recounting the whole block for
        # every candidate cost 15 ms a question. Whether the sum is exact across the blank-line
        # joins depends on the tokenizer, so `within` checks the final block as a whole.
        return sum(self._count(entry) for entry in _entries(passages)) <= self.limit

    def within(self, passages: list[Passage]) -> list[Passage]:
        """`passages` less the least relevant ones, until the whole block really fits."""
        while passages and self.count_tokens(_format(passages)) > self.limit:
            passages = passages[:-1]
        return passages

    def _count(self, entry: str) -> int:
        if entry not in self._counted:
            self._counted[entry] = self.count_tokens(entry)
        return self._counted[entry]


def _format(passages: Sequence[Passage]) -> str:
    return "\n\n".join(_entries(passages))


def _entries(passages: Sequence[Passage]) -> list[str]:
    return [
        f"{_header(n, passage)}\n{neutralise(passage.text)}"
        for n, passage in enumerate(passages, 1)
    ]


def _header(number: int, passage: Passage) -> str:
    name = cite_as(neutralise(passage.external_id), neutralise(passage.title or ""), passage.pages)
    return f"[{number}] {name}"


def cite_as(external_id: str, title: str | None, pages: PageSpan | None) -> str:
    """A source's name on one line: `Title (external_id, p. 3)`; `external_id, pp. 3\u20134`
    when there is no title or the title is the id; without the pages when it has none."""
    # Collapsed whitespace: a newline in a title would break a one-line header.
    name = " ".join(external_id.split())
    title = " ".join((title or "").split())
    where = name if pages is None else f"{name}, {pages.label}"
    return where if not title or title == name else f"{title} ({where})"


# -- runs and passages ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Found:
    """The distinct hits: each one's rank (its first, best position in the hits) and the score
    a hit needs to be cited beside the best hit of its passage (`floor`)."""

    ranks: dict[uuid.UUID, int]
    floor: float

    def __contains__(self, chunk_id: object) -> bool:
        return chunk_id in self.ranks

    def __getitem__(self, chunk_id: uuid.UUID) -> int:
        return self.ranks[chunk_id]


def _found(hits: Sequence[SearchHit]) -> _Found:
    """The hits' ranks (a repeated chunk keeps its first, best one), and the score a hit
    needs to be strong: within `_STRONG` of the best score's height above zero (above the
    weakest score, where scores go below zero, as a reranker's do)."""
    ranks: dict[uuid.UUID, int] = {}
    for rank, hit in enumerate(hits):
        ranks.setdefault(hit.chunk_id, rank)
    scores = [hits[rank].score for rank in ranks.values()]
    if not scores:
        return _Found(ranks, 0.0)
    best, low = max(scores), min(0.0, *scores)
    return _Found(ranks, best - (best - low) * _STRONG)


def _unique(hits: Sequence[SearchHit], found: _Found) -> list[SearchHit]:
    return [hits[rank] for rank in found.ranks.values()]


def _best_rank(run: _Run, found: _Found) -> int:
    return min(found[chunk.chunk_id] for chunk in run if chunk.chunk_id in found)


def _runs(chunks: Iterable[SearchHit]) -> list[_Run]:
    by_document: dict[uuid.UUID, list[SearchHit]] = {}
    for chunk in chunks:
        by_document.setdefault(chunk.document_id, []).append(chunk)
    return [
        run
        for group in by_document.values()
        for run in _split(sorted(group, key=lambda chunk: chunk.ordinal))
    ]


def _split(group: list[SearchHit]) -> list[_Run]:
    """One document's chunks (by ordinal) cut where one neither overlaps nor follows the last."""
    runs: list[_Run] = []
    end = -1
    for chunk in group:
        if runs and (chunk.ordinal == runs[-1][-1].ordinal + 1 or chunk.start_char <= end):
            runs[-1].append(chunk)
            end = max(end, chunk.end_char)
        else:
            runs.append([chunk])
            end = chunk.end_char
    return runs


@dataclass(frozen=True, slots=True)
class _Piece:
    """The text one chunk adds to a run; it starts at `at` there, at `doc_start` in the document."""

    at: int
    doc_start: int
    text: str


def _pieces(run: _Run) -> tuple[str, list[_Piece]]:
    """The run's text, each part written once, and where each chunk's part lies in it. A run
    that starts inside a table starts with the table's header its first chunk repeats."""
    parts: list[str] = []
    pieces: list[_Piece] = []
    at, end = 0, run[0].start_char
    header = run[0].chunk_metadata.get(TABLE_HEADER) if run[0].chunk_metadata else None
    if isinstance(header, str) and run[0].text.startswith(header):
        parts.append(header + "\n")
        at = len(parts[0])
    for chunk in run:
        own = own_text(chunk.text, chunk.chunk_metadata or {})
        if chunk.start_char <= end:
            # Starts inside (or at the end of) the text so far: add only what follows it.
            doc_start, text = end, own[end - chunk.start_char :]
        else:
            doc_start, text = chunk.start_char, own
            parts.append("\n")
            at += 1
        parts.append(text)
        pieces.append(_Piece(at, doc_start, text))
        at, end = at + len(text), max(end, chunk.end_char)
    return "".join(parts), pieces


def _passage(run: _Run, found: _Found, text: str | None = None, end: int | None = None) -> Passage:
    """The passage of a run; `text` and `end` when it was cut short."""
    hits = [chunk for chunk in run if chunk.chunk_id in found]
    first = run[0]
    return Passage(
        document_id=first.document_id,
        external_id=first.external_id,
        title=first.title,
        collection=first.collection,
        document_metadata=first.document_metadata,
        chunk_ids=tuple(chunk.chunk_id for chunk in run),
        start_char=min(chunk.start_char for chunk in run),
        end_char=max(chunk.end_char for chunk in run) if end is None else end,
        text=_pieces(run)[0] if text is None else text,
        score=max(hit.score for hit in hits),
        rank=min(found[hit.chunk_id] for hit in hits),
        flagged=any(chunk.injection for chunk in run),
        pages=PageSpan.covering(hit.pages for hit in _cited(hits, found)),
    )


def _cited(hits: list[SearchHit], found: _Found) -> list[SearchHit]:
    """The hits a passage is cited by: its best, and every other strong one (`_Found.floor`);
    a weak hit that came along because it is next to a strong one is context, as a neighbour
    is."""
    best = min(hits, key=lambda hit: found[hit.chunk_id])
    return [hit for hit in hits if hit is best or hit.score >= found.floor]


def _passages(chunks: Iterable[SearchHit], found: _Found) -> list[Passage]:
    return sorted((_passage(run, found) for run in _runs(chunks)), key=lambda p: p.rank)


# -- selection -----------------------------------------------------------------------------------


def _select(core: list[_Run], found: _Found, budget: _Budget) -> tuple[list[Passage], list[_Run]]:
    """The passages that fit, best first, and the runs taken whole (all but a cut one)."""
    passages: list[Passage] = []
    whole: list[_Run] = []
    for run in core:
        passage = _passage(run, found)
        if budget.fits([*passages, passage]):
            passages.append(passage)
            whole.append(run)
        elif not passages and (cut := _truncate(run, found, budget)) is not None:
            passages.append(cut)
    return passages, whole


def _truncate(run: _Run, found: _Found, budget: _Budget) -> Passage | None:
    """The run from its best hit on, cut to the longest prefix that fits alone, or None.

    Cut after a word; within the first word only when not even that fits.
    """
    best = min(range(len(run)), key=lambda i: found[run[i].chunk_id])
    run = run[best:]
    text, pieces = _pieces(run)
    word_ends = [match.end() for match in _WORD.finditer(text)]
    if not word_ends:
        return None

    def cut(length: int) -> Passage:
        end = _document_position(pieces, length)
        kept = [chunk for chunk in run if chunk.start_char < end] or run[:1]
        return _passage(kept, found, text[:length], end)

    def fits(length: int) -> bool:
        return budget.fits([cut(length)])

    length = _longest(word_ends, fits) or _longest(range(1, word_ends[0]), fits)
    return None if length is None else cut(length)


def _document_position(pieces: list[_Piece], length: int) -> int:
    """Where the first `length` characters of a run's text end in the document."""
    before = [piece for piece in pieces if piece.at < length]
    if not before:  # within the repeated table header, which is no part of the document
        return pieces[0].doc_start
    piece = before[-1]
    return piece.doc_start + max(0, min(length - piece.at, len(piece.text)))


def _longest(lengths: Sequence[int], fits: Callable[[int], bool]) -> int | None:
    """The largest of the ascending `lengths` that fits, by bisection (more text, more tokens).

    Only a length seen to fit is returned, so a counter that is not monotonic costs some text,
    never the budget.
    """
    low, high, found = 0, len(lengths) - 1, None
    while low <= high:
        middle = (low + high) // 2
        if fits(lengths[middle]):
            found, low = lengths[middle], middle + 1
        else:
            high = middle - 1
    return found


# -- neighbours ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Edge:
    """One side of a chosen run: the next ordinal to try and the direction it grows in."""

    document_id: uuid.UUID
    ordinal: int
    step: int


class _Growth:
    """Chosen runs grown by neighbours: one chunk per run side per round, while all fits.

    Rounds go nearest first across all runs, so every hit gets its closest context before any
    gets a distant one. A side stops at the first chunk that is missing, is a hit, or does not
    fit. Runs that grow into each other merge into one passage.
    """

    def __init__(
        self,
        runs: list[_Run],
        neighbours: Sequence[SearchHit],
        found: _Found,
        budget: _Budget,
    ) -> None:
        self._found = found
        self._budget = budget
        self._chunks = [chunk for run in runs for chunk in run]
        self._taken = {chunk.chunk_id for chunk in self._chunks}
        self._passages = _passages(self._chunks, found)
        # A hit is never a neighbour: a dropped hit stays dropped, and growth stops at it.
        self._spare = {
            (chunk.document_id, chunk.ordinal): chunk
            for chunk in neighbours
            if chunk.chunk_id not in found
        }
        self._edges = [
            edge
            for run in runs
            for edge in (
                _Edge(run[-1].document_id, run[-1].ordinal + 1, 1),
                _Edge(run[0].document_id, run[0].ordinal - 1, -1),
            )
        ]

    def grow(self) -> list[Passage]:
        while self._edges:
            self._edges = [edge for edge in self._edges if self._extend(edge)]
        return self._passages

    def _extend(self, edge: _Edge) -> bool:
        """Add the chunk at the edge if it fits; whether the edge can grow further."""
        chunk = self._spare.get((edge.document_id, edge.ordinal))
        if chunk is None:
            return False
        if chunk.chunk_id not in self._taken:  # else another run grew into it already
            trial = _passages([*self._chunks, chunk], self._found)
            if not self._budget.fits(trial):
                return False
            self._chunks.append(chunk)
            self._taken.add(chunk.chunk_id)
            self._passages = trial
        edge.ordinal += edge.step
        return True
