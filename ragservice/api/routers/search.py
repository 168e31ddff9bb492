"""`POST /v1/search`: dense, full-text (BM25) or hybrid retrieval over the caller's collections."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ragservice.api.deps import Reader, SearchDep, replica_reads
from ragservice.api.schemas.common import error_responses
from ragservice.api.schemas.search import SearchRequest, SearchResponse
from ragservice.services.views import found_out

router = APIRouter(
    prefix="/v1",
    tags=["search"],
    dependencies=[Depends(replica_reads)],
    responses=error_responses(),
)


@router.post("/search")
def search(body: SearchRequest, principal: Reader, service: SearchDep) -> SearchResponse:
    """Search chunks; results are ordered by `score`, best first. `embedding_model` says which
    model the search ran with (the serving one when it started)."""
    return found_out(service.search(principal.tenant_id, body.search_query()))
