"""`benchmarks/permissions.py`: exact search's rankings (ties by chunk id, the readable chunks
only, BM25 with the whole collection's statistics) and recall@10's overlap."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

from ragservice.retrieval.search import Mode, SearchOptions
from tests.unit.test_layering import ROOT


def _load() -> ModuleType:
    path = ROOT / "benchmarks" / "permissions.py"
    spec = importlib.util.spec_from_file_location("bench_permissions", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_permissions"] = module
    spec.loader.exec_module(module)
    return module


permissions = _load()
IDS = [uuid.UUID(int=i) for i in range(1, 6)]


def test_top_orders_by_score_then_chunk_id_and_cuts() -> None:
    ids = np.array([IDS[2], IDS[0], IDS[1], IDS[3]], dtype=object)
    scores = np.array([0.5, 0.9, 0.5, 0.1])
    assert permissions._top(ids, scores, 3) == [(IDS[0], 0.9), (IDS[1], 0.5), (IDS[2], 0.5)]


def test_text_top_scores_readable_chunks_only_with_collection_statistics() -> None:
    from scale_support import Postings, bm25_scores

    options = SearchOptions(mode=Mode.HYBRID, k=2)
    corpus = SimpleNamespace(
        ids=np.array(IDS, dtype=object),
        row_of_seq=np.array([-1, 0, 1, 2, 3, 4]),  # seq n is row n - 1
        n=5.0,
        avgdl=10.0,
    )
    postings = [
        Postings(np.array([1, 2, 3]), np.array([1.0, 3.0, 2.0]), np.array([10.0, 10.0, 10.0])),
        Postings(np.array([3, 5]), np.array([1.0, 1.0]), np.array([10.0, 5.0])),
    ]
    readable = np.array([True, False, True, True, True])  # seq 2 hidden
    ranked = permissions._text_top(corpus, postings, readable, options)
    seqs, scores = bm25_scores(postings, 5.0, 10.0, options.bm25_k1, options.bm25_b)
    expected = sorted(
        ((IDS[int(s) - 1], float(v)) for s, v in zip(seqs, scores, strict=True) if s != 2),
        key=lambda p: -p[1],
    )
    assert [chunk for chunk, _ in ranked] == [chunk for chunk, _ in expected]
    assert [score for _, score in ranked] == pytest.approx([score for _, score in expected])
    assert IDS[1] not in {chunk for chunk, _ in ranked}


def test_overlap_is_the_share_of_the_exact_top_found() -> None:
    assert permissions._overlap(IDS[:3], IDS[1:4]) == pytest.approx(2 / 3)
    assert permissions._overlap([], []) == 1.0
