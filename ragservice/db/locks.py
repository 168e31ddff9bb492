"""Session-level advisory locks held on connections of their own: a claim PostgreSQL itself
knows to be dead once its holder is.

A worker that claims an ingest job takes a lock with a fresh random key on a dedicated
connection and records the key in the job (`store.jobs`). PostgreSQL releases a session's
advisory locks when its connection ends, however it ends: the process killed with SIGKILL,
crashed, or stopped. Any worker then sees the key free in `pg_locks` (readable by every login)
and takes the job over at once, instead of waiting for its heartbeat to go stale.

The keys are positive 62-bit numbers, so that `pg_locks` shows them as `classid` (the high 32
bits) and `objid` (the low 32 bits) with `objsubid` 1, and two claims never share one.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from typing import Any

import psycopg
from sqlalchemy import BigInteger, ColumnElement, and_, cast, column, exists, func, select, table
from sqlalchemy.engine import make_url
from sqlalchemy.orm import InstrumentedAttribute

log = logging.getLogger(__name__)

KEY_BITS = 62

# How long PostgreSQL waits to notice that the holder's host is gone (a cable pulled, a VM
# lost): TCP keepalives every 5 s after 10 s idle, 3 missed. A process that dies closes its
# socket, which the server sees at once. (Unix-socket connections ignore these settings.)
_KEEPALIVES = (
    "-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3 "
    "-c idle_session_timeout=0"
)
_CONNECT_TIMEOUT_S = 10
_LOW_WORD = 1 << 32  # a key is classid * 2**32 + objid

_pg_locks = table(
    "pg_locks",
    column("locktype"),
    column("database"),
    column("classid"),
    column("objid"),
    column("objsubid"),
    column("granted"),
)
_pg_database = table("pg_database", column("oid"), column("datname"))


class SessionLock:
    """One advisory lock with a random key, held by a connection of its own until `release()`
    (or until the process or its connection dies)."""

    def __init__(self, url: str, key: int | None = None) -> None:
        self.key = key if key is not None else secrets.randbits(KEY_BITS)
        self._conninfo = (
            make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        self._conn: psycopg.Connection[Any] | None = None
        self._take()

    def check(self) -> bool:
        """Whether the lock is still held, taking it again on a new connection if the old one
        was lost (a PostgreSQL restart, say); False when it cannot be held now."""
        try:
            if self._conn is not None and not self._conn.closed:
                self._conn.execute("SELECT 1")
                return True
        except psycopg.Error:
            pass
        self.release()
        try:
            self._take()
        except psycopg.Error as exc:
            log.warning("advisory lock %d: cannot take it again: %s", self.key, exc)
            return False
        return True

    def release(self) -> None:
        """Let go: unlocked first, then the connection closed. Closing alone releases the lock
        only once its server process has ended, a moment later: another session looking at
        once could still see it held."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        with contextlib.suppress(psycopg.Error):  # a lost connection holds nothing any more
            if not conn.closed:
                conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
        conn.close()

    def __enter__(self) -> SessionLock:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()

    def _take(self) -> None:
        conn = psycopg.connect(
            self._conninfo,
            autocommit=True,
            connect_timeout=_CONNECT_TIMEOUT_S,
            options=_KEEPALIVES,
            application_name="ragservice claim",
        )
        try:
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
        except BaseException:
            conn.close()
            raise
        if row is None or not row[0]:  # a 62-bit random key already held: practically never
            conn.close()
            raise psycopg.OperationalError(f"advisory lock {self.key} is held elsewhere")
        self._conn = conn


def lock_held(key: ColumnElement[Any] | InstrumentedAttribute[Any]) -> ColumnElement[bool]:
    """Whether some session of this database holds the advisory lock `key` (a `SessionLock`'s
    key, as a bigint column or expression)."""
    this_database = (
        select(_pg_database.c.oid)
        .where(_pg_database.c.datname == func.current_database())
        .scalar_subquery()
    )
    return exists().where(
        and_(
            _pg_locks.c.locktype == "advisory",
            _pg_locks.c.granted.is_(True),
            _pg_locks.c.objsubid == 1,
            _pg_locks.c.database == this_database,
            cast(_pg_locks.c.classid, BigInteger) * _LOW_WORD + cast(_pg_locks.c.objid, BigInteger)
            == key,
        )
    )
