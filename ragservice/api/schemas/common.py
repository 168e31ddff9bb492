"""What every resource's schemas share: the error body, the error responses an operation
documents, and the types of request fields that every resource checks alike: text
(`Text`), JSON objects (`JsonObject`), finite numbers (`Finite`) and collection names.

Text reaches PostgreSQL, the tokenizers and the response encoder, none of which takes a NUL
character or a lone UTF-16 surrogate (valid JSON: `"\\ud800"`, which Python decodes to an
unencodable string): each refuses them with a 422 naming the field, never a 500.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field

from ragservice.limits import (
    MAX_COLLECTIONS_PER_REQUEST,
    MAX_JSON_DEPTH,
    json_text_problem,
    text_problem,
    too_deep,
)
from ragservice.services.views import Pages as Pages  # the documents' schemas name it here


def _storable(value: Any) -> Any:
    # Before pydantic's own checks, whose message for a surrogate does not say what is wrong.
    if isinstance(value, str) and (problem := text_problem(value)):
        raise ValueError(problem)
    return value


def _no_surrogates(value: Any) -> Any:
    if isinstance(value, str) and (problem := text_problem(value.replace("\x00", ""))):
        raise ValueError(problem)
    return value


def _storable_json(value: Any) -> Any:
    if problem := json_text_problem(value):
        raise ValueError(problem)
    return value


StorableJson = BeforeValidator(_storable_json)
"""On a field of several shapes (a text or a list of them, ...): its strings checked as
`Text` before pydantic tries each shape, so that the 422 says what is wrong, once."""

Storable = BeforeValidator(_storable)
"""The check of `Text`, for a text with bounds that may be null: `Annotated[str,
StringConstraints(max_length=...), Storable] | None` (bounds given to `Field` of such a union
would be checked as a list's, and say so)."""

Text = Annotated[str, Storable]
"""Text of a request: no NUL character, no lone surrogate."""

DocumentText = Annotated[str, BeforeValidator(_no_surrogates)]
"""A document's text: no lone surrogate; NUL characters are dropped at ingest, as in files."""


def _shallow(value: dict[str, Any]) -> dict[str, Any]:
    # Checked before anything recurses into it: the store, the filter compiler, jsonb.
    if too_deep(value):
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    if problem := json_text_problem(value):
        raise ValueError(f"a key or string value {problem}")
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_shallow)]
"""Metadata or a filter: a JSON object at most `MAX_JSON_DEPTH` levels deep, its keys and
strings `Text`."""


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


Finite = Annotated[float, BeforeValidator(_finite)]
"""A number that is not NaN or infinite (JSON has neither, but Python's parser takes both)."""

CollectionNames = Annotated[
    list[Text],
    Field(
        min_length=1,
        max_length=MAX_COLLECTIONS_PER_REQUEST,
        description=f"collection names, at most {MAX_COLLECTIONS_PER_REQUEST}; unset: all of yours",
    ),
]


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
