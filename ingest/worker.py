"""Ingest job workers: run the uploads queued in PostgreSQL through the ingest pipeline.

Worker threads of every server and every `ragservice worker` process share one queue. A job is
claimed with SELECT ... FOR UPDATE SKIP LOCKED; the claim is tied to an advisory lock its worker
holds on a connection of its own (`db.locks`), and kept alive by a heartbeat while it runs. When
the worker dies its connection ends, PostgreSQL frees the lock, and another worker takes the job
over at once; a worker that stays connected but stops heartbeating (frozen) loses its job after
`RAGSERVICE_JOB_STALE_SECONDS`. Up to `RAGSERVICE_JOB_MAX_ATTEMPTS` attempts. A worker that is
stopped puts its job back in the queue after the batch being written commits (or at once when
its stop's time is up). Either way the next attempt skips what is already stored (content
hashes), so no document is written twice or half.

A job of kind `source` syncs a source (`ingest.sources.sync`) instead of running uploaded
items; the threads' process also queues the sources' scheduled runs (`ingest.sources.schedule`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from types import FrameType

import psycopg
from prometheus_client import CollectorRegistry
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from ingest.loaders import (
    DocumentLimits,
    JsonlFields,
    LoadResult,
    ParquetColumns,
    load_bytes,
    load_text,
)
from ingest.loaders.readers import with_readers
from ingest.pipeline import IngestPipeline, IngestReport
from ingest.sources.runs import SourceGone, claimed_source, run_source
from ingest.sources.schedule import SourceScheduler
from ingest.sources.sync import SyncReport
from ingest.targets import ingest_pipeline, resolve_model
from ragservice import store
from ragservice.db import tenancy
from ragservice.db.locks import SessionLock
from ragservice.errors import NotFoundError, RagServiceError
from ragservice.metrics import JobMetrics
from ragservice.runtime import Runtime
from ragservice.types import JobStatus

log = logging.getLogger(__name__)

PROGRESS_SECONDS = 1.0
"""Counts and heartbeat of a running job are written at most this often."""

_RETRY_SECONDS = 5.0  # wait after the queue itself failed (the database is down, say)
_MAX_ERRORS = 1000  # per-file errors kept in a job; the counts still say how many failed
# SQLSTATEs of a server going away: administrator or crash shutdown, not accepting connections.
_SERVER_GONE_STATES = frozenset({"57P01", "57P02", "57P03"})


class _Stopped(Exception):
    """The job stops before its end; raised from the progress callback to leave the pipeline."""


class _Interrupted(_Stopped):
    """The worker is stopping."""


class _Lost(_Stopped):
    """The job is no longer this worker's: taken over, or deleted with its collection."""


class JobFailure(RagServiceError):
    """A job cannot run at all; the message is stored in the job and shown to its owner."""


class JobWorker:
    """Runs queued ingest jobs on background threads (the API server's `BackgroundService`).

    `threads` defaults to `RAGSERVICE_WORKERS`; zero threads is allowed (then only `run_once`
    runs jobs, or other processes do). `metrics` counts the jobs claimed and ended and the
    documents processed (the app's or the worker process's; by default counted nowhere).
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        name: str | None = None,
        threads: int | None = None,
        metrics: JobMetrics | None = None,
    ) -> None:
        self.name = name or _default_name()
        self._runtime = runtime
        self._metrics = metrics or JobMetrics(CollectorRegistry())
        self._thread_count = runtime.settings.jobs.workers if threads is None else threads
        self._stopping = threading.Event()
        self._wakeup = threading.Event()
        self._threads: list[threading.Thread] = []
        self._running: dict[str, store.jobs.ClaimedJob] = {}  # by worker name, while it runs
        self._scheduler: SourceScheduler | None = None

    def start(self) -> None:
        """Start the worker threads (again after `stop`); a no-op while they run."""
        if self._threads:
            return
        self._stopping.clear()
        for index in range(self._thread_count):
            worker = f"{self.name}/{index}"
            thread = threading.Thread(
                target=self._loop, args=(worker,), name=f"job-worker-{index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        poll = self._runtime.settings.sources.poll_seconds
        if self._threads and poll > 0:  # who runs jobs queues the sources' scheduled runs
            self._scheduler = SourceScheduler(self._runtime.db, poll, on_queued=self.wake)
            self._scheduler.start()
        log.info("job worker %s started with %d threads", self.name, self._thread_count)

    def request_stop(self) -> None:
        """Begin to stop without waiting (safe in a signal handler): no new claims, and each
        running job stops at its next progress tick. `stop` then waits for the threads."""
        self._stopping.set()
        self._wakeup.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the threads, waiting up to `timeout` seconds in all.

        A running job stops at its next progress tick, once the batch being written has
        committed, and goes back to the queue without counting the attempt. A thread still
        busy after `timeout` (parsing a slow file or embedding a large batch, say) is left
        behind, and its job is put back in the queue from here: it is no longer the thread's,
        which lets go at its next tick (or ends with the process).
        """
        self.request_stop()
        deadline = time.monotonic() + timeout
        if self._scheduler is not None:
            self._scheduler.stop(timeout)
            self._scheduler = None
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        busy = [thread.name for thread in self._threads if thread.is_alive()]
        if busy:
            log.warning(
                "job worker %s: threads %s did not stop in %.1f s", self.name, busy, timeout
            )
            self._release_running()
        self._threads = []
        log.info("job worker %s stopped", self.name)

    def wake(self) -> None:
        """Look for a job now instead of at the next poll (the API calls this after enqueueing)."""
        self._wakeup.set()

    def run_once(self) -> bool:
        """Claim one job and run it to its end in this thread; False when none was waiting."""
        return self._run_once(self.name)

    def process(self, job: store.jobs.ClaimedJob, claim: SessionLock | None = None) -> str:
        """Run a claimed job; returns its status after: `done`, `failed`, `queued` (the worker
        is stopping), `lost` (the job was taken over or deleted meanwhile), or `stalled` (the
        database went away: the job is taken over once its claim or heartbeat says so).
        `claim`: the advisory lock the claim is tied to, checked at each progress tick."""
        log.info("job %s: attempt %d by %s", job.id, job.attempts, job.worker)
        started = time.monotonic()
        outcome = "error"  # recording the job's end itself failed
        self._metrics.running.inc()
        self._running[job.worker] = job
        try:
            with tenancy.as_tenant(job.tenant_id):  # the job sees its tenant's rows only
                outcome = self._process(job, claim)
            return outcome
        finally:
            self._running.pop(job.worker, None)
            self._metrics.running.dec()
            self._metrics.finished_job(job.kind, outcome, time.monotonic() - started)

    def _process(self, job: store.jobs.ClaimedJob, claim: SessionLock | None) -> str:
        report = IngestReport()
        progress = _Progress(self._runtime, job, report, self._stopping, self._metrics, claim)
        try:
            return self._attempt(job, report, progress)
        finally:
            progress.count()

    def _attempt(
        self, job: store.jobs.ClaimedJob, report: IngestReport, progress: _Progress
    ) -> str:
        synced: SyncReport | None = None
        try:
            progress.tick(force=True)
            if job.kind == store.sources.SOURCE_JOB_KIND:
                synced = self._sync(job, report, progress)
            else:
                self._ingest(job, report, progress)
        except _Interrupted:
            return self._release(job)
        except _Lost:
            log.warning("job %s: taken over by another worker or deleted; left to it", job.id)
            return "lost"
        except Exception as exc:
            if _database_gone(exc):
                return self._stall(job, exc)
            return self._finish(job, report, error=_failure_message(job.id, exc))
        if synced is not None:
            return self._finish_sync(job, synced)
        return self._finish(job, report)

    # -- internals -------------------------------------------------------------------------

    def _loop(self, worker: str) -> None:
        poll = self._runtime.settings.jobs.poll_seconds
        while not self._stopping.is_set():
            self._wakeup.clear()
            try:
                busy = self._run_once(worker)
            except (SQLAlchemyError, psycopg.Error) as exc:
                log.warning("job worker %s: database error: %s", worker, type(exc).__name__)
                self._stopping.wait(max(poll, _RETRY_SECONDS))
                continue
            except Exception:
                log.exception("job worker %s: unexpected error", worker)
                self._stopping.wait(max(poll, _RETRY_SECONDS))
                continue
            if not busy:
                self._wakeup.wait(poll)

    def _run_once(self, worker: str) -> bool:
        claimed = self._claim(worker)
        if claimed is None:
            return False
        job, claim = claimed
        self._metrics.claimed.labels(kind=job.kind).inc()
        with claim:  # released once the job's end (or its release) is recorded
            self.process(job, claim)
        return True

    def _claim(self, worker: str) -> tuple[store.jobs.ClaimedJob, SessionLock] | None:
        """Claim a job, tied to an advisory lock taken on a connection of its own while the
        job's row is locked, so that no other worker sees it running and unheld."""
        settings = self._runtime.settings
        held: list[SessionLock] = []

        def hold() -> int:
            held.append(SessionLock(self._runtime.db.url))
            return held[-1].key

        try:
            # The queue is every tenant's: claiming is cross-tenant work; the job then runs as
            # its own tenant (`process`).
            with tenancy.as_system(), self._runtime.db.write() as session:
                job = store.jobs.claim_job(
                    session,
                    worker=worker,
                    stale_after_seconds=settings.jobs.stale_seconds,
                    max_attempts=settings.jobs.max_attempts,
                    hold=hold,
                )
        except BaseException:
            for claim in held:
                claim.release()
            raise
        return None if job is None else (job, held[0])

    def _ingest(
        self, job: store.jobs.ClaimedJob, report: IngestReport, progress: _Progress
    ) -> None:
        if job.collection is None:
            raise JobFailure("the job's collection no longer exists")
        pipeline = self._pipeline(job)
        items = self._results(job, _formats(job), progress)
        with contextlib.closing(items):
            pipeline.run(
                items,
                collection=job.collection,
                on_progress=progress,
                report=report,
                writes_as=job.writes_as,
            )

    def _sync(
        self, job: store.jobs.ClaimedJob, report: IngestReport, progress: _Progress
    ) -> SyncReport:
        """Run a source's sync (`ingest.sources`); the job's counts are the sync's."""
        source = claimed_source(self._runtime, job)
        synced = SyncReport()
        progress.counts_of = synced.counts
        run_source(
            self._runtime,
            source,
            progress=lambda _s: progress.tick(),
            report=synced,
            ingest=report,
            others_waiting=lambda: self._others_waiting(job.tenant_id),
        )
        return synced

    def _others_waiting(self, tenant_id: uuid.UUID) -> bool:
        with tenancy.as_system(), self._runtime.db.read() as session:
            return store.jobs.others_waiting(session, tenant_id)

    def _finish_sync(self, job: store.jobs.ClaimedJob, synced: SyncReport) -> str:
        status = JobStatus.FAILED if synced.failure else JobStatus.DONE
        ended = self._record_end(
            job, status, synced.counts(), synced.job_errors(), synced.restricted
        )
        if synced.yielded and ended == JobStatus.DONE:
            self._queue_next_run(job)
        return ended

    def _queue_next_run(self, job: store.jobs.ClaimedJob) -> None:
        """A run that gave its thread up goes on in a run queued now, behind the jobs that
        waited (the claims take the tenants with fewer running jobs, then the oldest)."""
        try:
            source = claimed_source(self._runtime, job)
        except SourceGone:
            return  # removed meanwhile: nothing goes on
        with tenancy.as_tenant(job.tenant_id), self._runtime.db.write() as session:
            queued = store.sources.queue_run(session, source)
        log.info("job %s: its source's run goes on in job %s", job.id, queued)

    def _results(
        self,
        job: store.jobs.ClaimedJob,
        formats: tuple[JsonlFields, ParquetColumns],
        progress: _Progress,
    ) -> Generator[LoadResult, None, None]:
        limits = DocumentLimits.from_settings(self._runtime.settings.ingest)
        with self._runtime.db.read() as session:
            for item in store.jobs.job_items(session, job.id):
                progress.tick()
                yield from _load_item(item, formats, limits)

    def _pipeline(self, job: store.jobs.ClaimedJob) -> IngestPipeline:
        """The whole job embeds with the model active when it starts, even across a switch;
        vectors it imports are for the version the upload named (`model`), if any."""
        ref = job.params.get("model")
        try:
            model = resolve_model(self._runtime, str(ref) if ref else None)
        except NotFoundError as exc:  # the version was deleted since the upload
            raise JobFailure(str(exc)) from exc
        return ingest_pipeline(self._runtime, tenant_id=job.tenant_id, model=model)

    def _finish(self, job: store.jobs.ClaimedJob, report: IngestReport, error: str = "") -> str:
        status = JobStatus.FAILED if error else JobStatus.DONE
        errors = [{"error": error}] if error else []
        errors += [{"source": f.source, "error": f.reason} for f in report.failed[:_MAX_ERRORS]]
        if len(report.failed) > _MAX_ERRORS:
            errors.append({"error": f"{len(report.failed) - _MAX_ERRORS} more failures not listed"})
        return self._record_end(job, status, report.counts(), errors, report.restricted)

    def _record_end(
        self,
        job: store.jobs.ClaimedJob,
        status: JobStatus,
        counts: dict[str, int],
        errors: list[dict[str, str]],
        restricted: bool,
    ) -> str:
        with self._runtime.db.write() as session:
            finished = store.jobs.finish_job(
                session,
                job.id,
                status=status,
                counts=counts,
                errors=errors,
                worker=job.worker,
                restricted=restricted,
            )
        if not finished:
            log.warning("job %s: taken over by another worker; this attempt's end dropped", job.id)
            return "lost"
        log.info("job %s %s: %s", job.id, status, counts)
        return status

    def _stall(self, job: store.jobs.ClaimedJob, exc: Exception) -> str:
        """Leave the job `running`, its heartbeats stopped: a worker takes it over as soon as
        its claim's lock is free (this worker lets go of it once the attempt returns), or
        after `RAGSERVICE_JOB_STALE_SECONDS` without a heartbeat, an attempt counted as after
        a crash. Failing it would end it for good over an outage (a restart, a failover)
        likely over by then; a lost connection can be a server-side cursor the job reads its
        items from, found dead only long after the database came back."""
        log.warning(
            "job %s: database connection lost (%s); left running for a takeover",
            job.id,
            type(exc).__name__,
        )
        return "stalled"

    def _release(self, job: store.jobs.ClaimedJob) -> str:
        with self._runtime.db.write() as session:
            released = store.jobs.release_job(session, job.id, job.worker)
        log.info("job %s: worker stopping, %s", job.id, "queued again" if released else "lost")
        return JobStatus.QUEUED if released else "lost"

    def _release_running(self) -> None:
        """Put the jobs of threads that did not stop in time back in the queue."""
        for job in list(self._running.values()):
            try:
                with tenancy.as_tenant(job.tenant_id):
                    self._release(job)
            except Exception as exc:  # the database is gone: the claim ends with the process
                log.warning("job %s: could not put it back in the queue: %s", job.id, exc)


class _Progress:
    """A running job's progress callback: writes counts and heartbeat at most once a second
    (and counts them in the metrics), and stops the pipeline when the worker is stopping or the
    job is no longer ours."""

    def __init__(
        self,
        runtime: Runtime,
        job: store.jobs.ClaimedJob,
        report: IngestReport,
        stopping: threading.Event,
        metrics: JobMetrics,
        claim: SessionLock | None = None,
    ) -> None:
        self._runtime = runtime
        self._job = job
        self._report = report
        self._stopping = stopping
        self._metrics = metrics
        self._claim = claim
        self._counted: dict[str, int] = {}
        self._last = time.monotonic()
        self.counts_of: Callable[[], dict[str, int]] = report.counts
        """The counts the heartbeat records (a source's sync has its own)."""

    def __call__(self, _docs: int, _chunks: int) -> None:
        self.tick()

    def tick(self, *, force: bool = False) -> None:
        if self._stopping.is_set():
            raise _Interrupted
        now = time.monotonic()
        if not force and now - self._last < PROGRESS_SECONDS:
            return
        self._last = now
        with self._runtime.db.write() as session:
            alive = store.jobs.heartbeat_job(
                session, self._job.id, self._job.worker, counts=self.counts_of()
            )
        if not alive:
            raise _Lost
        if self._claim is not None:
            self._claim.check()  # taken again if its connection was lost (a restart)
        self.count()

    def count(self) -> None:
        """Add what the job processed since the last count to the metrics."""
        counts = self._report.counts()
        self._metrics.add_progress({k: v - self._counted.get(k, 0) for k, v in counts.items()})
        self._counted = counts


def _load_item(
    item: store.jobs.JobItem,
    formats: tuple[JsonlFields, ParquetColumns],
    limits: DocumentLimits,
) -> Iterator[LoadResult]:
    if item.kind == "text":
        text = item.body.decode("utf-8", errors="replace")
        loaded = load_text(item.name, text, title=item.title, metadata=item.metadata, limits=limits)
        yield from with_readers([loaded], item.readers)
    else:
        fields, columns = formats
        results = load_bytes(
            item.name,
            item.body,
            jsonl_fields=fields,
            parquet_columns=columns,
            metadata=item.metadata,
            limits=limits,
        )
        yield from with_readers(results, item.readers)


def _formats(job: store.jobs.ClaimedJob) -> tuple[JsonlFields, ParquetColumns]:
    """The JSONL keys and Parquet columns the upload named (the API checked them)."""
    fields, columns = job.params.get("jsonl_fields"), job.params.get("parquet_columns")
    try:
        return (
            JsonlFields.parse(str(fields)) if fields else JsonlFields(),
            ParquetColumns.parse(str(columns)) if columns else ParquetColumns(),
        )
    except ValueError as exc:
        raise JobFailure(str(exc)) from exc


def _failure_message(job_id: uuid.UUID, exc: Exception) -> str:
    """What the job's owner reads: our own errors say what happened, others only what failed."""
    if isinstance(exc, RagServiceError):
        log.warning("job %s failed: %s", job_id, exc)
        return str(exc)
    log.error("job %s failed", job_id, exc_info=exc)
    if isinstance(exc, SQLAlchemyError):
        return "a database error stopped the job; the worker's log has the details"
    return "an internal error stopped the job; the worker's log has the details"


def _database_gone(exc: BaseException) -> bool:
    """Whether `exc` says the connection to PostgreSQL was lost or refused, not that a
    statement failed (a statement timeout is an OperationalError too, and fails the job)."""
    if isinstance(exc, DBAPIError):
        exc = exc.orig if exc.orig is not None else exc
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate or ""  # none: the client lost or could not open the connection
    return not state or state.startswith("08") or state in _SERVER_GONE_STATES


def _default_name() -> str:
    # The random part keeps two workers of one process (tests, a server with a CLI worker) apart.
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def run_until_signalled(worker: JobWorker, *, grace_seconds: float) -> None:
    """Run `worker` until SIGINT or SIGTERM, then stop it within `grace_seconds` (the
    `ragservice worker` command: a part of RAGSERVICE_SHUTDOWN_GRACE_SECONDS).

    The usual handlers are back while the worker stops: a second Ctrl-C ends the process at
    once, and the job it was running is taken over as soon as its claim's connection is gone.
    """
    received: list[int] = []
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        worker.request_stop()  # running jobs start stopping now, not at the next second
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        worker.start()
        while not stop.wait(1.0):
            pass
        log.info("%s received: stopping", signal.Signals(received[0]).name)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        worker.stop(grace_seconds)
