"""Log lines, as text (the default) or JSON (`RAGSERVICE_LOG_FORMAT=json`), and the request
each line was written for.

The request middleware opens a `request_context` for every HTTP request: its id, tenant (once
the key is checked) and route (once routing matched it). Every line written while the request
runs, in the event loop or in a worker thread it started, carries them: JSON lines as fields
`request_id`, `tenant`, `route` (and `trace_id`, `span_id` while tracing is on), beside
`timestamp` (ISO 8601, UTC), `level`, `logger` and `message`. The access line of a request
(`ragservice.access`, written in JSON mode only) adds `method`, `status` and `duration_ms`.
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, TextIO

from ragservice.observability import tracing

LogFormat = Literal["text", "json"]

TEXT_FORMAT = "%(levelname)s %(name)s: %(message)s"
ACCESS_LOGGER = "ragservice.access"


@dataclass
class RequestInfo:
    """The request a log line belongs to. `scope` is the request's ASGI scope, where the
    router leaves the matched route."""

    request_id: str
    scope: MutableMapping[str, Any]
    tenant: str | None = None

    @property
    def route(self) -> str | None:
        """The route's template (`/v1/collections/{name}`), once routing matched one."""
        path = getattr(self.scope.get("route"), "path", None)
        return path if isinstance(path, str) else None


_request: ContextVar[RequestInfo | None] = ContextVar("ragservice_request", default=None)


@contextmanager
def request_context(info: RequestInfo) -> Iterator[RequestInfo]:
    """`info` as the current request for the block (and the threads it starts)."""
    token = _request.set(info)
    try:
        yield info
    finally:
        _request.reset(token)


def current_request() -> RequestInfo | None:
    return _request.get()


def current_request_id() -> str | None:
    info = _request.get()
    return None if info is None else info.request_id


def set_request_tenant(tenant_id: uuid.UUID | str) -> None:
    """Name the current request's tenant (once its key is checked)."""
    info = _request.get()
    if info is not None:
        info.tenant = str(tenant_id)


class RequestFields(logging.Filter):
    """Adds the current request's `request_id`, `tenant` and `route` to each record, and
    `trace_id`, `span_id` while tracing is on; fields a record already has are kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        info = _request.get()
        if info is not None:
            _default(record, "request_id", info.request_id)
            _default(record, "tenant", info.tenant)
            _default(record, "route", info.route)
        ids = tracing.current_ids()
        if ids is not None:
            _default(record, "trace_id", ids[0])
            _default(record, "span_id", ids[1])
        return True


def _default(record: logging.LogRecord, name: str, value: object) -> None:
    if value is not None and not hasattr(record, name):
        setattr(record, name, value)


def formatter(log_format: LogFormat) -> logging.Formatter:
    """`text`: `LEVEL logger: message`; `json`: one JSON object a line."""
    if log_format == "text":
        return logging.Formatter(TEXT_FORMAT)
    from pythonjsonlogger.core import RESERVED_ATTRS
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(
        ["levelname", "name", "message"],
        rename_fields={"levelname": "level", "name": "logger"},
        # uvicorn's lines carry their message again with terminal colours: left out.
        reserved_attrs=[*RESERVED_ATTRS, "color_message"],
        timestamp=True,  # record.created as ISO 8601 in UTC
    )


def handler(log_format: LogFormat, stream: TextIO | None = None) -> logging.Handler:
    """A handler writing `log_format` lines (to stderr by default) with the request fields."""
    made = logging.StreamHandler(stream or sys.stderr)
    made.addFilter(RequestFields())
    made.setFormatter(formatter(log_format))
    return made


def configure_logging(level: str, log_format: LogFormat = "text") -> None:
    """The service's own messages at `level`; libraries only when something is wrong. Lines
    in `log_format` on stderr."""
    logging.basicConfig(level=logging.WARNING, handlers=[handler(log_format)])
    for name in ("ragservice", "ingest"):
        logging.getLogger(name).setLevel(level.upper())
    # pypdf warns about every damaged PDF; the ingest summary already reports those files.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
