"""The dense candidates' statement, and whether to rank the visible vectors exactly.

An unrestricted, unfiltered search walks the model's HNSW index. A search for an asker who may
not read every document, or under a metadata filter, may return only some of the vectors: the
walk then passes over the others (pgvector's iterative scan), about `limit / share` index
tuples for `limit` candidates, each with its neighbours' distances; ranking exactly the
vectors it may return costs about one heap tuple and one distance each (`share * rows`). The
restricted asker's search (`ranks_exactly`) estimates how many vectors it may read (the
planner's estimate of the statement's rows, from the statistics of `chunk_embeddings.readers`)
and ranks them exactly where `visible ** 2 < WALK_COST * limit * rows` (`exact_is_cheaper`).
A walk that ended before it found `limit` rows (`hnsw.max_scan_tuples`), restricted or
filtered, is followed by the exact ranking (`search.Searcher._run`), so a search returns k
whenever k visible chunks exist.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

import psycopg
from psycopg import sql

from ragservice.retrieval import statements
from ragservice.retrieval.options import SearchOptions

WALK_COST = 10.0
"""What a tuple of a filtered HNSW walk costs against a vector ranked exactly (its
neighbours' distances, the graph's pages): at 100,000 vectors of 384 dimensions, 100
candidates under a 10 % share cost the same either way (benchmarks/permissions.py)."""


class DenseModel(Protocol):
    """An embedding model as its vectors are stored: its row id (the partial HNSW index), its
    dimension and its storage (float32, halfvec or binary)."""

    @property
    def id(self) -> int: ...

    @property
    def dimension(self) -> int: ...

    @property
    def storage(self) -> str: ...


def nearest(
    model: DenseModel,
    options: SearchOptions,
    tenant: uuid.UUID | None,
    *,
    restricted: bool,
    exact: bool = False,
    by_function: bool = False,
) -> sql.Composed:
    """The dense candidates, read as the model's storage says (the tenant's, for one).
    `restricted`: the asker may not read every document (the vectors it may read are named,
    `statements.VISIBLE`); `exact`: ranked by an expression no index matches (every row that
    passes the conditions), not by the HNSW index, or with `by_function` (`ranks_exactly`) by
    `ragservice_nearest_visible`, which uses the indexes over the readers."""
    dim = sql.Literal(int(model.dimension))
    pieces = {
        "dim": dim,
        "model_id": sql.Literal(int(model.id)),
        "tenant": statements.tenant_and("e", tenant),
        "visible": statements.VISIBLE if restricted else sql.SQL(""),
        "limit": sql.Literal(options.dense_limit),
    }
    filtered = {
        "document_join": statements.document_join(options.filters),
        "filter": statements.filter_and(options.filters),
    }
    if model.storage == "binary":
        candidates = sql.Literal(options.index_limit(model.storage))
        hamming = statements.BINARY_DISTANCE.format(dim=dim)
        return statements.NEAREST_BINARY.format(
            candidates=candidates, order=_ordered(hamming, exact), **pieces, **filtered
        )
    halfvec = model.storage == "halfvec"
    distance = (statements.DISTANCE_HALFVEC if halfvec else statements.DISTANCE).format(dim=dim)
    order = _ordered(distance, exact)
    if options.filters is None:
        chunk_tenant = statements.tenant_and("c", tenant)
        if exact and by_function:
            return statements.NEAREST_VISIBLE.format(
                model_id=pieces["model_id"], limit=pieces["limit"], chunk_tenant=chunk_tenant
            )
        return statements.NEAREST.format(
            distance=distance, order=order, chunk_tenant=chunk_tenant, **pieces
        )
    return statements.NEAREST_FILTERED.format(distance=distance, order=order, **pieces, **filtered)


def _ordered(distance: sql.Composable, exact: bool) -> sql.Composable:
    return statements.EXACT_ORDER.format(distance=distance) if exact else distance


def ranks_exactly(
    model: DenseModel,
    options: SearchOptions,
    tenant: uuid.UUID | None,
    *,
    restricted: bool,
    definer: bool,
) -> bool:
    """Whether the search may choose the exact ranking by its estimate: a restricted asker's
    search of one tenant without a metadata filter, through `ragservice_nearest_visible`
    (`definer`: the function may run, not on Citus).
    Under row-level security the planner uses no index for a metadata filter (`@>` is not
    leakproof either), so a filtered exact ranking would read every vector of the
    collections: a filtered search walks the index, and ranks exactly only when the walk ends
    short. A model stored as binary walks its bit index (its candidates are re-scored)."""
    return (
        restricted
        and definer
        and tenant is not None
        and options.filters is None
        and model.storage != "binary"
    )


def visible_rows(model: DenseModel, tenant: uuid.UUID | None) -> sql.Composed:
    """The vectors a restricted asker may read, as a statement whose estimated rows the
    planner gives (`EXPLAIN`, never run)."""
    return statements.VISIBLE_VECTORS.format(
        model_id=sql.Literal(int(model.id)),
        tenant=statements.tenant_and("e", tenant),
        visible=statements.VISIBLE,
    )


def exact_is_cheaper(
    conn: psycopg.Connection[Any],
    estimate: sql.Composed,
    params: dict[str, Any],
    model_id: int,
    limit: int,
) -> bool:
    """Whether ranking the vectors `estimate` names exactly costs less than walking the model's
    HNSW index for `limit` of them (see the module's docstring). False where the model's
    index has no row count (not built or never analyzed; on Citus it is the shards')."""
    index = statements.hnsw_index_name(model_id)
    row = conn.execute(statements.INDEX_ROWS, {"index": index}, prepare=False).fetchone()
    rows = float(row[0]) if row and row[0] is not None else 0.0
    if rows <= 0:
        return False
    plan = conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) {}").format(estimate), params).fetchone()
    visible = float(plan[0][0]["Plan"]["Plan Rows"]) if plan else rows
    return visible * visible < WALK_COST * limit * rows
