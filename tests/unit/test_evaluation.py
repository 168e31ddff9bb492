"""BEIR metrics against hand-computed values, and the BEIR file readers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ragservice.embedding.evaluation import (
    load_beir_queries,
    ndcg_at_k,
    rank_documents,
    recall_at_k,
)


def test_ndcg_perfect_ranking_is_one_and_empty_is_zero() -> None:
    assert ndcg_at_k(["a", "b"], {"a": 1, "b": 1}, 10) == pytest.approx(1.0)
    assert ndcg_at_k(["x", "y"], {"a": 1}, 10) == 0.0
    assert ndcg_at_k([], {}, 10) == 0.0


def test_ndcg_uses_graded_gains_and_a_log2_discount() -> None:
    relevance = {"a": 2, "b": 1}
    dcg = 1 / math.log2(2) + 2 / math.log2(3)  # b first, then a
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    assert ndcg_at_k(["b", "a"], relevance, 10) == pytest.approx(dcg / idcg)


def test_ndcg_cuts_at_k() -> None:
    assert ndcg_at_k(["x", "a"], {"a": 1}, 1) == 0.0
    assert ndcg_at_k(["x", "a"], {"a": 1}, 2) == pytest.approx(1 / math.log2(3))


def test_recall_counts_relevant_documents_in_the_top_k() -> None:
    relevance = {"a": 1, "b": 1, "c": 0}
    assert recall_at_k(["a", "x", "b"], relevance, 2) == 0.5
    assert recall_at_k(["a", "x", "b"], relevance, 3) == 1.0


def test_documents_rank_by_their_best_chunk() -> None:
    assert rank_documents(["d1", "d2", "d1", "d3", "d2"]) == ["d1", "d2", "d3"]


def test_beir_queries_keep_only_judged_queries(tmp_path: Path) -> None:
    (tmp_path / "qrels").mkdir()
    (tmp_path / "queries.jsonl").write_text(
        '{"_id": "1", "text": "first"}\n{"_id": "2", "text": "second"}\n'
    )
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n2\td9\t1\n")
    loaded = load_beir_queries(tmp_path)
    assert loaded.texts == {"2": "second"}
    assert loaded.qrels == {"2": {"d9": 1}}
