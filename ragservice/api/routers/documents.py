"""Documents: upload (JSON texts or files, each upload one ingest job), list, get, delete."""

from __future__ import annotations

import hashlib
import json
import posixpath
import uuid
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, File, Form, Query, Request, Response, UploadFile, status

from ragservice import store
from ragservice.api.checks import check_batch, check_form_text
from ragservice.api.deps import Reader, RuntimeDep, Writer, collection_id, wake_workers
from ragservice.api.schemas.common import error_responses
from ragservice.api.schemas.documents import (
    DocumentDetail,
    DocumentPage,
    DocumentsIn,
    document_detail,
    document_out,
)
from ragservice.api.schemas.jobs import JobOut, job_out
from ragservice.bootstrap import Runtime
from ragservice.config import LimitSettings
from ragservice.embedding.registry import get_model_by_name
from ragservice.errors import (
    BadRequestError,
    InvalidInputError,
    NotFoundError,
    PayloadTooLargeError,
    UnsupportedMediaTypeError,
)
from ragservice.limits import (
    MAX_EXTERNAL_ID_BYTES,
    MAX_JSON_DEPTH,
    external_id_too_long,
    json_text_problem,
    too_deep,
)
from ragservice.types import SUPPORTED_SUFFIXES, file_type

router = APIRouter(
    prefix="/v1/collections/{collection}/documents",
    tags=["documents"],
    responses=error_responses(),
)


@router.post("", status_code=status.HTTP_202_ACCEPTED)
def add_documents(
    collection: str,
    body: DocumentsIn,
    principal: Writer,
    runtime: RuntimeDep,
    request: Request,
    response: Response,
) -> JobOut:
    """Queue JSON texts for ingestion; poll the returned job at `GET /v1/jobs/{id}`."""
    check_batch(len(body.documents), runtime.settings.limits, field="documents")
    items = [
        store.jobs.JobItem(
            kind="text",
            name=doc.external_id or _text_id(doc.text),
            title=doc.title,
            body=doc.text.encode(),
            metadata=doc.metadata,
        )
        for doc in body.documents
    ]
    _refuse_duplicates([item.name for item in items], "external_id")
    return _enqueue(runtime, request, response, principal.tenant_id, collection, items, {})


@router.post("/files", status_code=status.HTTP_202_ACCEPTED)
async def upload_files(
    collection: str,
    files: Annotated[
        list[UploadFile], File(description="txt, md, html, pdf, docx, jsonl or parquet")
    ],
    principal: Writer,
    runtime: RuntimeDep,
    request: Request,
    response: Response,
    metadata: Annotated[
        str | None, Form(description="JSON object added to every document's metadata")
    ] = None,
    jsonl_fields: Annotated[
        str | None, Form(description='JSONL keys, e.g. "id=doc_id,title=name,text=body"')
    ] = None,
    parquet_columns: Annotated[
        str | None, Form(description='Parquet columns, e.g. "id=doc,text=passage,embedding=vec"')
    ] = None,
    model: Annotated[
        str | None,
        Form(
            description="NAME[:VERSION] the uploaded vectors are for (default: the serving model)"
        ),
    ] = None,
) -> JobOut:
    """Queue uploaded files for ingestion; one job covers the whole upload."""
    limits = runtime.settings.limits
    for field, value in (("jsonl_fields", jsonl_fields), ("parquet_columns", parquet_columns)):
        check_form_text(value, field)
    params = _format_params(jsonl_fields, parquet_columns)
    if model and check_form_text(model, "model").strip():
        params["model"] = _model_ref(runtime, model.strip())
    if len(files) > limits.max_files_per_upload:
        raise PayloadTooLargeError(
            f"{len(files)} files in one upload; the limit is {limits.max_files_per_upload} "
            "(RAGSERVICE_MAX_FILES_PER_UPLOAD)"
        )
    extra = _metadata_field(metadata)
    names = [_file_name(upload.filename) for upload in files]
    _refuse_duplicates(names, "file name")
    items = [
        store.jobs.JobItem(
            kind="file",
            name=name,
            title=None,
            body=await _read_limited(upload, name, limits),
            metadata=extra,
        )
        for name, upload in zip(names, files, strict=True)
    ]
    # Writing the files into PostgreSQL is blocking work: off the event loop.
    return await anyio.to_thread.run_sync(
        _enqueue, runtime, request, response, principal.tenant_id, collection, items, params
    )


@router.get("")
def list_documents(
    collection: str,
    principal: Reader,
    runtime: RuntimeDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[str | None, Query(description="`next_after` of the previous page")] = None,
) -> DocumentPage:
    """Documents ordered by external id, a page at a time."""
    cid = collection_id(runtime, principal.tenant_id, collection)
    with runtime.db.read() as session:
        page = store.documents.list_documents(session, cid, limit=limit + 1, after=after)
    more = len(page) > limit
    page = page[:limit]
    return DocumentPage(
        documents=[document_out(doc) for doc in page],
        next_after=page[-1].external_id if more else None,
    )


@router.get("/{external_id:path}")
def get_document(
    collection: str,
    external_id: str,
    principal: Reader,
    runtime: RuntimeDep,
    chunks: Annotated[bool, Query(description="include the chunks")] = False,
) -> DocumentDetail:
    cid = collection_id(runtime, principal.tenant_id, collection)
    with runtime.db.read() as session:
        doc = store.documents.get_document(session, cid, external_id)
        if doc is None:
            raise _document_not_found(collection, external_id)
        found = store.documents.document_chunks(session, doc.id) if chunks else None
    return document_detail(doc, found)


@router.delete("/{external_id:path}", status_code=status.HTTP_204_NO_CONTENT)
def delete_document(
    collection: str, external_id: str, principal: Writer, runtime: RuntimeDep
) -> Response:
    """Delete a document with its chunks and embeddings."""
    cid = collection_id(runtime, principal.tenant_id, collection)
    with runtime.db.write() as session:
        if not store.documents.delete_documents(session, cid, [external_id]):
            raise _document_not_found(collection, external_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


def _enqueue(
    runtime: Runtime,
    request: Request,
    response: Response,
    tenant_id: uuid.UUID,
    collection: str,
    items: list[store.jobs.JobItem],
    params: dict[str, Any],
) -> JobOut:
    cid = collection_id(runtime, tenant_id, collection)
    with runtime.db.write() as session:
        job_id = store.jobs.enqueue_job(
            session,
            tenant_id=tenant_id,
            collection_id=cid,
            kind="upload",
            params={**params, "items": len(items)},
            items=items,
        )
    wake_workers(request)
    with runtime.db.read() as session:
        job = store.jobs.get_job(session, tenant_id, job_id)
    assert job is not None
    response.headers["Location"] = f"/v1/jobs/{job_id}"
    return job_out(job)


def _format_params(jsonl_fields: str | None, parquet_columns: str | None) -> dict[str, Any]:
    """The JSONL keys and Parquet columns named; a bad spec fails the job, with its reason."""
    named = {"jsonl_fields": jsonl_fields, "parquet_columns": parquet_columns}
    return {key: value for key, value in named.items() if value}


def _model_ref(runtime: Runtime, ref: str) -> str:
    """`ref` as `NAME:VERSION` of a registered version (422 naming the known ones otherwise)."""
    with runtime.db.read() as session:
        try:
            row = get_model_by_name(session, ref)
        except NotFoundError as exc:
            raise InvalidInputError(f"model: {exc}") from exc
    return f"{row.name}:{row.version}"


def _document_not_found(collection: str, external_id: str) -> NotFoundError:
    return NotFoundError(f"document {external_id!r} not found in {collection!r}")


def _text_id(text: str) -> str:
    return "text-" + hashlib.sha256(text.encode()).hexdigest()[:24]


def _refuse_duplicates(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise BadRequestError(f"duplicate {what} {name!r} in one request")
        seen.add(name)


def _metadata_field(raw: str | None) -> dict[str, Any]:
    if raw is None or not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise BadRequestError("the `metadata` form field is not valid JSON") from exc
    if not isinstance(value, dict):
        raise BadRequestError("the `metadata` form field must be a JSON object")
    if too_deep(value):
        raise InvalidInputError(f"metadata: nested deeper than {MAX_JSON_DEPTH} levels")
    if problem := json_text_problem(value):
        raise InvalidInputError(f"metadata: a key or string value {problem}")
    return value


def _file_name(raw: str | None) -> str:
    """The upload's base name; browsers may send a path, which is not ours to keep."""
    name = posixpath.basename((raw or "").replace("\\", "/")).strip()
    if not name or name in (".", ".."):
        raise BadRequestError("every uploaded file needs a file name")
    if external_id_too_long(name):
        raise InvalidInputError(
            f"file name {name[:60]!r}… is longer than {MAX_EXTERNAL_ID_BYTES} bytes"
        )
    check_form_text(name, "files")
    if not file_type(name):  # the job's own test of a file's type, so that it agrees
        raise UnsupportedMediaTypeError(
            f"{name!r}: unsupported file type; supported: {', '.join(SUPPORTED_SUFFIXES)} "
            "(the suffix after the last dot of a name that is more than its suffix)"
        )
    return name


async def _read_limited(upload: UploadFile, name: str, limits: LimitSettings) -> bytes:
    data = await upload.read(limits.max_file_bytes + 1)
    if len(data) > limits.max_file_bytes:
        raise PayloadTooLargeError(
            f"{name!r} exceeds {limits.max_file_bytes} bytes (RAGSERVICE_MAX_FILE_BYTES)"
        )
    return data
