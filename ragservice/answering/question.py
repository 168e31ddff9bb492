"""What one answer starts from: the `Question` (resolved and tenant-checked), and its embedding,
computed at most once per request (`QuestionVector`) and handed to every step that needs it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from ragservice.answering.prompt import ChatMessage
from ragservice.observability import tracing
from ragservice.retrieval.search import QueryModel, SearchOptions

Vector = npt.NDArray[np.float32]

AnswerStatus = Literal["ok", "extractive", "upstream_error", "error"]
ANSWER_STATUSES: tuple[AnswerStatus, ...] = ("ok", "extractive", "upstream_error", "error")


@dataclass(frozen=True)
class Question:
    """What to answer, and where to look; collection ids are resolved and tenant-checked."""

    text: str
    tenant_id: uuid.UUID
    collection_ids: Sequence[uuid.UUID]
    options: SearchOptions
    rerank: bool | None = None
    fallback_extractive: bool = False
    history: Sequence[ChatMessage] = ()
    endpoint: str = "query"
    max_tokens: int | None = None
    temperature: float | None = None
    use_cache: bool = True
    refresh_cache: bool = False


class QuestionVector:
    """The question's embedding by the request's model: computed on the first `get()` (the
    cache lookup's, retrieval's or the cache store's), never again; `embed_ms` times it."""

    def __init__(self, model: QueryModel, text: str) -> None:
        self._model = model
        self._text = text
        self._vector: Vector | None = None
        self.embed_ms = 0.0

    def get(self) -> Vector:
        if self._vector is None:
            started = time.perf_counter()
            with tracing.span("embed"):
                self._vector = self._model.embed_query(self._text)
            self.embed_ms = (time.perf_counter() - started) * 1000
        return self._vector

    @property
    def computed(self) -> Vector | None:
        """The vector if a step needed it already, else None."""
        return self._vector
