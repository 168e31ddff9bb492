"""Fusion, normalisation, document scores and RM3 weights: the pure functions of ranking."""

from __future__ import annotations

import pytest

from ragservice.retrieval.fusion import (
    Fusion,
    FusionSpec,
    document_scores,
    fuse,
    normalise,
    peakedness,
    rm3_weights,
)


def test_normalisations_map_each_side_onto_a_common_scale() -> None:
    scores = [10.0, 6.0, 2.0]
    assert normalise(scores, Fusion.MINMAX) == [1.0, 0.5, 0.0]
    zscore = normalise(scores, Fusion.ZSCORE)
    assert zscore[2] == 0 and zscore[0] == pytest.approx(2 * zscore[1])
    dbsf = normalise(scores, Fusion.DBSF)
    assert dbsf[1] == pytest.approx(0.5) and all(0 <= v <= 1 for v in dbsf)
    # A flat side carries no information but every candidate keeps full weight.
    assert normalise([3.0, 3.0], Fusion.MINMAX) == [1.0, 1.0]
    assert normalise([], Fusion.ZSCORE) == []
    assert peakedness([1.0, 0.1, 0.0]) > peakedness([1.0, 0.9, 0.0]) > 0
    # Statistics from the first `depth` only: a deeper list leaves the top's values alone.
    assert normalise([*scores, 0.0], Fusion.MINMAX, depth=3) == [1.0, 0.5, 0.0, -0.25]
    assert normalise([*scores, 0.0], Fusion.ZSCORE, depth=3)[:3] == pytest.approx(zscore)


def test_fuse_by_ranks_and_by_weighted_scores() -> None:
    dense = [("a", 0.9), ("b", 0.8), ("c", 0.1)]
    text = [("c", 30.0), ("a", 3.0)]
    rrf = dict(fuse(dense, text, FusionSpec(Fusion.RRF, rrf_k=60)))
    assert rrf["a"] == pytest.approx(1 / 61 + 1 / 62) and rrf["b"] == pytest.approx(1 / 62)
    # min-max: c is last on the dense side (0) but first in text (1); a the reverse.
    even = fuse(dense, text, FusionSpec(Fusion.MINMAX, text_weight=0.5))
    assert dict(even) == pytest.approx({"a": 0.5, "c": 0.5, "b": 0.5 * 0.875})
    assert [key for key, _ in even] == ["a", "c", "b"]  # equal scores: by key
    leaning = fuse(dense, text, FusionSpec(Fusion.MINMAX, text_weight=0.8))
    assert leaning[0][0] == "c"
    # Adaptive: the peaked text side (one clear winner) gains weight over the even split.
    adaptive = dict(fuse(dense, text, FusionSpec(Fusion.MINMAX, adaptive=True)))
    assert adaptive["c"] > adaptive["a"]
    # One side empty: the other's order stands.
    assert [k for k, _ in fuse(dense, [], FusionSpec(Fusion.ZSCORE))] == ["a", "b", "c"]


def test_documents_rank_by_best_chunk_plus_a_share_of_the_next() -> None:
    chunks = [("x", 0.9), ("y", 0.85), ("y", 0.8), ("y", 0.7), ("y", 0.6), ("x", -0.5)]
    assert document_scores(chunks) == [("x", 0.9), ("y", 0.85)]
    shared = dict(document_scores(chunks, share=0.1, extra=2))
    # y: 0.85 + 0.1 * (0.8 + 0.7); the fourth chunk is beyond `extra`; x's negative adds 0.
    assert shared == pytest.approx({"y": 1.0, "x": 0.9})


def test_rm3_interpolates_the_query_with_the_feedback_terms() -> None:
    rows = [("heart", 0.6), ("attack", 0.4), ("heart", None), ("risk", None)]
    lexemes, weights = rm3_weights(rows, query_weight=0.5)
    weight = dict(zip(lexemes, weights, strict=True))
    # Scaled by the 2 query lexemes: 0.5 / 2 * 2 + 0.5 * 0.6 * 2 for heart.
    assert weight == pytest.approx({"heart": 1.1, "risk": 0.5, "attack": 0.4})
    assert rm3_weights([("heart", None)], 0.5) == (["heart"], [1.0])  # no feedback: plain BM25
    assert rm3_weights([("heart", 1.0)], 0.5) == ([], [])  # no query lexemes: nothing to find
