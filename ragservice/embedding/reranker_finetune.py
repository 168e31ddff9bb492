"""Train a cross-encoder reranker on feedback triplets (question, relevant, hard negative).

No cross-encoder can be downloaded, but the embedding model's transformer reads text well: it
becomes a sentence-transformers `CrossEncoder` with a new one-logit head, trained on the same
triplets as `finetune.py` (split the same way, BY QUESTION). Two losses:

- `bce`: (question, relevant) = 1 and (question, hard negative) = 0, binary cross-entropy;
- `mnrl`: each question against its relevant text, its hard negative and other questions'
  texts of the batch (a listwise softmax).

Held-out figures: each held-out question ranks its own relevant texts and hard negatives (the
candidates a search would hand the reranker): the base model's cosine similarity (`before`)
against the trained reranker (`after`). Training stops after `max_minutes` when given. The
model is saved under `RAGSERVICE_DATA_DIR/rerankers/NAME-vN` and registered as version N of
NAME; `RAGSERVICE_RERANKER=NAME:N` serves it.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from sqlalchemy.orm import Session

from ragservice import store
from ragservice.config import DatabaseSettings
from ragservice.db import Database
from ragservice.db.models import RerankerModel
from ragservice.embedding.embedder import resolve_device
from ragservice.embedding.evaluation import mean, ndcg_at_k
from ragservice.embedding.finetune import (
    BaseModel,
    Split,
    Triplet,
    check_name,
    register_folder,
    scratch_folder,
    split_by_anchor,
    trainer_arguments,
)
from ragservice.errors import ConfigurationError, InvalidInputError
from ragservice.extras import missing_extra

log = logging.getLogger(__name__)

Loss = Literal["bce", "mnrl"]
LOSSES: tuple[Loss, ...] = ("bce", "mnrl")
_K = 10


@dataclass(frozen=True)
class RerankerOptions:
    epochs: int = 1
    batch_size: int = 16
    max_steps: int | None = None
    max_minutes: float | None = None  # stop training after this long (bounded on a small CPU)
    learning_rate: float = 3e-5
    warmup_ratio: float = 0.1
    held_out: float = 0.1
    negatives: int | None = 4  # hard negatives kept per question (None: all)
    max_length: int = 256  # tokens of question + passage
    loss: Loss = "bce"
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 2:
            raise InvalidInputError("epochs must be at least 1 and batch size at least 2")
        if self.max_steps is not None and self.max_steps < 1:
            raise InvalidInputError("max steps must be at least 1")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise InvalidInputError("max minutes must be above 0")
        if not 0 <= self.held_out < 1:
            raise InvalidInputError("the held-out share must be at least 0 and below 1")
        if self.learning_rate <= 0 or self.max_length < 16:
            raise InvalidInputError("the learning rate must be above 0, max length at least 16")
        if self.negatives is not None and self.negatives < 1:
            raise InvalidInputError("keep at least one negative per question")
        if self.loss not in LOSSES:
            raise InvalidInputError(f"loss {self.loss!r}: one of {', '.join(LOSSES)}")


@dataclass(frozen=True)
class TrainedReranker:
    path: Path
    before: dict[str, float]
    after: dict[str, float]
    steps: int
    seconds: float
    stopped_early: bool
    device: str


@dataclass(frozen=True)
class RerankerResult:
    model: RerankerModel
    path: Path
    details: dict[str, Any]

    def summary(self) -> dict[str, Any]:
        """The figures a run prints last, as one JSON object."""
        ref = {"id": self.model.id, "name": self.model.name, "version": self.model.version}
        return {"reranker": ref, "path": str(self.path), **self.details}


# -- data ------------------------------------------------------------------------------------


def capped(rows: Sequence[Triplet], negatives: int | None) -> list[Triplet]:
    """The triplets with at most `negatives` distinct hard negatives per question (the first
    ones in the rows' order), every relevant text kept: bounds the training time."""
    if negatives is None:
        return list(rows)
    kept: dict[str, list[str]] = {}
    for row in rows:
        chosen = kept.setdefault(row["anchor"], [])
        if row["negative"] not in chosen and len(chosen) < negatives:
            chosen.append(row["negative"])
    return [row for row in rows if row["negative"] in kept[row["anchor"]]]


def pairs(rows: Sequence[Triplet]) -> dict[str, list[Any]]:
    """Labelled (question, text) pairs, each once: relevant 1.0, hard negative 0.0."""
    labels: dict[tuple[str, str], float] = {}
    for row in rows:
        labels[(row["anchor"], row["positive"])] = 1.0
        labels.setdefault((row["anchor"], row["negative"]), 0.0)
    return {
        "query": [q for q, _ in labels],
        "passage": [t for _, t in labels],
        "label": list(labels.values()),
    }


# -- evaluation ------------------------------------------------------------------------------


def candidates(held_out: Sequence[Triplet]) -> dict[str, tuple[list[str], set[str]]]:
    """Each held-out question → (its texts to rank, the relevant ones)."""
    found: dict[str, tuple[list[str], set[str]]] = {}
    for row in held_out:
        texts, relevant = found.setdefault(row["anchor"], ([], set()))
        relevant.add(row["positive"])
        for text in (row["positive"], row["negative"]):
            if text not in texts:
                texts.append(text)
    return found


def ranking_figures(
    held_out: Sequence[Triplet], score: Any, *, batch_size: int = 32
) -> dict[str, float]:
    """nDCG@10, MRR@10 and pair accuracy (relevant above negative) of ranking each held-out
    question's own candidates by `score(list of (question, text)) → scores`."""
    if not held_out:
        return {}
    ndcg, mrr, wins = [], [], []
    for question, (texts, relevant) in candidates(held_out).items():
        scores = np.asarray(score([(question, t) for t in texts]), dtype=np.float32)
        order = np.lexsort((np.arange(len(texts)), -scores))[:_K]
        ranked = [texts[i] for i in order]
        ndcg.append(ndcg_at_k(ranked, dict.fromkeys(relevant, 1), _K))
        mrr.append(next((1 / (r + 1) for r, t in enumerate(ranked) if t in relevant), 0.0))
        by_text = dict(zip(texts, scores, strict=True))
        wins += [by_text[p] > by_text[n] for p in relevant for n in texts if n not in relevant]
    return {
        f"ndcg@{_K}": round(mean(ndcg), 4),
        f"mrr@{_K}": round(mean(mrr), 4),
        "pair_accuracy": round(float(np.mean(wins)) if wins else 0.0, 4),
    }


def _bi_encoder_scorer(base: str, device: str) -> Any:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(base, device=device, local_files_only=Path(base).exists())

    def score(batch: list[tuple[str, str]]) -> Any:
        vectors = model.encode(
            [q for q, _ in batch[:1]] + [t for _, t in batch],
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return vectors[1:] @ vectors[0]

    return score


def _cross_encoder_scorer(model: Any, batch_size: int) -> Any:
    import torch

    def score(batch: list[tuple[str, str]]) -> Any:
        return model.predict(
            batch,
            batch_size=batch_size,
            activation_fn=torch.nn.Identity(),
            show_progress_bar=False,
            convert_to_numpy=True,
        )

    return score


# -- training --------------------------------------------------------------------------------


def train(
    base: str, split: Split, options: RerankerOptions, out_dir: Path, *, progress: bool = True
) -> TrainedReranker:
    """A cross-encoder from the transformer in folder `base` (a new head), trained on
    `split.train`, its held-out figures measured, saved to `out_dir`."""
    from sentence_transformers import CrossEncoder

    if not split.train:
        raise InvalidInputError("no training triplets left after holding out the evaluation part")
    started = time.perf_counter()
    device = resolve_device(options.device)
    before = ranking_figures(split.held_out, _bi_encoder_scorer(base, device))
    model = CrossEncoder(
        base,
        num_labels=1,
        max_length=options.max_length,
        device=device,
        local_files_only=Path(base).exists(),
    )
    steps, stopped = _fit(model, capped(split.train, options.negatives), options, device, progress)
    after = ranking_figures(split.held_out, _cross_encoder_scorer(model, options.batch_size * 2))
    model.save(str(out_dir))
    return TrainedReranker(
        path=out_dir,
        before=before,
        after=after,
        steps=steps,
        seconds=round(time.perf_counter() - started, 2),
        stopped_early=stopped,
        device=device,
    )


def _fit(
    model: Any, rows: list[Triplet], options: RerankerOptions, device: str, progress: bool
) -> tuple[int, bool]:
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoderTrainer, losses

    loss: Any
    if options.loss == "bce":
        dataset = Dataset.from_dict(pairs(rows))
        loss = losses.BinaryCrossEntropyLoss(model)
    else:
        fields = ("anchor", "positive", "negative")
        dataset = Dataset.from_dict({f: [row[f] for row in rows] for f in fields})
        loss = losses.MultipleNegativesRankingLoss(model, num_negatives=options.batch_size // 4)
    deadline = _Deadline(options.max_minutes)
    with tempfile.TemporaryDirectory(prefix="ragservice-reranker-") as scratch:
        trainer = CrossEncoderTrainer(
            model=model,
            args=_arguments(options, device, len(dataset), scratch, progress=progress),
            train_dataset=dataset,
            loss=loss,
            callbacks=[deadline.callback()],
        )
        output = trainer.train()
    return int(output.global_step), deadline.reached


class _Deadline:
    """Stops training at the end of the step that passes `minutes`."""

    def __init__(self, minutes: float | None) -> None:
        self._end = None if minutes is None else time.monotonic() + minutes * 60
        self.reached = False

    def callback(self) -> Any:
        from transformers import TrainerCallback

        deadline = self

        class StopAtDeadline(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
                if deadline._end is not None and time.monotonic() >= deadline._end:
                    deadline.reached = True
                    control.should_training_stop = True
                return control

        return StopAtDeadline()


def _arguments(
    options: RerankerOptions, device: str, rows: int, scratch: str, *, progress: bool
) -> Any:
    from sentence_transformers.cross_encoder import CrossEncoderTrainingArguments

    return CrossEncoderTrainingArguments(
        **trainer_arguments(options, device, rows, scratch, progress=progress)
    )


# -- the whole run ---------------------------------------------------------------------------


def finetune_reranker(
    db: Database,
    database: DatabaseSettings,
    rows: Iterable[Triplet],
    *,
    name: str,
    base: BaseModel,
    options: RerankerOptions,
    source: Mapping[str, Any] | None = None,
    progress: bool = True,
) -> RerankerResult:
    """Split, train, evaluate, save to `data_dir/rerankers/NAME-vN` and register version N
    of NAME. A failure anywhere leaves no row and no folder."""
    if (missing := missing_extra("finetune", "fine-tuning")) is not None:
        raise ConfigurationError(missing)
    check_name(name)
    split = split_by_anchor(rows, options.held_out, options.seed)
    if not split.train and not split.held_out:
        raise InvalidInputError(
            "no training triplets: feedback must mark chunks relevant, with retrieved chunks "
            "left unmarked or marked irrelevant"
        )
    with scratch_folder(database.data_dir / "rerankers", name) as scratch:
        trained = train(base.path, split, options, scratch, progress=progress)
        details = {
            "base": {"id": base.model_id, "model": base.label, "path": base.path},
            "data": {**split.counts(), "source": dict(source or {})},
            "held_out": {"before": trained.before, "after": trained.after},
            "training": {
                "steps": trained.steps,
                "seconds": trained.seconds,
                "stopped_at_max_minutes": trained.stopped_early,
                "device": trained.device,
            },
            "hyperparameters": asdict(options),
        }
        return _register(db, database, name, trained, base, details)


def _register(
    db: Database,
    database: DatabaseSettings,
    name: str,
    trained: TrainedReranker,
    base: BaseModel,
    details: dict[str, Any],
) -> RerankerResult:
    def record(session: Session, version: int, path: Path) -> RerankerModel:
        return store.rerankers.register(
            session, name=name, version=version, path=str(path), base=base.label, details=details
        )

    row, path = register_folder(
        db,
        trained.path,
        database.data_dir / "rerankers",
        name,
        what="reranker",
        next_version=store.rerankers.next_version,
        record=record,
    )
    return RerankerResult(model=row, path=path, details=details)
