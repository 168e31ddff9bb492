"""The insights of one tenant: the figures analysts read in the `analytics` views
(migrations 0006 and 0008, docs/analysts.md), computed from the same tables with the same
definitions for the API. The service's login may not read those views (they show an analyst's
bound tenant only), so the definitions are repeated here; tests/api/test_console_api.py checks
that both give the same numbers.

Every query filters on the tenant (row-level security would too), on a window that starts at
`since`, and optionally on one collection. Days are UTC days (`date_trunc('day', ...)` with the
transaction's time zone set to UTC): an analyst gets the same ones after `SET TIME ZONE 'UTC'`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

WEAK_SCORE_THRESHOLD = 0.3
"""The top cosine similarity below which a dense, unreranked retrieval is weak: migration
0006's (and 0008's) `analytics.weak_retrieval` threshold."""

MAX_LISTED = 10
"""Weakest retrievals and negative feedback listed at most."""

# `q` is a query_log row; the filters every figure shares. `:collection` NULL: every collection.
_QUESTIONS_IN_WINDOW = """
    q.tenant_id = :tenant AND q.created_at >= :since
    AND (CAST(:collection AS uuid) IS NULL OR CAST(:collection AS uuid) = ANY(q.collection_ids))
"""

# analytics.queries_per_day: with a collection, that collection's row summed over endpoints;
# without, each question once (the view counts a question once in each collection it covered,
# so its rows summed over collections would count a question over all of them once per each).
_QUERIES_PER_DAY = f"""
SELECT date_trunc('day', q.created_at)::date AS day, count(*) AS queries
FROM query_log q
WHERE {_QUESTIONS_IN_WINDOW}
GROUP BY 1 ORDER BY 1
"""

# analytics.cache_hit_rate (which has no collection: with one, its questions only).
_CACHE_PER_DAY = f"""
SELECT date_trunc('day', q.created_at)::date AS day,
       count(*) AS lookups,
       count(*) FILTER (WHERE (q.cache ->> 'hit')::boolean) AS hits,
       round(count(*) FILTER (WHERE (q.cache ->> 'hit')::boolean)::numeric / count(*), 4)
           AS hit_rate
FROM query_log q
WHERE jsonb_typeof(q.cache) = 'object' AND {_QUESTIONS_IN_WINDOW}
GROUP BY 1 ORDER BY 1
"""

# analytics.stage_latency over the whole window instead of per day.
_STAGE_LATENCY = f"""
SELECT s.key AS stage,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY s.value::text::double precision) AS p50_ms,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY s.value::text::double precision) AS p95_ms,
       count(*) AS samples
FROM query_log q
CROSS JOIN LATERAL jsonb_each(q.timings) AS s(key, value)
WHERE jsonb_typeof(q.timings) = 'object' AND jsonb_typeof(s.value) = 'number'
  AND {_QUESTIONS_IN_WINDOW}
GROUP BY 1
"""

# analytics.weak_retrieval's rows, lowest top score first (nothing retrieved before anything).
_WEAKEST = f"""
SELECT q.id, q.question, (q.retrieved -> 0 ->> 'score')::double precision AS top_score,
       q.created_at,
       CASE
           WHEN jsonb_array_length(q.retrieved) = 0 THEN 'nothing_retrieved'
           WHEN q.params ->> 'mode' = 'dense'
                AND coalesce((q.params ->> 'rerank')::boolean, false) = false
                AND (q.retrieved -> 0 ->> 'score')::double precision < :threshold
               THEN 'low_score'
           ELSE 'no_citations'
       END AS reason
FROM query_log q
WHERE q.status IN ('ok', 'extractive')
  AND coalesce((q.cache ->> 'hit')::boolean, false) = false
  AND (jsonb_array_length(q.retrieved) = 0
       OR jsonb_array_length(q.citations) = 0
       OR (q.params ->> 'mode' = 'dense'
           AND coalesce((q.params ->> 'rerank')::boolean, false) = false
           AND (q.retrieved -> 0 ->> 'score')::double precision < :threshold))
  AND {_QUESTIONS_IN_WINDOW}
ORDER BY top_score ASC NULLS FIRST, q.created_at DESC, q.id
LIMIT :limit
"""

# analytics.negative_feedback's rows, newest first; the window is on the feedback's time.
_NEGATIVE_FEEDBACK = """
SELECT f.query_id, q.question, q.answer, f.scale, f.rating, f.comment, f.corrected_answer,
       f.created_at
FROM feedback f
JOIN query_log q ON q.id = f.query_id AND q.tenant_id = f.tenant_id
WHERE ((f.scale = 'thumbs' AND f.rating = -1) OR (f.scale = 'stars' AND f.rating <= 2))
  AND f.tenant_id = :tenant AND f.created_at >= :since
  AND (CAST(:collection AS uuid) IS NULL OR CAST(:collection AS uuid) = ANY(q.collection_ids))
ORDER BY f.created_at DESC, f.id
LIMIT :limit
"""


@dataclass(frozen=True, slots=True)
class DayQueries:
    day: date
    queries: int


@dataclass(frozen=True, slots=True)
class DayCache:
    day: date
    lookups: int
    hits: int
    hit_rate: float


@dataclass(frozen=True, slots=True)
class StageLatency:
    stage: str
    p50_ms: float
    p95_ms: float
    count: int


@dataclass(frozen=True, slots=True)
class WeakRetrieval:
    query_id: uuid.UUID
    question: str
    top_score: float | None
    created_at: datetime
    reason: str


@dataclass(frozen=True, slots=True)
class NegativeFeedback:
    query_id: uuid.UUID
    question: str
    answer: str | None
    scale: str
    rating: int | None
    comment: str | None
    corrected_answer: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Insights:
    since: datetime
    queries_per_day: list[DayQueries]
    cache_per_day: list[DayCache]
    stage_latency: list[StageLatency]
    weakest: list[WeakRetrieval]
    negative_feedback: list[NegativeFeedback]


# The pipeline's order; a stage not named here comes after these, by name.
_STAGE_ORDER = ("cache_lookup", "embed", "search", "rerank", "context", "generate", "total")


def insights(
    session: Session, tenant_id: uuid.UUID, *, days: int, collection_id: uuid.UUID | None
) -> Insights:
    """The tenant's figures over the last `days` UTC days, today included."""
    session.execute(text("SET LOCAL TIME ZONE 'UTC'"))
    since = session.execute(
        text("SELECT date_trunc('day', now()) - make_interval(days => :days - 1)"),
        {"days": days},
    ).scalar_one()
    params: dict[str, Any] = {
        "tenant": tenant_id,
        "since": since,
        "collection": collection_id,
        "threshold": WEAK_SCORE_THRESHOLD,
        "limit": MAX_LISTED,
    }

    def rows(query: str) -> list[Any]:
        return list(session.execute(text(query), params))

    stages = [
        StageLatency(row.stage, float(row.p50_ms), float(row.p95_ms), int(row.samples))
        for row in rows(_STAGE_LATENCY)
    ]
    stages.sort(key=_stage_rank)
    return Insights(
        since=since,
        queries_per_day=[DayQueries(row.day, int(row.queries)) for row in rows(_QUERIES_PER_DAY)],
        cache_per_day=[
            DayCache(row.day, int(row.lookups), int(row.hits), float(row.hit_rate))
            for row in rows(_CACHE_PER_DAY)
        ],
        stage_latency=stages,
        weakest=[WeakRetrieval(*row) for row in rows(_WEAKEST)],
        negative_feedback=[NegativeFeedback(*row) for row in rows(_NEGATIVE_FEEDBACK)],
    )


def _stage_rank(stage: StageLatency) -> tuple[int, str]:
    known = stage.stage in _STAGE_ORDER
    return (_STAGE_ORDER.index(stage.stage) if known else len(_STAGE_ORDER), stage.stage)
