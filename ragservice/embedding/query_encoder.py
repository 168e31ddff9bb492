"""Embed one query at a time, cheaply: the model's own pipeline, lean in torch or in ONNX Runtime.

For one short text on CPU a torch forward costs per-operator overhead rather than arithmetic, and
ONNX Runtime has far less of it: about 6 ms against 17 ms for all-MiniLM-L6-v2 on two cores, with
the same vector. Float batches stay with torch (`SentenceTransformerEmbedder.embed`): faster for
them. `quantized` builds an int8 variant of the same exported graph, for batches and queries.

The graph is the loaded sentence-transformers model itself (transformer, then its pooling, dense or
normalize modules as configured) followed by an L2 normalization, traced with torch's TorchScript
exporter: nothing about pooling is re-implemented, and a check against torch at load time catches a
model whose modules do not trace faithfully. The export is cached on disk (see `cache_key`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import torch

from ragservice.extras import missing_extra

log = logging.getLogger(__name__)

Vector = npt.NDArray[np.float32]
Inputs = dict[str, npt.NDArray[np.int64]]

OPSET = 17
# Bump whenever the exported graph changes shape (inputs, outputs, wrapper) to orphan old caches.
EXPORT_FORMAT = 1
# The tokenizer outputs this encoder knows how to produce, in the order the graph takes them.
_INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT_NAME = "sentence_embedding"
# Largest difference from torch accepted for an exported graph (observed: about 2e-7).
_TOLERANCE = 1e-4
_PROBE = "Does a probe sentence embed the same in torch and in ONNX Runtime?"


class QueryEncoderError(RuntimeError):
    """This model or machine cannot use a lean query encoder; callers fall back to `encode`."""


class QueryEncoder(Protocol):
    def encode(self, text: str) -> Vector:
        """One text's unit-length float32 vector (1-D)."""
        ...


class SingleTextTokenizer:
    """The model's fast tokenizer, for one text at a time, safe to call from many threads.

    transformers' wrapper reconfigures its shared Rust tokenizer (truncation, padding) on every
    call, and a Rust tokenizer changed while another thread uses it raises "Already borrowed".
    This private copy is configured once, and a lock keeps it to one caller at a time: tokenizing
    a query takes tens of microseconds, so nobody waits long.
    """

    def __init__(self, hf_tokenizer: Any, *, max_length: int, names: tuple[str, ...]) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
        # Truncate where sentence-transformers does: at the model's max_seq_length, in tokens.
        self._tokenizer.enable_truncation(max_length=max_length)
        self._tokenizer.no_padding()
        self._names = names
        self._lock = threading.Lock()

    def __call__(self, text: str) -> Inputs:
        with self._lock:
            encoding = self._tokenizer.encode(text)
        fields = {
            "input_ids": encoding.ids,
            "attention_mask": encoding.attention_mask,
            "token_type_ids": encoding.type_ids,
        }
        return {name: np.asarray([fields[name]], dtype=np.int64) for name in self._names}


class _Normalized(torch.nn.Module):
    """The whole sentence-transformers model as a function of positional token tensors.

    The final normalization matches `encode(normalize_embeddings=True)`, which `embed` uses; it is
    a no-op up to rounding for models that already end in a Normalize module.
    """

    def __init__(self, model: Any, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.names = names
        # A new module starts in training mode, and the exporter restores that mode when it is
        # done, recursively: the shared model would be left with dropout on. Inference only.
        self.eval()

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        features = dict(zip(self.names, inputs, strict=True))
        embedding: torch.Tensor = self.model(features)[OUTPUT_NAME]
        return torch.nn.functional.normalize(embedding, p=2, dim=-1)


class QueryPipeline:
    """A loaded sentence-transformers model seen as: one text in, one unit vector out."""

    def __init__(self, model: Any) -> None:
        self.names = model_input_names(model)
        self.tokenize = SingleTextTokenizer(
            model.tokenizer, max_length=int(model.max_seq_length), names=self.names
        )
        self.module = _Normalized(model, self.names)
        self.device: torch.device = model.device

    def torch_forward(self, inputs: Inputs) -> Vector:
        tensors = [torch.from_numpy(inputs[name]).to(self.device) for name in self.names]
        with torch.inference_mode():
            vectors = self.module(*tensors)
        return np.asarray(vectors[0].float().cpu().numpy(), dtype=np.float32)


def model_input_names(model: Any) -> tuple[str, ...]:
    """The graph's inputs; raises QueryEncoderError for a pipeline this module cannot reproduce."""
    if getattr(model[0], "auto_model", None) is None:
        raise QueryEncoderError("the model does not start with a transformer module")
    prompt_name = getattr(model, "default_prompt_name", None)
    if prompt_name and getattr(model, "prompts", {}).get(prompt_name):
        raise QueryEncoderError("the model prepends a default prompt")
    tokenizer = model.tokenizer
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise QueryEncoderError("the model has no fast tokenizer")
    wanted = set(tokenizer.model_input_names)
    if not wanted <= set(_INPUT_NAMES):
        raise QueryEncoderError(f"unsupported tokenizer outputs {sorted(wanted)}")
    return tuple(name for name in _INPUT_NAMES if name in wanted)


class TorchQueryEncoder:
    """The model's modules called under inference mode, without `encode`'s per-call work."""

    def __init__(self, pipeline: QueryPipeline) -> None:
        self._pipeline = pipeline

    def encode(self, text: str) -> Vector:
        return self._pipeline.torch_forward(self._pipeline.tokenize(text))


class OnnxQueryEncoder:
    """The exported pipeline in an ONNX Runtime session; `InferenceSession.run` is thread-safe."""

    def __init__(self, session: Any, tokenize: SingleTextTokenizer) -> None:
        self._session = session
        self._tokenize = tokenize

    def encode(self, text: str) -> Vector:
        (vectors,) = self._session.run([OUTPUT_NAME], self._tokenize(text))
        return np.asarray(vectors[0], dtype=np.float32)


def load_onnx_encoder(
    pipeline: QueryPipeline,
    *,
    name: str,
    model_dir: Path | None,
    cache_dir: Path | None,
    threads: int | None = None,
) -> OnnxQueryEncoder:
    """Export (or reuse the cached export of) `pipeline`, open it and check it against torch.

    Without a `cache_dir`, or without a model folder to key the cache on, the graph is exported
    to a temporary file on every call. Raises on any failure; the caller decides to fall back.
    """
    if (missing := missing_extra("onnx", "the ONNX query encoder")) is not None:
        raise QueryEncoderError(missing)
    if pipeline.device.type != "cpu":
        raise QueryEncoderError(f"ONNX queries run on CPU; the model is on {pipeline.device}")
    threads = threads or default_threads()
    if cache_dir is None or model_dir is None:
        session = _uncached_session(pipeline, threads)
    else:
        path = cached_export(pipeline, cache_dir / cache_file_name(name, model_dir))
        session = open_session(path, threads)
    encoder = OnnxQueryEncoder(session, pipeline.tokenize)
    _verify(encoder, pipeline)
    return encoder


def default_threads() -> int:
    """At most two intra-op threads: one query gains little from more; PostgreSQL needs CPU too."""
    return min(2, available_cpus())


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's count)."""
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return max(1, available or os.cpu_count() or 1)


def cache_file_name(name: str, model_dir: Path) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"
    return f"{slug}-{cache_key(model_dir)}.onnx"


def cache_key(model_dir: Path) -> str:
    """A hash of what the exported graph depends on: the model folder's path and files, the
    exporting libraries' versions and this module's export format. Size and mtime stand for a
    file's content, so a replaced or re-downloaded model gets a new key without reading 90 MB.
    """
    digest = hashlib.sha256()
    for part in _identity(model_dir):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:24]


def _identity(model_dir: Path) -> Iterator[str]:
    root = model_dir.resolve()
    yield str(root)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        stat = path.stat()
        yield f"{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}"
    yield f"torch={torch.__version__}"
    yield f"onnx={_version('onnx')}"
    yield f"opset={OPSET} format={EXPORT_FORMAT}"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def cached_file(path: Path, write: Callable[[Path], None]) -> Path:
    """`path`, written first by `write(temporary)` unless a previous run (or another process)
    already did. Used for the float export and its int8 variant (`quantized`)."""
    if path.is_file():
        log.debug("reusing ONNX graph %s", path)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed over it: processes exporting at the same time each
    # rename a complete file, and a reader never sees a partial one.
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    log.info("wrote ONNX graph %s", path)
    return path


def cached_export(pipeline: QueryPipeline, path: Path) -> Path:
    """`path`, the float graph of `pipeline`, exported first unless already there."""
    return cached_file(path, lambda out: export(pipeline, out))


def _uncached_session(pipeline: QueryPipeline, threads: int) -> Any:
    # The session reads the whole file when it opens, so the folder can go right after.
    with tempfile.TemporaryDirectory(prefix="ragservice-onnx-") as tmp:
        path = Path(tmp) / "query_encoder.onnx"
        export(pipeline, path)
        return open_session(path, threads)


def export(pipeline: QueryPipeline, out: Path) -> None:
    """Write `pipeline` as an ONNX graph (float) to `out`: dynamic batch and sequence axes."""
    dynamic = {name: {0: "batch", 1: "sequence"} for name in pipeline.names}
    with warnings.catch_warnings():
        # The legacy exporter warns that it is deprecated and that transformers' Python-level
        # checks become constants; the example below is padded so the traced branch is the
        # general one, and `_verify` checks the result.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            pipeline.module,
            _example(pipeline),
            out,
            input_names=list(pipeline.names),
            output_names=[OUTPUT_NAME],
            dynamic_axes={**dynamic, OUTPUT_NAME: {0: "batch"}},
            opset_version=OPSET,
            # TorchScript tracing: the dynamo exporter would need onnxscript, and this one suffices.
            dynamo=False,
        )


def _example(pipeline: QueryPipeline) -> tuple[torch.Tensor, ...]:
    """Two texts of different lengths: a trace that sees no padding may keep a mask-free branch."""
    short = pipeline.tokenize("a query")
    long = pipeline.tokenize("a longer query, so that the first one needs padding")
    width = long["input_ids"].shape[1]

    def stacked(name: str) -> torch.Tensor:
        padded = np.pad(short[name], ((0, 0), (0, width - short[name].shape[1])))
        return torch.from_numpy(np.concatenate([padded, long[name]]))

    return tuple(stacked(name) for name in pipeline.names)


def open_session(path: Path, threads: int) -> Any:
    """An ONNX Runtime CPU session on `path`, `threads` intra-op threads that do not spin."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Spinning idle workers take CPU from PostgreSQL on small machines, as torch's OpenMP threads
    # do without OMP_WAIT_POLICY=PASSIVE; on a busy 2-core machine spinning was slower anyway
    # (SciFact queries, p50 11.2 ms spinning against 8.7 ms not).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _verify(encoder: OnnxQueryEncoder, pipeline: QueryPipeline) -> None:
    expected = pipeline.torch_forward(pipeline.tokenize(_PROBE))
    difference = float(np.abs(encoder.encode(_PROBE) - expected).max())
    if not difference <= _TOLERANCE:
        raise QueryEncoderError(f"ONNX vector differs from torch by {difference:.2e}")
