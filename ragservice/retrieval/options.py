"""How one search runs (`SearchOptions`): the mode, k, the candidate lists, BM25, fusion,
pseudo-relevance feedback and document grouping, validated once, from settings or a request."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ragservice.config import DEFAULT_EF_SEARCH, Settings
from ragservice.errors import InvalidInputError
from ragservice.retrieval.filters import CompiledFilter
from ragservice.retrieval.fusion import Fusion, FusionSpec

# pgvector refuses hnsw.ef_search above 1000.
MAX_EF_SEARCH = 1000
# Pseudo-relevance feedback's bounds: chunks parsed for terms, and lexemes added to the query.
MAX_PRF_DOCS = 50
MAX_PRF_TERMS = 50
# Chunks after a document's best that `document_share` adds.
DOCUMENT_CHUNKS = 2


class Mode(StrEnum):
    DENSE = "dense"
    FULLTEXT = "fulltext"
    HYBRID = "hybrid"


def _fusion(value: str) -> Fusion:
    try:
        return Fusion(value)
    except ValueError:
        known = ", ".join(f.value for f in Fusion)
        raise InvalidInputError(f"fusion must be one of {known}, not {value!r}") from None


def _mode(value: str) -> Mode:
    try:
        return Mode(value)
    except ValueError:
        known = ", ".join(m.value for m in Mode)
        raise InvalidInputError(f"mode must be one of {known}, not {value!r}") from None


@dataclass(frozen=True, slots=True)
class SearchOptions:
    """How one search runs. `filters` is a compiled metadata filter (see `retrieval.filters`)."""

    mode: Mode = Mode.HYBRID
    k: int = 10
    filters: CompiledFilter | None = None
    # HNSW ef_search: given for this search, or (None) the default of the model's storage.
    ef_search: int | None = None
    ef_search_defaults: tuple[tuple[str, int], ...] = tuple(DEFAULT_EF_SEARCH.items())
    rrf_k: int = 30
    dense_candidates: int = 100
    text_candidates: int = 100
    bm25_k1: float = 0.9
    bm25_b: float = 0.4
    # Postings read per query term, highest impact first (see `statements.BM25`).
    bm25_postings_per_term: int = 2_000
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
        object.__setattr__(self, "mode", _mode(self.mode))
        if self.ef_search is not None and self.ef_search < 1:
            raise InvalidInputError("ef_search must be at least 1")
        for name in (
            "k",
            "rrf_k",
            "dense_candidates",
            "text_candidates",
            "bm25_postings_per_term",
            "rescore_factor",
            "prf_docs",
            "prf_terms",
        ):
            if getattr(self, name) < 1:
                raise InvalidInputError(f"{name} must be at least 1")
        if self.bm25_k1 < 0 or not 0 <= self.bm25_b <= 1:
            raise InvalidInputError("bm25_k1 must be >= 0 and bm25_b between 0 and 1")
        object.__setattr__(self, "fusion", _fusion(self.fusion))
        for name in ("text_weight", "prf_query_weight", "document_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise InvalidInputError(f"{name} must be between 0 and 1")
        if self.prf_docs > MAX_PRF_DOCS or self.prf_terms > MAX_PRF_TERMS:
            raise InvalidInputError(
                f"prf_docs must be at most {MAX_PRF_DOCS} and prf_terms at most {MAX_PRF_TERMS}"
            )

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        mode: Mode = Mode.HYBRID,
        k: int = 10,
        filters: CompiledFilter | None = None,
    ) -> SearchOptions:
        return cls(
            mode=mode,
            k=k,
            filters=filters,
            ef_search_defaults=tuple(settings.ef_search_by_storage().items()),
            rrf_k=settings.search_rrf_k,
            dense_candidates=settings.search_dense_candidates,
            text_candidates=settings.search_text_candidates,
            bm25_k1=settings.bm25_k1,
            bm25_b=settings.bm25_b,
            bm25_postings_per_term=settings.bm25_postings_per_term,
            rescore_factor=settings.binary_rescore_factor,
            fusion=Fusion(settings.search_fusion),
            text_weight=settings.search_text_weight,
            adaptive_weight=settings.search_adaptive_weight,
            prf=settings.search_prf == "rm3",
            prf_docs=settings.search_prf_docs,
            prf_terms=settings.search_prf_terms,
            prf_query_weight=settings.search_prf_query_weight,
            document_share=settings.search_document_share,
        )

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
