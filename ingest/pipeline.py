"""The ingest pipeline: classify → chunk → embed (reusing stored vectors) → write in batches.

The model works on batch N+1 while a writer thread commits batch N, so PostgreSQL never keeps
the model waiting. Each batch is one transaction: a crash or Ctrl-C leaves whole batches only,
and a rerun skips what is already stored (by content hash) and finishes the job.

A document that brings its own chunks and vectors (`LoadedDocument.precomputed`, a bulk
import) skips chunking and embedding: its vectors are checked against the model version's
dimension and written as they are. The model is loaded only when a document needs embedding,
so an import of vectors alone never loads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

import numpy as np

from ragservice import store
from ragservice.chunking import ChunkingOptions, chunk_text
from ragservice.db import Database, tenancy
from ragservice.embedding.embedder import Embedder, Vectors
from ragservice.errors import NotFoundError
from ragservice.safety import injection
from ragservice.types import (
    CHUNK_SEPARATOR,
    LoadedDocument,
    LoadFailure,
    PrecomputedChunks,
    TextChunk,
    Tokenizer,
)

log = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int], None]
"""Called with (documents done, chunks written) increments as the run advances."""

_LOOKUP_BATCH = 256  # documents per round trip when checking stored content hashes


@dataclass
class IngestReport:
    new: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    failed: list[LoadFailure] = field(default_factory=list)
    chunks_written: int = 0
    chunks_embedded: int = 0
    chunks_reused: int = 0
    chunks_imported: int = 0
    """Chunks that came with their vectors (counted as they are prepared for writing)."""
    seconds: float = 0.0
    write_seconds: float = 0.0
    """Time the writer spent in write transactions (COPY, triggers, commit)."""
    dry_run: bool = False

    @property
    def ok(self) -> bool:
        return not self.failed

    def counts(self) -> dict[str, int]:
        return {
            "new": len(self.new),
            "updated": len(self.updated),
            "unchanged": len(self.unchanged),
            "deleted": len(self.deleted),
            "failed": len(self.failed),
            "chunks_written": self.chunks_written,
            "chunks_embedded": self.chunks_embedded,
            "chunks_reused": self.chunks_reused,
            "chunks_imported": self.chunks_imported,
        }


@dataclass(frozen=True)
class _Pending:
    """A document that is new or changed, chunked and waiting to be embedded."""

    doc: LoadedDocument
    content_hash: str
    chunks: list[TextChunk]
    chunk_hashes: list[str]
    vectors: Vectors | None = None
    """The document's own vectors (imported), one row per chunk; None: embed the chunks."""


NO_EMBEDDER = (
    "this document has text to embed, but the import has no embedding model to embed it "
    "with (it writes vectors for a model version this process does not serve); send its "
    "chunks with their vectors"
)


def document_hash(doc: LoadedDocument, model_id: int | None = None) -> str:
    """Hash of a document's content: a change in title, text or metadata makes a new version.

    The source path is left out so that the same files ingested from another folder are unchanged.
    An imported document's hash covers its chunks (texts, metadata, vector bytes) and the model
    version they are for as well.
    """
    pre = doc.precomputed
    payload: list[object]
    if pre is None:
        payload = [doc.title, doc.text, doc.metadata]
    else:
        payload = [doc.title, doc.metadata, pre.texts, pre.metadata, model_id]
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode())
    if pre is not None:
        digest.update(np.ascontiguousarray(pre.vectors, dtype="<f4").tobytes())
    return digest.hexdigest()


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class IngestPipeline:
    """Ingests documents into one collection with one embedding model."""

    def __init__(
        self,
        db: Database,
        embedder: Embedder | None,
        *,
        model_id: int,
        tenant_id: uuid.UUID,
        chunking: ChunkingOptions | Callable[[], ChunkingOptions],
        batch_chunks: int = 2048,
    ) -> None:
        """`embedder` None: only documents with their own vectors can be ingested. `chunking`
        may be a function, called when the first text document needs chunking (the options
        depend on the model, which need not be loaded for an import of vectors)."""
        self._db = db
        self._embedder = embedder
        self._model_id = model_id
        self._tenant_id = tenant_id
        self._chunking_source = chunking
        self._batch_chunks = batch_chunks
        self._text_tools: tuple[Tokenizer, ChunkingOptions] | None = None
        self._dimension: int | None = None

    @property
    def model_id(self) -> int:
        """The model version the pipeline writes vectors for."""
        return self._model_id

    def _chunk(self, doc: LoadedDocument) -> list[TextChunk]:
        """Chunk a text document; loads the model on first use."""
        if self._text_tools is None:
            assert self._embedder is not None
            source = self._chunking_source
            options = source if isinstance(source, ChunkingOptions) else source()
            self._text_tools = (self._embedder.tokenizer, options)
        tokenizer, options = self._text_tools
        return chunk_text(doc.text, tokenizer=tokenizer, options=options, format=doc.format)

    def _model_dimension(self) -> int:
        if self._dimension is None:
            with self._db.read() as session:
                model = store.models.get_model(session, self._model_id)
            if model is None:
                raise NotFoundError(f"no embedding model with id {self._model_id}")
            self._dimension = model.dimension
        return self._dimension

    def run(
        self,
        items: Iterable[LoadedDocument | LoadFailure],
        *,
        collection: str,
        dry_run: bool = False,
        prune: bool = False,
        on_progress: ProgressCallback | None = None,
        report: IngestReport | None = None,
    ) -> IngestReport:
        """Ingest `items` into `collection`; `prune` deletes documents absent from `items`.

        Pass `report` to keep the counts of the batches committed before an interruption.
        Everything it reads and writes is the pipeline's tenant's, whatever the caller's scope.
        """
        with tenancy.as_tenant(self._tenant_id):
            return self._run(items, collection, dry_run, prune, on_progress, report)

    def _run(
        self,
        items: Iterable[LoadedDocument | LoadFailure],
        collection: str,
        dry_run: bool,
        prune: bool,
        on_progress: ProgressCallback | None,
        report: IngestReport | None,
    ) -> IngestReport:
        started = time.perf_counter()
        report = report or IngestReport()
        report.dry_run = dry_run
        progress = on_progress or (lambda _docs, _chunks: None)
        collection_id = self._collection_id(collection, create=not dry_run)
        seen: set[str] = set()
        writer = (
            None
            if dry_run
            else _BatchWriter(self._db, self._tenant_id, collection_id, self._model_id)
        )
        try:
            for batch in self._pending_batches(items, collection_id, seen, report, progress):
                if writer is None:
                    _count_dry_run(batch, report, progress)
                    continue
                self._embed_and_submit(batch, writer, report)
                writer.collect(report, progress)
            if writer is not None:
                writer.close(report, progress)
                writer = None
            if prune:
                self._prune(collection_id, seen, report, dry_run)
        finally:
            if writer is not None:
                writer.abort(report)
            report.seconds = time.perf_counter() - started
        return report

    # -- stages --------------------------------------------------------------------------

    def _collection_id(self, name: str, *, create: bool) -> uuid.UUID | None:
        if not create:
            with self._db.read() as session:
                return store.collections.find_collection_id(session, self._tenant_id, name)
        with self._db.write() as session:
            return store.collections.ensure_collection(session, self._tenant_id, name)

    def _pending_batches(
        self,
        items: Iterable[LoadedDocument | LoadFailure],
        collection_id: uuid.UUID | None,
        seen: set[str],
        report: IngestReport,
        progress: ProgressCallback,
    ) -> Iterator[list[_Pending]]:
        """Group new and changed documents into batches of about `batch_chunks` chunks."""
        batch: list[_Pending] = []
        size = 0
        for group in _groups(self._documents(items, seen, report, progress), _LOOKUP_BATCH):
            for pending in self._classify(group, collection_id, report, progress):
                batch.append(pending)
                size += len(pending.chunks)
                if size >= self._batch_chunks:
                    yield batch
                    batch, size = [], 0
        if batch:
            yield batch

    def _documents(
        self,
        items: Iterable[LoadedDocument | LoadFailure],
        seen: set[str],
        report: IngestReport,
        progress: ProgressCallback,
    ) -> Iterator[LoadedDocument]:
        for item in items:
            if isinstance(item, LoadFailure):
                report.failed.append(item)
                progress(1, 0)
            elif item.external_id in seen:
                reason = f"duplicate external id {item.external_id!r} in this ingest"
                report.failed.append(
                    LoadFailure(source=item.source or item.external_id, reason=reason)
                )
                progress(1, 0)
            else:
                seen.add(item.external_id)
                yield item

    def _classify(
        self,
        docs: Sequence[LoadedDocument],
        collection_id: uuid.UUID | None,
        report: IngestReport,
        progress: ProgressCallback,
    ) -> Iterator[_Pending]:
        stored = self._stored_hashes(collection_id, [d.external_id for d in docs])
        for doc in docs:
            digest = document_hash(doc, self._model_id)
            if stored.get(doc.external_id) == digest:
                report.unchanged.append(doc.external_id)
                progress(1, 0)
                continue
            pending = self._prepare(doc, digest)
            if isinstance(pending, LoadFailure):
                report.failed.append(pending)
                progress(1, 0)
                continue
            yield pending

    def _prepare(self, doc: LoadedDocument, digest: str) -> _Pending | LoadFailure:
        """The document's chunks (its own, or cut from its text), or why it cannot be taken."""
        if doc.precomputed is not None:
            return self._imported(doc, doc.precomputed, digest)
        if self._embedder is None:
            return LoadFailure(doc.source or doc.external_id, NO_EMBEDDER)
        chunks = self._chunk(doc)
        if not chunks:
            return LoadFailure(doc.source or doc.external_id, "no text to index")
        chunks = [flag_injection(chunk) for chunk in chunks]
        return _Pending(doc, digest, chunks, [text_hash(c.text) for c in chunks])

    def _imported(
        self, doc: LoadedDocument, pre: PrecomputedChunks, digest: str
    ) -> _Pending | LoadFailure:
        expected, given = self._model_dimension(), int(pre.vectors.shape[1])
        if given != expected:
            reason = (
                f"document {doc.external_id!r}: its vectors have {given} dimensions; the "
                f"model version they are imported for has {expected}"
            )
            return LoadFailure(pre.where, reason)
        chunks = [flag_injection(chunk) for chunk in imported_chunks(pre)]
        return _Pending(doc, digest, chunks, [text_hash(c.text) for c in chunks], pre.vectors)

    def _stored_hashes(
        self, collection_id: uuid.UUID | None, external_ids: list[str]
    ) -> dict[str, str]:
        if collection_id is None:
            return {}
        with self._db.read() as session:
            return store.documents.document_hashes(session, collection_id, external_ids)

    def _embed_and_submit(
        self, batch: list[_Pending], writer: _BatchWriter, report: IngestReport
    ) -> None:
        vectors = self._vectors_for([p for p in batch if p.vectors is None], report)
        report.chunks_imported += sum(len(p.chunks) for p in batch if p.vectors is not None)
        writes = [
            store.documents.DocumentWrite(
                external_id=p.doc.external_id,
                title=p.doc.title,
                source=p.doc.source,
                metadata=p.doc.metadata,
                content_hash=p.content_hash,
                char_count=len(p.doc.text),
                chunks=p.chunks,
                chunk_hashes=p.chunk_hashes,
                embeddings=(
                    p.vectors
                    if p.vectors is not None
                    else np.stack([vectors[h] for h in p.chunk_hashes])
                ),
            )
            for p in batch
        ]
        writer.submit(writes)

    def _vectors_for(self, batch: list[_Pending], report: IngestReport) -> dict[str, Any]:
        """One vector per distinct chunk text: stored ones reused, the rest embedded now."""
        wanted = list(dict.fromkeys(h for p in batch for h in p.chunk_hashes))
        if not wanted:
            return {}
        assert self._embedder is not None  # `_prepare` let no text document in without one
        with self._db.read() as session:
            vectors: dict[str, Any] = store.models.stored_embeddings(
                session, tenant_id=self._tenant_id, model_id=self._model_id, hashes=wanted
            )
        texts = _texts_by_hash(batch)
        missing = [h for h in wanted if h not in vectors]
        embedded: Vectors = self._embedder.embed([texts[h] for h in missing])
        vectors.update(zip(missing, embedded, strict=True))
        report.chunks_embedded += len(missing)
        report.chunks_reused += sum(len(p.chunk_hashes) for p in batch) - len(missing)
        return vectors

    def _prune(
        self, collection_id: uuid.UUID | None, seen: set[str], report: IngestReport, dry_run: bool
    ) -> None:
        if report.failed:
            log.warning(
                "not pruning: %d inputs failed, their documents would be lost", len(report.failed)
            )
            return
        if collection_id is None or dry_run:
            return
        with self._db.write() as session:
            report.deleted = store.documents.delete_documents_except(session, collection_id, seen)


def flag_injection(chunk: TextChunk) -> TextChunk:
    """The chunk with `metadata["injection"]` (the detector's reasons) when it reads like
    instructions to a model; search and answers act on the flag (see `ragservice.safety`)."""
    verdict = injection.scan(chunk.text)
    if not verdict.flagged:
        return chunk
    return replace(chunk, metadata={**chunk.metadata, "injection": list(verdict.reasons)})


def imported_chunks(pre: PrecomputedChunks) -> list[TextChunk]:
    """The chunks of an imported document, with their offsets in the document's text (the
    chunks joined by `CHUNK_SEPARATOR`). Their token count is a word count (whitespace
    separated): cheap, and no model needs loading for it."""
    chunks: list[TextChunk] = []
    start = 0
    for ordinal, (text, metadata) in enumerate(zip(pre.texts, pre.metadata, strict=True)):
        end = start + len(text)
        chunks.append(TextChunk(ordinal, text, start, end, len(text.split()), dict(metadata)))
        start = end + len(CHUNK_SEPARATOR)
    return chunks


def _count_dry_run(batch: list[_Pending], report: IngestReport, progress: ProgressCallback) -> None:
    for pending in batch:
        report.new.append(pending.doc.external_id)
        progress(1, len(pending.chunks))


def _texts_by_hash(batch: list[_Pending]) -> dict[str, str]:
    return {h: c.text for p in batch for h, c in zip(p.chunk_hashes, p.chunks, strict=True)}


def _groups(items: Iterable[LoadedDocument], size: int) -> Iterator[list[LoadedDocument]]:
    iterator = iter(items)
    while group := list(islice(iterator, size)):
        yield group


class _BatchWriter:
    """Commits batches on a thread of its own, one transaction each, at most one batch behind."""

    def __init__(
        self, db: Database, tenant_id: uuid.UUID, collection_id: uuid.UUID | None, model_id: int
    ) -> None:
        assert collection_id is not None
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
