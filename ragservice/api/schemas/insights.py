"""The insights of the caller's tenant: the figures of the analysts' `analytics` views."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from datetime import date, datetime

from pydantic import BaseModel, Field

from ragservice.store.insights import Insights

MAX_INSIGHT_DAYS = 365


class DayQueriesOut(BaseModel):
    day: date
    queries: int = Field(description="questions asked (over the collection, if one is given)")


class DayCacheOut(BaseModel):
    day: date
    lookups: int = Field(description="questions that consulted the prompt cache")
    hits: int
    hit_rate: float = Field(description="hits / lookups, 0..1, to 4 decimals")


class StageLatencyOut(BaseModel):
    stage: str = Field(description="cache_lookup, embed, search, rerank, context, generate, total")
    p50_ms: float
    p95_ms: float
    count: int = Field(description="questions timed in this stage")


class WeakRetrievalOut(BaseModel):
    query_id: uuid.UUID
    question: str
    top_score: float | None = Field(description="the best hit's score; null: nothing retrieved")
    created_at: datetime
    reason: str = Field(description="`nothing_retrieved`, `low_score` or `no_citations`")


class NegativeFeedbackOut(BaseModel):
    query_id: uuid.UUID
    question: str
    answer: str | None
    scale: str = Field(description="`thumbs` or `stars`")
    rating: int | None
    comment: str | None
    corrected_answer: str | None
    created_at: datetime = Field(description="when the feedback was given")


class InsightsOut(BaseModel):
    days: int
    since: datetime = Field(description="the window's start: a UTC midnight, `days` - 1 ago")
    queries_per_day: list[DayQueriesOut] = Field(description="days without questions left out")
    cache_per_day: list[DayCacheOut]
    stage_latency: list[StageLatencyOut] = Field(description="over the whole window")
    weakest: list[WeakRetrievalOut] = Field(description="the 10 weakest, lowest score first")
    negative_feedback: list[NegativeFeedbackOut] = Field(description="the 10 newest")


def insights_out(insights: Insights, days: int) -> InsightsOut:
    return InsightsOut.model_validate({"days": days, **asdict(insights)})
