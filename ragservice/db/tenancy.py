"""Whose rows a transaction may see: the row-level security of migration 0007.

Every transaction the service opens starts by telling PostgreSQL either one tenant (the
setting `ragservice.tenant_id`, `SET LOCAL`) or "all tenants"
(`SET LOCAL ROLE ragservice_system`, a role only the service's login may take: migration 0010);
the policies show nothing else:
- within an HTTP request, the request's tenant (`RequestScope.tenant_id`, set once the API key
  is known; before that, no tenant);
- within `as_tenant(id)`, that tenant (an ingest job runs so);
- within `as_system()`, every tenant: job claiming, cache purging, re-embedding, operator
  commands. The API key lookup is the one system read a request makes;
- anywhere else (outside a request, no `as_*`): no tenant. Such a transaction sees no tenant's
  rows at all, so code that forgets to say whose rows it works on fails closed.

A query that forgets its tenant filter therefore returns the caller's rows only.

Within its tenant, a transaction also says whose documents it may read (`readers`, migration
0026): the asker's principal set (`user:ana`, `group:hr`), or every document of the tenant
(None). A request reads with its caller's set (`RequestScope.readers`, set once the caller is
known; before that, the empty set: unrestricted documents only); `as_tenant` and `as_system`
read every document. A restricted document or chunk whose readers share nothing with the set is
invisible to every statement of the transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from psycopg import sql
from sqlalchemy import Connection

from ragservice.db.scope import current_scope
from ragservice.readers import array_literal


@dataclass(frozen=True, slots=True)
class Tenancy:
    """One tenant (`tenant_id`), all of them (`system`), or none (neither); within the tenant,
    the documents of the principal set `readers` (None: every document)."""

    tenant_id: uuid.UUID | None = None
    system: bool = False
    readers: frozenset[str] | None = None

    @property
    def restricted(self) -> bool:
        """Whether some of the tenant's documents may be hidden from this transaction."""
        return self.readers is not None and not self.system


SYSTEM = Tenancy(system=True)
NO_TENANT = Tenancy()

SYSTEM_ROLE = "ragservice_system"
"""The role a transaction works as to see every tenant's rows (migration 0010)."""

_override: ContextVar[Tenancy | None] = ContextVar("ragservice_tenancy", default=None)

# Sent as is (no SQLAlchemy compilation): they run at the start of every transaction. SET
# LOCAL rather than set_config(): a Citus coordinator sends a transaction's SET LOCAL commands
# on to the workers (citus.propagate_set_commands = 'local'), never a function call, so the
# workers' policies see the same tenant and readers (docs/scaling.md).
_SET_TENANT = "SET LOCAL ragservice.tenant_id = {}; SET LOCAL ragservice.readers = {}"
ALL_DOCUMENTS = "*"
"""`ragservice.readers` of a transaction that reads every document of its tenant."""
_AS_SYSTEM = f"SET LOCAL ROLE {SYSTEM_ROLE}"


def current() -> Tenancy:
    """What a transaction starting now may see (see the module's docstring)."""
    override = _override.get()
    if override is not None:
        return override
    scope = current_scope()
    if scope is None:
        return NO_TENANT
    return Tenancy(tenant_id=scope.tenant_id, readers=scope.readers)


@contextmanager
def as_tenant(tenant_id: uuid.UUID, readers: frozenset[str] | None = None) -> Iterator[None]:
    """Transactions opened within (in this context) see `tenant_id`'s rows only: its
    documents that `readers` may read (None: all of them)."""
    with _overridden(Tenancy(tenant_id=tenant_id, readers=readers)):
        yield


@contextmanager
def as_system() -> Iterator[None]:
    """Transactions opened within see every tenant's rows (for cross-tenant work only)."""
    with _overridden(SYSTEM):
        yield


@contextmanager
def within(tenancy: Tenancy) -> Iterator[None]:
    """Transactions opened within see what `tenancy` says: to carry `current()` over to work
    done on another thread (threads start with no tenant)."""
    with _overridden(tenancy):
        yield


@contextmanager
def _overridden(tenancy: Tenancy) -> Iterator[None]:
    reset = _override.set(tenancy)
    try:
        yield
    finally:
        _override.reset(reset)


def apply(connection: Connection, tenancy: Tenancy | None = None, *, switch_role: bool) -> None:
    """Set the transaction's tenancy on `connection` (it lasts until the transaction ends).

    `switch_role`: whether the connection works as the service role, so that "all tenants"
    means taking `SYSTEM_ROLE` (without row-level security nothing needs switching)."""
    tenancy = tenancy or current()
    tenant = "" if tenancy.tenant_id is None else str(tenancy.tenant_id)
    readers = readers_setting(tenancy.readers)
    connection.exec_driver_sql(_SET_TENANT.format(sql.quote(tenant), sql.quote(readers)))
    if tenancy.system and switch_role:
        connection.exec_driver_sql(_AS_SYSTEM)


@contextmanager
def reading_every_document(connection: Any) -> Iterator[None]:
    """Within the transaction open on `connection` (a driver connection), statements read every
    document of its tenant; the asker's principal set is put back after. For the writes that
    the caller was checked to be allowed first, and for counts of what the asker cannot see."""
    saved = connection.execute(_READERS_NOW).fetchone()
    connection.execute(_read_as(ALL_DOCUMENTS))
    try:
        yield
    finally:
        connection.execute(_read_as(saved[0] if saved and saved[0] is not None else ""))


_READERS_NOW = "SELECT current_setting('ragservice.readers', true)"


def _read_as(readers: str) -> sql.Composed:
    return sql.SQL("SET LOCAL ragservice.readers = {}").format(sql.Literal(readers))


def asker_principals() -> list[str] | None:
    """The principal set of the asker a transaction starting now reads as, sorted (what jobs
    and sources record as whose documents they may replace); None: every document."""
    now = current()
    return None if now.system or now.readers is None else sorted(now.readers)


def readers_setting(readers: frozenset[str] | None) -> str:
    """`ragservice.readers` for a principal set (None: every document)."""
    return ALL_DOCUMENTS if readers is None else array_literal(readers)


def current_tenant_id() -> uuid.UUID | None:
    """The one tenant whose work runs now (None: all tenants, or none yet). The shared slots
    of upstream calls and embedding computations are divided fairly by it."""
    return current().tenant_id
