"""`ingest.stages.BatchWriter` with several writers: batches written at once, accounted for in
the order they were submitted, a failure raised on the calling thread."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from ingest.report import IngestReport
from ingest.stages import BatchWriter
from ragservice import store
from ragservice.store.documents import BatchWriteResult, DocumentWrite, WrittenDocument


class _Db:
    """Stands in for `Database`: `write()` yields a session nobody reads."""

    @contextmanager
    def write(self) -> Iterator[object]:
        yield object()


def _batch(name: str) -> list[DocumentWrite]:
    """A batch whose one document's external id is `name` (nothing else of it is read)."""
    write = DocumentWrite.__new__(DocumentWrite)
    object.__setattr__(write, "external_id", name)
    return [write]


def _writer(writers: int) -> BatchWriter:
    return BatchWriter(_Db(), uuid.uuid4(), uuid.uuid4(), 1, writers=writers)  # type: ignore[arg-type]


def _written(documents: Sequence[DocumentWrite]) -> BatchWriteResult:
    ids = [WrittenDocument(uuid.uuid4(), d.external_id, 1) for d in documents]
    return BatchWriteResult(written=ids, chunks=len(ids))


def test_batches_in_flight_at_once_are_accounted_in_submission_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    both_started = threading.Barrier(2, timeout=10)

    def write(session: Any, *, documents: Sequence[DocumentWrite], **_: Any) -> BatchWriteResult:
        name = documents[0].external_id
        if name in ("a", "b"):
            both_started.wait()  # the two first batches are written at the same time
        if name == "a":
            time.sleep(0.2)  # ... and the first one commits last
        return _written(documents)

    monkeypatch.setattr(store.documents, "write_documents", write)
    writer, report, progress = _writer(2), IngestReport(), []
    for name in ("a", "b", "c", "d"):
        writer.submit(_batch(name))
    writer.close(report, lambda docs, chunks: progress.append((docs, chunks)))
    assert report.new == ["a", "b", "c", "d"]
    assert report.chunks_written == 4 and progress == [(1, 1)] * 4
    assert 0 < report.write_busy_seconds <= report.write_seconds


def test_a_failed_batch_is_raised_and_the_committed_ones_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def write(session: Any, *, documents: Sequence[DocumentWrite], **_: Any) -> BatchWriteResult:
        if documents[0].external_id == "b":
            raise RuntimeError("disk full")
        return _written(documents)

    monkeypatch.setattr(store.documents, "write_documents", write)
    writer, report = _writer(2), IngestReport()
    with pytest.raises(RuntimeError, match="disk full"):
        for name in ("a", "b", "c", "d", "e", "f"):
            writer.submit(_batch(name))
            time.sleep(0.05)
        writer.close(report, lambda _docs, _chunks: None)
    writer.abort(report)
    assert "a" in report.new and "b" not in report.new
    assert not any(
        t.name.startswith("ingest-writer") and t.is_alive() for t in threading.enumerate()
    )
