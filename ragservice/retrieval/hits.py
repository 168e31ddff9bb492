"""A search's hits as the searcher returns them: each hit, the result, and the downweighting
of flagged chunks."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from ragservice.types import PageSpan


@dataclass(frozen=True, slots=True)
class SearchHit:
    chunk_id: uuid.UUID
    score: float
    text: str
    ordinal: int
    start_char: int
    end_char: int
    chunk_metadata: dict[str, Any]
    collection_id: uuid.UUID
    collection: str
    document_id: uuid.UUID
    external_id: str
    title: str | None
    document_metadata: dict[str, Any]
    document_version: int = 1
    # The injection detector's reasons when it flagged the chunk (empty: not flagged), and
    # what the chunk's collection does with flagged chunks (mark, downweight, drop).
    injection: tuple[str, ...] = ()
    flagged_policy: str = "downweight"
    pages: PageSpan | None = None  # where in a paged document (pages, slides, sheets) it lies

    @property
    def flagged(self) -> bool:
        return bool(self.injection)


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Hits best first, the milliseconds each stage took (only the stages that ran), and the
    id of the embedding model searched with."""

    hits: list[SearchHit]
    timings_ms: dict[str, float] = field(default_factory=dict)
    model_id: int | None = None


# A flagged chunk in a `downweight` collection keeps half its score (a negative cosine score
# moves as far down): it still ranks, after unflagged chunks of a similar score.
_DOWNWEIGHT = 0.5


def downweight_flagged(hits: list[SearchHit]) -> list[SearchHit]:
    """`hits` with the flagged ones of `downweight` collections scored lower, best first."""
    if not any(_downweighted(hit) for hit in hits):
        return hits  # the common case: nothing to rescore, the order stands
    weighed = [
        replace(hit, score=hit.score - abs(hit.score) * _DOWNWEIGHT) if _downweighted(hit) else hit
        for hit in hits
    ]
    return sorted(weighed, key=lambda hit: (-hit.score, hit.chunk_id))


def _downweighted(hit: SearchHit) -> bool:
    return hit.flagged and hit.flagged_policy == "downweight"


def row_hit(row: tuple[Any, ...]) -> SearchHit:
    return SearchHit(
        chunk_id=row[0],
        score=float(row[1]),
        text=row[2],
        ordinal=row[3],
        start_char=row[4],
        end_char=row[5],
        chunk_metadata=row[6],
        collection_id=row[7],
        collection=row[8],
        document_id=row[9],
        external_id=row[10],
        title=row[11],
        document_metadata=row[12],
        document_version=row[13],
        injection=tuple(str(reason) for reason in (row[6] or {}).get("injection") or ()),
        flagged_policy=row[14],
        pages=None if row[15] is None else PageSpan.of_chunk(row[15], row[16], row[6] or {}),
    )
