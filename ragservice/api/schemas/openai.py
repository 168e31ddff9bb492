"""The OpenAI-compatible endpoints' requests: chat completions and embeddings.

Their replies are OpenAI's shapes, built by the router (`chat.completion`, its chunks, the
embedding and model lists); errors, streamed or not, are the service's `ErrorOut`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from ragservice.api.schemas.common import Finite, JsonObject, StorableJson, Text
from ragservice.limits.shape import MAX_COLLECTIONS_PER_REQUEST

MAX_GENERATED_TOKENS = 32768


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Text
    content: Annotated[Text | list[JsonObject] | None, StorableJson] = Field(
        default=None, description='a text, or content parts (`{"type": "text", "text": ...}`)'
    )


class ChatCompletionRequest(BaseModel):
    # Clients send many optional OpenAI fields (n, top_p, stream_options, …): accepted, unused.
    model_config = ConfigDict(extra="allow")

    model: Text = Field(
        description="`rag:<collection>`, `rag:<a>,<b>` (at most "
        f"{MAX_COLLECTIONS_PER_REQUEST} names) or `rag` (all)"
    )
    messages: list[ChatMessageIn] = Field(min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_GENERATED_TOKENS)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_GENERATED_TOKENS)
    temperature: Finite | None = Field(default=None, ge=0, le=2)
    sources_block: StrictBool | None = Field(
        default=None,
        description="end the answer with its `Sources:` list (default: "
        "RAGSERVICE_CHAT_SOURCES_BLOCK, on); `citations` carry the sources either way",
    )


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    input: Annotated[Text | list[Text] | list[StrictInt] | list[list[StrictInt]], StorableJson] = (
        Field(
            description="a text, texts, or token ids (tiktoken's, cl100k_base by default, as "
            "OpenAI clients send them; or the model's own tokenizer's: "
            "RAGSERVICE_EMBEDDING_TOKEN_IDS): one text's ids, or a list of them"
        )
    )
    model: Text = Field(default="", description="an embedding model's id (GET /v1/models)")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
