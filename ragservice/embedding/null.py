"""A zero-cost embedder: the model's real tokenizer, and fixed vectors instead of the model.

Chunking, token counts and token ids are exactly the real model's, so an ingest with it does
everything an ingest does except the model's arithmetic: what the pipeline itself sustains
(`benchmarks/ingest.py --embedder null`), and a fast, deterministic test double. A text's vector
is one of a fixed table of random unit vectors, picked by a hash of its token ids: the same text
always gets the same vector, different texts mostly different ones.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ragservice.chunking import HFTokenizer
from ragservice.config import EmbeddingSettings
from ragservice.embedding.embedder import Vector, Vectors, resolve_model_path
from ragservice.embedding.tokens import BatchTokenizer, TokenIds
from ragservice.types import Tokenizer

_TABLE_ROWS = 4096


class NullEmbedder:
    """Fixed vectors from the model folder's tokenizer; no model weights are read."""

    def __init__(self, model_path: str, dimension: int | None = None, *, name: str = "") -> None:
        from transformers import AutoTokenizer

        folder = Path(model_path)
        self._name = name or f"null:{folder.name}"
        self._hf = AutoTokenizer.from_pretrained(model_path)
        self._max_length = _max_sequence(folder, self._hf)
        self._dimension = dimension or _dimension(folder)
        self._batch = BatchTokenizer(self._hf, max_length=self._max_length)
        self._counter = BatchTokenizer(self._hf, max_length=self._max_length)
        rows = np.random.default_rng(0).standard_normal((_TABLE_ROWS, self._dimension))
        self._table = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)

    @property
    def name(self) -> str:
        return self._name

    @property
    def dimension(self) -> int:
        return self._dimension

    @property
    def max_tokens(self) -> int:
        return self._max_length - len(self._batch.prefix) - len(self._batch.suffix)

    @property
    def tokenizer(self) -> Tokenizer:
        return HFTokenizer(self._hf)

    @property
    def batch_tokenizer(self) -> BatchTokenizer:
        return self._batch

    def warm_up(self) -> None:
        """Nothing to load (the tokenizer is read at construction)."""

    def count_tokens(self, text: str) -> int:
        return len(self._counter.documents([text])[0].ids)

    def embed(self, texts: Sequence[str]) -> Vectors:
        return self.embed_tokens(self._batch.model_inputs(texts))

    def embed_tokens(self, inputs: Sequence[TokenIds]) -> Vectors:
        if not inputs:
            return np.zeros((0, self._dimension), dtype=np.float32)
        rows = [zlib.crc32(np.asarray(ids, dtype=np.int32).tobytes()) for ids in inputs]
        vectors: Vectors = self._table[np.asarray(rows) % _TABLE_ROWS]
        return vectors

    def embed_query(self, text: str) -> Vector:
        vector: Vector = self.embed([text])[0]
        return vector


def null_embedder(embedding: EmbeddingSettings) -> NullEmbedder:
    """The null embedder standing in for the configured model (its tokenizer and dimension)."""
    return NullEmbedder(resolve_model_path(embedding.model))


def _max_sequence(folder: Path, hf_tokenizer: object) -> int:
    config = folder / "sentence_bert_config.json"
    if config.is_file():
        return int(json.loads(config.read_text())["max_seq_length"])
    return int(getattr(hf_tokenizer, "model_max_length", 512))


def _dimension(folder: Path) -> int:
    """The sentence-embedding dimension a sentence-transformers folder declares."""
    pooling = folder / "1_Pooling" / "config.json"
    if pooling.is_file():
        return int(json.loads(pooling.read_text())["word_embedding_dimension"])
    config = folder / "config.json"
    if config.is_file():
        return int(json.loads(config.read_text())["hidden_size"])
    raise ValueError(f"{folder} declares no embedding dimension; pass one")
