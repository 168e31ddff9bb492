"""Retrieval over chunks: dense (HNSW, cosine), full-text (BM25) and hybrid (fusion), in SQL.

- dense: the model's partial HNSW index (`embedding::vector(DIM)`, `WHERE model_id = ID`;
  over `embedding_half::halfvec(DIM)` for a model stored as halfvec; over the vectors' binary
  quantization for one stored as binary, its candidates re-scored by the full vectors);
  score = cosine similarity (1 - cosine distance).
- fulltext: BM25 over the `chunk_postings` blocks, OR over the query's lexemes, with N, average
  length and document frequencies taken over the searched collections; score = the BM25 sum.
  Where the database has the `ragservice_bm25` extension (built and installed by `make`;
  migration 0023), an unfiltered search is exact: its C function reads the blocks from the
  highest score bound down and skips the blocks that cannot bring a chunk into the top k
  (block-max pruning). Otherwise, and for filtered searches, each term's postings are read by
  impact, highest first, up to `bm25_postings_per_term`: exact for terms in fewer chunks, the
  low-impact postings of more frequent terms skipped. With
  pseudo-relevance feedback (`prf`), a first pass's best chunks give RM3 expansion lexemes and
  the weighted, expanded query is searched again.
- hybrid: the dense and the full-text candidates fused (`retrieval.fusion`): reciprocal rank
  fusion, or their normalised scores weighted and summed; score = the fused score. The full-text
  side runs on its own connection while the query is embedded.
- `group_documents`: one hit per document (its best chunk), documents ranked by their chunks'
  scores (`fusion.document_scores`).

Searches that fuse, expand or group rank their candidates here, then read the hits in one
statement; the others are one statement each.
A query with no lexemes left after parsing (only stop words) finds nothing by full text, and
hybrid then ranks by the dense side alone. Ties are broken by chunk id, so equal inputs give
equal outputs. Model id and dimension come from the model's row (the serving model, resolved
once per search; never the request) and are written into the SQL as literals, because the
partial index only matches a literal model id; everything the caller sends is a bound parameter.
Every statement names the tenant its transaction works for (`statements.tenant_and`, the id bound
as %(tenant)s), so that a store distributed by tenant runs it on the tenant's shards alone.
"""

from __future__ import annotations

import contextvars
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql

from ragservice.db import Database, tenancy
from ragservice.db.engine import driver_connection
from ragservice.errors import EmbeddingError
from ragservice.retrieval import dense, statements
from ragservice.retrieval.fulltext import FullTextEngine
from ragservice.retrieval.fusion import document_scores, fuse, rm3_weights
from ragservice.retrieval.hits import SearchHit as SearchHit
from ragservice.retrieval.hits import SearchResult as SearchResult
from ragservice.retrieval.hits import downweight_flagged as downweight_flagged
from ragservice.retrieval.hits import row_hit
from ragservice.retrieval.options import DOCUMENT_CHUNKS, MAX_EF_SEARCH
from ragservice.retrieval.options import Mode as Mode
from ragservice.retrieval.options import SearchOptions as SearchOptions
from ragservice.retrieval.restricted import deepened, first_depth, restricted
from ragservice.timing import add_ms, timed, with_total

QueryEmbedder = Callable[[str], npt.NDArray[np.float32]]


class QueryModel(dense.DenseModel, Protocol):
    """The embedding model one search runs with: its row id (the partial HNSW index), its
    dimension, how its vectors are stored (float32, halfvec or binary) and its query encoder,
    resolved once when the search starts."""

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


# -- the searcher ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _ExactRanking:
    """The dense statement ranked exactly: run instead where `estimate` (the vectors a
    restricted asker may read, `dense.visible_rows`) says that costs less than the walk of the
    model's HNSW index, or when the walk brought fewer than `wanted` rows (it ended before it
    found them)."""

    query: sql.Composed
    wanted: int
    model_id: int
    estimate: sql.Composed | None = None


@dataclass(frozen=True, slots=True)
class _Statement:
    """One SQL statement of a search, with its parameters and the HNSW settings it needs."""

    query: sql.Composed
    params: dict[str, Any]
    ef_search: int | None = None
    wanted: int | None = None
    """A restricted asker's exact full text (`statements.BM25_EXACT_DEEP`): the rows wanted;
    fewer come back when too few of the top %(depth)s are visible, and it is run deeper."""
    exact: _ExactRanking | None = None
    """A restricted or filtered dense statement's exact ranking (see `_dense_rows`)."""
    explained: bool = False
    """Its plan is wanted (`EXPLAIN` of the statement as it would run), not its rows."""


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
        exact_bm25: bool | None = None,
    ) -> None:
        self._db = db
        # None: the database decides at the first search (`fulltext`); False: the SQL
        # statement with its per-term budget always.
        self._fulltext = FullTextEngine(function=exact_bm25)
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
            collections = list(collection_ids)
            if options.scored_here:
                rows = self._rank_here(model, collections, query, options, timings, vector)
            else:
                statement, stage = self._prepare(
                    model, collections, query, options, timings, vector
                )
                with timed(timings, stage):
                    rows = self._run(statement)
            hits = downweight_flagged([row_hit(row) for row in rows])
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
        collections = list(collection_ids)
        if not options.scored_here:
            statement, _ = self._prepare(model, collections, query, options, {})
        elif options.mode is Mode.FULLTEXT:
            statement = self._text_statement(collections, query, options, options.text_limit)
        else:  # the dense candidates, as hybrid and document searches read them
            statement = self._dense_candidates(model, collections, options, _vector(model, query))
        explain = replace(statement, explained=True, wanted=None)
        return "\n".join(str(row[0]) for row in self._run(explain))

    def neighbours(self, hits: Sequence[SearchHit], distance: int) -> list[SearchHit]:
        """Chunks up to `distance` ordinals before and after each hit, in the hits' documents."""
        if distance < 1 or not hits:
            return []
        ids = [hit.chunk_id for hit in hits]
        tenant = tenancy.current().tenant_id
        statement = _Statement(
            sql.Composed([statements.neighbours(tenant), statements.hits(tenant)]),
            {"ids": ids, "distance": distance, "tenant": tenant},
        )
        return [row_hit(row) for row in self._run(statement)]

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
        tenant = tenancy.current().tenant_id
        if options.mode is Mode.FULLTEXT:
            bm25 = statements.with_ctes(
                statements.bm25(
                    options.filters,
                    options.text_limit,
                    exact=self._exact(options),
                    restricted=restricted(),
                    tenant=tenant,
                    of_tenant=self._fulltext.of_tenant,
                ),
                select=statements.hits(tenant),
            )
            params = self._params(collections, options, tenant, query=query)
            return self._deepened(bm25, params, options, options.text_limit), "fulltext"
        if options.mode is Mode.DENSE:
            with timed(timings, "embed"):
                vector = _vector(model, query, given)

            statement = self._dense_statement(
                model,
                collections,
                options,
                vector,
                tenant,
                ctes=(statements.DENSE_RANKED,),
                select=statements.hits(tenant),
            )
            return statement, "dense"
        raise AssertionError("hybrid searches are ranked by the searcher")  # scored_here

    def _rank_here(
        self,
        model: QueryModel,
        collections: list[uuid.UUID],
        query: str,
        options: SearchOptions,
        timings: dict[str, float],
        given: npt.NDArray[np.float32] | None = None,
    ) -> list[tuple[Any, ...]]:
        """The hits' rows of candidates ranked here (fused, expanded by feedback or grouped by
        document). The full-text side runs on a worker while the query is embedded (in the
        caller's context: its tenant and replica routing hold); the dense candidates and the
        hits are read in one transaction."""
        tenant = tenancy.current().tenant_id
        text_side = None
        if options.mode is not Mode.DENSE:
            text_side = self._pool.submit(
                contextvars.copy_context().run, self._text_candidates, collections, query, options
            )

        def text() -> list[_Candidate]:
            if text_side is None:
                return []
            found, text_ms = text_side.result()
            add_ms(timings, "fulltext", text_ms)
            return found

        def hits(dense: list[_Candidate]) -> _Statement:
            ranked = _rank(dense, text(), options)
            ids, scores = [chunk for chunk, _ in ranked], [score for _, score in ranked]
            query_hits = statements.with_ctes(statements.GIVEN, select=statements.hits(tenant))
            return _Statement(query_hits, {"ids": ids, "scores": scores, "tenant": tenant})

        if options.mode is Mode.FULLTEXT:
            found = hits([])
            with timed(timings, "fulltext"):
                return self._run(found)
        with timed(timings, "embed"):
            vector = _vector(model, query, given)
        with timed(timings, "fuse" if options.mode is Mode.HYBRID else "dense"):
            nearest = self._dense_candidates(model, collections, options, vector)
            return self._run(nearest, then=lambda rows: hits(_candidate_list(rows)))

    def _text_candidates(
        self, collections: list[uuid.UUID], query: str, options: SearchOptions
    ) -> tuple[list[_Candidate], float]:
        """Full-text candidates best first (expanded by feedback when asked), and the
        milliseconds they took (runs on a worker)."""
        timings: dict[str, float] = {}
        with timed(timings, "fulltext"):
            terms: tuple[list[str], list[float]] | None = None
            if options.prf:
                terms = self._feedback_terms(collections, query, options)
            statement = self._text_statement(collections, query, options, options.text_limit, terms)
            found = self._candidates(statement)
        return found, timings["fulltext"]

    def _feedback_terms(
        self, collections: list[uuid.UUID], query: str, options: SearchOptions
    ) -> tuple[list[str], list[float]]:
        """RM3: the query's lexemes and the feedback chunks' likeliest, with their weights."""
        first_pass = self._text_statement(collections, query, options, options.prf_docs)
        feedback = statements.feedback(first_pass.params["tenant"])
        statement = _Statement(
            statements.with_ctes(first_pass.query, feedback, select=statements.FEEDBACK_TERMS),
            first_pass.params | {"fb_terms": options.prf_terms},
        )
        rows = [(str(row[0]), row[1]) for row in self._run(statement)]
        return rm3_weights(rows, options.prf_query_weight)

    def _text_statement(
        self,
        collections: list[uuid.UUID],
        query: str,
        options: SearchOptions,
        limit: int,
        terms: tuple[list[str], list[float]] | None = None,
    ) -> _Statement:
        """BM25's ranked CTEs (bare: callers add their SELECT) over the query's lexemes, or
        over weighted `terms`."""
        tenant = tenancy.current().tenant_id
        bm25 = statements.bm25(
            options.filters,
            limit,
            weighted=terms is not None,
            exact=self._exact(options),
            restricted=restricted(),
            tenant=tenant,
            of_tenant=self._fulltext.of_tenant,
        )
        params = self._params(collections, options, tenant, query=query)
        if terms is not None:
            params |= {"terms": terms[0], "weights": terms[1]}
        return self._deepened(bm25, params, options, limit)

    def _deepened(
        self, query: sql.Composed, params: dict[str, Any], options: SearchOptions, limit: int
    ) -> _Statement:
        """A full-text statement; for a restricted asker's exact one, the depth it starts at."""
        if not ((restricted() or options.filters is not None) and self._exact(options)):
            return _Statement(query, params)
        return _Statement(query, params | {"depth": first_depth(limit)}, wanted=limit)

    def _dense_candidates(
        self,
        model: QueryModel,
        collections: list[uuid.UUID],
        options: SearchOptions,
        vector: npt.NDArray[np.float32],
    ) -> _Statement:
        tenant = tenancy.current().tenant_id

        return self._dense_statement(
            model, collections, options, vector, tenant, select=statements.DENSE_CANDIDATES
        )

    def _candidates(self, statement: _Statement) -> list[_Candidate]:
        query = statement.query
        if statement.ef_search is None:  # a BM25 statement: bare CTEs
            query = statements.with_ctes(query, select=statements.TEXT_CANDIDATES)
        return _candidate_list(self._run(replace(statement, query=query)))

    def _dense_statement(
        self,
        model: QueryModel,
        collections: list[uuid.UUID],
        options: SearchOptions,
        vector: npt.NDArray[np.float32],
        tenant: uuid.UUID | None,
        *,
        ctes: tuple[sql.Composable, ...] = (),
        select: sql.Composable,
    ) -> _Statement:
        """The dense candidates (`dense.nearest`), then `ctes`, then `select`; for a restricted
        or filtered search, the same ranked exactly beside it (see `_dense_rows`)."""

        asker_restricted = restricted()
        by_function = dense.ranks_exactly(
            model,
            options,
            tenant,
            restricted=asker_restricted,
            definer=asker_restricted and self._definer(),
        )

        def query(exact: bool) -> sql.Composed:
            nearest = dense.nearest(
                model,
                options,
                tenant,
                restricted=asker_restricted,
                exact=exact,
                by_function=by_function,
            )
            return statements.with_ctes(nearest, *ctes, select=select)

        # The HNSW candidate list must hold at least the rows asked for: pgvector's default of
        # 40 silently caps LIMIT 100 at 40 rows.
        wanted = options.index_limit(model.storage)
        ef_search = min(max(options.ef_search_for(model.storage), wanted), MAX_EF_SEARCH)
        params = self._params(collections, options, tenant, vector=vector)
        if not (asker_restricted or options.filters is not None):
            return _Statement(query(False), params, ef_search)
        readers = tenancy.asker_principals()
        if readers is not None:
            params["readers"] = readers
        estimate = dense.visible_rows(model, tenant) if by_function else None
        exact = _ExactRanking(query(True), wanted, model.id, estimate)
        return _Statement(query(False), params, ef_search, exact=exact)

    # -- pieces ----------------------------------------------------------------------------------

    def _run(
        self,
        statement: _Statement,
        then: Callable[[list[tuple[Any, ...]]], _Statement] | None = None,
    ) -> list[tuple[Any, ...]]:
        """The statement's rows; with `then`, the rows of the statement it makes of them, in
        the same read transaction (one connection checkout for both)."""
        # prepare=False: a server-side prepared statement drifts to a generic plan after five
        # runs, blind to the actual filter values and collections (exact search through a
        # selective filter vs. the HNSW index). Planning every time cost nothing measurable.
        with self._db.read() as session:
            conn = driver_connection(session)
            if statement.ef_search is not None:
                # SET LOCAL: it ends with the read transaction.
                conn.execute(
                    statements.SET_DENSE.format(ef_search=sql.Literal(int(statement.ef_search))),
                    prepare=False,
                )
            rows = self._dense_rows(conn, statement)
            if statement.wanted:
                rows = deepened(conn, statement.query, statement.params, rows, statement.wanted)
            if then is not None:
                follow = then(rows)
                rows = conn.execute(follow.query, follow.params, prepare=False).fetchall()
            return rows

    def _dense_rows(
        self, conn: psycopg.Connection[Any], statement: _Statement
    ) -> list[tuple[Any, ...]]:
        """The statement's rows; for a restricted or filtered dense one, by the exact ranking
        where that is cheaper, or when the index's walk ended short of the rows wanted."""
        ranking = statement.exact
        exact = (
            ranking is not None
            and ranking.estimate is not None
            and dense.exact_is_cheaper(
                conn, ranking.estimate, statement.params, ranking.model_id, ranking.wanted
            )
        )
        query = ranking.query if exact and ranking is not None else statement.query
        if statement.explained:
            query = sql.SQL("EXPLAIN {}").format(query)
        rows = conn.execute(query, statement.params, prepare=False).fetchall()
        short = ranking is not None and not exact and len(rows) < ranking.wanted
        if short and ranking is not None and not statement.explained:
            rows = conn.execute(ranking.query, statement.params, prepare=False).fetchall()
        return rows

    def _definer(self) -> bool:
        """Whether the exact ranking of a restricted asker's vectors may run through
        `ragservice_nearest_visible`: not on Citus, where a query on a shard may not read the
        distributed table again."""
        self._fulltext.has_function(self._probe_fulltext)
        return not self._fulltext.distributed

    def _exact(self, options: SearchOptions) -> bool:
        """Whether unfiltered full text runs the extension's exact function."""
        return self._fulltext.exact(options, self._probe_fulltext)

    def _probe_fulltext(self) -> tuple[bool, bool, bool]:
        extension, citus, of_tenant = self._run(_Statement(statements.HAS_EXACT_BM25, {}))[0]
        return bool(extension), bool(citus), bool(of_tenant)

    def _params(
        self,
        collections: list[uuid.UUID],
        options: SearchOptions,
        tenant: uuid.UUID | None,
        *,
        vector: npt.NDArray[np.float32] | None = None,
        query: str | None = None,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"collections": collections, "tenant": tenant}
        if vector is not None:
            params["vector"] = vector
        if query is not None:
            params |= {
                "query": query,
                "k1": options.bm25_k1,
                "b": options.bm25_b,
                "budget": self._fulltext.budget(options, self._probe_fulltext),
            }
        if options.filters is not None:
            params |= options.filters.params
        return params


@dataclass(frozen=True, slots=True)
class _Candidate:
    chunk_id: uuid.UUID
    document_id: uuid.UUID
    score: float


def _candidate_list(rows: list[tuple[Any, ...]]) -> list[_Candidate]:
    return [_Candidate(row[0], row[1], float(row[2])) for row in rows]


def _rank(
    dense: list[_Candidate], text: list[_Candidate], options: SearchOptions
) -> list[tuple[uuid.UUID, float]]:
    """The best `options.k` (chunk, score): fused when hybrid; with one chunk per document,
    documents ranked by their chunks, when grouped."""
    documents = {c.chunk_id: c.document_id for c in (*dense, *text)}
    if options.mode is Mode.HYBRID:
        pairs = [(c.chunk_id, c.score) for c in dense], [(c.chunk_id, c.score) for c in text]
        chunks = fuse(*pairs, options.fusion_spec)
    else:
        chunks = [(c.chunk_id, c.score) for c in (dense or text)]
    if not options.group_documents:
        return chunks[: options.k]
    best: dict[uuid.UUID, uuid.UUID] = {}
    for chunk, _ in chunks:  # best first: a document's first chunk is its best
        best.setdefault(documents[chunk], chunk)
    ranked = document_scores(
        ((documents[chunk], score) for chunk, score in chunks),
        share=options.document_share,
        extra=DOCUMENT_CHUNKS,
    )
    return [(best[document], score) for document, score in ranked[: options.k]]


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
