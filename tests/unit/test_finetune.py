"""Fine-tuning without a database: the split by question, the held-out figures, a tiny real
training run whose result loads through the service's own loading code, and the model
registry's switch (a load never blocks the model being served)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from ragservice.config import Settings
from ragservice.embedding import registry
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from ragservice.embedding.finetune import Split, TrainingOptions, evaluate, split_by_anchor, train
from ragservice.errors import InvalidInputError
from tests.tiny_models import TOPIC_WORDS


def rows(questions: int, per_question: int = 2) -> list[dict[str, str]]:
    return [
        {"anchor": f"q{q}", "positive": f"p{q}", "negative": f"n{q}-{i}"}
        for q in range(questions)
        for i in range(per_question)
    ]


# -- the split -------------------------------------------------------------------------------


def test_no_question_is_on_both_sides_of_the_split() -> None:
    split = split_by_anchor(rows(20), held_out=0.25, seed=3)
    train_anchors = {t["anchor"] for t in split.train}
    held_anchors = {t["anchor"] for t in split.held_out}
    assert not train_anchors & held_anchors
    assert (len(train_anchors), len(held_anchors)) == (15, 5)
    assert len(split.train) + len(split.held_out) == 40
    assert split.counts() == {
        "train_triplets": 30,
        "train_questions": 15,
        "held_out_triplets": 10,
        "held_out_questions": 5,
    }


def test_the_split_is_seeded_deduplicated_and_keeps_a_side_each() -> None:
    def held(split: Split) -> set[str]:
        return {t["anchor"] for t in split.held_out}

    data = rows(10)
    assert held(split_by_anchor(data, 0.3, 1)) == held(split_by_anchor(data[::-1], 0.3, 1))
    assert held(split_by_anchor(data, 0.3, 1)) != held(split_by_anchor(data, 0.3, 2))
    doubled = split_by_anchor(data + data, 0.3, 1)
    assert len(doubled.train) + len(doubled.held_out) == 20
    two = split_by_anchor(rows(2), held_out=0.01, seed=0)
    assert len({t["anchor"] for t in two.held_out}) == 1  # at least one when asked for
    almost_all = split_by_anchor(rows(2), held_out=0.99, seed=0)
    assert len({t["anchor"] for t in almost_all.train}) == 1  # and always one to train on
    assert split_by_anchor(rows(5), held_out=0.0, seed=0).held_out == []


def test_rows_without_the_three_fields_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="no 'negative' field"):
        split_by_anchor([{"anchor": "a", "positive": "b"}], 0.1, 0)


@pytest.mark.parametrize(
    "options",
    [
        {"epochs": 0},
        {"batch_size": 1},
        {"max_steps": 0},
        {"held_out": 1.0},
        {"learning_rate": 0.0},
    ],
)
def test_training_options_are_checked(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError):
        TrainingOptions(**options)


# -- held-out figures ------------------------------------------------------------------------


class FixedVectors:
    """A model whose vectors are given per text."""

    def __init__(self, vectors: dict[str, Sequence[float]]) -> None:
        self.vectors = vectors

    def encode(self, texts: list[str], **_: Any) -> np.ndarray[Any, Any]:
        return np.asarray([self.vectors[t] for t in texts], dtype=np.float32)


def test_held_out_figures_are_computed_over_all_held_out_texts() -> None:
    model = FixedVectors(
        {
            "qa": [1, 0],
            "qb": [0, 1],
            "pa": [0.9, 0.1],  # for qa: pa .9, nb .7, na .5, pb .2
            "na": [0.5, 0.5],
            "pb": [0.2, 0.8],  # for qb: pb .8, na .5, nb .3, pa .1
            "nb": [0.7, 0.3],
        }
    )
    held_out = [
        {"anchor": "qa", "positive": "pa", "negative": "na"},
        {"anchor": "qb", "positive": "pb", "negative": "nb"},
    ]
    figures = evaluate(model, held_out)
    assert figures == {"triplet_accuracy": 1.0, "ndcg@10": 1.0, "mrr@10": 1.0}
    swapped = [{"anchor": "qa", "positive": "na", "negative": "pa"}]
    worse = evaluate(model, swapped)
    assert worse["triplet_accuracy"] == 0.0
    assert worse["mrr@10"] == 0.5
    assert worse["ndcg@10"] == pytest.approx(1 / np.log2(3), abs=1e-4)
    assert evaluate(model, []) == {}


# -- a real, tiny training run ---------------------------------------------------------------


def test_two_steps_of_training_save_a_model_the_service_loads(
    tiny_path: Path, tmp_path: Path
) -> None:
    words = TOPIC_WORDS[:8]
    data = [
        {"anchor": f"about {w}", "positive": f"the {w} is near", "negative": f"the {v} is near"}
        for w, v in zip(words, words[1:] + words[:1], strict=True)
    ]
    split = split_by_anchor(data, 0.25, 0)
    options = TrainingOptions(batch_size=4, max_steps=2, device="cpu", learning_rate=1e-3)
    trained = train(str(tiny_path), split, options, tmp_path / "out", progress=False)
    assert (trained.steps, trained.dimension, trained.device) == (2, 32, "cpu")
    assert set(trained.before) == set(trained.after) == {"triplet_accuracy", "ndcg@10", "mrr@10"}
    loaded = SentenceTransformerEmbedder(str(trained.path), device="cpu")
    loaded.warm_up()
    before = SentenceTransformerEmbedder(str(tiny_path), device="cpu")
    texts = ["the river is near", "about music"]
    assert loaded.embed(texts).shape == (2, 32)
    assert not np.allclose(loaded.embed(texts), before.embed(texts))  # training changed it
    np.testing.assert_allclose(loaded.embed_query(texts[0]), loaded.embed(texts)[0], atol=1e-5)


def test_training_needs_training_rows(tiny_path: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="no training triplets"):
        train(str(tiny_path), Split(train=[], held_out=[]), TrainingOptions(), tmp_path)


# -- the registry's switch -------------------------------------------------------------------


class FakeEmbedder:
    def __init__(self, dimension: int) -> None:
        self.dimension = dimension

    def warm_up(self) -> None:
        pass


class FakeDatabase:
    @contextmanager
    def read(self) -> Iterator[None]:
        yield None


def serving(model_id: int, dimension: int = 4) -> registry.ServingModel:
    return registry.ServingModel(model_id, f"m{model_id}", 1, dimension, FakeEmbedder(dimension))  # type: ignore[arg-type]


def test_a_switch_loads_first_and_never_makes_the_serving_model_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    row = SimpleNamespace(id=2, name="m2", version=1, dimension=8, path="/m2", storage="float32")
    active: list[Any] = [SimpleNamespace(id=1, storage="float32")]
    monkeypatch.setattr(registry.store.embedding_models, "active_model", lambda _session: active[0])
    loading, release = threading.Event(), threading.Event()

    def slow_loader(_row: Any) -> Any:
        loading.set()
        assert release.wait(10)
        return FakeEmbedder(8)

    models = registry.ModelRegistry(
        FakeDatabase(),  # type: ignore[arg-type]
        Settings(),
        serving(1),
        loader=slow_loader,
    )
    first = models.current()
    assert models.refresh() is False
    active[0] = row
    switch = threading.Thread(target=models.refresh)
    switch.start()
    assert loading.wait(10)
    assert models.current() is first  # served while the new model loads
    release.set()
    switch.join(10)
    assert (models.current().id, models.current().dimension) == (2, 8)
    active[0] = SimpleNamespace(id=1, storage="float32")
    assert models.refresh() is True and models.current() is first  # kept loaded


def test_a_model_that_fails_to_load_is_skipped_until_another_is_active(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    active: list[Any] = [SimpleNamespace(id=3, name="bad", version=1, dimension=4, path="/bad")]
    monkeypatch.setattr(registry.store.embedding_models, "active_model", lambda _session: active[0])
    calls: list[int] = []

    def broken(row: Any) -> Any:
        calls.append(row.id)
        raise OSError("no such folder")

    models = registry.ModelRegistry(FakeDatabase(), Settings(), serving(1), loader=broken)  # type: ignore[arg-type]
    assert models.refresh() is False and models.refresh() is False
    assert calls == [3]  # tried once, logged once
    assert models.current().id == 1
