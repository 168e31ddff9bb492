"""Documents: upload (JSON texts or files, each upload one ingest job), list, get, change who
may read one, delete."""

from __future__ import annotations

import json
import posixpath
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, File, Form, Query, Request, Response, UploadFile, status

from ingest.loaders.formats import SUPPORTED_SUFFIXES, file_type, suffix_list
from ragservice.api.deps import DatabaseDep, Reader, SettingsDep, Writer, wake_workers
from ragservice.api.schemas.common import error_responses
from ragservice.api.schemas.documents import (
    DocumentDetail,
    DocumentOut,
    DocumentPage,
    DocumentsIn,
    ReadersIn,
    document_detail,
    document_out,
)
from ragservice.api.schemas.jobs import JobOut, job_out
from ragservice.config import LimitSettings
from ragservice.errors import (
    BadRequestError,
    InvalidInputError,
    PayloadTooLargeError,
    UnsupportedMediaTypeError,
)
from ragservice.limits.request_bounds import check_batch, check_form_text
from ragservice.limits.shape import (
    MAX_EXTERNAL_ID_BYTES,
    MAX_JSON_DEPTH,
    external_id_too_long,
    too_deep,
)
from ragservice.limits.text import json_text_problem
from ragservice.readers import parse_readers
from ragservice.services import documents, ingest
from ragservice.services.jobs import JobView

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
    db: DatabaseDep,
    settings: SettingsDep,
    request: Request,
    response: Response,
) -> JobOut:
    """Queue JSON texts for ingestion; poll the returned job at `GET /v1/jobs/{id}`."""
    check_batch(len(body.documents), settings.limits, field="documents")
    texts = [
        ingest.TextDocument(
            text=doc.text,
            external_id=doc.external_id,
            title=doc.title,
            metadata=doc.metadata,
            readers=None if doc.readers is None else tuple(doc.readers),
        )
        for doc in body.documents
    ]
    job = ingest.queue_texts(db, principal.tenant_id, collection, texts)
    return _queued(job, request, response)


@router.post("/files", status_code=status.HTTP_202_ACCEPTED)
async def upload_files(
    collection: str,
    files: Annotated[list[UploadFile], File(description=suffix_list())],
    principal: Writer,
    db: DatabaseDep,
    settings: SettingsDep,
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
    readers: Annotated[
        str | None,
        Form(
            description="who may read the documents, e.g. `group:hr,user:ana` (empty: the whole "
            "tenant); a JSONL row's `readers` wins; unset: stored documents keep theirs"
        ),
    ] = None,
) -> JobOut:
    """Queue uploaded files for ingestion; one job covers the whole upload."""
    for field, value in (
        ("jsonl_fields", jsonl_fields),
        ("parquet_columns", parquet_columns),
        ("readers", readers),
    ):
        check_form_text(value, field)
    named_readers = parse_readers(readers)
    named_model = check_form_text(model, "model").strip() if model else None
    params = ingest.file_options(
        db, jsonl_fields=jsonl_fields, parquet_columns=parquet_columns, model=named_model
    )
    limits = settings.limits
    if len(files) > limits.max_files_per_upload:
        raise PayloadTooLargeError(
            f"{len(files)} files in one upload; the limit is {limits.max_files_per_upload} "
            "(RAGSERVICE_MAX_FILES_PER_UPLOAD)"
        )
    extra = _metadata_field(metadata)
    names = [_file_name(upload.filename) for upload in files]
    ingest.refuse_duplicates(names, "file name")
    read = [
        ingest.UploadedFile(name, await _read_limited(upload, name, limits))
        for name, upload in zip(names, files, strict=True)
    ]
    # Writing the files into PostgreSQL is blocking work: off the event loop.
    job = await anyio.to_thread.run_sync(
        lambda: ingest.queue_files(
            db,
            principal.tenant_id,
            collection,
            read,
            metadata=extra,
            params=params,
            readers=named_readers,
        )
    )
    return _queued(job, request, response)


@router.get("")
def list_documents(
    collection: str,
    principal: Reader,
    db: DatabaseDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[str | None, Query(description="`next_after` of the previous page")] = None,
) -> DocumentPage:
    """Documents ordered by external id, a page at a time."""
    page = documents.list_documents(db, principal.tenant_id, collection, limit=limit, after=after)
    return DocumentPage(
        documents=[document_out(doc) for doc in page.documents], next_after=page.next_after
    )


@router.get("/{external_id:path}")
def get_document(
    collection: str,
    external_id: str,
    principal: Reader,
    db: DatabaseDep,
    chunks: Annotated[bool, Query(description="include the chunks")] = False,
) -> DocumentDetail:
    found = documents.get_document(db, principal.tenant_id, collection, external_id, chunks=chunks)
    return document_detail(found.document, found.chunks)


@router.patch("/{external_id:path}")
def set_document_readers(
    collection: str, external_id: str, body: ReadersIn, principal: Writer, db: DatabaseDep
) -> DocumentOut:
    """Change who may read a document (its chunks follow; nothing is re-embedded). The cached
    answers built on it are dropped. 404 for a document you may not read."""
    readers = None if body.readers is None else tuple(body.readers)
    return document_out(documents.set_readers(db, principal, collection, external_id, readers))


@router.delete("/{external_id:path}", status_code=status.HTTP_204_NO_CONTENT)
def delete_document(
    collection: str, external_id: str, principal: Writer, db: DatabaseDep
) -> Response:
    """Delete a document with its chunks and embeddings."""
    documents.delete_document(db, principal.tenant_id, collection, external_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


def _queued(job: JobView, request: Request, response: Response) -> JobOut:
    """The queued job's 202: workers woken, its URL in `Location`."""
    wake_workers(request)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return job_out(job)


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
