"""Cross-encoder reranking behind one small protocol. Never imports the database layer.

A cross-encoder reads the query and a passage together and scores their relevance: slower than
comparing vectors, so it rescores only the first candidates of a search (`rerank_candidates`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from ragservice.config import Settings
from ragservice.embedding.embedder import resolve_device
from ragservice.errors import ConfigurationError

if TYPE_CHECKING:
    # Only for annotations: search.py brings in the database layer, which adapters never load.
    from ragservice.retrieval.search import SearchHit

log = logging.getLogger(__name__)

Scores = npt.NDArray[np.float32]


class Reranker(Protocol):
    """Scores passages against a query: one float32 per text, in input order, higher = better."""

    @property
    def name(self) -> str: ...

    def rerank(self, query: str, texts: Sequence[str]) -> Scores: ...


class CrossEncoderReranker:
    """A sentence-transformers `CrossEncoder` with one output label, loaded once in `warm_up`.

    Scores are the model's raw logits, with no sigmoid: the order is the same, and a sigmoid
    rounds every logit above ~17 to exactly 1.0 in float32, turning the most relevant passages
    into ties. Scores compare passages for one query; they are not probabilities.
    fp16 on CUDA. Safe to call from many threads (one prediction at a time).
    """

    def __init__(
        self, name: str, *, folder: str | None = None, device: str = "auto", batch_size: int = 32
    ) -> None:
        self._name = name
        self._folder = folder  # a registered reranker's folder; else `name` says where
        self._device = device
        self._batch_size = batch_size
        self._model: Any = None
        self._load_lock = threading.Lock()
        # The transformers tokenizer reconfigures its Rust tokenizer on every call (padding,
        # truncation), so two threads predicting at once can corrupt each other's batches.
        self._predict_lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    @property
    def device(self) -> str:
        return str(self._loaded().device)

    def warm_up(self) -> None:
        """Load the model (once; later calls do nothing)."""
        self._loaded()

    def rerank(self, query: str, texts: Sequence[str]) -> Scores:
        """Score each text against `query`; loads the model on first use if not warmed up."""
        if not texts:
            return np.zeros(0, dtype=np.float32)
        import torch

        model = self._loaded()
        with self._predict_lock:
            scores = model.predict(
                [(query, text) for text in texts],
                batch_size=self._batch_size,
                activation_fn=torch.nn.Identity(),
                show_progress_bar=False,
                convert_to_numpy=True,
            )
        return np.asarray(scores, dtype=np.float32).reshape(len(texts))

    def _loaded(self) -> Any:
        if self._model is None:
            with self._load_lock:
                if self._model is None:
                    self._model = self._load()
        return self._model

    def _load(self) -> Any:
        from sentence_transformers import CrossEncoder
        from transformers.utils import logging as hf_logging

        # A weight-loading progress bar at every start is noise in a service.
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

        device = resolve_device(self._device)
        folder = Path(self._folder) if self._folder else _model_folder(self._name)
        try:
            model = CrossEncoder(
                str(folder) if folder is not None else self._name,
                device=device,
                local_files_only=folder is not None,
            )
        except Exception as exc:
            raise ConfigurationError(_load_failure(self._name, folder)) from exc
        if model.num_labels != 1:
            raise ConfigurationError(
                f"reranker model {self._name!r} has {model.num_labels} output labels; "
                "a reranker needs a single relevance score"
            )
        if device.startswith("cuda"):
            model.half()
        log.info("loaded reranker %s on %s", self._name, device)
        return model


def _model_folder(name: str) -> Path | None:
    """The model's folder, or None when `name` is a Hugging Face model id.

    A name written as a path (absolute, or from `.` or `~`) is a folder even when missing, so
    that it fails as a missing folder, never as an odd model id looked up on the hub.
    """
    folder = Path(name).expanduser()
    if folder.is_dir() or name.startswith((".", "~")) or folder.is_absolute():
        return folder
    return None


def _load_failure(name: str, folder: Path | None) -> str:
    if folder is None:
        return f"could not load reranker model {name!r}: no such folder or cached model"
    if not folder.is_dir():
        return f"could not load reranker model: no folder {str(folder)!r}"
    return f"could not load reranker model from {str(folder)!r}: not a cross-encoder model"


def make_reranker(
    settings: Settings, *, resolve: Callable[[str], str | None] | None = None
) -> CrossEncoderReranker | None:
    """The configured reranker, not yet loaded (call `warm_up`); None when reranking is off.

    `resolve` maps `RAGSERVICE_RERANKER` to a registered reranker's folder (None when it names
    none: a path or a hub model): this module never reads the database itself.
    """
    name = settings.answering.reranker
    if not name:
        return None
    folder = resolve(name) if resolve is not None else None
    return CrossEncoderReranker(name, folder=folder, device=settings.embedding.device)


def rerank_hits(
    reranker: Reranker, query: str, hits: Sequence[SearchHit], k: int
) -> list[SearchHit]:
    """The `k` hits the reranker scores highest, best first, each `score` now the rerank score.

    Equal scores keep the hits' original order. The retrieval score is replaced, not kept:
    callers who need it hold the hits they passed in (match them by `chunk_id`).
    """
    if k < 1 or not hits:
        return []
    scores = reranker.rerank(query, [hit.text for hit in hits])
    if scores.shape != (len(hits),):
        raise ValueError(
            f"reranker {reranker.name!r} returned {scores.shape} scores for {len(hits)} texts"
        )
    # A stable sort of the negated scores: best first, ties in input order.
    order = np.argsort(-scores, kind="stable")[:k]
    return [dataclasses.replace(hits[i], score=float(scores[i])) for i in order]
