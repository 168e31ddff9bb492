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
    """Commits batches on a thread of its own, one transaction each, at most one batch behind."""

    def __init__(
        self,
        db: Database,
        tenant_id: uuid.UUID,
        collection_id: uuid.UUID | None,
        model_id: int,
        writes_as: frozenset[str] | None = None,
    ) -> None:
        assert collection_id is not None
        self._writes_as = writes_as
        self._db = db
        self._tenant_id = tenant_id
        self._collection_id = collection_id
        self._model_id = model_id
        self._inbox: queue.Queue[list[store.documents.DocumentWrite] | None] = queue.Queue(
            maxsize=1
        )
        self._results: queue.Queue[tuple[store.documents.BatchWriteResult, float]] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with tenancy.as_tenant(self._tenant_id):  # the batches' rows are all this tenant's
            self._loop()

    def submit(self, writes: list[store.documents.DocumentWrite] | None) -> None:
        """Queue a batch (None: no more), waiting while the previous one is still in flight."""
        while True:
            self._raise_if_failed()
            try:
                self._inbox.put(writes, timeout=0.2)
                return
            except queue.Full:
                continue

    def collect(self, report: IngestReport, progress: ProgressCallback) -> None:
        """Account for the batches committed so far; re-raise a writer failure here."""
        while not self._results.empty():
            _account(*self._results.get_nowait(), report, progress)
        self._raise_if_failed()

    def close(self, report: IngestReport, progress: ProgressCallback) -> None:
        """Wait for every submitted batch to commit."""
        self.submit(None)
        self._thread.join()
        self.collect(report, progress)

    def abort(self, report: IngestReport) -> None:
        """Stop after the batch in flight (it still commits whole, or not at all), and count
        what did commit."""
        with contextlib.suppress(queue.Empty):
            self._inbox.get_nowait()
        with contextlib.suppress(queue.Full):
            self._inbox.put_nowait(None)
        self._thread.join(timeout=60)
        while not self._results.empty():
            _account(*self._results.get_nowait(), report, lambda _docs, _chunks: None)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _loop(self) -> None:
        while (writes := self._inbox.get()) is not None:
            started = time.perf_counter()
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
                self._error = exc
                return
            self._results.put((result, time.perf_counter() - started))


def _account(
    result: store.documents.BatchWriteResult,
    seconds: float,
    report: IngestReport,
    progress: ProgressCallback,
) -> None:
    report.write_seconds += seconds
    for doc in result.written:
        (report.new if doc.version == 1 else report.updated).append(doc.external_id)
    report.unchanged.extend(result.unchanged)
    report.chunks_written += result.chunks
    progress(len(result.written) + len(result.unchanged), result.chunks)
