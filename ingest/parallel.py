"""One ingest run spread over several worker processes: `ragservice ingest --workers N`.

Chunking, the injection scan and hashing are Python work that holds the GIL, so more cores
need more processes. The parent loads the documents, turns away duplicate external ids and
unreadable inputs itself (as the pipeline does) and counts the files skipped, and hands the
rest out in groups through a bounded queue, so the corpus is never held in memory whole. Each
worker opens its own runtime on the same database (as a client of the parent's embedded
server, if that is what runs), builds the usual pipeline for the same model version and
collection, and runs it over the groups it takes. The workers send their progress and, at the
end, their reports; the parent merges them into one `IngestReport` and prunes (once, after
every worker has finished, when nothing failed).

Every batch a worker writes is one transaction, as in a single-process run. On Ctrl-C (SIGINT
reaches the whole process group) each worker stops after its batch in flight commits and still
reports what it committed. A worker that fails stops the others the same way and fails the run.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.queues
import os
import queue
import signal
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

from pydantic import SecretStr

from ingest.pipeline import IngestReport, ProgressCallback, pack_postings
from ingest.targets import ingest_pipeline
from ragservice import store
from ragservice.config import EmbeddingSettings, Settings
from ragservice.db import tenancy
from ragservice.embedding.embedder import Embedder, available_cpus
from ragservice.errors import NotFoundError, RagServiceError
from ragservice.runtime import Runtime, open_runtime
from ragservice.types import LoadedDocument, LoadFailure, LoadResult, SkippedFile

log = logging.getLogger(__name__)

EmbedderFactory = Callable[[EmbeddingSettings], Embedder]
"""Builds a worker's embedder from its embedding settings (`null_embedder`, say); a
module-level function (it is pickled)."""

GROUP_SIZE = 64
"""Documents per hand-out to a worker."""

_PROGRESS_SECONDS = 0.2  # a worker sends its progress at most this often
_POLL_SECONDS = 0.1


class IngestWorkerError(RagServiceError):
    """A worker process of a parallel ingest failed; the run stops."""


@dataclass(frozen=True)
class WorkerTask:
    """What each worker process needs to know (pickled to it)."""

    settings: Settings
    model_id: int
    tenant_id: uuid.UUID
    collection: str
    threads: int
    embedder_factory: EmbedderFactory | None = None
    group_size: int = GROUP_SIZE


def max_workers() -> int:
    """The most worker processes worth starting: one per CPU this process may use."""
    return available_cpus()


def worker_settings(runtime: Runtime) -> Settings:
    """The parent's settings pointed at the database it actually uses, so that a worker joins
    that server as a client instead of starting (or stopping) an embedded one."""
    return runtime.settings.model_copy(
        update={
            "database_url": SecretStr(runtime.db.url),
            "owner_database_url": SecretStr(runtime.db.owner_url),
        }
    )


def run_parallel(
    runtime: Runtime,
    items: Iterable[LoadResult],
    *,
    workers: int,
    model_id: int,
    tenant_id: uuid.UUID,
    collection: str,
    prune: bool = False,
    on_progress: ProgressCallback | None = None,
    report: IngestReport | None = None,
    embedder_factory: EmbedderFactory | None = None,
    group_size: int = GROUP_SIZE,
) -> IngestReport:
    """Ingest `items` into `collection` with `workers` processes, writing vectors for
    `model_id`; the same rows as `IngestPipeline.run` (not for dry runs: use that).

    `embedder_factory` None: each worker loads the model version the way a CLI ingest does.
    Pass `report` to keep the counts of what committed if Ctrl-C stops the run (the
    KeyboardInterrupt is raised again once every worker has reported)."""
    if workers < 1:
        raise ValueError("workers must be at least 1")
    started = time.perf_counter()
    report = report or IngestReport()
    progress = on_progress or (lambda _docs, _chunks: None)
    with tenancy.as_tenant(tenant_id), runtime.db.write() as session:
        collection_id = store.collections.ensure_collection(session, tenant_id, collection)
    task = WorkerTask(
        worker_settings(runtime),
        model_id,
        tenant_id,
        collection,
        max(1, available_cpus() // workers),
        embedder_factory,
        group_size,
    )
    seen: set[str] = set()
    try:
        with _Pool(task, workers) as pool:
            error: BaseException | None = None
            try:
                pool.feed(_groups(_documents(items, seen, report, progress), group_size), progress)
            except _WorkerFailed:
                pass  # `finish` says which worker failed, and how
            except BaseException as exc:  # Ctrl-C, or the documents could not be read on
                pool.stop(interrupted=isinstance(exc, KeyboardInterrupt))
                error = exc
            pool.finish(report, progress)
            if error is not None:
                raise error
        if report.chunks_written >= store.postings.APPEND_MIN_CHUNKS:
            with tenancy.as_tenant(tenant_id):
                pack_postings(runtime.db, collection_id, report)
        if prune:
            _prune(runtime, tenant_id, collection_id, seen, report)
    finally:
        report.seconds = time.perf_counter() - started
    return report


def _documents(
    items: Iterable[LoadResult],
    seen: set[str],
    report: IngestReport,
    progress: ProgressCallback,
) -> Iterator[LoadedDocument]:
    """The documents to hand out; failures and repeated external ids are failed here, and
    skipped files counted here."""
    for item in items:
        if isinstance(item, LoadFailure):
            report.failed.append(item)
            progress(1, 0)
        elif isinstance(item, SkippedFile):
            report.skipped.append(item)
            progress(1, 0)
        elif item.external_id in seen:
            reason = f"duplicate external id {item.external_id!r} in this ingest"
            report.failed.append(LoadFailure(source=item.source or item.external_id, reason=reason))
            progress(1, 0)
        else:
            seen.add(item.external_id)
            yield item


def _groups(docs: Iterator[LoadedDocument], size: int) -> Iterator[list[LoadedDocument]]:
    group: list[LoadedDocument] = []
    for doc in docs:
        group.append(doc)
        if len(group) >= size:
            yield group
            group = []
    if group:
        yield group


def _prune(
    runtime: Runtime,
    tenant_id: uuid.UUID,
    collection_id: uuid.UUID,
    seen: set[str],
    report: IngestReport,
) -> None:
    if report.failed:
        log.warning(
            "not pruning: %d inputs failed, their documents would be lost", len(report.failed)
        )
        return
    with tenancy.as_tenant(tenant_id), runtime.db.write() as session:
        report.deleted = store.documents.delete_documents_except(session, collection_id, seen)


# -- the parent's side ------------------------------------------------------------------------

# Messages from the workers: ("progress", docs, chunks), ("done", index, report),
# ("failed", index, description).
_Message = tuple[Any, ...]


class _Pool:
    """The worker processes, their shared inbox of document groups and their outbox."""

    def __init__(self, task: WorkerTask, workers: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._inbox: multiprocessing.queues.Queue[list[LoadedDocument] | None] = context.Queue(
            maxsize=2 * workers
        )
        self._outbox: multiprocessing.queues.Queue[_Message] = context.Queue()
        self._processes = [
            context.Process(
                target=_worker_main,
                args=(task, index, self._inbox, self._outbox),
                name=f"ingest-worker-{index}",
                daemon=True,
            )
            for index in range(workers)
        ]
        self._reports: dict[int, IngestReport] = {}
        self._failures: dict[int, str] = {}
        self._interrupted = False

    def __enter__(self) -> _Pool:
        for process in self._processes:
            process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for process in self._processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
        self._inbox.cancel_join_thread()  # groups no worker took are dropped, not waited on
        self._inbox.close()
        self._outbox.close()

    def feed(self, groups: Iterator[list[LoadedDocument]], progress: ProgressCallback) -> None:
        """Hand out the groups, then one end mark per worker; waits while the inbox is full.
        Raises `_WorkerFailed` as soon as a worker failed (the others are told to stop)."""
        for group in groups:
            self._put(group, progress)
        for _ in self._processes:
            self._put(None, progress)

    def stop(self, *, interrupted: bool) -> None:
        """Ask every worker still running to stop after its batch in flight (a second SIGINT
        to a worker that already got the user's is ignored there)."""
        self._interrupted = self._interrupted or interrupted
        for index, process in enumerate(self._processes):
            if index not in self._reports and process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGINT)

    def finish(self, report: IngestReport, progress: ProgressCallback) -> None:
        """Wait for every worker's report and merge them into `report`. After Ctrl-C (here or
        before) the workers stop after their batch in flight; what they committed is merged
        before KeyboardInterrupt goes on."""
        while True:
            try:
                self._wait_all(progress)
                break
            except KeyboardInterrupt:
                self.stop(interrupted=True)
        for part in self._reports.values():
            report.add(part)
        if self._interrupted:
            raise KeyboardInterrupt
        if self._failures:
            raise IngestWorkerError("; ".join(self._failures.values()))

    def _put(self, group: list[LoadedDocument] | None, progress: ProgressCallback) -> None:
        while True:
            self._read_messages(progress, wait=False)
            if self._failures:
                self.stop(interrupted=False)
                raise _WorkerFailed
            try:
                self._inbox.put(group, timeout=_POLL_SECONDS)
                return
            except queue.Full:
                self._check_alive()

    def _wait_all(self, progress: ProgressCallback) -> None:
        while len(self._reports) + len(self._failures) < len(self._processes):
            self._read_messages(progress, wait=True)
            self._check_alive()
            if self._failures:
                self.stop(interrupted=False)

    def _read_messages(self, progress: ProgressCallback, *, wait: bool) -> None:
        try:
            message = self._outbox.get(timeout=_POLL_SECONDS) if wait else self._outbox.get_nowait()
            while True:
                self._handle(message, progress)
                message = self._outbox.get_nowait()
        except queue.Empty:
            return

    def _handle(self, message: _Message, progress: ProgressCallback) -> None:
        kind = message[0]
        if kind == "progress":
            progress(message[1], message[2])
        elif kind == "done":
            self._reports[message[1]] = message[2]
        else:
            self._failures[message[1]] = f"ingest worker {message[1]} failed: {message[2]}"

    def _check_alive(self) -> None:
        """A worker that died without a word (killed, out of memory) is a failure."""
        for index, process in enumerate(self._processes):
            if process.exitcode is None or index in self._reports or index in self._failures:
                continue
            self._read_messages(lambda _docs, _chunks: None, wait=False)  # its last words
            if index not in self._reports and index not in self._failures:
                status = process.exitcode
                self._failures[index] = f"ingest worker {index} exited with status {status}"


class _WorkerFailed(Exception):
    """A worker failed while documents were being handed out; `finish` reports it."""


# -- the worker's side ------------------------------------------------------------------------


class _FirstSigint:
    """A worker's SIGINT handler: the first stops the run (KeyboardInterrupt), later ones (the
    parent passing the user's Ctrl-C on) are ignored so they cannot break the clean-up."""

    def __init__(self) -> None:
        self.received = False

    def __call__(self, _signum: int, _frame: FrameType | None) -> None:
        if not self.received:
            self.received = True
            raise KeyboardInterrupt


def _worker_main(
    task: WorkerTask,
    index: int,
    inbox: multiprocessing.queues.Queue[list[LoadedDocument] | None],
    outbox: multiprocessing.queues.Queue[_Message],
) -> None:
    sigint = _FirstSigint()
    signal.signal(signal.SIGINT, sigint)
    report = IngestReport()
    try:
        try:
            _limit_threads(task.threads)
            _run_worker(task, inbox, outbox, report)
        finally:
            sigint.received = True  # from here on a SIGINT cuts nothing short
    except KeyboardInterrupt:
        pass
    except BaseException as exc:
        log.debug("ingest worker %d failed", index, exc_info=True)
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        outbox.put(("failed", index, detail))
        return
    outbox.put(("done", index, report))


def _run_worker(
    task: WorkerTask,
    inbox: multiprocessing.queues.Queue[list[LoadedDocument] | None],
    outbox: multiprocessing.queues.Queue[_Message],
    report: IngestReport,
) -> None:
    runtime = open_runtime(task.settings, warm=False)
    try:
        embedder = task.embedder_factory(task.settings.embedding) if task.embedder_factory else None
        with tenancy.as_tenant(task.tenant_id), runtime.db.read() as session:
            model = store.embedding_models.get_model(session, task.model_id)
        if model is None:
            raise NotFoundError(f"no embedding model with id {task.model_id}")
        # Each group is looked up as it arrives: a worker never waits for more groups than
        # the queue holds (an input still being written, such as a pipe, would stall it).
        pipeline = ingest_pipeline(
            runtime,
            tenant_id=task.tenant_id,
            model=model,
            load_other=True,
            embedder=embedder,
            lookup_batch=task.group_size,
        )
        sender = _ProgressSender(outbox)
        try:
            pipeline.run(
                _received(inbox),
                collection=task.collection,
                on_progress=sender,
                report=report,
                pack=False,  # the parent packs once, after every worker
            )
        finally:
            sender.flush()
    finally:
        runtime.close()


def _received(
    inbox: multiprocessing.queues.Queue[list[LoadedDocument] | None],
) -> Iterator[LoadedDocument]:
    while (group := inbox.get()) is not None:
        yield from group


class _ProgressSender:
    """Sums progress increments and sends them to the parent at most every 0.2 s."""

    def __init__(self, outbox: multiprocessing.queues.Queue[_Message]) -> None:
        self._outbox = outbox
        self._docs = self._chunks = 0
        self._sent = time.monotonic()

    def __call__(self, docs: int, chunks: int) -> None:
        self._docs += docs
        self._chunks += chunks
        if time.monotonic() - self._sent >= _PROGRESS_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self._docs or self._chunks:
            self._outbox.put(("progress", self._docs, self._chunks))
        self._docs = self._chunks = 0
        self._sent = time.monotonic()


def _limit_threads(threads: int) -> None:
    """The model's share of the CPUs: each worker gets CPUs / workers threads."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    with contextlib.suppress(ImportError):
        import torch

        torch.set_num_threads(threads)
