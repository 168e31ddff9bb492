"""One run of a source: what its reader found, brought into the collection.

The reader says, for each document it finds, whether it is new or changed (with its bytes),
unchanged, or failed, and which files it skips (a type no loader reads; `ingest.sources.base`).
Changed documents go through the ingest pipeline in batches; nothing is written for unchanged
ones (their state's `seen_at` moves on); a failed one keeps its stored document. A skipped file
is counted and listed, as are the attachments the loaders skip; it is no document, so one the
collection held is removed as gone. After a scan that completed, the documents the source knew and
did not find are deleted (when the source prunes). A run that fails as a whole (`SourceError`)
or stops halfway deletes nothing.

What a source knew of a document (its `ItemState`) is saved only once the document's write
has committed, batch by batch: a run that dies halfway leaves no state ahead of the store,
and the next run fetches what the last one did not finish (the pipeline then skips what is
stored already, by content hash).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from ingest.loaders import DocumentLimits, LoadResult
from ingest.loaders.loading import load_fetched
from ingest.loaders.readers import with_readers
from ingest.pipeline import IngestPipeline, IngestReport, pack_postings
from ingest.sources.base import (
    Changed,
    Failed,
    ItemState,
    Skipped,
    SourceError,
    SourceReader,
    Unchanged,
)
from ingest.sources.deadline import RunYielded
from ingest.targets import ingest_pipeline
from ragservice import store
from ragservice.db import tenancy
from ragservice.runtime import Runtime
from ragservice.types import LoadedDocument, LoadFailure

log = logging.getLogger(__name__)

BATCH_DOCUMENTS = 64
"""Changed documents handed to the pipeline at a time (their states are saved after each)."""
BATCH_BYTES = 16 * 2**20
"""Fetched bytes held before they go to the pipeline, whatever the documents' count."""
MAX_ERRORS = 1000
"""Per-document errors (and skipped files) kept in a report; `failed` (`skipped`) still counts
them all."""


@dataclass
class SyncReport:
    """What a run did. `found`: documents the scan found; `added`, `changed`, `unchanged`,
    `failed`: of those; `removed`: documents deleted because the source no longer has them;
    `requests` and `not_modified`: what the reader asked its source and how many answers said
    nothing changed (where it counts them). `errors`: (key, reason) per failed document.
    `skipped`: files not read on purpose (a type no loader reads, the source's files or an
    attachment), `skips` their (key, reason). `complete`: the scan went through the whole
    source (only then is anything removed). `failure`: why the source as a whole could not
    be read (the run failed)."""

    found: int = 0
    added: int = 0
    changed: int = 0
    unchanged: int = 0
    removed: int = 0
    failed: int = 0
    requests: int = 0
    not_modified: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)
    skipped: int = 0
    skips: list[tuple[str, str]] = field(default_factory=list)
    complete: bool = False
    failure: str | None = None
    yielded: str | None = None
    """Why the run stopped early, done for now (its turn was over while another tenant's job
    waited: `deadline.RunYielded`); its next run goes on from there."""
    restricted: bool = False
    """A document it wrote has readers (its job is then shown to fewer askers)."""

    def counts(self) -> dict[str, int]:
        return {
            "found": self.found,
            "added": self.added,
            "changed": self.changed,
            "unchanged": self.unchanged,
            "removed": self.removed,
            "failed": self.failed,
            "skipped": self.skipped,
            "requests": self.requests,
            "not_modified": self.not_modified,
            "yielded": int(self.yielded is not None),
        }

    def job_errors(self) -> list[dict[str, str]]:
        """The errors as a job stores them: the run's own first, then one per document."""
        errors = [{"error": self.failure}] if self.failure else []
        errors += [{"source": key, "error": reason} for key, reason in self.errors]
        if self.failed > len(self.errors):
            errors.append({"error": f"{self.failed - len(self.errors)} more failures not listed"})
        return errors

    def fail(self, key: str, reason: str) -> None:
        self.failed += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append((key, reason))

    def skip(self, key: str, reason: str) -> None:
        self.skipped += 1
        if len(self.skips) < MAX_ERRORS:
            self.skips.append((key, reason))


SyncProgress = Callable[[SyncReport], None]
"""Called as a run goes on (after each document, and as batches are written); it may raise to
stop the run (a worker stopping), which then deletes nothing."""


@dataclass(frozen=True, slots=True)
class SyncTarget:
    """The source a run syncs, and where to."""

    source_id: uuid.UUID
    tenant_id: uuid.UUID
    collection_id: uuid.UUID
    collection: str
    readers: tuple[str, ...] | None = None
    prune: bool = True
    writes_as: frozenset[str] | None = None
    """Whose documents its runs may replace or delete: its adder's principal set (None: all)."""


def sync_source(
    runtime: Runtime,
    target: SyncTarget,
    reader: SourceReader,
    *,
    progress: SyncProgress | None = None,
    report: SyncReport | None = None,
    ingest: IngestReport | None = None,
    pipeline: IngestPipeline | None = None,
) -> SyncReport:
    """Run `reader` over its source and bring the collection in line (see the module's
    docstring). `report` and `ingest` (the pipeline's counts, for metrics) are filled as it
    goes, so that a caller sees them after an interruption too. `pipeline`: write with this
    one (default: the serving model's)."""
    run = _Run(runtime, target, progress, report or SyncReport(), ingest or IngestReport())
    with tenancy.as_tenant(target.tenant_id):
        run.sync(reader, pipeline or ingest_pipeline(runtime, tenant_id=target.tenant_id))
    return run.report


class _Run:
    def __init__(
        self,
        runtime: Runtime,
        target: SyncTarget,
        progress: SyncProgress | None,
        report: SyncReport,
        ingest: IngestReport,
    ) -> None:
        self._runtime = runtime
        self._target = target
        self._progress = progress or (lambda _report: None)
        self.report = report
        self._ingest = ingest
        self._limits = DocumentLimits.from_settings(runtime.settings.ingest)
        self._unchanged: dict[str, ItemState] = {}
        self._not_modified = 0

    def sync(self, reader: SourceReader, pipeline: IngestPipeline) -> None:
        known = self._known()
        found: set[str] = set()
        try:
            self._scan(reader, pipeline, known, found)
        except RunYielded as exc:
            self.report.yielded = str(exc)
            log.info("source %s: %s", self._target.source_id, self.report.yielded)
        except SourceError as exc:
            self.report.failure = str(exc) or type(exc).__name__
            log.warning("source %s: %s", self._target.source_id, self.report.failure)
        self._reader_counts(reader)
        self.report.complete = (
            self.report.failure is None
            and self.report.yielded is None
            and bool(getattr(reader, "complete", True))
        )
        self._save({})
        if self._target.prune:
            self._remove_gone(set(known) - found, found)
        if self._ingest.chunks_written >= store.postings.APPEND_MIN_CHUNKS:
            pack_postings(self._runtime.db, self._target.collection_id, self._ingest)
        self._progress(self.report)

    def _known(self) -> dict[str, ItemState]:
        with self._runtime.db.read() as session:
            states = store.sources.item_states(session, self._target.source_id)
        return {key: ItemState.from_json(state) for key, state in states.items()}

    def _scan(
        self,
        reader: SourceReader,
        pipeline: IngestPipeline,
        known: dict[str, ItemState],
        found: set[str],
    ) -> None:
        batch: list[Changed] = []
        size = 0
        try:
            for event in reader.scan(known):
                if isinstance(event, Skipped):
                    self.report.skip(event.key, event.reason)
                    self._progress(self.report)
                    continue  # no document: its key is not found, so a stored one goes
                if event.key in found:
                    continue  # a reader yields each key once; one that does not is not trusted
                found.add(event.key)
                self.report.found += 1
                if isinstance(event, Changed):
                    batch.append(event)
                    size += len(event.data)
                    if len(batch) >= BATCH_DOCUMENTS or size >= BATCH_BYTES:
                        self._write(pipeline, batch)
                        batch, size = [], 0
                elif isinstance(event, Unchanged):
                    self.report.unchanged += 1
                    self._not_modified += 1
                    self._unchanged[event.key] = event.state
                elif isinstance(event, Failed):
                    self.report.fail(event.key, event.reason)
                self._progress(self.report)
        except SourceError:
            self._write(pipeline, batch)  # what was fetched before the source failed is good
            raise
        self._write(pipeline, batch)

    def _write(self, pipeline: IngestPipeline, batch: list[Changed]) -> None:
        """Ingest a batch of changed documents, then save the states of those written (or
        found unchanged by content) with the unchanged ones seen since the last batch."""
        if not batch:
            return
        keys = {change.key for change in batch}
        produced: dict[str, str] = {}  # external id → the key of the document it came from
        # Parsed here, not on the pipeline's preparation thread (a new one per batch): the
        # parsing sandbox is a process per thread, started once and kept (a worker's thread
        # keeps its own across jobs), so a batch does not pay for starting one.
        loaded = list(self._loaded(batch, produced))
        ingested = pipeline.run(
            loaded,
            collection=self._target.collection,
            on_progress=lambda _docs, _chunks: self._progress(self.report),
            pack=False,
            writes_as=self._target.writes_as,
        )
        self._ingest.add(ingested)
        self._ingest.seconds += ingested.seconds  # one after another: they add up
        self.report.restricted = self.report.restricted or ingested.restricted
        for skipped in ingested.skipped:
            self.report.skip(skipped.source, skipped.reason)
        failed = self._failures(ingested.failed, keys, produced)
        new, updated = set(ingested.new), set(ingested.updated)
        saved: dict[str, ItemState] = {}
        rows: dict[str, set[str]] = {}
        for change in batch:
            if change.key in failed:
                continue  # its state stays as it was: the next run tries it again
            ids = {i for i, key in produced.items() if key == change.key}
            if ids & new:
                self.report.added += 1
            elif ids & updated:
                self.report.changed += 1
            else:
                self.report.unchanged += 1
            saved[change.key] = change.state
            if ids != {change.key} or ids & updated:
                rows[change.key] = (
                    ids  # what a changed file holds no longer goes (rows, attachments)
                )
        self._save(saved, rows)

    def _loaded(self, batch: list[Changed], produced: dict[str, str]) -> Iterator[LoadResult]:
        for change in batch:
            results = load_fetched(
                change.key,
                change.name,
                change.data,
                metadata={"origin": change.origin},
                limits=self._limits,
            )
            readers = _readers(change.readers, self._target.readers)
            for result in with_readers(results, readers):
                if isinstance(result, LoadedDocument):
                    produced[result.external_id] = change.key
                yield result

    def _failures(
        self, failures: list[LoadFailure], keys: set[str], produced: dict[str, str]
    ) -> set[str]:
        """Count the batch's failures per document of the source (the rows of a file are one)
        and return the keys that failed."""
        reasons: dict[str, str] = {}
        for failure in failures:
            key = _key_of(failure.source, keys, produced)
            reasons.setdefault(key, failure.reason)
        for key, reason in reasons.items():
            self.report.fail(key, reason)
        return set(reasons)

    def _save(self, states: dict[str, ItemState], rows: dict[str, set[str]] | None = None) -> None:
        """Record `states` (written) and the unchanged ones seen so far in one transaction,
        deleting the rows a changed file holds no longer (when the source prunes)."""
        states = {**self._unchanged, **states}
        self._unchanged = {}
        if not states:
            return
        target = self._target
        with self._deleting(), self._runtime.db.write() as session:
            store.sources.save_items(
                session,
                tenant_id=target.tenant_id,
                source_id=target.source_id,
                states={key: state.as_json() for key, state in states.items()},
            )
            for key, ids in (rows or {}).items() if target.prune else ():
                store.sources.delete_stale_rows(session, target.collection_id, key, ids)

    def _remove_gone(self, gone: set[str], found: set[str]) -> None:
        """Delete the documents of `gone`, after a complete scan only; a scan that found
        nothing at all deletes nothing either (an emptied source looks like a broken one)."""
        if not gone or not self.report.complete:
            return
        if not found:
            log.warning(
                "source %s: its scan found no documents; the %d it had are kept",
                self._target.source_id,
                len(gone),
            )
            return
        with self._deleting(), self._runtime.db.write() as session:
            store.sources.delete_source_documents(session, self._target.collection_id, gone)
            store.sources.delete_items(session, self._target.source_id, gone)
        self.report.removed += len(gone)

    def _deleting(self) -> AbstractContextManager[None]:
        """Transactions that delete the source's documents see only those its adder may read
        (row-level security): a run never deletes a document hidden from who added it."""
        return tenancy.as_tenant(self._target.tenant_id, readers=self._target.writes_as)

    def _reader_counts(self, reader: SourceReader) -> None:
        """The requests and `304 Not Modified` answers the reader counts (its `stats`), if it
        does; else every document it found unchanged counts as not modified."""
        stats = getattr(reader, "stats", None)
        self.report.requests = int(getattr(stats, "requests", 0) or 0)
        not_modified = getattr(stats, "not_modified", None)
        self.report.not_modified = self._not_modified if not_modified is None else int(not_modified)


def _readers(own: tuple[str, ...] | None, source: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """Who may read a fetched document (after its own rows' readers): what the source says of
    it (a sidecar), else the source's readers; `()` from the source (a sidecar gone) with no
    source readers opens it to the whole tenant."""
    if own:
        return own
    return source if source is not None else own


def _key_of(source: str, keys: set[str], produced: dict[str, str]) -> str:
    """The source's key a failure is about: the key itself, a row's document (by its
    external id), or a row's line (`key:line`)."""
    if source in keys:
        return source
    if source in produced:
        return produced[source]
    head = source.rpartition(":")[0]
    return head if head in keys else source
