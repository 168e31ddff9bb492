"""What one request asks of the database layer, and what it did there.

An HTTP request opens a `RequestScope` (the API middleware does); the database layer reads and
fills it without any caller passing it along:
- `replica_reads`: whether the request's reads may be served by a replica. Only requests that
  write nothing do (GET, and the POST routes that only read: search, query, chat); a request
  that writes reads on the primary, so it never acts on a stale view.
- `min_lsn`: the consistency token the caller presented. Reads are served only by a node that
  has replayed at least this WAL position (read-your-writes).
- `written_lsn`: the primary's WAL position after the request's last write; it goes back to
  the caller as the consistency token.
- `read_node`: which node served the request's reads.
- `tenant_id`: the caller's tenant once the API key is known; the database shows the request's
  transactions that tenant's rows only (row-level security, see `tenancy`).
- `asker`: who the request acts for, as the query log and feedback record it (`user:<name>`,
  else `key:<prefix>`).
- `readers`: the caller's principal set once known (None: every document of the tenant);
  until then the empty set, which reads the unrestricted documents only (see `tenancy`).
- `deferred`: writes that need not delay the response (the query log, cache stores); they run
  on the primary after the response is sent.

Outside a request (the CLI, job workers, tests calling the pipeline) there is no scope: reads
go to the primary and deferred writes run at once.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from ragservice.errors import BadRequestError

CONSISTENCY_HEADER = "x-consistency-token"
READ_NODE_HEADER = "x-read-node"

DeferredWrite = Callable[[Session], object]

_LSN = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")


def parse_lsn(text: str) -> int:
    """A WAL position as PostgreSQL prints it (`16/B374D848`) → bytes since the start."""
    match = _LSN.match(text.strip())
    if match is None:
        raise ValueError(f"not a WAL position: {text!r}")
    return (int(match.group(1), 16) << 32) | int(match.group(2), 16)


def format_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def parse_token(value: str) -> int:
    """The `X-Consistency-Token` header's value, or a 400 that says what is wrong with it."""
    try:
        return parse_lsn(value)
    except ValueError:
        raise BadRequestError(
            f"{CONSISTENCY_HEADER}: {value[:40]!r} is not a token this service issued "
            "(pass back the value of a write response's X-Consistency-Token header)"
        ) from None


@dataclass
class RequestScope:
    replica_reads: bool = False
    min_lsn: int | None = None
    written_lsn: int | None = None
    read_node: str | None = None
    tenant_id: uuid.UUID | None = None
    readers: frozenset[str] | None = frozenset()
    asker: str | None = None
    deferred: list[DeferredWrite] = field(default_factory=list)

    def wrote(self, lsn: int) -> None:
        self.written_lsn = lsn if self.written_lsn is None else max(self.written_lsn, lsn)

    def token(self) -> str | None:
        return None if self.written_lsn is None else format_lsn(self.written_lsn)


_current: ContextVar[RequestScope | None] = ContextVar("ragservice_request_scope", default=None)


def current_scope() -> RequestScope | None:
    return _current.get()


def current_asker() -> str | None:
    """Who the current request acts for (None: outside a request, or not known yet)."""
    scope = _current.get()
    return None if scope is None else scope.asker


@contextmanager
def request_scope(
    *, replica_reads: bool = False, min_lsn: int | None = None
) -> Iterator[RequestScope]:
    """Open a scope for the current context (and the worker threads it hands work to)."""
    scope = RequestScope(replica_reads=replica_reads, min_lsn=min_lsn)
    reset = _current.set(scope)
    try:
        yield scope
    finally:
        _current.reset(reset)
