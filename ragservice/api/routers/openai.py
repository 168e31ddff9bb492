"""OpenAI-compatible endpoints, so existing OpenAI clients work by changing `base_url`.

- `POST /v1/chat/completions`: retrieval-augmented. The last user message is the question, the
  `model` names where to look (`rag:<collection>`, `rag:<a>,<b>`, or `rag` for all of the
  key's collections); the answer cites `[n]` sources, listed at its end and in `citations`.
- `POST /v1/embeddings`: the service's embedding model (or another one this process holds
  loaded), from texts or from token id arrays (tiktoken's, or the model's own tokenizer's).
- `GET /v1/models`: the `rag:<collection>` models this key can use, and the embedding models.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from ragservice.answering.answer import Answer
from ragservice.answering.context import Source
from ragservice.answering.prompt import ChatMessage
from ragservice.api.charges import charge
from ragservice.api.deps import (
    AnswersDep,
    DatabaseDep,
    ModelsDep,
    Reader,
    SettingsDep,
    replica_reads,
)
from ragservice.api.schemas.common import error_responses
from ragservice.api.schemas.openai import ChatCompletionRequest, ChatMessageIn, EmbeddingsRequest
from ragservice.api.sse import frame, stream_answer
from ragservice.api.stopping import first_unless_stopping, stopping_of
from ragservice.errors import InvalidInputError, NotFoundError
from ragservice.limits.rate_limits import ANSWER_COST, embedding_cost
from ragservice.limits.request_bounds import (
    check_chat,
    check_text,
)
from ragservice.limits.results import ANSWER_K
from ragservice.limits.shape import MAX_COLLECTIONS_PER_REQUEST
from ragservice.safety.html import AnswerText
from ragservice.services import embeddings as embedding_service
from ragservice.services.answers import AskQuery
from ragservice.services.collections import collection_names
from ragservice.services.search import SearchQuery
from ragservice.services.views import answer_out

router = APIRouter(
    prefix="/v1",
    tags=["openai"],
    dependencies=[Depends(replica_reads)],
    responses=error_responses(502, 504),
)

MODEL_PREFIX = "rag"


@router.get("/models")
def list_models(principal: Reader, db: DatabaseDep, models: ModelsDep) -> dict[str, Any]:
    """One `rag:<collection>` chat model per collection of the key's tenant, `rag` for all, and
    the embedding models `/v1/embeddings` takes (`type` tells them apart)."""
    names = collection_names(db, principal.tenant_id)
    chat = [MODEL_PREFIX, *(f"{MODEL_PREFIX}:{name}" for name in names)]
    return {
        "object": "list",
        "data": [
            *({**_model_entry(m), "type": "chat"} for m in chat),
            *(
                {
                    **_model_entry(embedding_service.served_name(m, i)),
                    "type": "embedding",
                    "dimension": m.dimension,
                }
                for i, m in enumerate(models.loaded())
            ),
        ],
    }


def _model_entry(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "ragservice"}


@router.post("/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest,
    principal: Reader,
    settings: SettingsDep,
    answers: AnswersDep,
    request: Request,
) -> Any:
    """Answer the last user message from the model's collections, OpenAI style. A stream
    cut short because the server is stopping ends with a `data:` chunk whose `error` is
    `ServiceStopping`, then `data: [DONE]`."""
    question_text, history = _split_messages(body.messages)
    check_text(question_text, settings.limits, field="messages")
    max_tokens = body.max_completion_tokens or body.max_tokens
    forwarded = len(question_text) + sum(len(turn.content) for turn in history)
    check_chat(len(body.messages), forwarded, max_tokens, settings.limits)
    charge(request, principal.rate_key, ANSWER_COST, what="an answer")
    ask = AskQuery(
        search=SearchQuery(text=question_text, collections=_collections(body.model), k=ANSWER_K),
        history=history,
        endpoint="chat.completions",
        max_tokens=max_tokens,
        temperature=body.temperature,
        use_cache=_cache_flag(body),
    )
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    # The footer is added here, never stored: a cached answer follows the request's choice.
    answering = settings.answering
    block = answering.chat_sources_block if body.sources_block is None else body.sources_block
    # Titles in the sources footer are document text too: their links and HTML are cleaned.
    footer = _Footer(AnswerText(answering.link_host_names(), answering.html)) if block else None
    if not body.stream:
        answer = await answers.answer(principal.tenant_id, ask)
        return _completion(completion_id, body.model, answer, footer)
    events = await answers.stream(principal.tenant_id, ask)
    # Failures before the first token keep their status code (a stop: 503 ServiceStopping).
    first = await first_unless_stopping(events, stopping_of(request))
    return StreamingResponse(
        stream_answer(request, first, events, _ChatChunks(completion_id, body.model, footer)),
        media_type="text/event-stream",
    )


@router.post("/embeddings")
async def embeddings(
    body: EmbeddingsRequest,
    principal: Reader,
    settings: SettingsDep,
    models: ModelsDep,
    request: Request,
) -> Any:
    """Embed texts, or token id arrays (tiktoken's ids, decoded to their texts; or the model's
    own tokenizer's, RAGSERVICE_EMBEDDING_TOKEN_IDS), with the requested embedding model
    (normalized vectors, cosine-ready)."""
    planned = embedding_service.plan(models, settings.limits, body.model, body.input)
    noun, count = planned.noun, planned.count
    charge(request, principal.rate_key, embedding_cost(count), what=f"{count} {noun}")
    embedded = await embedding_service.embed(
        planned, settings.embedding, settings.limits, dimensions=body.dimensions
    )
    vectors, tokens, model_id = embedded.vectors, embedded.tokens, planned.model_id
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
            for i, v in enumerate(vectors)
        ],
        "model": model_id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


# -- chat ------------------------------------------------------------------------------------


def _split_messages(messages: Sequence[ChatMessageIn]) -> tuple[str, list[ChatMessage]]:
    """The last user message is the question; what came before is the conversation."""
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if last_user is None:
        raise InvalidInputError("messages: there is no user message to answer")
    # Earlier user and assistant turns are the conversation; the service's own system prompt
    # stays in charge, so a client's system (or tool) messages are not passed on.
    history = [
        ChatMessage(role="user" if m.role == "user" else "assistant", content=_text(m))
        for m in messages[:last_user]
        if m.role in ("user", "assistant")
    ]
    return _text(messages[last_user]), history


def _text(message: ChatMessageIn) -> str:
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    return "\n".join(str(p.get("text", "")) for p in message.content if p.get("type") == "text")


def _cache_flag(body: ChatCompletionRequest) -> bool:
    value = (body.model_extra or {}).get("cache", True)
    if not isinstance(value, bool):
        raise InvalidInputError("cache: must be true or false")
    return value


def _collections(model: str) -> list[str] | None:
    name, _, rest = model.partition(":")
    if name != MODEL_PREFIX:
        raise NotFoundError(
            f"model {model!r} not found; use 'rag:<collection>' or 'rag' "
            "(GET /v1/models lists them)"
        )
    names = [n.strip() for n in rest.split(",") if n.strip()]
    if len(names) > MAX_COLLECTIONS_PER_REQUEST:
        raise InvalidInputError(
            f"model: {len(names)} collections; the limit is {MAX_COLLECTIONS_PER_REQUEST}"
        )
    return names or None


class _Footer:
    """The `Sources:` list that ends a chat answer, cleaned as answers are."""

    def __init__(self, text: AnswerText) -> None:
        self.text = text

    def of(self, citations: Sequence[Source]) -> str:
        if not citations:
            return ""
        lines = [f"[{c.number}] {c.cited_as}" for c in citations]
        return self.text.clean("\n\nSources:\n" + "\n".join(lines))


def _sources(citations: Sequence[Source], footer: _Footer | None) -> str:
    """The answer's footer, or "" when the request turned it off."""
    return "" if footer is None else footer.of(citations)


def _completion(
    completion_id: str, model: str, answer: Answer, footer: _Footer | None
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": answer.text + _sources(answer.citations, footer),
                },
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": answer.prompt_tokens,
            "completion_tokens": answer.completion_tokens,
            "total_tokens": answer.prompt_tokens + answer.completion_tokens,
        },
        **_extra(answer),
    }


class _ChatChunks:
    """`chat.completion.chunk`s: the role, the pieces, the sources footer, the finish with
    the citations, then `[DONE]`."""

    def __init__(self, completion_id: str, model: str, footer: _Footer | None) -> None:
        self.completion_id, self.model, self.footer = completion_id, model, footer

    def chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        body = {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
        return frame(body)

    def opening(self) -> Iterable[str]:
        return (self.chunk({"role": "assistant", "content": ""}),)

    def piece(self, text: str) -> str:
        return self.chunk({"content": text})

    def failed(self, error: dict[str, str]) -> Iterable[str]:
        # The body a non-streamed failure gets; OpenAI clients raise on its `error`.
        return (frame(error),)

    def stopped(self, error: dict[str, str]) -> Iterable[str]:
        # The same, then the stream's usual end.
        return (frame(error), frame("[DONE]"))

    def finished(self, answer: Answer) -> Iterable[str]:
        sources = _sources(answer.citations, self.footer)
        head = [self.chunk({"content": sources})] if sources else []
        return (*head, self.chunk({}, "stop", **_extra(answer)), frame("[DONE]"))


def _extra(answer: Answer) -> dict[str, Any]:
    out = answer_out(answer).model_dump(mode="json")
    return {"citations": out["citations"], "query_id": out["query_id"], "cache": out["cache"]}


# -- embeddings ------------------------------------------------------------------------------


def _encode(vector: np.ndarray[Any, np.dtype[np.float32]], encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return [float(x) for x in vector]
