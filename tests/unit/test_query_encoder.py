"""One query's vector: the ONNX and torch paths agree with `embed`, cache and fall back safely."""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from ragservice.embedding import query_encoder as qe
from ragservice.embedding.embedder import QueryEncoderChoice, SentenceTransformerEmbedder

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
LONG = " ".join(f"word{i}" for i in range(1000))  # far past the model's 256 tokens
QUERIES = [
    "",
    "What causes cancer?",
    "  Mixed CASE, ünïcode, tabs\tand   spaces  ",
    "0-dimensional biomaterials lack inductive properties.",
    LONG,
]


def fresh(tmp_path: Path, choice: QueryEncoderChoice = "auto") -> SentenceTransformerEmbedder:
    """A second embedder on the same model files (loading them again takes well under a second)."""
    return SentenceTransformerEmbedder(
        MODEL, device="cpu", query_encoder=choice, cache_dir=tmp_path
    )


def onnx_files(folder: Path) -> list[Path]:
    return sorted(folder.iterdir()) if folder.exists() else []


@pytest.mark.parametrize("text", QUERIES, ids=["empty", "short", "messy", "claim", "long"])
def test_embed_query_equals_embed(embedder: SentenceTransformerEmbedder, text: str) -> None:
    assert embedder.query_backend == "onnx"
    vector = embedder.embed_query(text)
    assert vector.shape == (embedder.dimension,)
    assert vector.dtype == np.float32
    np.testing.assert_allclose(vector, embedder.embed([text])[0], atol=1e-5)
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)


def test_long_text_is_cut_where_embed_cuts_it(embedder: SentenceTransformerEmbedder) -> None:
    # Past the cut, more text must change nothing: both paths read the same first 254 tokens.
    longer = LONG + " and a different ending"
    np.testing.assert_allclose(embedder.embed_query(longer), embedder.embed_query(LONG), atol=1e-6)
    np.testing.assert_allclose(embedder.embed_query(longer), embedder.embed([LONG])[0], atol=1e-5)


def test_torch_path_equals_embed(embedder: SentenceTransformerEmbedder) -> None:
    encoder = qe.TorchQueryEncoder(qe.QueryPipeline(embedder.model))
    for text in QUERIES:
        np.testing.assert_allclose(encoder.encode(text), embedder.embed([text])[0], atol=1e-5)


def test_warm_up_leaves_the_shared_model_in_eval_mode(
    embedder: SentenceTransformerEmbedder,
) -> None:
    # The exporter restores its wrapper's mode; a wrapper in training mode turned dropout on.
    assert not embedder.model.training


def test_concurrent_queries_get_their_own_vectors(embedder: SentenceTransformerEmbedder) -> None:
    texts = [f"question {i}: does protein {i} bind receptor {i % 5}?" for i in range(32)]
    expected = embedder.embed(texts)
    start = threading.Barrier(8)

    def work(worker: int) -> list[tuple[int, np.ndarray]]:
        start.wait()
        mine = range(worker, len(texts), 8)
        return [(i, embedder.embed_query(texts[i])) for _ in range(3) for i in mine]

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = [pair for batch in pool.map(work, range(8)) for pair in batch]
    assert len(results) == 3 * len(texts)
    for i, vector in results:
        np.testing.assert_allclose(vector, expected[i], atol=1e-5)


def test_export_is_cached_and_reused(
    embedder: SentenceTransformerEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = fresh(tmp_path)
    first.warm_up()
    (cached,) = onnx_files(tmp_path)  # one finished file, no temporary left behind
    assert cached.suffix == ".onnx"
    stamp = cached.stat().st_mtime_ns

    def no_export(*args: object, **kwargs: object) -> None:
        raise AssertionError("exported again instead of reusing the cache")

    monkeypatch.setattr(torch.onnx, "export", no_export)
    second = fresh(tmp_path)
    second.warm_up()
    assert second.query_backend == "onnx"
    assert onnx_files(tmp_path) == [cached]
    assert cached.stat().st_mtime_ns == stamp
    text = "Vitamin D deficiency raises the risk of fractures."
    np.testing.assert_allclose(second.embed_query(text), embedder.embed([text])[0], atol=1e-5)


def test_failed_export_falls_back_to_torch(
    embedder: SentenceTransformerEmbedder,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("exporter exploded")

    monkeypatch.setattr(torch.onnx, "export", broken)
    fallback = fresh(tmp_path, "onnx")
    with caplog.at_level(logging.WARNING, logger="ragservice"):
        fallback.warm_up()
    assert fallback.query_backend == "torch"
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "exporter exploded" in warnings[0].getMessage()
    assert onnx_files(tmp_path) == []  # the half-written temporary file was removed
    for text in QUERIES[:3]:
        np.testing.assert_allclose(fallback.embed_query(text), embedder.embed([text])[0], atol=1e-5)


def test_corrupt_cache_file_falls_back_to_torch(
    embedder: SentenceTransformerEmbedder, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / qe.cache_file_name(MODEL, Path(embedder.path))).write_bytes(b"not a model")
    damaged = fresh(tmp_path)
    with caplog.at_level(logging.WARNING, logger="ragservice"):
        damaged.warm_up()
    assert damaged.query_backend == "torch"
    assert "ONNX query encoder unavailable" in caplog.text
    text = "Smoking causes lung cancer."
    np.testing.assert_allclose(damaged.embed_query(text), embedder.embed([text])[0], atol=1e-5)


def test_torch_choice_never_exports(embedder: SentenceTransformerEmbedder, tmp_path: Path) -> None:
    plain = fresh(tmp_path, "torch")
    plain.warm_up()
    assert plain.query_backend == "torch"
    assert onnx_files(tmp_path) == []


def test_cache_key_follows_the_model_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "weights.bin").write_bytes(b"1234")
    key = qe.cache_key(tmp_path)
    assert qe.cache_key(tmp_path) == key
    (tmp_path / "weights.bin").write_bytes(b"12345")
    resized = qe.cache_key(tmp_path)
    assert resized != key
    os.utime(tmp_path / "weights.bin", ns=(1, 1))
    assert qe.cache_key(tmp_path) not in {key, resized}
