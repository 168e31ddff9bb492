"""Retrieval quality the way BEIR measures it (pytrec_eval's definitions), and BEIR data files.

nDCG@k uses graded gains (the qrels score itself) with a log2 discount; recall@k is the share of
relevant documents (score > 0) found in the top k. A document ranks where its best chunk ranks.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

Qrels = dict[str, dict[str, int]]
"""query id → document id → graded relevance."""


@dataclass(frozen=True)
class BeirQueries:
    texts: dict[str, str]
    qrels: Qrels


def load_beir_queries(root: Path, split: str = "test") -> BeirQueries:
    """The queries of `split` that have judgments, from `queries.jsonl` and `qrels/<split>.tsv`."""
    qrels = load_qrels(root / "qrels" / f"{split}.tsv")
    texts: dict[str, str] = {}
    with (root / "queries.jsonl").open(encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            if str(row["_id"]) in qrels:
                texts[str(row["_id"])] = str(row["text"])
    return BeirQueries(texts=texts, qrels={q: qrels[q] for q in texts})


def load_qrels(path: Path) -> Qrels:
    qrels: Qrels = {}
    with path.open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle, delimiter="\t"):
            qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    return qrels


def rank_documents(chunk_document_ids: Iterable[str]) -> list[str]:
    """Documents in the order of their best chunk (chunk hits arrive best first)."""
    return list(dict.fromkeys(chunk_document_ids))


def ndcg_at_k(ranked: Sequence[str], relevance: Mapping[str, int], k: int) -> float:
    dcg = sum(relevance.get(doc, 0) / math.log2(rank + 2) for rank, doc in enumerate(ranked[:k]))
    ideal = sorted((g for g in relevance.values() if g > 0), reverse=True)[:k]
    idcg = sum(gain / math.log2(rank + 2) for rank, gain in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at_k(ranked: Sequence[str], relevance: Mapping[str, int], k: int) -> float:
    relevant = {doc for doc, gain in relevance.items() if gain > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranked[:k])) / len(relevant)


def mean(values: Iterable[float]) -> float:
    collected = list(values)
    return sum(collected) / len(collected) if collected else 0.0
