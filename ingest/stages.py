"""The ingest pipeline's threads: preparation runs ahead of the model, writes run behind it.

`Prefetch` runs the preparation (loading, classifying, tokenizing, chunking) on a thread of its
own, a few batches ahead, while the calling thread embeds; `BatchWriter` commits each embedded
batch on a third thread while the next one is embedded. Both hand failures to the calling
thread, which re-raises them, and both stop cleanly when it stops (Ctrl-C, a job cancelled).
"""

from __future__ import annotations

import contextlib
import contextvars
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, Literal, TypeVar

from ingest.report import IngestReport, ProgressCallback
from ragservice import store
from ragservice.db import Database, tenancy

T = TypeVar("T")

_POLL_SECONDS = 0.2  # how often a blocked hand-over looks whether the other side stopped


class Prefetch(Generic[T]):
    """Iterates `source` on a thread of its own, at most `depth` items ahead of the consumer.

    The thread runs in a copy of the creating thread's context (its tenant scope included).
    An exception in `source` is raised from the consumer's `next`; `close` stops the thread
    at its next hand-over and closes `source` there.
    """

    def __init__(self, source: Iterator[T], *, depth: int, name: str) -> None:
        self._items: queue.Queue[tuple[Literal["item", "end", "error"], object]] = queue.Queue(
            maxsize=depth
        )
        self._stop = threading.Event()
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._produce, source), name=name, daemon=True
        )
        self._thread.start()

    def __iter__(self) -> Iterator[T]:
        while True:
            kind, value = self._take()
            if kind == "end":
                return
            if kind == "error":
                assert isinstance(value, BaseException)
                raise value
            yield value  # type: ignore[misc]  # an item of `source`

    def __enter__(self) -> Prefetch[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self, timeout: float = 2.0) -> None:
        """Stop the thread and wait for it a moment. It stops at its next hand-over; a source
        blocked on its input (a pipe that stays open, a file being parsed) is not waited for:
        the thread is a daemon, touches nothing of the caller's, and ends once it gets on."""
        self._stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                self._items.get_nowait()
        self._thread.join(timeout)

    def _take(self) -> tuple[Literal["item", "end", "error"], object]:
        # A timed wait, so that Ctrl-C reaches a consumer waiting here.
        while True:
            with contextlib.suppress(queue.Empty):
                return self._items.get(timeout=_POLL_SECONDS)

    def _produce(self, source: Iterator[T]) -> None:
        try:
            for item in source:
                if not self._put(("item", item)):
                    return
            self._put(("end", None))
        except BaseException as exc:  # handed to the consumer, which raises it
            self._put(("error", exc))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def _put(self, entry: tuple[Literal["item", "end", "error"], object]) -> bool:
        while not self._stop.is_set():
            try:
                self._items.put(entry, timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False


class BatchWriter:
    """Commits batches on threads of their own, one transaction each, at most one batch behind
    the writers busy. With `writers` > 1, as many batches are written at once, each on a
    connection of its own (a large load: its batches append their postings blocks without
    taking turns, and the model's HNSW index takes concurrent inserts); they may commit in any
    order, and are accounted for in the order they were submitted. A crash or Ctrl-C leaves
    whole batches only (with several writers not necessarily a prefix of them: a rerun skips
    what is stored, by content hash)."""

    def __init__(
        self,
        db: Database,
        tenant_id: uuid.UUID,
        collection_id: uuid.UUID | None,
        model_id: int,
        writes_as: frozenset[str] | None = None,
        *,
        writers: int = 1,
    ) -> None:
        assert collection_id is not None and writers >= 1
        self._writes_as = writes_as
        self._db = db
        self._tenant_id = tenant_id
        self._collection_id = collection_id
        self._model_id = model_id
        self._inbox: queue.Queue[tuple[int, list[store.documents.DocumentWrite]] | None] = (
            queue.Queue(maxsize=1)
        )
        self._results: queue.Queue[_Written] = queue.Queue()
        self._submitted = 0
        self._done: dict[int, _Written] = {}  # committed, waiting for earlier batches
        self._accounted = 0
        self._busy = _BusyClock()
        self._busy_accounted = 0.0
        self._error: BaseException | None = None
        self._failed = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, name=f"ingest-writer-{i}", daemon=True)
            for i in range(writers)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        with tenancy.as_tenant(self._tenant_id):  # the batches' rows are all this tenant's
            self._loop()

    def submit(self, writes: list[store.documents.DocumentWrite] | None) -> None:
        """Queue a batch (None: no more), waiting while the writers are all busy and one
        batch waits already."""
        if writes is None:
            for _ in self._threads:
                self._put(None)
            return
        self._put((self._submitted, writes))
        self._submitted += 1

    def _put(self, entry: tuple[int, list[store.documents.DocumentWrite]] | None) -> None:
        while True:
            self._raise_if_failed()
            try:
                self._inbox.put(entry, timeout=0.2)
                return
            except queue.Full:
                continue

    def collect(self, report: IngestReport, progress: ProgressCallback) -> None:
        """Account for the batches committed so far, in the order they were submitted;
        re-raise a writer failure here."""
        self._take_results()
        while self._accounted in self._done:
            _account(self._done.pop(self._accounted), report, progress)
            self._accounted += 1
        self._account_busy(report)
        self._raise_if_failed()

    def close(self, report: IngestReport, progress: ProgressCallback) -> None:
        """Wait for every submitted batch to commit."""
        self.submit(None)
        for thread in self._threads:
            thread.join()
        self.collect(report, progress)

    def abort(self, report: IngestReport) -> None:
        """Stop after the batches in flight (each still commits whole, or not at all), and
        count what did commit."""
        with contextlib.suppress(queue.Empty):
            while True:
                self._inbox.get_nowait()
        for _ in self._threads:
            with contextlib.suppress(queue.Full):
                self._inbox.put_nowait(None)
        deadline = time.monotonic() + 60
        for thread in self._threads:
            thread.join(timeout=max(deadline - time.monotonic(), 0.0))
        self._take_results()
        for index in sorted(self._done):
            _account(self._done.pop(index), report, lambda _docs, _chunks: None)
        self._account_busy(report)

    def _account_busy(self, report: IngestReport) -> None:
        busy = self._busy.seconds()
        report.write_busy_seconds += busy - self._busy_accounted
        self._busy_accounted = busy

    def _take_results(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                written = self._results.get_nowait()
                self._done[written.index] = written

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _loop(self) -> None:
        while (entry := self._inbox.get()) is not None and not self._failed.is_set():
            index, writes = entry
            started = time.perf_counter()
            self._busy.start()
            try:
                with self._db.write() as session:
                    result = store.documents.write_documents(
                        session,
                        tenant_id=self._tenant_id,
                        collection_id=self._collection_id,
                        model_id=self._model_id,
                        documents=writes,
                        writes_as=self._writes_as,
                    )
            except BaseException as exc:  # handed to the main thread, which re-raises it
                if self._error is None:
                    self._error = exc
                self._failed.set()
                return
            finally:
                self._busy.stop()
            self._results.put(_Written(index, result, time.perf_counter() - started))


@dataclass(frozen=True, slots=True)
class _Written:
    """A committed batch: its place in the order of submission, what it wrote, its seconds."""

    index: int
    result: store.documents.BatchWriteResult
    seconds: float


class _BusyClock:
    """Wall-clock seconds during which at least one writer is in a transaction."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._since = 0.0
        self._total = 0.0

    def start(self) -> None:
        with self._lock:
            if self._running == 0:
                self._since = time.perf_counter()
            self._running += 1

    def stop(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0:
                self._total += time.perf_counter() - self._since

    def seconds(self) -> float:
        with self._lock:
            running = time.perf_counter() - self._since if self._running else 0.0
            return self._total + running


def _account(written: _Written, report: IngestReport, progress: ProgressCallback) -> None:
    result = written.result
    report.write_seconds += written.seconds
    for doc in result.written:
        (report.new if doc.version == 1 else report.updated).append(doc.external_id)
    report.unchanged.extend(result.unchanged)
    report.chunks_written += result.chunks
    progress(len(result.written) + len(result.unchanged), result.chunks)
