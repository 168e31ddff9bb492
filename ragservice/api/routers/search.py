"""`POST /v1/search`: dense, full-text (BM25) or hybrid retrieval over the caller's collections."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Depends

from ragservice import store
from ragservice.api.deps import Reader, RuntimeDep, SearcherDep, replica_reads
from ragservice.api.schemas import (
    DocumentRef,
    EmbeddingModelOut,
    SearchHitOut,
    SearchRequest,
    SearchResponse,
    error_responses,
)
from ragservice.bootstrap import Runtime
from ragservice.config import Settings
from ragservice.errors import InvalidInputError, NotFoundError
from ragservice.retrieval.filters import parse_and_compile
from ragservice.retrieval.search import SearchHit, SearchOptions

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
    options = SearchOptions.from_settings(
        runtime.settings,
        mode=body.mode,
        k=body.k,
        filters=parse_and_compile(body.filters),
    )
    ids = collection_ids(runtime, principal.tenant_id, body.collections)
    result = searcher.search(collection_ids=ids, query=body.query, options=options, model=model)
    return SearchResponse(
        mode=body.mode,
        results=[_hit_out(hit) for hit in result.hits],
        timings_ms=result.timings_ms,
        embedding_model=EmbeddingModelOut(id=model.id, name=model.name, version=model.version),
    )


def check_query(text: str, k: int, settings: Settings, *, field: str) -> None:
    """The limits a request's text and k must keep (RAGSERVICE_MAX_QUERY_CHARS, MAX_K)."""
    check_text(text, settings, field=field)
    if k > settings.max_k:
        raise InvalidInputError(f"k: {k} is above the limit of {settings.max_k}")


def check_text(text: str, settings: Settings, *, field: str) -> None:
    if len(text) > settings.max_query_chars:
        raise InvalidInputError(
            f"{field}: {len(text)} characters; the limit is {settings.max_query_chars} "
            "(RAGSERVICE_MAX_QUERY_CHARS)"
        )
    if not text.strip():
        raise InvalidInputError(f"{field}: must contain more than white space")


def collection_ids(
    runtime: Runtime, tenant_id: uuid.UUID, names: list[str] | None
) -> list[uuid.UUID]:
    with runtime.db.read() as session:
        found = store.collections.collection_ids(session, tenant_id, names)
    """Ids of the tenant's collections by name (all of them for None); 404 for a missing one."""
    missing = sorted(set(names or ()) - set(found))
    if missing:
        raise NotFoundError(f"collection {missing[0]!r} not found")
    return list(found.values())


def _hit_out(hit: SearchHit) -> SearchHitOut:
    return SearchHitOut(
        chunk_id=hit.chunk_id,
        score=hit.score,
        text=hit.text,
        ordinal=hit.ordinal,
        start_char=hit.start_char,
        end_char=hit.end_char,
        metadata=hit.chunk_metadata,
        collection=hit.collection,
        document=DocumentRef(
            id=hit.document_id,
            external_id=hit.external_id,
            title=hit.title,
            metadata=hit.document_metadata,
        ),
    )
