"""The embedding model in int8 on CPU: the exported float graph, dynamically quantized.

ONNX Runtime's dynamic quantization stores the weights of the graph's MatMuls as int8 (one scale
per output channel) and quantizes each MatMul's input at run time, per tensor. On two cores it
embeds SciFact texts about twice as fast as torch (all-MiniLM-L6-v2), with vectors within cosine
0.99 of the float model's. Quantizing every op type, or one scale per weight tensor, lost far more
(cosine median 0.94): only MatMuls, per channel. The FFN down-projections (weights wider in than
out, e.g. 1536 → 384) are the most sensitive; `exclude_ffn_down` keeps them in float, for a
smaller error at some speed (measured: cosine min 0.989 → 0.993, 4.4 s → 6.0 s for 320 texts).

Because the scale of each MatMul's input is taken over the whole batch, a row's vector depends
slightly on the rows and the padding beside it (cosine ≥ 0.99 to the same text alone).

The int8 graph is cached beside the float export (`int8_file_name`), and checked against the
float torch model every time it is loaded (`MIN_MEAN_COSINE`): a model that quantizes badly
raises `Int8EncoderError`, and the caller embeds in float instead.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ragservice.embedding.query_encoder import (
    OUTPUT_NAME,
    Inputs,
    QueryEncoderError,
    QueryPipeline,
    Vector,
    available_cpus,
    cache_file_name,
    cached_export,
    cached_file,
    export,
    open_session,
)
from ragservice.extras import missing_extra

log = logging.getLogger(__name__)

Matrix = npt.NDArray[np.float32]

# Bump whenever the quantization recipe changes, to orphan old int8 caches.
INT8_FORMAT = 1
# Mean cosine to the float model, over `_SAMPLE`, below which the int8 graph is refused.
MIN_MEAN_COSINE = 0.99
# Varied on purpose: short and long, questions and claims, numbers, units, accents, noise.
_SAMPLE = (
    "What causes cancer?",
    "a",
    "Vitamin D deficiency raises the risk of fractures in elderly patients.",
    "0-dimensional biomaterials lack inductive properties.",
    "How do I reset my password if I no longer have access to my e-mail?",
    "The mitochondrial membrane potential dropped by 35 % within 2 h of exposure to 10 µM CCCP.",
    "Übermäßiger Kaffeekonsum, café crème, naïve façade: accents and other scripts.",
    "SELECT * FROM users WHERE id = 42; -- code, symbols {} [] <> and URLs https://example.org",
    "Randomized controlled trials showed no significant difference in all-cause mortality "
    "between the treatment and placebo groups after five years of follow-up, although the "
    "subgroup of patients over seventy years of age had fewer hospital admissions.",
    "the the the the the",
    "Quarterly revenue grew 12% year over year, driven by subscriptions in Europe and Asia.",
    "Is it safe to take ibuprofen together with paracetamol for a fever in children?",
)


class Int8EncoderError(QueryEncoderError):
    """This model or machine cannot embed in int8; callers embed in float instead."""


class Int8Encoder:
    """The model's exported graph, int8-quantized, in an ONNX Runtime session (CPU).

    `InferenceSession.run` is thread-safe, and so is the tokenizer: one instance serves all.
    """

    def __init__(self, session: Any, pipeline: QueryPipeline, *, dimension: int) -> None:
        self._session = session
        self._tokenize = pipeline.tokenize
        self.names: tuple[str, ...] = pipeline.names
        self.dimension = dimension

    def encode_batch(self, inputs: Mapping[str, npt.NDArray[np.integer[Any]]]) -> Matrix:
        """Padded token arrays (`names`, each (n, length)) → (n, dimension) unit float32 rows."""
        feed = {name: np.asarray(inputs[name], dtype=np.int64) for name in self.names}
        if feed[self.names[0]].shape[0] == 0:
            return np.empty((0, self.dimension), dtype=np.float32)
        (vectors,) = self._session.run([OUTPUT_NAME], feed)
        return np.asarray(vectors, dtype=np.float32)

    def encode(self, text: str) -> Vector:
        """One query's unit float32 vector (the `QueryEncoder` protocol)."""
        vector: Vector = self.encode_batch(self._tokenize(text))[0]
        return vector


def load_int8_encoder(
    pipeline: QueryPipeline,
    *,
    name: str,
    model_dir: Path | None,
    cache_dir: Path | None,
    threads: int | None = None,
    exclude_ffn_down: bool = True,
) -> Int8Encoder:
    """Quantize (or reuse the cached int8 graph of) `pipeline`, open it and check it.

    `threads`: intra-op threads of the session; unset, every CPU this process may use (batches
    gain from them, unlike one query). Without a `cache_dir` or a `model_dir` to key the cache
    on, the graph is exported and quantized in a temporary folder on every call. Raises
    `Int8EncoderError` on any failure: the caller falls back to float.
    """
    if (missing := missing_extra("onnx", "int8 embedding")) is not None:
        raise Int8EncoderError(missing)
    if pipeline.device.type != "cpu":
        raise Int8EncoderError(f"int8 embeds on CPU; the model is on {pipeline.device}")
    try:
        session = _int8_session(
            pipeline,
            name=name,
            model_dir=model_dir,
            cache_dir=cache_dir,
            threads=threads or available_cpus(),
            exclude_ffn_down=exclude_ffn_down,
        )
    except Exception as exc:
        raise Int8EncoderError(f"int8 graph unavailable: {exc!r}") from exc
    expected = _float_sample(pipeline)
    encoder = Int8Encoder(session, pipeline, dimension=expected.shape[1])
    verify(encoder, pipeline, expected)
    return encoder


def int8_file_name(name: str, model_dir: Path, *, exclude_ffn_down: bool) -> str:
    """The int8 graph's cache file: the float export's name (model, its files, exporter
    versions) plus this recipe's version, options and the quantizing ONNX Runtime's version."""
    import onnxruntime

    variant = "ffn-down-float" if exclude_ffn_down else "all-matmul"
    stem = cache_file_name(name, model_dir).removesuffix(".onnx")
    return f"{stem}.int8-v{INT8_FORMAT}-{variant}-ort{onnxruntime.__version__}.onnx"


def quantize(float_path: Path, out: Path, *, exclude_ffn_down: bool) -> None:
    """Write the int8 variant of the float graph at `float_path` to `out`."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    excluded = ffn_down_projections(float_path) if exclude_ffn_down else []
    with _quiet_quantizer():
        quantize_dynamic(
            float_path,
            out,
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=excluded,
        )


def ffn_down_projections(float_path: Path) -> list[str]:
    """The MatMuls whose weight narrows its input (more rows than columns): a transformer's
    feed-forward output projection (intermediate → hidden), or a narrowing Dense module."""
    import onnx

    graph = onnx.load(str(float_path)).graph
    shapes = {init.name: tuple(init.dims) for init in graph.initializer}
    return [
        node.name
        for node in graph.node
        if node.op_type == "MatMul" and _narrows(shapes.get(node.input[1], ()))
    ]


def _narrows(dims: tuple[int, ...]) -> bool:
    return len(dims) == 2 and dims[0] > dims[1]


def pad_batch(rows: Sequence[Inputs]) -> Inputs:
    """Single-text token arrays ((1, length) each) → one batch, right-padded with zeros."""
    width = max(row[next(iter(row))].shape[1] for row in rows)
    return {
        name: np.concatenate(
            [np.pad(row[name], ((0, 0), (0, width - row[name].shape[1]))) for row in rows]
        )
        for name in rows[0]
    }


def verify(encoder: Int8Encoder, pipeline: QueryPipeline, expected: Matrix | None = None) -> float:
    """The mean cosine between int8 and float torch vectors of `_SAMPLE`, embedded as one padded
    batch; raises `Int8EncoderError` below `MIN_MEAN_COSINE`."""
    if expected is None:
        expected = _float_sample(pipeline)
    got = encoder.encode_batch(pad_batch([pipeline.tokenize(text) for text in _SAMPLE]))
    cosines = cosine_rows(got, expected)
    mean, worst = float(cosines.mean()), float(cosines.min())
    log.info("int8 encoder: cosine to the float model mean %.4f, min %.4f", mean, worst)
    if not mean >= MIN_MEAN_COSINE:
        raise Int8EncoderError(
            f"int8 vectors too far from the float model: mean cosine {mean:.4f} "
            f"(min {worst:.4f}) < {MIN_MEAN_COSINE}"
        )
    return mean


def cosine_rows(a: Matrix, b: Matrix) -> npt.NDArray[np.float64]:
    """Row-wise cosine similarity of two (n, d) matrices."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    return np.asarray((a64 * b64).sum(axis=1) / np.maximum(norms, 1e-12), dtype=np.float64)


def _float_sample(pipeline: QueryPipeline) -> Matrix:
    return np.stack([pipeline.torch_forward(pipeline.tokenize(text)) for text in _SAMPLE])


def _int8_session(
    pipeline: QueryPipeline,
    *,
    name: str,
    model_dir: Path | None,
    cache_dir: Path | None,
    threads: int,
    exclude_ffn_down: bool,
) -> Any:
    if cache_dir is None or model_dir is None:
        # The session reads the whole file when it opens, so the folder can go right after.
        with tempfile.TemporaryDirectory(prefix="ragservice-int8-") as tmp:
            float_path, int8_path = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
            export(pipeline, float_path)
            quantize(float_path, int8_path, exclude_ffn_down=exclude_ffn_down)
            return open_session(int8_path, threads)
    float_path = cache_dir / cache_file_name(name, model_dir)
    target = cache_dir / int8_file_name(name, model_dir, exclude_ffn_down=exclude_ffn_down)

    def write(out: Path) -> None:
        # The float export is needed only to build the int8 graph, and reused if cached.
        quantize(cached_export(pipeline, float_path), out, exclude_ffn_down=exclude_ffn_down)

    return open_session(cached_file(target, write), threads)


class _QuantizerChatter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        advice = "pre-processing before quantization" in record.getMessage()
        return record.levelno >= logging.WARNING and not advice


@contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """quantize_dynamic logs on the root logger: a line per tensor at INFO, and at every call
    advice to run `quant_pre_process`, which on these graphs needs `skip_symbolic_shape` and
    changed nothing measured. Both are dropped; its other warnings pass."""
    advice = _QuantizerChatter()
    root = logging.getLogger()
    root.addFilter(advice)
    try:
        yield
    finally:
        root.removeFilter(advice)
