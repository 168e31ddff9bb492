"""The int8 embedder: built and cached beside the float export, close to the float model, and
refused (Int8EncoderError, a QueryEncoderError) whenever it cannot be trusted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ragservice.embedding import quantized
from ragservice.embedding import query_encoder as qe
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from ragservice.embedding.quantized import Int8Encoder, Int8EncoderError, load_int8_encoder

TEXTS = [
    "What causes cancer?",
    "Smoking causes lung cancer.",
    "  Mixed CASE, ünïcode, tabs\tand   spaces  ",
    "0-dimensional biomaterials lack inductive properties.",
    "Aspirin lowers the risk of a second heart attack in patients with coronary disease, "
    "according to a meta-analysis of sixteen trials with over fifty thousand participants.",
]
LONG = " ".join(f"word{i}" for i in range(1000))


@pytest.fixture(scope="module")
def tiny(tiny_path: Path) -> qe.QueryPipeline:
    from sentence_transformers import SentenceTransformer

    return qe.QueryPipeline(SentenceTransformer(str(tiny_path), device="cpu"))


@pytest.fixture(scope="module")
def minilm(embedder: SentenceTransformerEmbedder) -> qe.QueryPipeline:
    return qe.QueryPipeline(embedder.model)


@pytest.fixture(scope="module")
def int8(minilm: qe.QueryPipeline) -> Int8Encoder:
    """The bundled model in int8, built in a temporary folder (no cache): about 7 s."""
    return load_int8_encoder(minilm, name="minilm", model_dir=None, cache_dir=None)


def load_tiny(
    pipeline: qe.QueryPipeline, tiny_path: Path, cache: Path, **options: bool
) -> Int8Encoder:
    return load_int8_encoder(pipeline, name="tiny", model_dir=tiny_path, cache_dir=cache, **options)


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_int8_graph_is_cached_and_reused(
    tiny: qe.QueryPipeline, tiny_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    real = quantized.quantize

    def counting(float_path: Path, out: Path, *, exclude_ffn_down: bool) -> None:
        calls.append(out)
        real(float_path, out, exclude_ffn_down=exclude_ffn_down)

    monkeypatch.setattr(quantized, "quantize", counting)
    first = load_tiny(tiny, tiny_path, tmp_path)
    int8_name = quantized.int8_file_name("tiny", tiny_path, exclude_ffn_down=True)
    assert ".int8-v1-ffn-down-float-ort" in int8_name
    # The float export and its int8 variant, finished; no temporary file left behind.
    assert files(tmp_path) == sorted([qe.cache_file_name("tiny", tiny_path), int8_name])
    assert len(calls) == 1
    stamp = (tmp_path / int8_name).stat().st_mtime_ns

    second = load_tiny(tiny, tiny_path, tmp_path)
    assert len(calls) == 1  # reused, not quantized again
    assert (tmp_path / int8_name).stat().st_mtime_ns == stamp
    text = "the quick brown fox"
    np.testing.assert_array_equal(second.encode(text), first.encode(text))


def test_the_other_variant_has_its_own_file_and_reuses_the_float_export(
    tiny: qe.QueryPipeline, tiny_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    load_tiny(tiny, tiny_path, tmp_path)

    def no_export(*args: object, **kwargs: object) -> None:
        raise AssertionError("exported the float graph again instead of reusing it")

    monkeypatch.setattr(qe, "export", no_export)
    load_tiny(tiny, tiny_path, tmp_path, exclude_ffn_down=False)
    names = files(tmp_path)
    assert len(names) == 3
    assert quantized.int8_file_name("tiny", tiny_path, exclude_ffn_down=False) in names


def test_ffn_down_projections_are_the_narrowing_matmuls(
    tiny: qe.QueryPipeline, tmp_path: Path
) -> None:
    graph = tmp_path / "float.onnx"
    qe.export(tiny, graph)
    assert quantized.ffn_down_projections(graph) == [
        f"/model/model.0/encoder/layer.{i}/output/dense/MatMul" for i in range(2)
    ]


def test_vectors_are_close_to_the_float_model(
    int8: Int8Encoder, embedder: SentenceTransformerEmbedder
) -> None:
    got = np.stack([int8.encode(text) for text in [*TEXTS, LONG]])
    assert got.dtype == np.float32
    assert got.shape == (len(TEXTS) + 1, embedder.dimension)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cosines = quantized.cosine_rows(got, embedder.embed([*TEXTS, LONG]))
    assert cosines.min() >= 0.99, cosines
    # Close, not equal: these are other vectors than the float model's.
    assert cosines.max() < 0.99999


def test_encode_and_encode_batch_agree(int8: Int8Encoder, minilm: qe.QueryPipeline) -> None:
    assert int8.names == ("input_ids", "attention_mask", "token_type_ids")
    rows = [minilm.tokenize(text) for text in TEXTS]
    for text, row in zip(TEXTS, rows, strict=True):
        np.testing.assert_allclose(int8.encode(text), int8.encode_batch(row)[0], atol=1e-6)
    batch = int8.encode_batch(quantized.pad_batch(rows))
    alone = np.stack([int8.encode(text) for text in TEXTS])
    assert quantized.cosine_rows(batch, alone).min() >= 0.99
    assert int8.encode_batch({name: np.zeros((0, 4), np.int64) for name in int8.names}).shape == (
        0,
        384,
    )


def test_padding_leaves_a_row_near_its_own_vector(
    int8: Int8Encoder, minilm: qe.QueryPipeline
) -> None:
    short, long = minilm.tokenize("What causes cancer?"), minilm.tokenize(TEXTS[-1] * 3)
    padded = int8.encode_batch(quantized.pad_batch([short, long]))
    float_short = minilm.torch_forward(short)
    # Activations are quantized per batch, so the padding moves the row a little (measured
    # about 0.992-0.997), but a mask ignored would pool pad tokens and land far away.
    assert float(padded[0] @ int8.encode_batch(short)[0]) >= 0.99
    assert float(padded[0] @ float_short) >= 0.99
    unmasked = quantized.pad_batch([short, long])
    unmasked["attention_mask"] = np.ones_like(unmasked["input_ids"])
    assert float(int8.encode_batch(unmasked)[0] @ float_short) < 0.95


def test_failed_quantization_raises_the_fallback_error(
    tiny: qe.QueryPipeline, tiny_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(float_path: Path, out: Path, *, exclude_ffn_down: bool) -> None:
        out.write_bytes(b"half a graph")
        raise RuntimeError("quantizer exploded")

    monkeypatch.setattr(quantized, "quantize", broken)
    with pytest.raises(Int8EncoderError, match="quantizer exploded") as caught:
        load_tiny(tiny, tiny_path, tmp_path)
    assert isinstance(caught.value, qe.QueryEncoderError)
    assert files(tmp_path) == [qe.cache_file_name("tiny", tiny_path)]  # no int8 file, no temp


def test_verification_below_threshold_raises(
    tiny: qe.QueryPipeline, tiny_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(quantized, "MIN_MEAN_COSINE", 1.01)
    with pytest.raises(Int8EncoderError, match="mean cosine"):
        load_tiny(tiny, tiny_path, tmp_path)


def test_corrupt_cache_file_raises(tiny: qe.QueryPipeline, tiny_path: Path, tmp_path: Path) -> None:
    name = quantized.int8_file_name("tiny", tiny_path, exclude_ffn_down=True)
    (tmp_path / name).write_bytes(b"not a model")
    with pytest.raises(Int8EncoderError):
        load_tiny(tiny, tiny_path, tmp_path)


def test_a_model_off_the_cpu_is_refused(tiny_path: Path, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    pipeline = qe.QueryPipeline(SentenceTransformer(str(tiny_path), device="cpu"))
    pipeline.device = torch.device("cuda")
    with pytest.raises(Int8EncoderError, match="on CPU"):
        load_tiny(pipeline, tiny_path, tmp_path)
    assert files(tmp_path) == []


# -- the embedder in int8 ------------------------------------------------------------------


@pytest.fixture(scope="module")
def int8_embedder(tmp_path_factory: pytest.TempPathFactory) -> SentenceTransformerEmbedder:
    """RAGSERVICE_EMBEDDING_PRECISION=int8: ingest batches and queries on the int8 graph."""
    embedder = SentenceTransformerEmbedder(
        "sentence-transformers/all-MiniLM-L6-v2",
        device="cpu",
        precision="int8",
        cache_dir=tmp_path_factory.mktemp("int8-embedder"),
    )
    embedder.warm_up()
    return embedder


def test_int8_precision_embeds_batches_and_queries_in_int8(
    int8_embedder: SentenceTransformerEmbedder, embedder: SentenceTransformerEmbedder
) -> None:
    assert int8_embedder.precision == "int8"
    assert int8_embedder.query_backend == "onnx-int8"
    vectors = int8_embedder.embed(TEXTS)
    floats = embedder.embed(TEXTS)
    cosines = (vectors * floats).sum(axis=1)
    assert cosines.min() >= 0.98
    assert cosines.mean() >= 0.99
    assert not np.allclose(vectors, floats, atol=1e-4)  # int8 indeed, not the float model
    query = int8_embedder.embed_query(TEXTS[0])
    assert float(query @ vectors[0]) >= 0.99


def test_int8_precision_falls_back_to_float_with_a_warning(
    tiny_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def refused(*args: object, **kwargs: object) -> Int8Encoder:
        raise Int8EncoderError("int8 vectors too far from the float model's")

    monkeypatch.setattr(quantized, "load_int8_encoder", refused)
    embedder = SentenceTransformerEmbedder(
        str(tiny_path), device="cpu", precision="int8", cache_dir=tmp_path
    )
    with caplog.at_level("WARNING"):
        embedder.warm_up()
    assert embedder.precision == "float"
    assert embedder.query_backend == "onnx"
    assert "in float, not int8" in caplog.text
    texts = ["a short text", "another one"]
    expected = embedder.model.encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(embedder.embed(texts), expected, atol=1e-5)
