"""Every error leaves the API in one shape: `{"error", "detail", "request_id"}`.

The service's own errors carry their status code; validation errors become 400 (a body that is
not JSON) or 422; anything unexpected is logged with its request id and answered with a bare 500.
A stream that fails after its 200 ends with the same body in its last event (`stream_error`),
and so does a stream cut short by the server stopping (`ServiceStopping`, a 503's body).

An unexpected error is answered and logged here, once (`UnexpectedErrors`, the innermost
middleware): Starlette hands a handler of `Exception` to its outermost middleware, which
re-raises after answering, so that the server logged every traceback a second time.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request, params
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg import DataError as DriverDataError
from psycopg import OperationalError as DriverOperationalError
from sqlalchemy.exc import DataError, OperationalError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ragservice.api.middleware import REQUEST_ID_HEADER
from ragservice.api.stopping import STOPPING_DETAIL
from ragservice.db import error_summary
from ragservice.errors import (
    AuthenticationError,
    RagServiceError,
    RateLimitedError,
    ServiceStoppingError,
)

log = logging.getLogger(__name__)

INTERNAL_DETAIL = "internal error; quote the request id when reporting it"

_STATUS_NAMES = {
    400: "BadRequest",
    401: "Authentication",
    403: "PermissionDenied",
    404: "NotFound",
    405: "MethodNotAllowed",
    413: "PayloadTooLarge",
    415: "UnsupportedMediaType",
    422: "InvalidInput",
    429: "RateLimited",
}


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RagServiceError, _service_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(DataError, _unstorable_value)
    app.add_exception_handler(DriverDataError, _unstorable_value)
    app.add_exception_handler(OperationalError, _database_down)
    app.add_exception_handler(DriverOperationalError, _database_down)
    app.add_exception_handler(Exception, _unexpected_error)  # raised by the middlewares
    app.add_middleware(UnexpectedErrors)  # the first added: the innermost


class UnexpectedErrors:
    """Answers an exception no handler took with the 500 of `_unexpected_error`, and ends it
    there (logged once). One raised after the response started goes on up: a stream's
    errors are its own (`stream_error`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            if started:
                raise
            response = await _unexpected_error(Request(scope), exc)
            await response(scope, receive, send)


def request_id(request: Request) -> str:
    return str(getattr(request.state, "request_id", "-"))


def error_response(
    request: Request, status: int, error: str, detail: str, **extra: Any
) -> JSONResponse:
    rid = request_id(request)
    headers = {REQUEST_ID_HEADER: rid}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    body = {"error": error, "detail": detail, "request_id": rid, **extra}
    return JSONResponse(body, status_code=status, headers=headers)


def error_kind(exc: Exception) -> tuple[str, str]:
    """The `error` and `detail` of the body for `exc`: a RagServiceError's class name without
    `Error` (`InvalidInput`, `NotFound`, `Upstream`) and its message, which is safe to show;
    anything else `InternalError`, its details left to the server log."""
    if isinstance(exc, RagServiceError):
        return type(exc).__name__.removesuffix("Error"), str(exc)
    return "InternalError", INTERNAL_DETAIL


def stream_error(request: Request, exc: Exception) -> dict[str, str]:
    """The data of the event that ends a stream failing after its 200 was sent (`/v1/query`,
    `/v1/chat/completions`): the body an error response would have had, logged as it would."""
    _log_failure(request, exc)
    error, detail = error_kind(exc)
    return {"error": error, "detail": detail, "request_id": request_id(request)}


def stopped_stream_error(request: Request) -> dict[str, str]:
    """The data of the event that ends a stream cut short because the server is stopping
    (`ServiceStopping`, as a 503 would say it)."""
    return stream_error(request, ServiceStoppingError(STOPPING_DETAIL))


def _log_failure(request: Request, exc: Exception) -> None:
    if isinstance(exc, ServiceStoppingError):
        log.info("request %s cut short: the server is stopping", request_id(request))
    elif not isinstance(exc, RagServiceError):
        # The caller gets the request id to quote; the details stay in the server log.
        log.exception("request %s failed", request_id(request), exc_info=exc)
    elif exc.status_code >= 500:
        log.error("request %s failed: %s", request_id(request), exc)


async def _service_error(request: Request, exc: RagServiceError) -> JSONResponse:
    _log_failure(request, exc)
    status = 401 if isinstance(exc, AuthenticationError) else exc.status_code
    response = error_response(request, status, *error_kind(exc))
    if isinstance(exc, RateLimitedError):
        response.headers["Retry-After"] = str(exc.retry_after)
    return response


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [_describe(error) for error in exc.errors()]
    if any(error["type"] == "json_invalid" for error in errors):
        return error_response(request, 400, "BadRequest", "request body is not valid JSON")
    expected = _expected_media_type(request)
    body_errors = any(error.get("loc", ())[:1] == ("body",) for error in exc.errors())
    if expected and body_errors:
        detail = f"send the request body as {expected}, not {_sent_media_type(request)}"
        return error_response(request, 415, "UnsupportedMediaType", detail)
    detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
    return error_response(request, 422, "InvalidInput", detail, errors=errors)


def _expected_media_type(request: Request) -> str:
    """The body type the route takes when the request sent another (so FastAPI could not
    parse it and reported the body invalid); empty when the types agree."""
    sent = _sent_media_type(request)
    body = getattr(request.scope.get("route"), "body_field", None)
    if body is None or not sent:
        return ""  # without a Content-Type FastAPI reads JSON, so there is nothing to blame
    if isinstance(body.field_info, params.Form):
        forms = ("multipart/form-data", "application/x-www-form-urlencoded")
        return "" if sent in forms else "multipart/form-data"
    subtype = sent.removeprefix("application/")
    is_json = subtype != sent and (subtype == "json" or subtype.endswith("+json"))
    return "" if is_json else "application/json"


def _sent_media_type(request: Request) -> str:
    return request.headers.get("content-type", "").partition(";")[0].strip().lower()


_LOCATIONS = ("body", "query", "path", "header", "cookie")


def _describe(error: Any) -> dict[str, str]:
    loc = list(error.get("loc", ()))
    if loc and loc[0] in _LOCATIONS:  # where the field is, not its name (search's `query`)
        loc = loc[1:]
    location = [str(part) for part in loc]
    return {
        "field": ".".join(location) or "body",
        "message": str(error.get("msg", "invalid")).removeprefix("Value error, "),
        "type": str(error.get("type", "")),
    }


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    name = _STATUS_NAMES.get(exc.status_code, "Error")
    detail = str(exc.detail)
    if isinstance(exc.__cause__, RecursionError):  # FastAPI's "error parsing the body"
        detail = "request body is nested too deeply to parse"
    if exc.status_code == 400 and detail.startswith(_TOO_MANY_FILES):
        # Starlette's multipart parser stops at the route's form limit (app.py sets it from
        # RAGSERVICE_MAX_FILES_PER_UPLOAD): over a limit is a 413, as the route's own check.
        limit = detail.rstrip(".").rpartition(" ")[2]
        detail = (
            f"too many files in one upload; the limit is {limit} (RAGSERVICE_MAX_FILES_PER_UPLOAD)"
        )
        return error_response(request, 413, "PayloadTooLarge", detail)
    return error_response(request, exc.status_code, name, detail)


_TOO_MANY_FILES = "Too many files. Maximum number of files is "


async def _unstorable_value(request: Request, exc: Exception) -> JSONResponse:
    # E.g. a number out of a column's range: the caller's input, not our fault. (The fields
    # are checked before this; the message quotes what was refused, so it is not logged.)
    log.info(
        "request %s: value refused by the database: %s", request_id(request), error_summary(exc)
    )
    detail = "a value in the request cannot be stored or searched (e.g. a NUL character)"
    return error_response(request, 422, "InvalidInput", detail)


async def _database_down(request: Request, exc: Exception) -> JSONResponse:
    log.error("request %s: database unavailable: %s", request_id(request), exc)
    return error_response(request, 503, "DatabaseUnavailable", "the database is unavailable")


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    _log_failure(request, exc)
    return error_response(request, 500, *error_kind(exc))
