"""`POST /v1/search`: dense, full-text (BM25) or hybrid retrieval over the caller's collections."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ragservice.api.deps import Reader, RuntimeDep, SearcherDep, collection_ids, replica_reads
from ragservice.api.schemas.common import error_responses
from ragservice.api.schemas.search import (
    SearchRequest,
    SearchResponse,
    embedding_model_out,
    hit_out,
)
from ragservice.limits.request_bounds import check_query
from ragservice.retrieval.filters import parse_and_compile

router = APIRouter(
    prefix="/v1",
    tags=["search"],
    dependencies=[Depends(replica_reads)],
    responses=error_responses(),
)


@router.post("/search")
def search(
    body: SearchRequest, principal: Reader, runtime: RuntimeDep, searcher: SearcherDep
) -> SearchResponse:
    """Search chunks; results are ordered by `score`, best first. `embedding_model` says which
    model the search ran with (the serving one when it started)."""
    check_query(body.query, body.k, runtime.settings, field="query")
    model = runtime.models.current()
    options = body.options(runtime.settings, parse_and_compile(body.filters))
    ids = collection_ids(runtime, principal.tenant_id, body.collections)
    result = searcher.search(collection_ids=ids, query=body.query, options=options, model=model)
    return SearchResponse(
        mode=body.mode,
        results=[hit_out(hit) for hit in result.hits],
        timings_ms=result.timings_ms,
        embedding_model=embedding_model_out(model),
    )
