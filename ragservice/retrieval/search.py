"""Retrieval over chunks: dense (HNSW, cosine), full-text (BM25) and hybrid (RRF), all in SQL.

- dense: the model's partial HNSW index (`embedding::vector(DIM)`, `WHERE model_id = ID`);
  score = cosine similarity (1 - cosine distance).
- fulltext: BM25 over the `chunk_terms` postings, OR over the query's lexemes, with N, average
  length and document frequencies taken over the searched collections; score = the BM25 sum.
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
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql
from sqlalchemy.orm import Session

from ragservice.config import Settings
from ragservice.db import Database
from ragservice.errors import EmbeddingError, InvalidInputError
from ragservice.retrieval.filters import CompiledFilter

QueryEmbedder = Callable[[str], npt.NDArray[np.float32]]


class QueryModel(Protocol):
    """The embedding model one search runs with: its row id (the partial HNSW index), its
    dimension and its query encoder, resolved once when the search starts."""

    @property
    def id(self) -> int: ...

    @property
    def dimension(self) -> int: ...

    def embed_query(self, text: str) -> npt.NDArray[np.float32]: ...


@dataclass(frozen=True, slots=True)
class FixedModel:
    """A `QueryModel` from its parts (a searcher on one model, benchmarks, tests)."""

    id: int
    dimension: int
    embed: QueryEmbedder

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
    """How one search runs. `filters` is a compiled metadata filter (see ragservice.retrieval.filters)."""

    mode: Mode = Mode.HYBRID
    k: int = 10
    filters: CompiledFilter | None = None
    ef_search: int = 100
    rrf_k: int = 30
    dense_candidates: int = 100
    text_candidates: int = 100
    bm25_k1: float = 0.9
    bm25_b: float = 0.4

    def __post_init__(self) -> None:
        # Accept the plain strings an API layer may pass; compare as the enum from here on.
        object.__setattr__(self, "mode", _mode(self.mode))
        for name in ("k", "ef_search", "rrf_k", "dense_candidates", "text_candidates"):
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
        )

    @property
    def dense_limit(self) -> int:
        """Rows the dense side returns: k alone, or the hybrid candidate list."""
        return self.k if self.mode is Mode.DENSE else max(self.dense_candidates, self.k)

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


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Hits best first, the milliseconds each stage took (only the stages that ran), and the
    id of the embedding model searched with."""

    hits: list[SearchHit]
    timings_ms: dict[str, float] = field(default_factory=dict)
    model_id: int | None = None


# -- SQL -------------------------------------------------------------------------------------
# Fragments refer to chunks as `c` and documents as `d`, as compiled filters do.

# relaxed_order iterative scans keep reading the index until enough rows pass the filters
# (the collection restriction is a filter too). Their rows may come slightly out of order, so
# the candidates are materialized and sorted again outside, as the pgvector docs advise.
_SET_DENSE = sql.SQL(
    "SELECT set_config('hnsw.ef_search', %(ef_search)s, true), "
    "set_config('hnsw.iterative_scan', 'relaxed_order', true)"
)

_NEAREST = sql.SQL("""
nearest AS MATERIALIZED (
    SELECT e.chunk_id, e.embedding::vector({dim}) <=> %(vector)s::vector({dim}) AS distance
    FROM chunk_embeddings e
    JOIN chunks c ON c.id = e.chunk_id {document_join}
    WHERE e.model_id = {model_id} AND c.collection_id = ANY(%(collections)s::uuid[]) {filter}
    ORDER BY distance
    LIMIT {limit}
)""")

# BM25, Lucene flavour. N and avgdl over the searched collections; df counted from the same
# posting scan, so both follow the collection set. k1 and b are bound parameters.
_BM25 = sql.SQL("""
stats AS (
    SELECT sum(chunk_count)::float8 AS n,
           sum(token_count)::float8 / greatest(sum(chunk_count), 1) AS avgdl
    FROM collection_text_stats WHERE collection_id = ANY(%(collections)s::uuid[])
),
postings AS MATERIALIZED (
    SELECT t.lexeme, t.chunk_id, t.tf, t.chunk_length
    FROM chunk_terms t
    WHERE t.collection_id = ANY(%(collections)s::uuid[])
      AND t.lexeme = ANY(tsvector_to_array(to_tsvector('english'::regconfig, %(query)s)))
),
idf AS (
    SELECT p.lexeme, ln(1 + (s.n - count(*) + 0.5) / (count(*) + 0.5)) AS idf
    FROM postings p CROSS JOIN stats s
    GROUP BY p.lexeme, s.n
),
bm25 AS (
    SELECT p.chunk_id,
           sum(i.idf * p.tf * (%(k1)s + 1)
               / (p.tf + %(k1)s * (1 - %(b)s + %(b)s * p.chunk_length / s.avgdl))) AS score
    FROM postings p JOIN idf i USING (lexeme) CROSS JOIN stats s
    GROUP BY p.chunk_id
),
ranked AS (
    SELECT b.chunk_id, b.score
    FROM bm25 b {filter_join}
    ORDER BY b.score DESC, b.chunk_id
    LIMIT {limit}
)""")

_DENSE_RANKED = sql.SQL("""
ranked AS (SELECT chunk_id, 1 - distance AS score FROM nearest)""")

_FUSED = sql.SQL("""
dense AS (
    SELECT chunk_id, row_number() OVER (ORDER BY distance, chunk_id) AS rank FROM nearest
),
fulltext AS (
    SELECT * FROM unnest(%(text_ids)s::uuid[], %(text_ranks)s::int[]) AS t(chunk_id, rank)
),
ranked AS (
    SELECT chunk_id, sum(1.0::float8 / (%(rrf_k)s + rank)) AS score
    FROM (SELECT chunk_id, rank FROM dense UNION ALL SELECT chunk_id, rank FROM fulltext) AS u
    GROUP BY chunk_id
    ORDER BY score DESC, chunk_id
    LIMIT {limit}
)""")

_HITS = sql.SQL("""
SELECT r.chunk_id, r.score, c.text, c.ordinal, c.start_char, c.end_char, c.metadata,
       c.collection_id, col.name, d.id, d.external_id, d.title, d.metadata, d.version
FROM ranked r
JOIN chunks c ON c.id = r.chunk_id
JOIN documents d ON d.id = c.document_id
JOIN collections col ON col.id = c.collection_id
ORDER BY r.score DESC, r.chunk_id""")

_TEXT_CANDIDATES = sql.SQL("SELECT chunk_id FROM ranked ORDER BY score DESC, chunk_id")

_JOIN_DOCUMENTS = sql.SQL("JOIN documents d ON d.id = c.document_id")

# Chunks within `distance` ordinals of the given ones, in the same documents (for continuity in
# an assembled context); the given chunks themselves are left out. Score 0: not retrieved.
_NEIGHBOURS = sql.SQL("""
WITH ranked AS (
    SELECT DISTINCT n.id AS chunk_id, 0.0::float8 AS score
    FROM chunks h
    JOIN chunks n ON n.document_id = h.document_id
                 AND n.ordinal BETWEEN h.ordinal - %(distance)s AND h.ordinal + %(distance)s
    WHERE h.id = ANY(%(ids)s::uuid[]) AND n.id <> ALL(%(ids)s::uuid[])
)
""")


def _with(*ctes: sql.Composable, select: sql.Composable) -> sql.Composed:
    return sql.SQL("WITH {ctes}\n{select}").format(ctes=sql.SQL(",").join(ctes), select=select)


def _filter_and(filters: CompiledFilter | None) -> sql.Composable:
    return sql.SQL("") if filters is None else sql.SQL("AND {}").format(filters.where)


def _document_join(filters: CompiledFilter | None) -> sql.Composable:
    return _JOIN_DOCUMENTS if filters is not None and filters.needs_document else sql.SQL("")


def _bm25_filter_join(filters: CompiledFilter | None) -> sql.Composable:
    """Filters apply before the LIMIT, so a filtered full-text search still returns k rows."""
    if filters is None:
        return sql.SQL("")
    return sql.SQL("JOIN chunks c ON c.id = b.chunk_id {docs} WHERE {where}").format(
        docs=_document_join(filters), where=filters.where
    )


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
        timer = _Timer()
        model = model or self._models()
        hits: list[SearchHit] = []
        if collection_ids:
            statement, stage = self._prepare(
                model, list(collection_ids), query, options, timer, vector
            )
            with timer.stage(stage):
                hits = [_hit(row) for row in self._run(statement)]
        return SearchResult(hits=hits, timings_ms=timer.finish(), model_id=model.id)

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
        statement, _ = self._prepare(model, list(collection_ids), query, options, _Timer())
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
            sql.Composed([_NEIGHBOURS, _HITS]), {"ids": ids, "distance": distance}
        )
        return [_hit(row) for row in self._run(statement)]

    # -- statements per mode ---------------------------------------------------------------------

    def _prepare(
        self,
        model: QueryModel,
        collections: list[uuid.UUID],
        query: str,
        options: SearchOptions,
        timer: _Timer,
        given: npt.NDArray[np.float32] | None = None,
    ) -> tuple[_Statement, str]:
        """The final statement of the mode and the name of its timing stage."""
        if options.mode is Mode.FULLTEXT:
            bm25 = _with(self._bm25(options), select=_HITS)
            return _Statement(bm25, self._params(collections, options, query=query)), "fulltext"
        if options.mode is Mode.DENSE:
            with timer.stage("embed"):
                vector = _vector(model, query, given)
            dense = _with(_nearest(model, options), _DENSE_RANKED, select=_HITS)
            return self._dense_statement(dense, collections, options, vector), "dense"
        return self._hybrid(model, collections, query, options, timer, given), "fuse"

    def _hybrid(
        self,
        model: QueryModel,
        collections: list[uuid.UUID],
        query: str,
        options: SearchOptions,
        timer: _Timer,
        given: npt.NDArray[np.float32] | None,
    ) -> _Statement:
        # In the caller's context: its request's tenant and replica routing hold there too.
        text_side = self._pool.submit(
            contextvars.copy_context().run, self._text_candidates, collections, query, options
        )
        with timer.stage("embed"):
            vector = _vector(model, query, given)
        text_ids, text_ms = text_side.result()
        timer.record("fulltext", text_ms)
        fused = _FUSED.format(limit=sql.Literal(options.k))
        statement = self._dense_statement(
            _with(_nearest(model, options), fused, select=_HITS), collections, options, vector
        )
        statement.params.update(
            text_ids=text_ids, text_ranks=list(range(1, len(text_ids) + 1)), rrf_k=options.rrf_k
        )
        return statement

    def _text_candidates(
        self, collections: list[uuid.UUID], query: str, options: SearchOptions
    ) -> tuple[list[uuid.UUID], float]:
        """Full-text chunk ids best first, and the milliseconds it took (runs on a worker)."""
        started = time.perf_counter()
        statement = _Statement(
            _with(self._bm25(options), select=_TEXT_CANDIDATES),
            self._params(collections, options, query=query),
        )
        ids = [row[0] for row in self._run(statement)]
        return ids, (time.perf_counter() - started) * 1000

    def _dense_statement(
        self,
        query: sql.Composed,
        collections: list[uuid.UUID],
        options: SearchOptions,
        vector: npt.NDArray[np.float32],
    ) -> _Statement:
        # The HNSW candidate list must hold at least the rows asked for: pgvector's default of
        # 40 silently caps LIMIT 100 at 40 rows.
        ef_search = min(max(options.ef_search, options.dense_limit), _MAX_EF_SEARCH)
        params = self._params(collections, options, vector=vector)
        return _Statement(query, params, ef_search)

    # -- pieces ----------------------------------------------------------------------------------

    def _run(self, statement: _Statement) -> list[tuple[Any, ...]]:
        # prepare=False: a server-side prepared statement drifts to a generic plan after five
        # runs, blind to the actual filter values and collections (exact search through a
        # selective filter vs. the HNSW index). Planning every time cost nothing measurable.
        with self._db.read() as session:
            conn = _connection(session)
            if statement.ef_search is not None:
                # set_config(..., true) is SET LOCAL: it ends with the read transaction.
                conn.execute(_SET_DENSE, {"ef_search": str(statement.ef_search)}, prepare=False)
            return conn.execute(statement.query, statement.params, prepare=False).fetchall()

    @staticmethod
    def _bm25(options: SearchOptions) -> sql.Composed:
        return _BM25.format(
            filter_join=_bm25_filter_join(options.filters),
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
            params |= {"query": query, "k1": options.bm25_k1, "b": options.bm25_b}
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
    return _NEAREST.format(
        dim=sql.Literal(int(model.dimension)),
        model_id=sql.Literal(int(model.id)),
        document_join=_document_join(options.filters),
        filter=_filter_and(options.filters),
        limit=sql.Literal(options.dense_limit),
    )


def _connection(session: Session) -> psycopg.Connection[Any]:
    """The psycopg connection under a read session, inside the session's transaction."""
    conn = session.connection().connection.driver_connection
    assert isinstance(conn, psycopg.Connection)
    return conn


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
    )


class _Timer:
    """Milliseconds per named stage, plus the total since creation."""

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self._stages: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.record(name, (time.perf_counter() - started) * 1000)

    def record(self, name: str, ms: float) -> None:
        self._stages[name] = round(ms, 3)

    def finish(self) -> dict[str, float]:
        return self._stages | {"total": round((time.perf_counter() - self._started) * 1000, 3)}
