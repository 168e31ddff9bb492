"""`benchmarks/scale_support.py`: the distractor model is deterministic and calibrated to the
real corpus's neighbour cosine, and the exhaustive BM25 oracle tells an exact top k (ties at
the cut allowed) from an approximate one."""

from __future__ import annotations

import importlib.util
import math
import sys
from types import ModuleType

import numpy as np

from tests.unit.test_layering import ROOT


def _load() -> ModuleType:
    path = ROOT / "benchmarks" / "scale_support.py"
    spec = importlib.util.spec_from_file_location("scale_support", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["scale_support"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


support = _load()


def _corpus(seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((20, 32))
    return support.unit(
        (centres[rng.integers(0, 20, 1000)] + rng.standard_normal((1000, 32)) * 0.6).astype(
            np.float32
        )
    )


def test_distractors_are_deterministic_under_a_seed_and_unit_length() -> None:
    real = _corpus()
    draws = [
        support.DistractorModel.fit(real, np.random.default_rng(1)).draw(
            np.random.default_rng(2), 50
        )
        for _ in range(2)
    ]
    np.testing.assert_array_equal(draws[0], draws[1])
    np.testing.assert_allclose(np.linalg.norm(draws[0], axis=1), 1, rtol=1e-5)


def test_the_calibrated_distractors_crowd_real_chunks_as_the_corpus_does() -> None:
    real = _corpus()
    rng = np.random.default_rng(5)
    model = support.DistractorModel.fit(real, rng, per_cluster=50)
    sample = rng.choice(len(real), 100, replace=False)
    target = float(np.median(support.real_neighbour_cosines(real, sample)))
    model.scale = support.calibrate(model, real[sample], target, 3000, rng)
    distractors = model.draw(np.random.default_rng(6), 3000)
    check = np.median(support.top_cosines(real[sample], distractors))
    assert abs(check - target) <= 0.05


def test_exhaustive_bm25_scores_every_posting_with_lucene_idf() -> None:
    term = support.Postings(np.array([1, 2]), np.array([2.0, 1.0]), np.array([10.0, 20.0]))
    other = support.Postings(np.array([2]), np.array([1.0]), np.array([20.0]))
    chunks, scores = support.bm25_scores([term, other], 10, 15, 0.9, 0.4)
    idf2, idf1 = math.log(1 + 8.5 / 2.5), math.log(1 + 9.5 / 1.5)
    one = idf2 * 2 * 1.9 / (2 + 0.9 * (0.6 + 0.4 * 10 / 15))
    two = (idf2 + idf1) * 1.9 / (1 + 0.9 * (0.6 + 0.4 * 20 / 15))
    assert chunks.tolist() == [1, 2]
    np.testing.assert_allclose(scores, [one, two])


def test_a_top_k_is_exact_with_any_of_the_chunks_tied_at_the_cut() -> None:
    chunks = np.array([1, 2, 3, 4, 5])
    scores = np.array([5.0, 4.0, 3.0, 3.0, 1.0])
    assert support.same_top([1, 2, 4], chunks, scores, 3)
    assert support.same_top([2, 1, 3], chunks, scores, 3)
    assert not support.same_top([1, 3, 4], chunks, scores, 3)  # 2 missing
    assert not support.same_top([1, 2, 5], chunks, scores, 3)  # 5 below the cut
    assert not support.same_top([1, 2], chunks, scores, 3)  # too few
    assert support.same_top([1, 2, 3, 4, 5], chunks, scores, 10)  # fewer matches than k
