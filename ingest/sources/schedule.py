"""The schedule of sources: runs queued when a source's `every_seconds` come round.

Each job worker (the threads of `ragservice serve`, a `ragservice worker`) runs a round every
`RAGSERVICE_SOURCES_POLL_SECONDS` that queues a run of every due source of every tenant
(`store.sources.queue_due_runs`); several processes may do so at once without queuing a
source twice. A source whose last run is still queued or running skips that turn.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from ragservice import store
from ragservice.db import Database, tenancy
from ragservice.periodic import Periodic

log = logging.getLogger(__name__)


def queue_due_runs(db: Database) -> list[uuid.UUID]:
    """Queue the runs of the sources that are due, across tenants; the jobs queued."""
    with tenancy.as_system(), db.write() as session:
        queued = store.sources.queue_due_runs(session)
    if queued:
        log.info("queued %d scheduled source runs", len(queued))
    return queued


class SourceScheduler:
    """Calls `queue_due_runs` at start and every `poll_seconds`; `on_queued` (waking the
    workers) after a round that queued some."""

    def __init__(
        self, db: Database, poll_seconds: float, on_queued: Callable[[], None] = lambda: None
    ) -> None:
        self._db = db
        self._on_queued = on_queued
        self._rounds = Periodic(
            "source-scheduler",
            self.round,
            poll_seconds,
            what="queuing the scheduled source runs",
            at_start=True,
        )

    def round(self) -> list[uuid.UUID]:
        queued = queue_due_runs(self._db)
        if queued:
            self._on_queued()
        return queued

    def start(self) -> None:
        self._rounds.start()

    def stop(self, timeout: float) -> None:
        self._rounds.stop(timeout)
