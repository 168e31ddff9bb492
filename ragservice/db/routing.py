"""Where reads go: the replica of the server's region when it is healthy and current, else
another healthy replica, else the primary.

A background thread checks every node each `replication.check_seconds` (never per request): the
primary's WAL position, and each replica's recovery state, replayed WAL position and last
replayed commit time. A replica serves reads while it answers and is at most
`replication.max_lag_seconds` behind. A read that fails to connect takes its replica out at once
(the next request goes elsewhere); the next good check takes it back.

Lag is measured without trusting clocks: the checker remembers when it first saw the primary
pass each WAL position, so a replica's lag is the time since the primary passed the position
the replica has replayed (precise to one check interval). A replica behind everything the
checker has seen falls back to `now() - pg_last_xact_replay_timestamp()` on the replica.

Read-your-writes: a read carrying a consistency token (a WAL position) is served by a replica
only once that replica has replayed it, waiting at most `replication.wait_seconds`, else by the
primary. A token ahead of the primary's own position was not issued by it and is ignored.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from ragservice.db.scope import format_lsn

log = logging.getLogger(__name__)

PRIMARY = "primary"

_PRIMARY_LSN = text("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
# Tokens are insert positions (`engine.Database.write`), at or past the write position.
_PRIMARY_INSERT_LSN = text("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
_REPLICA_STATE = text(
    """
    SELECT pg_is_in_recovery(),
           pg_last_wal_replay_lsn() - '0/0'::pg_lsn,
           CASE WHEN pg_is_in_recovery() THEN pg_is_wal_replay_paused() ELSE false END,
           extract(epoch FROM now() - pg_last_xact_replay_timestamp())
    """
)
_REPLAYED = text("SELECT pg_last_wal_replay_lsn() - '0/0'::pg_lsn >= :lsn")


@dataclass(frozen=True)
class Health:
    """One check's verdict on one node."""

    healthy: bool
    checked_at: datetime | None = None
    lsn: int | None = None  # the primary's WAL position, or what a replica has replayed
    lag_bytes: int | None = None
    lag_seconds: float | None = None
    replay_paused: bool = False
    error: str | None = None


NOT_CHECKED = Health(healthy=False, error="not checked yet")


@dataclass(frozen=True)
class _ReplicaState:
    in_recovery: bool
    replay_lsn: int | None
    paused: bool
    clock_lag: float | None


class Replica:
    """One read replica: its engine, its session factory and its last health check."""

    def __init__(self, name: str, region: str, engine: Engine) -> None:
        self.name = name
        self.region = region
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)
        self.health = NOT_CHECKED

    @property
    def display_url(self) -> str:
        return make_url(self.engine.url).render_as_string(hide_password=True)

    def serves(self, max_lag_seconds: float) -> bool:
        health = self.health
        return (
            health.healthy
            and health.lag_seconds is not None
            and health.lag_seconds <= max_lag_seconds
        )

    def known_replayed(self, lsn: int) -> bool:
        replayed = self.health.lsn
        return replayed is not None and replayed >= lsn


@dataclass
class _Checks:
    """The checker's memory: when the primary was first seen at each WAL position."""

    primary: Health = NOT_CHECKED
    history: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=4096))
    pending: dict[str, Future[Any]] = field(default_factory=dict)


class ReadRouter:
    def __init__(
        self,
        primary: Engine,
        replicas: Sequence[Replica],
        *,
        region: str | None,
        max_lag_seconds: float,
        wait_seconds: float,
        check_seconds: float,
        check_timeout: float,
    ) -> None:
        self.replicas = list(replicas)
        self.region = region
        self.max_lag_seconds = max_lag_seconds
        self.wait_seconds = wait_seconds
        self.check_seconds = check_seconds
        self._primary = primary
        self._check_timeout = check_timeout
        self._checks = _Checks()
        self._reads: Counter[str] = Counter()
        self._reads_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(
            max_workers=len(self.replicas) + 1, thread_name_prefix="replica-check"
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replica-checker", daemon=True)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Check every node once (so the first requests are routed well), then keep checking."""
        self.check()
        for replica in self.replicas:
            if not replica.health.healthy:
                log.warning("replica %s is not serving: %s", replica.name, replica.health.error)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._check_timeout + self.check_seconds)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        while not self._stop.wait(self.check_seconds):
            try:
                self.check()
            except Exception:  # the checker must outlive any one bad round
                log.exception("checking the replicas failed")

    # -- routing ---------------------------------------------------------------------------------

    def session(self, min_lsn: int | None) -> tuple[Session, str] | None:
        """A session on the replica that should serve this read, or None for the primary.

        The connection is taken at once: a replica that cannot be reached is marked down and
        the next one is tried, so a stopped replica costs one failed connect, not a failed read.
        """
        deadline = time.monotonic() + self.wait_seconds
        for replica in self._candidates():
            session = replica.sessions()
            try:
                connection = session.connection()
                if min_lsn is not None and not self._caught_up(
                    replica, connection, min_lsn, deadline
                ):
                    session.close()
                    break  # waited the whole bound: the primary has it for sure
            except DBAPIError as exc:
                session.close()
                self.mark_down(replica, exc)
                continue
            return session, replica.name
        return None

    def count_read(self, node: str) -> None:
        with self._reads_lock:
            self._reads[node] += 1

    def reads(self) -> dict[str, int]:
        with self._reads_lock:
            return dict(self._reads)

    def mark_down(self, replica: Replica, exc: BaseException) -> None:
        log.warning(
            "replica %s failed a read and is out until it checks well: %s", replica.name, exc
        )
        replica.health = Health(healthy=False, checked_at=_now(), error=_describe(exc))

    def _candidates(self) -> list[Replica]:
        """Replicas that may serve: the server's region first; equals in random order."""
        serving = [r for r in self.replicas if r.serves(self.max_lag_seconds)]
        return sorted(serving, key=lambda r: (r.region != self.region, random.random()))

    def _issued(self, lsn: int) -> bool:
        """Whether the primary has reached `lsn`, so a token for it may be one it issued. A
        token ahead of the primary is ignored (the replica serves the read at once): no
        replica could ever catch up with it, and honouring it would hold a connection and a
        thread for `wait_seconds`. Asked only before a wait, and of the primary only for
        positions past the last check's (a write since, or a forgery); when the primary
        cannot say, the token stands."""
        known = self._checks.primary.lsn
        if known is not None and lsn <= known:
            return True
        try:
            with self._primary.connect() as conn:
                current = int(conn.execute(_PRIMARY_INSERT_LSN).scalar_one())
        except DBAPIError:
            return True
        if lsn > current:
            log.info("ignored a consistency token ahead of the primary: %s", format_lsn(lsn))
            return False
        return True

    def _caught_up(self, replica: Replica, connection: Any, lsn: int, deadline: float) -> bool:
        """Whether `replica` has replayed `lsn`, waiting for it until `deadline`."""
        if replica.known_replayed(lsn):
            return True
        pause = 0.001
        checked = False
        while True:
            if connection.execute(_REPLAYED, {"lsn": lsn}).scalar_one():
                return True
            if not checked:  # about to wait: only for a position the primary has reached
                checked = True
                if not self._issued(lsn):
                    return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, 0.02)

    # -- health checks ---------------------------------------------------------------------------

    def check(self) -> None:
        """One round: the primary's WAL position and every replica's state, concurrently."""
        checks = self._checks
        started = time.monotonic()
        primary = self._submit(PRIMARY, self._primary_lsn)
        states = {r.name: self._submit(r.name, self._replica_state, r) for r in self.replicas}
        submitted = [f for f in (primary, *states.values()) if f is not None]
        wait(submitted, timeout=self._check_timeout)
        if primary is not None:
            checks.primary = self._primary_health(primary, started)
        for replica in self.replicas:
            future = states[replica.name]
            if future is not None:
                replica.health = self._replica_health(future, started)

    def _submit(self, name: str, fn: Any, *args: Any) -> Future[Any] | None:
        """Start a check unless the previous one of this node still hangs (reported as such)."""
        previous = self._checks.pending.get(name)
        if previous is not None and not previous.done():
            return None
        future = self._pool.submit(fn, *args)
        self._checks.pending[name] = future
        return future

    def _primary_lsn(self) -> int:
        with self._primary.connect() as conn:
            return int(conn.execute(_PRIMARY_LSN).scalar_one())

    @staticmethod
    def _replica_state(replica: Replica) -> _ReplicaState:
        with replica.engine.connect() as conn:
            in_recovery, replay_lsn, paused, clock_lag = conn.execute(_REPLICA_STATE).one()
        return _ReplicaState(
            in_recovery=bool(in_recovery),
            replay_lsn=None if replay_lsn is None else int(replay_lsn),
            paused=bool(paused),
            clock_lag=None if clock_lag is None else float(clock_lag),
        )

    def _primary_health(self, future: Future[int], started: float) -> Health:
        error = _failure(future)
        if error is not None:
            return Health(healthy=False, checked_at=_now(), error=error)
        lsn = future.result()
        history = self._checks.history
        if not history or history[-1][1] != lsn:
            history.append((started, lsn))
        return Health(healthy=True, checked_at=_now(), lsn=lsn, lag_bytes=0, lag_seconds=0.0)

    def _replica_health(self, future: Future[_ReplicaState], started: float) -> Health:
        error = _failure(future)
        if error is not None:
            return Health(healthy=False, checked_at=_now(), error=error)
        state = future.result()
        if not state.in_recovery:
            return Health(
                healthy=False, checked_at=_now(), error="not a standby (promoted?): serves no reads"
            )
        if state.replay_lsn is None:
            return Health(healthy=False, checked_at=_now(), error="has replayed no WAL yet")
        primary_lsn = self._checks.primary.lsn
        return Health(
            healthy=True,
            checked_at=_now(),
            lsn=state.replay_lsn,
            lag_bytes=None if primary_lsn is None else max(primary_lsn - state.replay_lsn, 0),
            lag_seconds=self._lag_seconds(state, started),
            replay_paused=state.paused,
        )

    def _lag_seconds(self, state: _ReplicaState, now: float) -> float:
        assert state.replay_lsn is not None
        history = list(self._checks.history)
        if not history or state.replay_lsn >= history[-1][1]:
            return 0.0
        first_past = next(seen for seen, lsn in history if lsn > state.replay_lsn)
        if history[0][1] <= state.replay_lsn:
            return max(now - first_past, 0.0)
        # Behind everything this process has seen: the replica's own account is all there is.
        return max(now - history[0][0], state.clock_lag or 0.0)

    # -- reporting -------------------------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        """Every node's role, health and lag, as readiness and `replicas status` show them."""
        reads = self.reads()
        nodes = [_node_status(PRIMARY, "primary", None, self._checks.primary)]
        nodes[0]["reads"] = reads.get(PRIMARY, 0)
        for replica in self.replicas:
            node = _node_status(replica.name, "replica", replica.region, replica.health)
            node["url"] = replica.display_url
            node["serving"] = replica.serves(self.max_lag_seconds)
            node["local"] = replica.region == self.region
            node["reads"] = reads.get(replica.name, 0)
            nodes.append(node)
        return nodes


def replica_names(regions: Sequence[str]) -> list[str]:
    """`eu`, `eu`, `us` → `eu-1`, `eu-2`, `us-1`."""
    seen: Counter[str] = Counter()
    names = []
    for region in regions:
        seen[region] += 1
        names.append(f"{region}-{seen[region]}")
    return names


def _node_status(name: str, role: str, region: str | None, health: Health) -> dict[str, Any]:
    return {
        "name": name,
        "role": role,
        "region": region,
        "healthy": health.healthy,
        "lsn": None if health.lsn is None else format_lsn(health.lsn),
        "lag_seconds": None if health.lag_seconds is None else round(health.lag_seconds, 3),
        "lag_bytes": health.lag_bytes,
        "replay_paused": health.replay_paused,
        "error": health.error,
        "checked_at": None if health.checked_at is None else health.checked_at.isoformat(),
    }


def _failure(future: Future[Any]) -> str | None:
    if not future.done():
        return "health check timed out"
    exc = future.exception()
    return None if exc is None else _describe(exc)


def _describe(exc: BaseException) -> str:
    """The first line of a driver error (never a password: URLs are not in these messages)."""
    original = getattr(exc, "orig", None) or exc
    message = str(original).strip().splitlines()
    return f"{type(original).__name__}: {message[0] if message else ''}".strip()


def _now() -> datetime:
    return datetime.now(UTC)
