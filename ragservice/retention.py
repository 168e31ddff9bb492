"""The retention purge: logged queries (with their feedback) past the query log's retention
and the items of jobs ended longer ago than the job payloads' (`purge_retention`, run by
`ragservice db purge`), and the background rounds every server repeats it in
(`RetentionPurger`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from ragservice import store
from ragservice.config import RetentionSettings
from ragservice.db import Database, tenancy
from ragservice.periodic import Periodic

log = logging.getLogger(__name__)


_PURGE_BATCH = 10_000


@dataclass(frozen=True, slots=True)
class PurgeReport:
    """What one retention purge deleted."""

    queries: int = 0
    feedback: int = 0
    job_items: int = 0


def purge_retention(
    db: Database,
    retention: RetentionSettings,
    *,
    query_log_days: int | None = None,
    job_payload_hours: float | None = None,
) -> PurgeReport:
    """Delete, across tenants, logged queries (with their feedback) older than the query log
    retention, and the items of jobs that ended longer ago than the job payload retention.
    The arguments override the settings. Queries go in batches, each its own transaction."""
    days = retention.query_log_days if query_log_days is None else query_log_days
    hours = retention.job_payload_hours if job_payload_hours is None else job_payload_hours
    queries = feedback = 0
    with tenancy.as_system():
        with db.write() as session:
            items = store.jobs.purge_job_payloads(session, older_than=timedelta(hours=hours))
        while days > 0:
            with db.write() as session:
                batch, batch_feedback = store.query_log.purge_query_log(
                    session, older_than_days=days, limit=_PURGE_BATCH
                )
            queries, feedback = queries + batch, feedback + batch_feedback
            if batch < _PURGE_BATCH:
                break
    return PurgeReport(queries=queries, feedback=feedback, job_items=items)


class RetentionPurger:
    """Runs `purge_retention` at start and then every `RAGSERVICE_RETENTION_PURGE_SECONDS`."""

    def __init__(self, db: Database, retention: RetentionSettings) -> None:
        self._db = db
        self._retention = retention
        self._rounds = Periodic(
            "retention-purger",
            self.purge_once,
            retention.purge_seconds,
            what="the retention purge",
            at_start=True,
        )

    def start(self) -> None:
        self._rounds.start()

    def stop(self, timeout: float) -> None:
        self._rounds.stop(timeout)

    def purge_once(self) -> PurgeReport:
        report = purge_retention(self._db, self._retention)
        if report != PurgeReport():
            log.info("retention purge: %s", report)
        return report
