"""What one search is (`SearchOptions`): the mode, k, the filter, the candidate lists, BM25 and
its pruning, fusion, pseudo-relevance feedback, document grouping, ef_search and rescoring.

One definition: each option a server setting gives the default of is listed once in
`DEFAULTS_FROM`, and takes that setting's bounds (`bounds_of`), so the settings, a request's
overrides (the REST API's `Ranking`, derived from the same bounds) and this class accept the
same values. The answer cache's scope is this object's fields (`scope_parts`): an option added
here is part of it without anyone listing it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, Final, TypeVar

import annotated_types

from ragservice.config import DEFAULT_EF_SEARCH, SearchSettings
from ragservice.errors import InvalidInputError
from ragservice.limits.results import SEARCH_K
from ragservice.retrieval.filters import CompiledFilter
from ragservice.retrieval.fusion import Fusion, FusionSpec

# pgvector refuses hnsw.ef_search above 1000.
MAX_EF_SEARCH = 1000
# Chunks after a document's best that `document_share` adds.
DOCUMENT_CHUNKS = 2

DEFAULTS_FROM: Final[Mapping[str, str]] = {
    "rrf_k": "rrf_k",
    "dense_candidates": "dense_candidates",
    "text_candidates": "text_candidates",
    "bm25_k1": "bm25_k1",
    "bm25_b": "bm25_b",
    "bm25_postings_per_term": "bm25_postings_per_term",
    "bm25_exact": "bm25_exact",
    "rescore_factor": "binary_rescore_factor",
    "fusion": "fusion",
    "text_weight": "text_weight",
    "adaptive_weight": "adaptive_weight",
    "prf": "prf",
    "prf_docs": "prf_docs",
    "prf_terms": "prf_terms",
    "prf_query_weight": "prf_query_weight",
    "document_share": "document_share",
    "ef_search": "hnsw_ef_search",
}
"""The `SearchSettings` field each option's default and bounds come from."""


class Mode(StrEnum):
    DENSE = "dense"
    FULLTEXT = "fulltext"
    HYBRID = "hybrid"


@dataclass(frozen=True, slots=True)
class Bounds:
    """The closed range a number must lie in; None: unbounded on that side."""

    ge: float | None = None
    le: float | None = None

    def check(self, name: str, value: float) -> None:
        if (self.ge is not None and value < self.ge) or (self.le is not None and value > self.le):
            raise InvalidInputError(f"{name} must be {self.describe()}, not {value}")

    def describe(self) -> str:
        if self.le is None:
            return f"at least {_number(self.ge)}"
        if self.ge is None:
            return f"at most {_number(self.le)}"
        return f"between {_number(self.ge)} and {_number(self.le)}"


def _number(value: float | None) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def bounds_of(option: str) -> Bounds:
    """The bounds of an option: those of the setting its default comes from."""
    metadata = SearchSettings.model_fields[DEFAULTS_FROM[option]].metadata
    ge = next((m.ge for m in metadata if isinstance(m, annotated_types.Ge)), None)
    le = next((m.le for m in metadata if isinstance(m, annotated_types.Le)), None)
    return Bounds(ge=ge, le=le)  # type: ignore[arg-type]  # numbers, for numeric settings


E = TypeVar("E", bound=StrEnum)


def _enum(kind: type[E], name: str, value: str) -> E:
    try:
        return kind(value)
    except ValueError:
        known = ", ".join(member.value for member in kind)
        raise InvalidInputError(f"{name} must be one of {known}, not {value!r}") from None


@dataclass(frozen=True, slots=True)
class SearchOptions:
    """How one search runs. `filters` is a compiled metadata filter (see `retrieval.filters`)."""

    mode: Mode = Mode.HYBRID
    k: int = SEARCH_K
    filters: CompiledFilter | None = None
    # HNSW ef_search: given for this search, or (None) the default of the model's storage.
    ef_search: int | None = None
    ef_search_defaults: tuple[tuple[str, int], ...] = tuple(DEFAULT_EF_SEARCH.items())
    rrf_k: int = 30
    dense_candidates: int = 100
    text_candidates: int = 100
    bm25_k1: float = 0.9
    bm25_b: float = 0.4
    # Postings read per query term, highest impact first, where full text is not exact (see
    # `statements.BM25`).
    bm25_postings_per_term: int = 2_000
    # Unfiltered full text is exact BM25 where the database has the extension.
    bm25_exact: bool = True
    # Binary storage: candidates read from the bit index per dense row, then re-scored.
    rescore_factor: int = 4
    # Hybrid: how the two candidate lists are fused (see `retrieval.fusion`).
    fusion: Fusion = Fusion.ZSCORE
    text_weight: float = 0.5
    adaptive_weight: bool = False
    # Full text: RM3 pseudo-relevance feedback from the first pass's best `prf_docs` chunks,
    # adding up to `prf_terms` lexemes; the original query keeps `prf_query_weight`.
    prf: bool = False
    prf_docs: int = 10
    prf_terms: int = 20
    prf_query_weight: float = 0.7
    # One hit per document, documents ranked by their best chunk plus `document_share` of each
    # of their next `document_chunks` best chunks.
    group_documents: bool = False
    document_share: float = 0.0

    def __post_init__(self) -> None:
        # Accept the plain strings an API layer may pass; compare as the enum from here on.
        object.__setattr__(self, "mode", _enum(Mode, "mode", self.mode))
        object.__setattr__(self, "fusion", _enum(Fusion, "fusion", self.fusion))
        if self.k < 1:
            raise InvalidInputError("k must be at least 1")
        for option in DEFAULTS_FROM:
            value = getattr(self, option)
            if isinstance(value, int | float) and not isinstance(value, bool):
                bounds_of(option).check(option, value)

    @classmethod
    def from_settings(
        cls,
        settings: SearchSettings,
        *,
        mode: Mode = Mode.HYBRID,
        k: int = SEARCH_K,
        filters: CompiledFilter | None = None,
        group_documents: bool = False,
        **overrides: Any,
    ) -> SearchOptions:
        """The options of a search: the server's settings, then a request's `overrides` (options
        by name, checked against the same bounds)."""
        defaults = {
            option: getattr(settings, setting)
            for option, setting in DEFAULTS_FROM.items()
            if option != "ef_search"  # the storage's default, unless a request names one
        }
        defaults["prf"] = defaults["prf"] == "rm3"
        unknown = set(overrides) - set(DEFAULTS_FROM)
        if unknown:
            raise InvalidInputError(f"unknown search options: {', '.join(sorted(unknown))}")
        return cls(
            mode=mode,
            k=k,
            filters=filters,
            group_documents=group_documents,
            ef_search_defaults=tuple(settings.ef_search_by_storage().items()),
            **(defaults | overrides),
        )

    def scope_parts(self, storage: str) -> dict[str, Any]:
        """Everything about this search that shapes its results, for the answer cache's scope:
        every field, the filter by its canonical key, ef_search as a model of `storage` runs
        it (its default resolved), and the storage itself."""
        parts: dict[str, Any] = {"storage": storage}
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name == "filters":
                value = None if value is None else value.key
            elif field.name == "ef_search":
                value = self.ef_search_for(storage)
            elif field.name == "ef_search_defaults":
                continue  # in `ef_search`, as this storage resolves it
            parts[field.name] = str(value) if isinstance(value, StrEnum) else value
        return parts

    @property
    def fusion_spec(self) -> FusionSpec:
        # Normalised over the candidates a search of the usual k reads, whatever k is.
        depth = min(self.dense_candidates, self.text_candidates)
        return FusionSpec(self.fusion, self.rrf_k, self.text_weight, self.adaptive_weight, depth)

    @property
    def dense_limit(self) -> int:
        """Rows the dense side returns: k alone, or the candidate list (hybrid, documents)."""
        alone = self.mode is Mode.DENSE and not self.group_documents
        return self.k if alone else max(self.dense_candidates, self.k)

    def ef_search_for(self, storage: str) -> int:
        """The ef_search a search over a model of this storage runs with (before it is raised
        to the rows read from the index): the one given, else the storage's default."""
        if self.ef_search is not None:
            return self.ef_search
        return dict(self.ef_search_defaults).get(storage, DEFAULT_EF_SEARCH["float32"])

    def index_limit(self, storage: str) -> int:
        """Rows the dense side reads from the HNSW index: binary storage reads
        `rescore_factor` times as many candidates, re-scored by the full vectors."""
        if storage == "binary":
            return min(self.dense_limit * self.rescore_factor, MAX_EF_SEARCH)
        return self.dense_limit

    @property
    def text_limit(self) -> int:
        alone = self.mode is Mode.FULLTEXT and not self.group_documents
        return self.k if alone else max(self.text_candidates, self.k)

    @property
    def scored_here(self) -> bool:
        """Whether the searcher ranks candidates itself (fusion, feedback, documents), not one
        statement. Feedback only concerns full text: a dense search ignores it."""
        feedback = self.prf and self.mode is Mode.FULLTEXT
        return self.mode is Mode.HYBRID or self.group_documents or feedback
