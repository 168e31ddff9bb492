"""Reranking with a real (tiny, freshly trained) cross-encoder, and the pure reordering."""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragservice.config import Settings
from ragservice.errors import ConfigurationError
from ragservice.retrieval.rerank import CrossEncoderReranker, Scores, make_reranker, rerank_hits
from ragservice.retrieval.search import SearchHit
from tests.tiny_models import tiny_passage


@pytest.fixture(scope="module")
def reranker(tiny_cross_encoder_path: Path) -> CrossEncoderReranker:
    model = CrossEncoderReranker(str(tiny_cross_encoder_path), device="cpu")
    model.warm_up()
    return model


def passages(query: str, *, relevant_at: int, n: int = 6, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [tiny_passage(query, rng, relevant=i == relevant_at) for i in range(n)]


def hit(text: str, score: float) -> SearchHit:
    return SearchHit(
        chunk_id=uuid.uuid4(),
        score=score,
        text=text,
        ordinal=0,
        start_char=0,
        end_char=len(text),
        chunk_metadata={},
        collection_id=uuid.uuid4(),
        collection="docs",
        document_id=uuid.uuid4(),
        external_id=text,
        title=None,
        document_metadata={},
    )


def hits_for(texts: Sequence[str]) -> list[SearchHit]:
    """Hits in retrieval order: the first text has the best retrieval score."""
    return [hit(text, 1.0 - i / 10) for i, text in enumerate(texts)]


class FixedReranker:
    """Scores given up front, to test the reordering on its own; counts its calls."""

    def __init__(self, scores: Sequence[float]) -> None:
        self.scores = np.asarray(scores, dtype=np.float32)
        self.calls = 0

    @property
    def name(self) -> str:
        return "fixed"

    def rerank(self, query: str, texts: Sequence[str]) -> Scores:
        self.calls += 1
        return self.scores


# -- the cross-encoder ----------------------------------------------------------------------


def test_scores_are_float32_one_per_text_in_input_order(reranker: CrossEncoderReranker) -> None:
    texts = passages("ocean", relevant_at=2)
    scores = reranker.rerank("ocean", texts)
    assert scores.dtype == np.float32
    assert scores.shape == (len(texts),)
    assert int(np.argmax(scores)) == 2
    # The same texts reversed get the same scores reversed: nothing is sorted on the way.
    np.testing.assert_allclose(reranker.rerank("ocean", texts[::-1]), scores[::-1], atol=1e-5)


def test_the_score_depends_on_the_query(reranker: CrossEncoderReranker) -> None:
    texts = ["old apple near the river", "the music of a new engine"]
    assert reranker.rerank("apple", texts)[0] > reranker.rerank("apple", texts)[1]
    assert reranker.rerank("music", texts)[1] > reranker.rerank("music", texts)[0]


def test_rerank_moves_the_relevant_hit_from_last_to_first(reranker: CrossEncoderReranker) -> None:
    hits = hits_for(passages("castle", relevant_at=7, n=8, seed=1))
    ranked = rerank_hits(reranker, "castle", hits, k=3)
    assert ranked[0].chunk_id == hits[7].chunk_id
    assert len(ranked) == 3
    scores = [h.score for h in ranked]
    assert scores == sorted(scores, reverse=True)
    # Scores are replaced by the reranker's own, which separate the match by a wide margin.
    assert scores[0] == pytest.approx(float(reranker.rerank("castle", [hits[7].text])[0]), abs=1e-5)
    assert scores[0] - scores[1] > 2.0


def test_rerank_of_no_texts_is_empty(reranker: CrossEncoderReranker) -> None:
    scores = reranker.rerank("ocean", [])
    assert scores.shape == (0,)
    assert scores.dtype == np.float32


def test_many_threads_get_the_scores_one_thread_gets(reranker: CrossEncoderReranker) -> None:
    cases = [("river", passages("river", relevant_at=i % 5, n=5 + i, seed=i)) for i in range(8)]
    expected = [reranker.rerank(query, texts) for query, texts in cases]

    def work(i: int) -> bool:
        query, texts = cases[i % len(cases)]
        return bool(np.allclose(reranker.rerank(query, texts), expected[i % len(cases)], atol=1e-5))

    with ThreadPoolExecutor(max_workers=6) as pool:
        assert all(pool.map(work, range(32)))


def test_a_missing_folder_is_a_configuration_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigurationError, match="no-such-model"):
        CrossEncoderReranker(str(missing), device="cpu").warm_up()


def test_a_folder_without_a_model_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not a cross-encoder model"):
        CrossEncoderReranker(str(tmp_path), device="cpu").warm_up()


@pytest.fixture
def constructed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The model folders a `CrossEncoder` is built from from now on (the real class still runs)."""
    import sentence_transformers

    built: list[str] = []
    real = sentence_transformers.CrossEncoder

    def spy(model_name_or_path: str, *args: Any, **kwargs: Any) -> Any:
        built.append(model_name_or_path)
        return real(model_name_or_path, *args, **kwargs)

    monkeypatch.setattr(sentence_transformers, "CrossEncoder", spy)
    return built


def test_nothing_loads_before_warm_up_or_first_use(
    tiny_cross_encoder_path: Path, tmp_path: Path, constructed: list[str]
) -> None:
    # A bad name is only found out when loading: constructing must stay cheap and quiet.
    missing = CrossEncoderReranker(str(tmp_path / "missing"), device="cpu")
    warmed = CrossEncoderReranker(str(tiny_cross_encoder_path), device="cpu")
    used = CrossEncoderReranker(str(tiny_cross_encoder_path), device="cpu")
    assert warmed.name == str(tiny_cross_encoder_path)
    assert used.rerank("ocean", []).shape == (0,)
    assert constructed == []  # nor by naming it, nor by scoring no texts

    warmed.warm_up()
    warmed.warm_up()
    assert warmed.rerank("ocean", ["an ocean"]).shape == (1,)
    assert constructed == [str(tiny_cross_encoder_path)]  # once, at warm-up

    assert used.rerank("ocean", ["an ocean", "a river"]).shape == (2,)
    assert used.device == "cpu"
    assert constructed == [str(tiny_cross_encoder_path)] * 2  # once more, at first use

    with pytest.raises(ConfigurationError, match="missing"):
        missing.rerank("ocean", ["an ocean"])


# -- settings -------------------------------------------------------------------------------


def test_no_reranker_configured_means_none() -> None:
    assert make_reranker(Settings(reranker=None)) is None


def test_a_configured_reranker_is_named_after_the_setting(tiny_cross_encoder_path: Path) -> None:
    reranker = make_reranker(Settings(reranker=str(tiny_cross_encoder_path), device="cpu"))
    assert reranker is not None
    assert reranker.name == str(tiny_cross_encoder_path)


# -- reordering -----------------------------------------------------------------------------


def test_k_keeps_the_best_k_and_more_than_there_are_keeps_all() -> None:
    hits = hits_for(["a", "b", "c", "d"])
    fixed = FixedReranker([0.1, 0.9, 0.5, 0.7])
    assert [h.text for h in rerank_hits(fixed, "q", hits, k=2)] == ["b", "d"]
    assert [h.text for h in rerank_hits(fixed, "q", hits, k=10)] == ["b", "d", "c", "a"]
    assert [h.score for h in rerank_hits(fixed, "q", hits, k=2)] == pytest.approx([0.9, 0.7])


def test_equal_scores_keep_the_retrieval_order() -> None:
    hits = hits_for(["a", "b", "c", "d"])
    ranked = rerank_hits(FixedReranker([0.5, 0.8, 0.5, 0.5]), "q", hits, k=4)
    assert [h.text for h in ranked] == ["b", "a", "c", "d"]


def test_everything_but_the_score_is_kept() -> None:
    hits = hits_for(["a", "b"])
    ranked = rerank_hits(FixedReranker([0.2, 0.1]), "q", hits, k=2)
    assert ranked[0].chunk_id == hits[0].chunk_id
    assert ranked[0].external_id == hits[0].external_id
    assert ranked[0].score == pytest.approx(0.2)


def test_no_hits_or_no_room_asks_the_reranker_nothing() -> None:
    fixed = FixedReranker([])
    assert rerank_hits(fixed, "q", [], k=5) == []
    assert rerank_hits(fixed, "q", hits_for(["a"]), k=0) == []
    assert fixed.calls == 0


def test_a_reranker_returning_the_wrong_number_of_scores_is_refused() -> None:
    with pytest.raises(ValueError, match="2 texts"):
        rerank_hits(FixedReranker([0.5]), "q", hits_for(["a", "b"]), k=2)
