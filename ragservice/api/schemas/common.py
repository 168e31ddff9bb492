"""What every resource's schemas share: the error body, the error responses an operation
documents, and the JSON object type of metadata and filters."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field

from ragservice.limits import MAX_JSON_DEPTH, too_deep
from ragservice.types import PageSpan


def _shallow(value: dict[str, Any]) -> dict[str, Any]:
    # Checked before anything recurses into it: the store, the filter compiler, jsonb.
    if too_deep(value):
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_shallow)]
"""Metadata or a filter: a JSON object at most `MAX_JSON_DEPTH` levels deep."""


Pages = Annotated[
    list[int] | None,
    Field(
        description="the pages (1-based) of a paged document (a PDF) the text lies on, every "
        "one from the first to the last, e.g. [12, 13]; null for a document without pages"
    ),
]


def pages_out(span: PageSpan | None) -> list[int] | None:
    return None if span is None else span.numbers


class FieldErrorOut(BaseModel):
    field: str = Field(description="dotted path of the field in the request")
    message: str
    type: str


class ErrorOut(BaseModel):
    """The one shape of every error response."""

    error: str = Field(description="the kind of error, e.g. `InvalidInput`, `NotFound`")
    detail: str = Field(description="what went wrong, for a person to read")
    request_id: str = Field(description="quote it when reporting a problem")
    errors: list[FieldErrorOut] | None = Field(
        default=None, description="one entry per invalid field (validation errors only)"
    )


_ERROR_DESCRIPTIONS = {
    400: "malformed request (a body that is not JSON, a bad header)",
    401: "missing or unknown API key",
    403: "the key's role may not do this",
    404: "no such collection, document, job, answer or model",
    409: "conflicts with what exists",
    413: "body, file or batch over its limit",
    415: "a body or file of a type this operation does not take",
    422: "an invalid field",
    429: "over the key's rate limit; see Retry-After",
    502: "the inference layer failed",
    503: "the database is unavailable",
    504: "the inference layer did not answer in time",
}
COMMON_ERRORS = (400, 401, 403, 404, 413, 415, 422, 429, 503)


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the error statuses an operation may answer, all `ErrorOut`."""
    return {
        code: {"model": ErrorOut, "description": _ERROR_DESCRIPTIONS[code]}
        for code in sorted({*COMMON_ERRORS, *codes})
    }
