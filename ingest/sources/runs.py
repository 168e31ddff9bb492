"""A source's run as a job: the reader its stored row asks for, and the sync of a claimed
`source` job (a worker's) or of a run the CLI makes in its own process."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import ingest.sources as sources
from ingest.pipeline import IngestReport
from ingest.sources.base import SourceError, SourceReader
from ingest.sources.credentials import Credentials, redact
from ingest.sources.deadline import RunDeadline
from ingest.sources.sync import SyncProgress, SyncReport, SyncTarget, sync_source
from ragservice import store
from ragservice.config import Settings
from ragservice.db.models import Source
from ragservice.errors import ConfigurationError, RagServiceError
from ragservice.runtime import Runtime


class SourceGone(RagServiceError):
    """The run's source was deleted after the run was queued."""

    status_code = 404


def open_reader(
    settings: Settings,
    location: str,
    options: dict[str, Any],
    *,
    credentials: Credentials | None = None,
    others_waiting: Callable[[], bool] | None = None,
) -> SourceReader:
    """The reader for a source at `location` with its `options` (`ingest.sources.reader_for`,
    which checks them: ValueError for one it does not know or a bad value), fetching with
    `credentials`, its scan bounded by the run's deadline (`run_seconds`) and, given
    `others_waiting` (a worker's run), by its turn (`RAGSERVICE_SOURCE_TURN_SECONDS`)."""
    reader_for = getattr(sources, "reader_for", None)
    if reader_for is None:  # the readers are not installed in this build
        raise ConfigurationError("this build has no source readers")
    reader: SourceReader = reader_for(
        location, options, settings=settings.sources, credentials=credentials
    )
    # A run ends by its deadline (`ingest.sources.deadline`), whatever reads it.
    return RunDeadline(
        reader,
        sources.run_seconds(options, settings.sources),
        turn=settings.sources.turn_seconds,
        others_waiting=others_waiting,
    )


def source_target(runtime: Runtime, source: Source) -> SyncTarget:
    """Where a run of `source` writes (its collection's name is looked up now)."""
    with runtime.db.read() as session:
        collection = store.sources.collection_name(session, source.collection_id)
    if collection is None:
        raise SourceGone("the source's collection no longer exists")
    return SyncTarget(
        source_id=source.id,
        tenant_id=source.tenant_id,
        collection_id=source.collection_id,
        collection=collection,
        readers=None if source.readers is None else tuple(source.readers),
        prune=source.prune,
        writes_as=None if source.writes_as is None else frozenset(source.writes_as),
    )


def run_source(
    runtime: Runtime,
    source: Source,
    *,
    progress: SyncProgress | None = None,
    report: SyncReport | None = None,
    ingest: IngestReport | None = None,
    others_waiting: Callable[[], bool] | None = None,
) -> SyncReport:
    """Sync `source` now in this thread. A source whose reader cannot even be opened (its
    host refused by the guard since, say) fails the run: `report.failure` says why. Its
    credentials are in none of the report's messages, nor in the message of what it raises.
    `others_waiting`: whether another tenant's job waits for a thread (a worker's run gives
    its thread up then, once its turn is over: `report.yielded`)."""
    report = report or SyncReport()
    target = source_target(runtime, source)
    credentials = Credentials.from_json(source.credentials)
    try:
        options = dict(source.options)
        try:
            reader = open_reader(
                runtime.settings,
                source.location,
                options,
                credentials=credentials,
                others_waiting=others_waiting,
            )
        except SourceError as exc:
            report.failure = str(exc)
            return report
        return sync_source(runtime, target, reader, progress=progress, report=report, ingest=ingest)
    except Exception as exc:
        if credentials is not None and redact(str(exc), credentials) != str(exc):
            raise SourceError(redact(str(exc), credentials)) from None
        raise
    finally:
        _redact_report(report, credentials)


def _redact_report(report: SyncReport, credentials: Credentials | None) -> None:
    if report.failure is not None:
        report.failure = redact(report.failure, credentials)
    report.errors = [(key, redact(reason, credentials)) for key, reason in report.errors]
    report.skips = [(key, redact(reason, credentials)) for key, reason in report.skips]


def claimed_source(runtime: Runtime, job: store.jobs.ClaimedJob) -> Source:
    """The source a claimed `source` job runs; SourceGone when it was deleted meanwhile."""
    source_id = job.params.get("source_id")
    source = None
    if source_id:
        with runtime.db.read() as session:
            source = store.sources.source_by_id(session, uuid.UUID(str(source_id)))
    if source is None or source.collection_id != job.collection_id:
        raise SourceGone("the job's source was deleted")
    return source
