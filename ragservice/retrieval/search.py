"""Retrieval over chunks: dense (HNSW, cosine), full-text (BM25) and hybrid (RRF), all in SQL.

- dense: the model's partial HNSW index (`embedding::vector(DIM)`, `WHERE model_id = ID`;
  over `embedding_half::halfvec(DIM)` for a model stored as halfvec; over the vectors' binary
  quantization for one stored as binary, its candidates re-scored by the full vectors);
  score = cosine similarity (1 - cosine distance).
- fulltext: BM25 over the `chunk_postings` blocks, OR over the query's lexemes, with N, average
  length and document frequencies taken over the searched collections; score = the BM25 sum.
  Each term's postings are read by impact, highest first, up to `bm25_postings_per_term`: exact
  for terms in fewer chunks, the low-impact postings of more frequent terms skipped.
- hybrid: reciprocal rank fusion, sum of 1 / (rrf_k + rank), of the dense and the full-text
  candidates. The full-text side runs on its own connection while the query is embedded; one
  statement then does the dense side and the fusion. Score = the RRF score.

A query with no lexemes left after parsing (only stop words) finds nothing by full text, and
hybrid then ranks by the dense side alone. Ties are broken by chunk id, so equal inputs give
equal outputs. Model id and dimension come from the model's row (the serving model, resolved
once per search; never the request) and are written into the SQL as literals, because the
partial index only matches a literal model id; everything the caller sends is a bound parameter.
"""

from __future__ import annotations

import contextvars
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from psycopg import sql

from ragservice.config import Settings
from ragservice.db import Database
from ragservice.db.engine import driver_connection
from ragservice.errors import EmbeddingError, InvalidInputError
from ragservice.retrieval import statements
from ragservice.retrieval.filters import CompiledFilter
from ragservice.timing import add_ms, timed, with_total
from ragservice.types import PageSpan

QueryEmbedder = Callable[[str], npt.NDArray[np.float32]]


class QueryModel(Protocol):
    """The embedding model one search runs with: its row id (the partial HNSW index), its
    dimension, how its vectors are stored (float32, halfvec or binary) and its query encoder,
    resolved once when the search starts."""

    @property
    def id(self) -> int: ...

    @property
    def dimension(self) -> int: ...

    @property
    def storage(self) -> str: ...

    def embed_query(self, text: str) -> npt.NDArray[np.float32]: ...


@dataclass(frozen=True, slots=True)
class FixedModel:
    """A `QueryModel` from its parts (a searcher on one model, benchmarks, tests)."""

    id: int
    dimension: int
    embed: QueryEmbedder
    storage: str = "float32"

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        return self.embed(text)


# pgvector refuses hnsw.ef_search above 1000.
_MAX_EF_SEARCH = 1000


class Mode(StrEnum):
    DENSE = "dense"
    FULLTEXT = "fulltext"
    HYBRID = "hybrid"


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
    ef_search: int = 100
    rrf_k: int = 30
    dense_candidates: int = 100
    text_candidates: int = 100
    bm25_k1: float = 0.9
    bm25_b: float = 0.4
    # Postings read per query term, highest impact first (see `statements.BM25`).
    bm25_postings_per_term: int = 2_000
    # Binary storage: candidates read from the bit index per dense row, then re-scored.
    rescore_factor: int = 4

    def __post_init__(self) -> None:
        # Accept the plain strings an API layer may pass; compare as the enum from here on.
        object.__setattr__(self, "mode", _mode(self.mode))
        for name in (
            "k",
            "ef_search",
            "rrf_k",
            "dense_candidates",
            "text_candidates",
            "bm25_postings_per_term",
            "rescore_factor",
        ):
            if getattr(self, name) < 1:
                raise InvalidInputError(f"{name} must be at least 1")
        if self.bm25_k1 < 0 or not 0 <= self.bm25_b <= 1:
            raise InvalidInputError("bm25_k1 must be >= 0 and bm25_b between 0 and 1")

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
            ef_search=settings.hnsw_ef_search,
            rrf_k=settings.search_rrf_k,
            dense_candidates=settings.search_dense_candidates,
            text_candidates=settings.search_text_candidates,
            bm25_k1=settings.bm25_k1,
            bm25_b=settings.bm25_b,
            bm25_postings_per_term=settings.bm25_postings_per_term,
            rescore_factor=settings.binary_rescore_factor,
        )

    @property
    def dense_limit(self) -> int:
        """Rows the dense side returns: k alone, or the hybrid candidate list."""
        return self.k if self.mode is Mode.DENSE else max(self.dense_candidates, self.k)

    def index_limit(self, storage: str) -> int:
        """Rows the dense side reads from the HNSW index: binary storage reads
        `rescore_factor` times as many candidates, re-scored by the full vectors."""
        if storage == "binary":
            return min(self.dense_limit * self.rescore_factor, _MAX_EF_SEARCH)
        return self.dense_limit

    @property
    def text_limit(self) -> int:
        return self.k if self.mode is Mode.FULLTEXT else max(self.text_candidates, self.k)


@dataclass(frozen=True, slots=True)
class SearchHit:
    chunk_id: uuid.UUID
    score: float
    text: str
    ordinal: int
    start_char: int
    end_char: int
    chunk_metadata: dict[str, Any]
    collection_id: uuid.UUID
    collection: str
    document_id: uuid.UUID
    external_id: str
    title: str | None
    document_metadata: dict[str, Any]
    document_version: int = 1
    # The injection detector's reasons when it flagged the chunk (empty: not flagged), and
    # what the chunk's collection does with flagged chunks (mark, downweight, drop).
    injection: tuple[str, ...] = ()
    flagged_policy: str = "downweight"
    pages: PageSpan | None = None  # the pages of a paged document (a PDF) it lies on

    @property
    def flagged(self) -> bool:
        return bool(self.injection)


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Hits best first, the milliseconds each stage took (only the stages that ran), and the
    id of the embedding model searched with."""

    hits: list[SearchHit]
    timings_ms: dict[str, float] = field(default_factory=dict)
    model_id: int | None = None


# -- the searcher ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Statement:
    """One SQL statement of a search, with its parameters and the HNSW settings it needs."""

    query: sql.Composed
    params: dict[str, Any]
    ef_search: int | None = None


class Searcher:
    """Runs searches. Thread-safe; `close()` stops its worker threads.

    The embedding model is fixed (`embed_query`, `model_id`, `dimension`), or `models` gives
    it: called once as each search starts (the serving model, which may change between
    searches but never within one). A caller may also pass the model to `search` itself.
    """

    def __init__(
        self,
        db: Database,
        embed_query: QueryEmbedder | None = None,
        *,
        model_id: int | None = None,
        dimension: int | None = None,
        models: Callable[[], QueryModel] | None = None,
        workers: int = 4,
    ) -> None:
        self._db = db
        self._models = models or _fixed(embed_query, model_id, dimension)
        # Full-text candidates of hybrid searches run here, overlapping the query's embedding.
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="search")

    @property
    def model_id(self) -> int:
        """The id of the model a search starting now would use."""
        return self._models().id

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> Searcher:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def search(
        self,
        *,
        collection_ids: Sequence[uuid.UUID],
        query: str,
        options: SearchOptions,
        vector: npt.NDArray[np.float32] | None = None,
        model: QueryModel | None = None,
    ) -> SearchResult:
        """The top `options.k` chunks of the collections (already resolved and tenant-checked).

        `vector`: the query's embedding when the caller already has it (it is not redone), by
        `model` (default: the searcher's model as this search starts).
        """
        started, timings = time.perf_counter(), dict[str, float]()
        model = model or self._models()
        hits: list[SearchHit] = []
        if collection_ids:
            statement, stage = self._prepare(
                model, list(collection_ids), query, options, timings, vector
            )
            with timed(timings, stage):
                hits = downweight_flagged([_hit(row) for row in self._run(statement)])
        return SearchResult(hits=hits, timings_ms=with_total(timings, started), model_id=model.id)

    def explain(
        self,
        *,
        collection_ids: Sequence[uuid.UUID],
        query: str,
        options: SearchOptions,
        model: QueryModel | None = None,
    ) -> str:
        """PostgreSQL's plan for the final statement `search` would run (for diagnosis)."""
        model = model or self._models()
        statement, _ = self._prepare(model, list(collection_ids), query, options, {})
        explain = _Statement(
            sql.SQL("EXPLAIN {}").format(statement.query), statement.params, statement.ef_search
        )
        return "\n".join(str(row[0]) for row in self._run(explain))

    def neighbours(self, hits: Sequence[SearchHit], distance: int) -> list[SearchHit]:
        """Chunks up to `distance` ordinals before and after each hit, in the hits' documents."""
        if distance < 1 or not hits:
            return []
        ids = [hit.chunk_id for hit in hits]
        statement = _Statement(
            sql.Composed([statements.NEIGHBOURS, statements.HITS]),
            {"ids": ids, "distance": distance},
        )
        return [_hit(row) for row in self._run(statement)]

    # -- statements per mode ---------------------------------------------------------------------

    def _prepare(
        self,
        model: QueryModel,
        collections: list[uuid.UUID],
        query: str,
        options: SearchOptions,
        timings: dict[str, float],
        given: npt.NDArray[np.float32] | None = None,
    ) -> tuple[_Statement, str]:
        """The final statement of the mode and the name of its timing stage."""
        if options.mode is Mode.FULLTEXT:
            bm25 = statements.with_ctes(self._bm25(options), select=statements.HITS)
            return _Statement(bm25, self._params(collections, options, query=query)), "fulltext"
        if options.mode is Mode.DENSE:
            with timed(timings, "embed"):
                vector = _vector(model, query, given)
            dense = statements.with_ctes(
                _nearest(model, options), statements.DENSE_RANKED, select=statements.HITS
            )
            return self._dense_statement(dense, model, collections, options, vector), "dense"
        return self._hybrid(model, collections, query, options, timings, given), "fuse"

    def _hybrid(
        self,
        model: QueryModel,
        collections: list[uuid.UUID],
        query: str,
        options: SearchOptions,
        timings: dict[str, float],
        given: npt.NDArray[np.float32] | None,
    ) -> _Statement:
        # In the caller's context: its request's tenant and replica routing hold there too.
        text_side = self._pool.submit(
            contextvars.copy_context().run, self._text_candidates, collections, query, options
        )
        with timed(timings, "embed"):
            vector = _vector(model, query, given)
        text_ids, text_ms = text_side.result()
        add_ms(timings, "fulltext", text_ms)
        fused = statements.FUSED.format(limit=sql.Literal(options.k))
        statement = self._dense_statement(
            statements.with_ctes(_nearest(model, options), fused, select=statements.HITS),
            model,
            collections,
            options,
            vector,
        )
        statement.params.update(
            text_ids=text_ids, text_ranks=list(range(1, len(text_ids) + 1)), rrf_k=options.rrf_k
        )
        return statement

    def _text_candidates(
        self, collections: list[uuid.UUID], query: str, options: SearchOptions
    ) -> tuple[list[uuid.UUID], float]:
        """Full-text chunk ids best first, and the milliseconds it took (runs on a worker)."""
        timings: dict[str, float] = {}
        with timed(timings, "fulltext"):
            statement = _Statement(
                statements.with_ctes(self._bm25(options), select=statements.TEXT_CANDIDATES),
                self._params(collections, options, query=query),
            )
            ids = [row[0] for row in self._run(statement)]
        return ids, timings["fulltext"]

    def _dense_statement(
        self,
        query: sql.Composed,
        model: QueryModel,
        collections: list[uuid.UUID],
        options: SearchOptions,
        vector: npt.NDArray[np.float32],
    ) -> _Statement:
        # The HNSW candidate list must hold at least the rows asked for: pgvector's default of
        # 40 silently caps LIMIT 100 at 40 rows.
        wanted = options.index_limit(model.storage)
        ef_search = min(max(options.ef_search, wanted), _MAX_EF_SEARCH)
        params = self._params(collections, options, vector=vector)
        return _Statement(query, params, ef_search)

    # -- pieces ----------------------------------------------------------------------------------

    def _run(self, statement: _Statement) -> list[tuple[Any, ...]]:
        # prepare=False: a server-side prepared statement drifts to a generic plan after five
        # runs, blind to the actual filter values and collections (exact search through a
        # selective filter vs. the HNSW index). Planning every time cost nothing measurable.
        with self._db.read() as session:
            conn = driver_connection(session)
            if statement.ef_search is not None:
                # set_config(..., true) is SET LOCAL: it ends with the read transaction.
                conn.execute(
                    statements.SET_DENSE, {"ef_search": str(statement.ef_search)}, prepare=False
                )
            return conn.execute(statement.query, statement.params, prepare=False).fetchall()

    @staticmethod
    def _bm25(options: SearchOptions) -> sql.Composed:
        return statements.BM25.format(
            filter_join=statements.bm25_filter_join(options.filters, options.text_limit),
            limit=sql.Literal(options.text_limit),
        )

    @staticmethod
    def _params(
        collections: list[uuid.UUID],
        options: SearchOptions,
        *,
        vector: npt.NDArray[np.float32] | None = None,
        query: str | None = None,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"collections": collections}
        if vector is not None:
            params["vector"] = vector
        if query is not None:
            params |= {
                "query": query,
                "k1": options.bm25_k1,
                "b": options.bm25_b,
                "budget": options.bm25_postings_per_term,
            }
        if options.filters is not None:
            params |= options.filters.params
        return params


def _fixed(
    embed_query: QueryEmbedder | None, model_id: int | None, dimension: int | None
) -> Callable[[], QueryModel]:
    if embed_query is None or model_id is None or dimension is None:
        raise TypeError("Searcher needs embed_query, model_id and dimension, or models")
    model = FixedModel(id=int(model_id), dimension=int(dimension), embed=embed_query)
    return lambda: model


def _vector(
    model: QueryModel, query: str, given: npt.NDArray[np.float32] | None = None
) -> npt.NDArray[np.float32]:
    embedded = model.embed_query(query) if given is None else given
    vector = np.asarray(embedded, dtype=np.float32).reshape(-1)
    if vector.shape[0] != model.dimension:
        raise EmbeddingError(
            f"query embedding has {vector.shape[0]} dimensions, the index {model.dimension}"
        )
    return vector


def _nearest(model: QueryModel, options: SearchOptions) -> sql.Composed:
    """The dense candidates, read as the model's storage says."""
    dim = sql.Literal(int(model.dimension))
    pieces = {
        "dim": dim,
        "model_id": sql.Literal(int(model.id)),
        "document_join": statements.document_join(options.filters),
        "filter": statements.filter_and(options.filters),
        "limit": sql.Literal(options.dense_limit),
    }
    if model.storage == "binary":
        candidates = sql.Literal(options.index_limit(model.storage))
        return statements.NEAREST_BINARY.format(candidates=candidates, **pieces)
    halfvec = model.storage == "halfvec"
    distance = (statements.DISTANCE_HALFVEC if halfvec else statements.DISTANCE).format(dim=dim)
    return statements.NEAREST.format(distance=distance, **pieces)


# A flagged chunk in a `downweight` collection keeps half its score (a negative cosine score
# moves as far down): it still ranks, after unflagged chunks of a similar score.
_DOWNWEIGHT = 0.5


def downweight_flagged(hits: list[SearchHit]) -> list[SearchHit]:
    """`hits` with the flagged ones of `downweight` collections scored lower, best first."""
    if not any(_downweighted(hit) for hit in hits):
        return hits  # the common case: nothing to rescore, the order stands
    weighed = [
        replace(hit, score=hit.score - abs(hit.score) * _DOWNWEIGHT) if _downweighted(hit) else hit
        for hit in hits
    ]
    return sorted(weighed, key=lambda hit: (-hit.score, hit.chunk_id))


def _downweighted(hit: SearchHit) -> bool:
    return hit.flagged and hit.flagged_policy == "downweight"


def _hit(row: tuple[Any, ...]) -> SearchHit:
    return SearchHit(
        chunk_id=row[0],
        score=float(row[1]),
        text=row[2],
        ordinal=row[3],
        start_char=row[4],
        end_char=row[5],
        chunk_metadata=row[6],
        collection_id=row[7],
        collection=row[8],
        document_id=row[9],
        external_id=row[10],
        title=row[11],
        document_metadata=row[12],
        document_version=row[13],
        injection=tuple(str(reason) for reason in (row[6] or {}).get("injection") or ()),
        flagged_policy=row[14],
        pages=None if row[15] is None else PageSpan(row[15], row[16]),
    )
