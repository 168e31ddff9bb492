"""What `benchmarks/scale.py` computes apart from the service, in numpy: distractor vectors drawn
from a model of the real corpus, the neighbour-cosine check that they resemble it, and the
exhaustive BM25 its full-text results are compared with.

Distractor vectors (docs/benchmarks.md, "The distractor model"): spherical k-means on the real
chunk vectors gives cluster centres; a distractor picks a cluster (in proportion to its size)
and is its centre plus `scale` times a Gaussian residual, normalised. The residual has the
covariance of the real vectors around their centres: half the cluster's own (a random Gaussian
combination of its members' residuals), half the pooled one of all clusters (its principal
components, so small clusters still get every direction). `scale` is calibrated at startup so
that the median cosine of a real chunk to its 10 nearest distractors equals the median cosine
of a real chunk to its 10 nearest other real chunks: the distractors crowd the real chunks as
much as the real corpus crowds itself, no more.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float32]
NEIGHBOURS = 10


def unit(x: Vector) -> Vector:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1
    return (x / norms).astype(np.float32)


def spherical_kmeans(
    x: Vector, clusters: int, rng: np.random.Generator, iterations: int = 15
) -> npt.NDArray[np.int64]:
    """Each row's cluster (cosine k-means on unit rows); an emptied cluster is re-seeded."""
    centres = x[rng.choice(len(x), clusters, replace=False)].copy()
    labels = np.zeros(len(x), dtype=np.int64)
    for _ in range(iterations):
        labels = np.argmax(x @ centres.T, axis=1)
        for c in range(clusters):
            members = x[labels == c]
            centres[c] = members.mean(axis=0) if len(members) else x[rng.integers(len(x))]
        centres = unit(centres)
    return labels


@dataclass
class DistractorModel:
    """Cluster centres, their weights and residuals, the pooled residual's principal axes
    (scaled by their standard deviations), and the calibrated noise scale."""

    centres: Vector
    weights: npt.NDArray[np.float64]
    residuals: list[Vector]
    pooled: Vector
    scale: float = 1.0

    @classmethod
    def fit(
        cls, vectors: Vector, rng: np.random.Generator, per_cluster: int = 50
    ) -> DistractorModel:
        x = unit(vectors)
        clusters = max(1, len(x) // per_cluster)
        labels = spherical_kmeans(x, clusters, rng)
        kept = [c for c in range(clusters) if np.any(labels == c)]
        centres = np.stack([x[labels == c].mean(axis=0) for c in kept]).astype(np.float32)
        residuals = [(x[labels == c] - centres[i]).astype(np.float32) for i, c in enumerate(kept)]
        sizes = np.array([len(r) for r in residuals], dtype=np.float64)
        everything = np.concatenate(residuals)
        variances, axes = np.linalg.eigh(everything.T @ everything / len(everything))
        pooled = (axes * np.sqrt(np.clip(variances, 0, None))).T.astype(np.float32)
        return cls(centres, sizes / sizes.sum(), residuals, pooled)

    def parts(self, rng: np.random.Generator, size: int) -> tuple[Vector, Vector]:
        """`size` draws as (centre, residual): a distractor is unit(centre + scale * residual)."""
        picked = rng.choice(len(self.centres), size, p=self.weights)
        base = self.centres[picked]
        own = np.zeros_like(base)
        for c in np.unique(picked):
            rows = np.flatnonzero(picked == c)
            members = self.residuals[c]
            w = rng.standard_normal((len(rows), len(members))).astype(np.float32)
            own[rows] = (w / math.sqrt(len(members))) @ members
        dim = self.pooled.shape[0]
        shared = rng.standard_normal((size, dim)).astype(np.float32) @ self.pooled
        return base, (own + shared) * np.float32(math.sqrt(0.5))

    def draw(self, rng: np.random.Generator, size: int) -> Vector:
        base, residual = self.parts(rng, size)
        return unit(base + np.float32(self.scale) * residual)


def top_cosines(queries: Vector, candidates: Vector, k: int = NEIGHBOURS) -> Vector:
    """Per unit query, its k largest cosines to the unit candidates, unordered."""
    scores = queries @ candidates.T
    k = min(k, scores.shape[1])
    return np.partition(scores, scores.shape[1] - k, axis=1)[:, -k:]


def merge_top(best: Vector | None, more: Vector, k: int = NEIGHBOURS) -> Vector:
    """Running top k per row, over blocks of candidates."""
    pooled = more if best is None else np.concatenate([best, more], axis=1)
    k = min(k, pooled.shape[1])
    return np.partition(pooled, pooled.shape[1] - k, axis=1)[:, -k:]


def real_neighbour_cosines(real: Vector, sample: npt.NDArray[np.int64]) -> Vector:
    """Each sampled real chunk's cosines to its 10 nearest other real chunks."""
    x = unit(real)
    scores = x[sample] @ x.T
    scores[np.arange(len(sample)), sample] = -np.inf  # not itself
    return np.partition(scores, scores.shape[1] - NEIGHBOURS, axis=1)[:, -NEIGHBOURS:]


def distribution(values: Vector) -> dict[str, float]:
    flat = np.asarray(values, dtype=np.float64).ravel()
    return {
        "median": round(float(np.median(flat)), 4),
        "p10": round(float(np.quantile(flat, 0.1)), 4),
        "p90": round(float(np.quantile(flat, 0.9)), 4),
    }


def calibrate(
    model: DistractorModel,
    queries: Vector,
    target: float,
    count: int,
    rng: np.random.Generator,
    sample: int = 100_000,
) -> float:
    """The scale at which the median cosine of the (unit) queries to their 10 nearest among
    `count` distractors is nearest `target`. Measured on up to `sample` draws: with fewer
    draws than `count`, the 10 nearest of `count` are stood in for by the 10·sample/count
    nearest of the draws (at least 1). A distractor is unit(a + s·r), so its cosine to q is
    (q·a + s q·r) / |a + s r|: one set of dot products serves every scale tried."""
    drawn = min(sample, count)
    kth = max(1, round(NEIGHBOURS * drawn / count))
    a, r = model.parts(rng, drawn)
    qa, qr = queries @ a.T, queries @ r.T
    aa, ar, rr = (a * a).sum(1), (a * r).sum(1), (r * r).sum(1)

    def median_at(s: float) -> float:
        cos = (qa + s * qr) / np.sqrt(aa + 2 * s * ar + s * s * rr)
        return float(np.median(np.partition(cos, cos.shape[1] - kth, axis=1)[:, -kth:]))

    grid = list(np.geomspace(0.05, 8.0, 25))
    best = min(grid, key=lambda s: abs(median_at(s) - target))
    fine = list(np.geomspace(best / 1.25, best * 1.25, 21))
    return float(min(fine, key=lambda s: abs(median_at(s) - target)))


# -- exhaustive BM25 -------------------------------------------------------------------------


@dataclass(frozen=True)
class Postings:
    """All of one lexeme's postings in the searched collection: chunk numbers, term
    frequencies and chunk lengths (in lexemes)."""

    seqs: npt.NDArray[np.int64]
    tfs: npt.NDArray[np.float64]
    lengths: npt.NDArray[np.float64]


def bm25_scores(
    postings: Iterable[Postings], n: float, avgdl: float, k1: float, b: float
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Every matching chunk and its BM25 (Lucene's idf, as `retrieval.statements.BM25`): the
    sum over the query's lexemes of idf · tf · (k1 + 1) / (tf + k1 · (1 - b + b · len / avgdl))."""
    seqs: list[npt.NDArray[np.int64]] = []
    parts: list[npt.NDArray[np.float64]] = []
    for term in postings:
        df = len(term.seqs)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        norm = term.tfs + k1 * (1 - b + b * term.lengths / avgdl)
        seqs.append(term.seqs)
        parts.append(idf * term.tfs * (k1 + 1) / norm)
    if not seqs:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    chunks, where = np.unique(np.concatenate(seqs), return_inverse=True)
    return chunks, np.bincount(where, weights=np.concatenate(parts))


def same_top(
    found: Sequence[int],
    chunks: npt.NDArray[np.int64],
    scores: npt.NDArray[np.float64],
    k: int,
    tolerance: float = 1e-6,
) -> bool:
    """Whether `found` (a search's top-k chunk numbers) is an exact BM25 top k of `chunks`
    scored `scores`: as many as k (or every match), each scoring at least the k-th best, and
    every chunk scoring above the k-th best present. Chunks tied at the cut may be any."""
    wanted = min(k, len(scores))
    if len(set(found)) != wanted or len(found) != wanted:
        return False
    if wanted == 0:
        return True
    cut = float(np.partition(scores, len(scores) - wanted)[len(scores) - wanted])
    slack = tolerance * max(1.0, abs(cut))
    score_of = dict(zip(chunks.tolist(), scores.tolist(), strict=True))
    if any(score_of.get(seq, -math.inf) < cut - slack for seq in found):
        return False
    above = set(chunks[scores > cut + slack].tolist())
    return above <= set(found)
