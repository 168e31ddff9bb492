"""Fusion of ranked candidate lists and document scores from chunk scores: pure functions.

Hybrid search fuses a dense and a full-text candidate list. Reciprocal rank fusion (`rrf`)
looks at ranks only; the score-aware methods normalise each side's scores first, so a side
that is sure of its best candidate (a peaked score curve) counts for more than its ranks say:

- `minmax`: (s - min) / (max - min) over the side's candidates;
- `zscore`: (s - mean) / std, shifted so the side's lowest candidate scores 0;
- `dbsf` (distribution-based score fusion): (s - (mean - 3 std)) / (6 std), clipped to [0, 1].

A candidate missing from one side gets 0 from it (its lowest normalised score). The sides are
weighted `text_weight` and `1 - text_weight`; `adaptive` sets that weight per query from how
peaked each side's normalised scores are (how far the best stands above the rest), so a query
whose words match one document sharply leans on full text, and a vague one on the vectors.

`document_scores` ranks documents by their chunks: the best chunk's score plus `share` of each
of the next `extra` chunks' (0: the best chunk alone). Every function breaks ties by key, so
equal inputs give equal outputs.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


class Fusion(StrEnum):
    RRF = "rrf"
    MINMAX = "minmax"
    ZSCORE = "zscore"
    DBSF = "dbsf"


@dataclass(frozen=True, slots=True)
class FusionSpec:
    """How two candidate lists become one: the method, its constant and the weights."""

    method: Fusion = Fusion.RRF
    rrf_k: int = 60
    text_weight: float = 0.5
    adaptive: bool = False
    # Normalisation statistics come from each side's first `depth` candidates only, so a
    # search asking for more results (a deeper list) scores its top candidates the same.
    depth: int | None = None


def normalise(scores: Sequence[float], method: Fusion, depth: int | None = None) -> list[float]:
    """The scores of one side (best first) on a common scale: [0, 1] over the first `depth`
    (default: all), below 0 for minmax and zscore beyond them."""
    if not scores:
        return []
    top = scores[:depth] if depth else scores
    if method is Fusion.MINMAX:
        low, high = min(top), max(top)
        span = high - low
        return [(s - low) / span if span > 0 else 1.0 for s in scores]
    mean = sum(top) / len(top)
    std = math.sqrt(sum((s - mean) ** 2 for s in top) / len(top))
    if std == 0:
        return [1.0 for _ in scores]
    if method is Fusion.ZSCORE:
        low = (min(top) - mean) / std
        return [(s - mean) / std - low for s in scores]
    if method is Fusion.DBSF:
        return [min(1.0, max(0.0, (s - mean + 3 * std) / (6 * std))) for s in scores]
    raise ValueError(f"no normalisation for {method}")


def peakedness(normalised: Sequence[float]) -> float:
    """How far the best candidate stands above the mean of the others (0: a flat curve)."""
    if len(normalised) < 2:
        return 1.0
    ordered = sorted(normalised, reverse=True)
    top, rest = ordered[0], ordered[1:]
    spread = top - min(ordered)
    return (top - sum(rest) / len(rest)) / spread if spread > 0 else 0.0


def fuse(
    dense: Sequence[tuple[K, float]], text: Sequence[tuple[K, float]], spec: FusionSpec
) -> list[tuple[K, float]]:
    """One list from two (each best first, keys unique within a list), best first."""
    fused: dict[K, float] = {}
    if spec.method is Fusion.RRF:
        weights = _weights(spec, None, None)
        for side, weight in ((dense, weights[0]), (text, weights[1])):
            for rank, (key, _) in enumerate(side, start=1):
                fused[key] = fused.get(key, 0.0) + 2 * weight / (spec.rrf_k + rank)
    else:
        dense_norm = normalise([s for _, s in dense], spec.method, spec.depth)
        text_norm = normalise([s for _, s in text], spec.method, spec.depth)
        weights = _weights(spec, dense_norm, text_norm)
        for side, norm, weight in ((dense, dense_norm, weights[0]), (text, text_norm, weights[1])):
            for (key, _), value in zip(side, norm, strict=True):
                fused[key] = fused.get(key, 0.0) + weight * value
    return _ordered(fused.items())


def _weights(
    spec: FusionSpec, dense: Sequence[float] | None, text: Sequence[float] | None
) -> tuple[float, float]:
    """(dense, text) weights, summing to 1; adaptive: in proportion to the text weight times
    each side's peakedness. A side with no candidates leaves the whole weight to the other."""
    text_weight = spec.text_weight
    if spec.adaptive and dense and text:
        d, t = (1 - text_weight) * peakedness(dense), text_weight * peakedness(text)
        if d + t > 0:
            text_weight = t / (d + t)
    return 1 - text_weight, text_weight


def document_scores(
    chunks: Iterable[tuple[K, float]], *, share: float = 0.0, extra: int = 2
) -> list[tuple[K, float]]:
    """Documents best first from (document, chunk score) pairs: the best chunk's score plus
    `share` times each of the next `extra` best (positive) chunk scores of the document."""
    by_document: dict[K, list[float]] = {}
    for document, score in chunks:
        by_document.setdefault(document, []).append(score)
    scored = {}
    for document, scores in by_document.items():
        ordered = sorted(scores, reverse=True)
        following = sum(max(s, 0.0) for s in ordered[1 : 1 + extra]) if share > 0 else 0.0
        scored[document] = ordered[0] + share * following
    return _ordered(scored.items())


def _ordered(items: Iterable[tuple[K, float]]) -> list[tuple[K, float]]:
    # Ties by the key's string form: uuids and strings alike, stable across runs.
    return sorted(items, key=lambda item: (-item[1], str(item[0])))


def rm3_weights(
    rows: Iterable[tuple[str, float | None]], query_weight: float
) -> tuple[list[str], list[float]]:
    """RM3's expanded query from the query's lexemes (p None) and the feedback model's
    (lexeme, P(t|R)): `query_weight` of the weight spread evenly over the query's lexemes, the
    rest over the feedback lexemes by probability, scaled so that each original lexeme of an
    unexpanded query weighs 1 (scores stay on plain BM25's scale)."""
    collected = list(rows)
    query = sorted({lexeme for lexeme, p in collected if p is None})
    feedback = [(lexeme, p) for lexeme, p in collected if p is not None and p > 0]
    if not query:
        return [], []
    total = sum(p for _, p in feedback)
    weights = dict.fromkeys(query, query_weight / len(query) if feedback else 1 / len(query))
    for lexeme, p in feedback:
        weights[lexeme] = weights.get(lexeme, 0.0) + (1 - query_weight) * p / total
    lexemes = sorted(weights)
    return lexemes, [weights[lexeme] * len(query) for lexeme in lexemes]
