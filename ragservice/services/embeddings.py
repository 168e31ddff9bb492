"""Texts (or token id arrays) embedded with one of the models this process holds: what
`POST /v1/embeddings` does, apart from its wire format.

A request is planned first (its model, inputs and bounds checked, `Planned.count` what a
caller charges for), then embedded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio.to_thread
import numpy as np

from ragservice.config import EmbeddingSettings, LimitSettings
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from ragservice.embedding.registry import ModelRegistry, ServingModel
from ragservice.embedding.token_ids import tiktoken_texts
from ragservice.embedding.tokens import BatchTokenizer, TokenIds
from ragservice.errors import InvalidInputError, NotFoundError
from ragservice.limits.request_bounds import (
    check_batch,
    check_embedding_count,
    check_embedding_texts,
)

Input = str | list[int]
"""One input: a text, or one text's token ids."""
Vectors = np.ndarray[Any, np.dtype[np.float32]]


@dataclass(frozen=True)
class Planned:
    """A request within the bounds: the model that embeds it (and the id replies name it by)
    and its inputs, one per vector."""

    model: ServingModel
    model_id: str
    inputs: list[Input]
    noun: str
    """`texts`, or `token arrays` when any input is token ids."""

    @property
    def count(self) -> int:
        return len(self.inputs)

    @property
    def texts(self) -> list[str]:
        return [text for text in self.inputs if isinstance(text, str)]


@dataclass(frozen=True)
class Embedded:
    """The normalized vectors (cosine-ready), in input order, and the tokens they read."""

    vectors: Vectors
    tokens: int


def plan(
    models: ModelRegistry,
    limits: LimitSettings,
    requested: str,
    given: str | list[str] | list[int] | list[list[int]],
) -> Planned:
    """The model `requested` names (none named: the serving one) and the inputs, within
    the limits on their number and size."""
    model, model_id = embedding_model(models, requested)  # one for the request
    inputs = inputs_of(given)
    texts = [text for text in inputs if isinstance(text, str)]
    noun = "texts" if len(texts) == len(inputs) else "token arrays"
    check_batch(len(inputs), limits, field="input")
    check_embedding_count(len(inputs), limits, noun=noun)
    check_embedding_texts(texts, limits)
    return Planned(model, model_id, inputs, noun)


async def embed(
    planned: Planned,
    embedding: EmbeddingSettings,
    limits: LimitSettings,
    *,
    dimensions: int | None = None,
) -> Embedded:
    """Embed the planned inputs; token ids are tiktoken's (decoded to their texts) or the
    model's own tokenizer's, as RAGSERVICE_EMBEDDING_TOKEN_IDS says."""
    embedder, inputs, texts = planned.model.embedder, planned.inputs, planned.texts
    _check_input(inputs, dimensions, embedder)
    if len(texts) < len(inputs) and embedding.token_ids == "tiktoken":
        arrays = [ids for ids in inputs if isinstance(ids, list)]
        encoding = embedding.tiktoken_encoding
        texts = await anyio.to_thread.run_sync(tiktoken_texts, arrays, encoding)
        check_embedding_texts(texts, limits)
    if len(texts) == len(inputs):
        vectors = await anyio.to_thread.run_sync(_embed, embedder, texts)
        tokens = await anyio.to_thread.run_sync(_token_count, embedder, texts)
        return Embedded(vectors, tokens)
    token_inputs = _token_inputs(embedder, [ids for ids in inputs if isinstance(ids, list)])
    vectors = await anyio.to_thread.run_sync(embedder.embed_tokens, token_inputs)
    return Embedded(vectors, sum(map(len, token_inputs)))


def inputs_of(given: str | list[str] | list[int] | list[list[int]]) -> list[Input]:
    """The request's inputs, one per vector: a text, texts, one text's ids, or lists of ids."""
    if isinstance(given, str):
        return [given]
    if given and all(isinstance(item, int) for item in given):
        return [[item for item in given if isinstance(item, int)]]
    return [item for item in given if not isinstance(item, int)]


def embedding_model(models: ModelRegistry, requested: str) -> tuple[ServingModel, str]:
    """The model `requested` names among those loaded (none named: the serving one), and the
    id replies name it by; NotFoundError naming the available ones otherwise."""
    loaded = models.loaded()
    if not requested:
        return loaded[0], served_name(loaded[0], 0)
    for position, model in enumerate(loaded):
        if requested in model.names:
            return model, served_name(model, position)
    available = ", ".join(served_name(m, i) for i, m in enumerate(loaded))
    raise NotFoundError(
        f"embedding model {requested!r} not found; this server embeds with {available} "
        "(GET /v1/models lists them)"
    )


def served_name(model: ServingModel, position: int) -> str:
    """The serving model by its name, one loaded besides it by `NAME:VERSION`."""
    return model.name if position == 0 else f"{model.name}:{model.version}"


def _token_inputs(embedder: SentenceTransformerEmbedder, arrays: list[list[int]]) -> list[TokenIds]:
    """Model inputs from token id arrays, each checked against the model's tokenizer."""
    tokenizer: BatchTokenizer | None = embedder.batch_tokenizer
    if tokenizer is None:
        raise InvalidInputError(
            f"input: embedding model {embedder.name!r} takes texts only, not token ids"
        )
    inputs: list[TokenIds] = []
    for i, ids in enumerate(arrays):
        try:
            inputs.append(tokenizer.input_from_ids(ids))
        except ValueError as exc:
            raise InvalidInputError(
                f"input[{i}]: {exc}; token ids are read as the embedding model's own "
                "tokenizer's (RAGSERVICE_EMBEDDING_TOKEN_IDS=model), not tiktoken's: send "
                "the text instead"
            ) from exc
    return inputs


def _check_input(
    inputs: list[Input], dimensions: int | None, embedder: SentenceTransformerEmbedder
) -> None:
    if not inputs:
        raise InvalidInputError("input: give at least one text")
    if dimensions is not None and dimensions != embedder.dimension:
        raise InvalidInputError(
            f"dimensions: this model gives {embedder.dimension}, not {dimensions}"
        )


def _token_count(embedder: SentenceTransformerEmbedder, texts: list[str]) -> int:
    return int(embedder.token_lengths(texts).sum())


def _embed(embedder: SentenceTransformerEmbedder, texts: list[str]) -> Vectors:
    if len(texts) == 1:  # one text: the fast query encoder
        return embedder.embed_query(texts[0]).reshape(1, -1)
    return embedder.embed(texts)
