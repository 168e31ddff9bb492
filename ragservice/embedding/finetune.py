"""Fine-tune the embedding model on (question, relevant chunk, hard negative) triplets.

The triplets come from users' feedback (`exports.triplets`). Questions are split in two BY
QUESTION: a held-out part, never trained on, measures the model before and after (triplet
accuracy, and nDCG@10 / MRR@10 of ranking all held-out chunks for each held-out question).
Training is sentence-transformers' trainer with MultipleNegativesRankingLoss: each question
against its relevant chunk, its hard negative and the other chunks of the batch; on CUDA with
fp16 when there is a GPU. The result is saved under `RAGSERVICE_DATA_DIR/models/NAME-vN` and
registered as a new, inactive version of NAME: `ragservice reembed` embeds the corpus with it,
`ragservice models activate` switches to it.
"""

from __future__ import annotations

import importlib
import logging
import random
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
from sqlalchemy.orm import Session

from ragservice import store
from ragservice.config import EmbeddingSettings, Settings
from ragservice.db import Database
from ragservice.db.models import EmbeddingModel
from ragservice.embedding.embedder import resolve_device, resolve_model_path
from ragservice.embedding.evaluation import mean, ndcg_at_k
from ragservice.embedding.registry import get_model_by_name
from ragservice.errors import ConfigurationError, InvalidInputError, NotFoundError
from ragservice.extras import missing_extra

log = logging.getLogger(__name__)

Triplet = Mapping[str, str]
"""`{"anchor": question, "positive": relevant text, "negative": irrelevant text}`."""

_FIELDS = ("anchor", "positive", "negative")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # whole: fullmatch
_K = 10


@dataclass(frozen=True)
class TrainingOptions:
    epochs: int = 1
    batch_size: int = 32
    max_steps: int | None = None  # stop after this many optimizer steps (before the epochs end)
    learning_rate: float = 2e-5
    warmup_ratio: float = 0.1
    held_out: float = 0.1  # share of the questions kept for evaluation
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 2:
            raise InvalidInputError("epochs must be at least 1 and batch size at least 2")
        if self.max_steps is not None and self.max_steps < 1:
            raise InvalidInputError("max steps must be at least 1")
        if not 0 <= self.held_out < 1:
            raise InvalidInputError("the held-out share must be at least 0 and below 1")
        if self.learning_rate <= 0:
            raise InvalidInputError("the learning rate must be above 0")


@dataclass(frozen=True)
class Split:
    train: list[Triplet]
    held_out: list[Triplet]

    def counts(self) -> dict[str, int]:
        return {
            "train_triplets": len(self.train),
            "train_questions": len({t["anchor"] for t in self.train}),
            "held_out_triplets": len(self.held_out),
            "held_out_questions": len({t["anchor"] for t in self.held_out}),
        }


@dataclass(frozen=True)
class BaseModel:
    """What a fine-tune starts from: a model folder, and its row when it is registered."""

    path: str
    label: str
    model_id: int | None = None


@dataclass(frozen=True)
class Trained:
    """A fine-tuned model saved in `path`, with what training measured."""

    path: Path
    dimension: int
    before: dict[str, float]
    after: dict[str, float]
    steps: int
    seconds: float
    device: str


@dataclass(frozen=True)
class FinetuneResult:
    model: EmbeddingModel
    path: Path
    details: dict[str, Any]

    def summary(self) -> dict[str, Any]:
        """The figures a run prints last, as one JSON object."""
        return {
            "model": {"id": self.model.id, "name": self.model.name, "version": self.model.version},
            "path": str(self.path),
            **self.details,
        }


# -- data ------------------------------------------------------------------------------------


def split_by_anchor(rows: Iterable[Triplet], held_out: float, seed: int) -> Split:
    """Duplicate-free triplets split so that no question is in both parts. The held-out part
    gets `held_out` of the questions (at least one when asked for and there are two or more)."""
    unique = list(dict.fromkeys(_triplet(row) for row in rows))
    anchors = sorted({anchor for anchor, _, _ in unique})
    random.Random(seed).shuffle(anchors)
    count = round(len(anchors) * held_out)
    if held_out > 0 and len(anchors) >= 2:
        count = min(max(count, 1), len(anchors) - 1)
    kept = set(anchors[:count])
    as_dicts = [dict(zip(_FIELDS, t, strict=True)) for t in unique]
    return Split(
        train=[t for t in as_dicts if t["anchor"] not in kept],
        held_out=[t for t in as_dicts if t["anchor"] in kept],
    )


def _triplet(row: Triplet) -> tuple[str, str, str]:
    try:
        values = tuple(str(row[field]) for field in _FIELDS)
    except KeyError as exc:
        raise InvalidInputError(f"a training row has no {exc.args[0]!r} field") from None
    return values[0], values[1], values[2]


# -- evaluation ------------------------------------------------------------------------------


def evaluate(model: Any, held_out: Sequence[Triplet], *, batch_size: int = 64) -> dict[str, float]:
    """Held-out figures of a loaded sentence-transformers model (empty without held-out data).

    - `triplet_accuracy`: share of triplets whose question is closer to the positive.
    - `ndcg@10`, `mrr@10`: each held-out question ranks every held-out text (all positives and
      negatives); its own positives are the relevant ones.
    """
    if not held_out:
        return {}
    anchors = list(dict.fromkeys(t["anchor"] for t in held_out))
    texts = list(dict.fromkeys(t[f] for t in held_out for f in ("positive", "negative")))
    vectors = _encode(model, anchors + texts, batch_size)
    queries, corpus = vectors[: len(anchors)], vectors[len(anchors) :]
    index = {text: i for i, text in enumerate(texts)}
    similarity = queries @ corpus.T
    return {
        "triplet_accuracy": _triplet_accuracy(held_out, anchors, index, similarity),
        **_ranking(held_out, anchors, texts, similarity),
    }


def _encode(model: Any, texts: list[str], batch_size: int) -> np.ndarray[Any, Any]:
    vectors = model.encode(
        texts,
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    return np.asarray(vectors, dtype=np.float32)


def _triplet_accuracy(
    held_out: Sequence[Triplet],
    anchors: list[str],
    index: dict[str, int],
    similarity: np.ndarray[Any, Any],
) -> float:
    row = {anchor: i for i, anchor in enumerate(anchors)}
    wins = [
        similarity[row[t["anchor"]], index[t["positive"]]]
        > similarity[row[t["anchor"]], index[t["negative"]]]
        for t in held_out
    ]
    return round(float(np.mean(wins)), 4)


def _ranking(
    held_out: Sequence[Triplet],
    anchors: list[str],
    texts: list[str],
    similarity: np.ndarray[Any, Any],
) -> dict[str, float]:
    relevant: dict[str, set[str]] = {}
    for t in held_out:
        relevant.setdefault(t["anchor"], set()).add(t["positive"])
    ndcg, mrr = [], []
    for i, anchor in enumerate(anchors):
        # Ties broken by text order, so equal models give equal figures.
        order = np.lexsort((np.arange(len(texts)), -similarity[i]))[:_K]
        ranked = [texts[j] for j in order]
        ndcg.append(ndcg_at_k(ranked, dict.fromkeys(relevant[anchor], 1), _K))
        mrr.append(next((1 / (r + 1) for r, t in enumerate(ranked) if t in relevant[anchor]), 0.0))
    return {f"ndcg@{_K}": round(mean(ndcg), 4), f"mrr@{_K}": round(mean(mrr), 4)}


# -- training --------------------------------------------------------------------------------


def train(
    base: str, split: Split, options: TrainingOptions, out_dir: Path, *, progress: bool = True
) -> Trained:
    """Fine-tune the model in folder `base` on `split.train`, evaluating `split.held_out`
    before and after, and save it to `out_dir`."""
    from sentence_transformers import SentenceTransformer

    if not split.train:
        raise InvalidInputError("no training triplets left after holding out the evaluation part")
    started = time.perf_counter()
    device = resolve_device(options.device)
    model = SentenceTransformer(base, device=device, local_files_only=Path(base).exists())
    before = evaluate(model, split.held_out)
    steps = _fit(model, split.train, options, device, progress=progress)
    after = evaluate(model, split.held_out)
    model.save(str(out_dir))
    return Trained(
        path=out_dir,
        dimension=_dimension(model),
        before=before,
        after=after,
        steps=steps,
        seconds=round(time.perf_counter() - started, 2),
        device=device,
    )


def _fit(
    model: Any, rows: list[Triplet], options: TrainingOptions, device: str, *, progress: bool
) -> int:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer

    dataset = Dataset.from_dict({f: [row[f] for row in rows] for f in _FIELDS})
    with tempfile.TemporaryDirectory(prefix="ragservice-finetune-") as scratch:
        trainer = SentenceTransformerTrainer(
            model=model,
            args=_arguments(options, device, len(rows), scratch, progress=progress),
            train_dataset=dataset,
            loss=_loss(model),
        )
        output = trainer.train()
    return int(output.global_step)


class Schedule(Protocol):
    """The training schedule both fine-tunes share (`TrainingOptions`, `RerankerOptions`)."""

    @property
    def epochs(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def max_steps(self) -> int | None: ...
    @property
    def learning_rate(self) -> float: ...
    @property
    def warmup_ratio(self) -> float: ...
    @property
    def seed(self) -> int: ...


def trainer_arguments(
    options: Schedule, device: str, rows: int, scratch: str, *, progress: bool
) -> dict[str, Any]:
    """The keyword arguments of a sentence-transformers trainer's arguments class: the
    schedule, the device's precision, nothing saved or reported."""
    per_epoch = max(1, -(-rows // options.batch_size))
    steps = options.max_steps or per_epoch * options.epochs
    return {
        "output_dir": scratch,
        "num_train_epochs": options.epochs,
        "max_steps": options.max_steps or -1,
        "per_device_train_batch_size": options.batch_size,
        "learning_rate": options.learning_rate,
        "warmup_steps": int(steps * options.warmup_ratio),
        "fp16": device.startswith("cuda"),
        "use_cpu": device == "cpu",
        "seed": options.seed,
        "data_seed": options.seed,
        "save_strategy": "no",
        "report_to": "none",
        "logging_strategy": "no",
        "disable_tqdm": not progress,
        "dataloader_pin_memory": device.startswith("cuda"),
    }


def _arguments(
    options: TrainingOptions, device: str, rows: int, scratch: str, *, progress: bool
) -> Any:
    training_args = _st_module("training_args")
    return training_args.SentenceTransformerTrainingArguments(
        **trainer_arguments(options, device, rows, scratch, progress=progress),
        # A repeated text in a batch would be another row's in-batch negative: a false one.
        batch_sampler=training_args.BatchSamplers.NO_DUPLICATES,
    )


def _loss(model: Any) -> Any:
    return _st_module("losses").MultipleNegativesRankingLoss(model)


def _st_module(name: str) -> Any:
    """A sentence-transformers module where version 6 keeps it, else where 3 to 5 did."""
    try:
        return importlib.import_module(f"sentence_transformers.sentence_transformer.{name}")
    except ImportError:
        return importlib.import_module(f"sentence_transformers.{name}")


def _dimension(model: Any) -> int:
    get = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(get())


# -- the whole run ---------------------------------------------------------------------------


def resolve_base(db: Database, embedding: EmbeddingSettings, ref: str | None) -> BaseModel:
    """`--base`: a registered model `NAME[:VERSION]`, a model folder, or the bundled MiniLM;
    by default the active model, else the configured one."""
    with db.read() as session:
        if ref is None:
            active = store.embedding_models.active_model(session)
            if active is not None and active.path and Path(active.path).exists():
                return _registered(active)
            ref = embedding.model
        try:
            return _registered(get_model_by_name(session, ref))
        except NotFoundError:
            pass
    path = resolve_model_path(ref)
    if not Path(path).is_dir():
        raise NotFoundError(
            f"unknown base model {ref!r}: give a registered model (`ragservice models list`), "
            "a folder with a sentence-transformers model, or all-MiniLM-L6-v2"
        )
    return BaseModel(path=path, label=ref, model_id=_registered_path(db, path))


def _registered(row: EmbeddingModel) -> BaseModel:
    path = row.path or resolve_model_path(row.name)
    if not Path(path).is_dir():
        raise NotFoundError(f"base model {row.name}:{row.version} has no folder here ({path})")
    return BaseModel(path=path, label=f"{row.name}:{row.version}", model_id=row.id)


def _registered_path(db: Database, path: str) -> int | None:
    with db.read() as session:
        rows = store.embedding_models.list_models(session)
    resolved = Path(path).resolve()
    return next((m.id for m in rows if m.path and Path(m.path).resolve() == resolved), None)


def check_name(name: str) -> str:
    """A model name is part of a folder name and of `NAME:VERSION` references."""
    if not _NAME.fullmatch(name):
        raise InvalidInputError(
            f"model name {name!r}: use letters, digits, '.', '_' and '-' (up to 100 characters)"
        )
    return name


def finetune(
    db: Database,
    settings: Settings,
    rows: Iterable[Triplet],
    *,
    name: str,
    base: BaseModel,
    options: TrainingOptions,
    source: Mapping[str, Any] | None = None,
    progress: bool = True,
) -> FinetuneResult:
    """Split, train, evaluate, save to `data_dir/models/NAME-vN` and register version N of
    NAME (inactive). `source` describes where the rows came from (kept in the row's details)."""
    if (missing := missing_extra("finetune", "fine-tuning")) is not None:
        raise ConfigurationError(missing)
    check_name(name)
    split = split_by_anchor(rows, options.held_out, options.seed)
    if not split.train and not split.held_out:
        raise InvalidInputError(
            "no training triplets: feedback must mark chunks relevant (or rate an answer that "
            "cites sources well), with retrieved chunks left unmarked or marked irrelevant"
        )
    with scratch_folder(settings.database.data_dir / "models", name) as scratch:
        trained = train(base.path, split, options, scratch, progress=progress)
        details = _details(split, trained, base, options, source or {})
        return _register(db, settings, name, trained, base, details)


@contextmanager
def scratch_folder(folder: Path, name: str) -> Iterator[Path]:
    """A path to train into beside the versioned folders (so that registering is a rename on
    the same file system), removed afterwards whatever happened."""
    folder.mkdir(parents=True, exist_ok=True)
    scratch = folder / f".{name}-{uuid.uuid4().hex[:8]}"
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


Row = TypeVar("Row")


def register_folder(
    db: Database,
    trained: Path,
    folder: Path,
    name: str,
    *,
    what: str,
    next_version: Callable[[Session, str], int],
    record: Callable[[Session, int, Path], Row],
) -> tuple[Row, Path]:
    """Move `trained` to `folder/NAME-vN` and `record` version N, in one transaction: a
    failure leaves neither a row without a folder nor a folder without a row."""
    moved: Path | None = None
    try:
        with db.write() as session:
            version = next_version(session, name)
            path = folder.resolve() / f"{name}-v{version}"
            if path.exists():
                raise InvalidInputError(f"{path} exists but is no registered {what}; move it away")
            moved = trained.rename(path)
            row = record(session, version, path)
    except BaseException:
        if moved is not None:
            shutil.rmtree(moved, ignore_errors=True)
        raise
    log.info("registered %s %s v%d at %s", what, name, version, path)
    return row, path


def _register(
    db: Database,
    settings: Settings,
    name: str,
    trained: Trained,
    base: BaseModel,
    details: dict[str, Any],
) -> FinetuneResult:
    def record(session: Session, version: int, path: Path) -> EmbeddingModel:
        return store.embedding_models.register_model_version(
            session,
            name=name,
            version=version,
            dimension=trained.dimension,
            path=str(path),
            base_model_id=base.model_id,
            details=details,
            hnsw_m=settings.indexing.hnsw_m,
            hnsw_ef_construction=settings.indexing.hnsw_ef_construction,
            storage=settings.indexing.vector_storage,
        )

    model, path = register_folder(
        db,
        trained.path,
        settings.database.data_dir / "models",
        name,
        what="model",
        next_version=store.embedding_models.next_model_version,
        record=record,
    )
    return FinetuneResult(model=model, path=path, details=details)


def _details(
    split: Split,
    trained: Trained,
    base: BaseModel,
    options: TrainingOptions,
    source: Mapping[str, Any],
) -> dict[str, Any]:
    return {
        "base": {"id": base.model_id, "model": base.label, "path": base.path},
        "data": {**split.counts(), "source": dict(source)},
        "held_out": {"before": trained.before, "after": trained.after},
        "training": {"steps": trained.steps, "seconds": trained.seconds, "device": trained.device},
        "hyperparameters": asdict(options),
    }
