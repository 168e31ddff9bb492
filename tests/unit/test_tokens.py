"""Tokenizing once: chunk inputs sliced from their document's tokens equal tokenizing the chunk
texts; padding and length batches; the null embedder; the preparation thread's hand-over."""

from __future__ import annotations

import contextvars
import json
import random
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from transformers import AutoTokenizer

from ingest.stages import Prefetch
from ragservice.chunking import ChunkingOptions, chunk_text
from ragservice.embedding.embedder import SentenceTransformerEmbedder, resolve_model_path
from ragservice.embedding.null import NullEmbedder
from ragservice.embedding.tokens import BatchTokenizer, length_batches, pad_batch

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
WORDS = [
    *[
        "vitamin",
        "deficiency",
        "osteoporosis",
        "immunohistochemistry",
        "0-dimensional",
        "e.g.",
        "x=y+z",
    ],
    *[
        "Ünïcode",
        "naïve",
        "café",
        "résumé",
        "(parenthesis)",
        "[bracket]",
        "3.14",
        "10^-3",
        "hyphen-ated",
    ],
    "\u03b1-helix",  # Greek letters, CJK characters, emoji, tabs and newlines inside words
    "\u4e2d\u6587\u5b57\u7b26",
    "emoji\U0001f642",
    "tab\tsep",
    "new\nline",
    "antidisestablishmentarianism",
    "...",
]


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(resolve_model_path(MODEL))


def random_text(rng: random.Random, words: int) -> str:
    parts = [rng.choice(WORDS) for _ in range(words)]
    for _ in range(words // 20):  # run-on words force cuts between tokens of one word
        parts.insert(rng.randrange(len(parts)), "x".join(rng.choice(WORDS) for _ in range(30)))
    return " ".join(parts)


def test_chunk_slices_equal_tokenizing_the_chunk_texts(hf_tokenizer: Any) -> None:
    batch = BatchTokenizer(hf_tokenizer, max_length=256)
    assert batch.slices_exact
    rng = random.Random(7)
    texts = [random_text(rng, rng.randrange(5, 600)) for _ in range(60)]
    options = ChunkingOptions(max_tokens=40, overlap_tokens=8)
    chunks_seen = 0
    for document, text in zip(batch.documents(texts), texts, strict=True):
        chunks = chunk_text(text, tokenizer=document, options=options)
        ranges = [(c.start_char, c.end_char) for c in chunks]
        chunk_texts = [c.text for c in chunks]
        assert batch.chunk_inputs(document, ranges, chunk_texts) == batch.model_inputs(chunk_texts)
        chunks_seen += len(chunks)
    assert chunks_seen > 300


def test_model_inputs_match_the_models_own_tokenizer(hf_tokenizer: Any) -> None:
    batch = BatchTokenizer(hf_tokenizer, max_length=256)
    texts = ["What causes cancer?", "", " ".join(["word"] * 1000)]
    expected = hf_tokenizer(texts, truncation=True, max_length=256)["input_ids"]
    assert batch.model_inputs(texts) == expected
    assert len(batch.model_inputs(texts)[2]) == 256


def test_other_tokenizers_are_tokenized_chunk_by_chunk(hf_tokenizer: Any) -> None:
    """Slicing is exact for WordPiece behind the BERT pre-tokenizer only; with any other
    pre-tokenizer every chunk is tokenized on its own."""
    config = json.loads(hf_tokenizer.backend_tokenizer.to_str())
    config["pre_tokenizer"] = {"type": "Whitespace"}
    other = AutoTokenizer.from_pretrained(resolve_model_path(MODEL))
    from tokenizers import Tokenizer

    other._tokenizer = Tokenizer.from_str(json.dumps(config))
    batch = BatchTokenizer(other, max_length=256)
    assert not batch.slices_exact
    text = "alpha beta gamma delta"
    document = batch.documents([text])[0]
    assert batch.chunk_inputs(document, [(6, 16)], ["beta gamma"]) == batch.model_inputs(
        ["beta gamma"]
    )


def test_pad_batch_and_length_batches() -> None:
    inputs = [[101, 5, 102], [101, 102], [101, 7, 8, 9, 102]]
    padded = pad_batch(inputs, pad_id=0)
    assert padded["input_ids"].tolist() == [
        [101, 5, 102, 0, 0],
        [101, 102, 0, 0, 0],
        [101, 7, 8, 9, 102],
    ]
    assert padded["attention_mask"].sum(axis=1).tolist() == [3, 2, 5]
    assert not padded["token_type_ids"].any()
    batches = length_batches(inputs, 2)
    assert [b.tolist() for b in batches] == [[2, 0], [1]]


def test_embed_tokens_equals_encode(embedder: SentenceTransformerEmbedder) -> None:
    texts = ["What causes cancer?", "A longer sentence about vitamin D and bones.", "x"]
    batch_tokenizer = embedder.batch_tokenizer
    assert batch_tokenizer is not None
    vectors = embedder.embed_tokens(batch_tokenizer.model_inputs(texts))
    expected = embedder.model.encode(texts, normalize_embeddings=True)
    assert np.abs(vectors - expected).max() < 1e-5


def test_null_embedder_is_deterministic_and_uses_the_real_tokenizer(
    embedder: SentenceTransformerEmbedder,
) -> None:
    null = NullEmbedder(embedder.path)
    assert (null.dimension, null.max_tokens) == (embedder.dimension, embedder.max_tokens)
    texts = ["one text", "another text", "one text"]
    vectors = null.embed(texts)
    assert vectors.shape == (3, embedder.dimension)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(vectors[0], vectors[2])
    assert not np.array_equal(vectors[0], vectors[1])
    assert np.array_equal(null.embed_query("one text"), vectors[0])
    text = "Counting tokens the way the model does: immunohistochemistry."
    assert null.count_tokens(text) == embedder.count_tokens(text)


# -- the preparation thread ---------------------------------------------------------------


def test_prefetch_hands_over_every_item_in_order_with_the_callers_context() -> None:
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")
    marker.set("caller")
    threads: set[str] = set()

    def source() -> Iterator[tuple[int, str]]:
        for i in range(50):
            threads.add(threading.current_thread().name)
            yield i, marker.get()

    with Prefetch(source(), depth=2, name="test-prefetch") as prefetch:
        items = list(prefetch)
    assert items == [(i, "caller") for i in range(50)]
    assert threads == {"test-prefetch"}


def test_prefetch_raises_the_sources_error_in_the_consumer() -> None:
    def source() -> Iterator[int]:
        yield 1
        raise ValueError("broken input")

    with Prefetch(source(), depth=1, name="test-prefetch") as prefetch:
        iterator = iter(prefetch)
        assert next(iterator) == 1
        with pytest.raises(ValueError, match="broken input"):
            next(iterator)


def test_prefetch_close_stops_the_source_early() -> None:
    closed = threading.Event()
    produced: list[int] = []

    def source() -> Iterator[int]:
        try:
            for i in range(1_000_000):
                produced.append(i)
                yield i
        finally:
            closed.set()

    prefetch = Prefetch(source(), depth=2, name="test-prefetch")
    assert next(iter(prefetch)) == 0
    prefetch.close()
    assert closed.is_set()
    assert len(produced) < 10
