"""The OpenAI-compatible endpoints' requests: chat completions and embeddings.

Their replies are OpenAI's shapes, built by the router (`chat.completion`, its chunks, the
embedding and model lists); errors, streamed or not, are the service's `ErrorOut`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_GENERATED_TOKENS = 32768


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(BaseModel):
    # Clients send many optional OpenAI fields (n, top_p, stream_options, …): accepted, unused.
    model_config = ConfigDict(extra="allow")

    model: str = Field(description="`rag:<collection>`, `rag:<a>,<b>` or `rag` (all)")
    messages: list[ChatMessageIn] = Field(min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_GENERATED_TOKENS)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_GENERATED_TOKENS)
    temperature: float | None = Field(default=None, ge=0, le=2)


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    input: str | list[str]
    model: str = ""
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
