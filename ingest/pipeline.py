"""The ingest pipeline: classify → chunk → embed (reusing stored vectors) → write in batches.

Three threads overlap (see `ingest.stages`): a preparation thread loads, classifies, tokenizes
and chunks batch N+2; the calling thread embeds batch N+1; a writer thread commits batch N. So
neither Python nor PostgreSQL keeps the model waiting. Each group of documents is tokenized in
one call, and each chunk's model input is cut from its document's tokens
(`ragservice.embedding.tokens`): a text is tokenized once. Each batch is one transaction: a
crash or Ctrl-C leaves whole batches only, and a rerun skips what is already stored (by content
hash) and finishes the job.

A document that brings its own chunks and vectors (`LoadedDocument.precomputed`, a bulk
import) skips chunking and embedding: its vectors are checked against the model version's
dimension and written as they are. The model is loaded only when a document needs embedding,
so an import of vectors alone never loads it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

import numpy as np

from ingest.report import IngestReport, ProgressCallback
from ingest.stages import BatchWriter, Prefetch
from ragservice import store
from ragservice.chunking import TABLE_HEADER, ChunkingOptions, chunk_text, place_chunks
from ragservice.db import Database, tenancy
from ragservice.embedding.embedder import Embedder, Vectors
from ragservice.embedding.tokens import DocumentTokens, TokenIds
from ragservice.errors import NotFoundError
from ragservice.readers import may_read
from ragservice.safety import injection
from ragservice.types import (
    CHUNK_SEPARATOR,
    LoadedDocument,
    LoadFailure,
    LoadResult,
    PrecomputedChunks,
    SkippedFile,
    TextChunk,
    Tokenizer,
)

__all__ = ["NO_EMBEDDER", "IngestPipeline", "IngestReport", "ProgressCallback"]

log = logging.getLogger(__name__)

LOOKUP_BATCH = 256  # documents per round trip when checking stored content hashes
_PREPARED_AHEAD = 2  # batches the preparation thread may have ready before the model takes them


@dataclass(frozen=True)
class _Pending:
    """A document that is new or changed, chunked and waiting to be embedded."""

    doc: LoadedDocument
    content_hash: str
    chunks: list[TextChunk]
    chunk_hashes: list[str]
    vectors: Vectors | None = None
    """The document's own vectors (imported), one row per chunk; None: embed the chunks."""
    inputs: list[TokenIds] | None = None
    """The chunks' model inputs, already tokenized (None: the model tokenizes their texts)."""


@dataclass
class _Prepared:
    """What the preparation thread hands on: a batch to embed (maybe empty), and the documents
    it settled meanwhile (unchanged, failed) and the files skipped, for the calling thread to
    account for."""

    batch: list[_Pending] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    failed: list[LoadFailure] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)

    @property
    def settled(self) -> bool:
        """Whether it holds anything besides its batch."""
        return bool(self.unchanged or self.failed or self.skipped)


NO_EMBEDDER = (
    "this document has text to embed, but the import has no embedding model to embed it "
    "with (it writes vectors for a model version this process does not serve); send its "
    "chunks with their vectors"
)


def document_hash(doc: LoadedDocument, model_id: int | None = None) -> str:
    """Hash of a document's content: a change in title, text or metadata makes a new version.

    The source path is left out so that the same files ingested from another folder are unchanged.
    Readers the ingest names are covered (a change rewrites the document's rows, with its stored
    vectors: nothing is embedded again); readers it does not name are not.
    A paged document's hash covers where its pages start (a document without pages hashes as
    it always did). An imported document's hash covers its chunks (texts, metadata, vector
    bytes) and the model version they are for as well.
    """
    pre = doc.precomputed
    payload: list[object]
    if pre is None:
        payload = [doc.title, doc.text, doc.metadata]
        if doc.page_starts:
            payload.append(list(doc.page_starts))
        if doc.page_unit != "page" or doc.row_starts:
            places = [doc.page_unit, list(doc.page_names), [list(r) for r in doc.row_starts]]
            payload.append({"places": places})
    else:
        payload = [doc.title, doc.metadata, pre.texts, pre.metadata, model_id]
    if doc.readers is not None:
        payload.append({"readers": list(doc.readers)})
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode())
    if pre is not None:
        digest.update(np.ascontiguousarray(pre.vectors, dtype="<f4").tobytes())
    return digest.hexdigest()


NOT_YOURS = "this external id cannot be written by you (it is not free, and you may not read it)"
"""Why an ingest refuses a stored document its asker may not read: the same words whatever the
document holds, so that the refusal tells no more than that the id is taken."""


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
        lookup_batch: int = LOOKUP_BATCH,
    ) -> None:
        """`embedder` None: only documents with their own vectors can be ingested. `chunking`
        may be a function, called when the first text document needs chunking (the options
        depend on the model, which need not be loaded for an import of vectors).
        `lookup_batch`: documents read before their stored hashes are looked up in one round
        trip; a source that hands documents out in groups (the workers of a parallel run)
        sets its group size, so that no group waits for the next one to arrive."""
        self._db = db
        self._embedder = embedder
        self._model_id = model_id
        self._tenant_id = tenant_id
        self._chunking_source = chunking
        self._batch_chunks = batch_chunks
        self._lookup_batch = lookup_batch
        self._text_tools: tuple[Tokenizer, ChunkingOptions] | None = None
        self._dimension: int | None = None
        self._writes_as: frozenset[str] | None = None  # of the current run

    @property
    def model_id(self) -> int:
        """The model version the pipeline writes vectors for."""
        return self._model_id

    def _chunk(self, doc: LoadedDocument, tokens: DocumentTokens | None) -> list[TextChunk]:
        """Chunk a text document (by its tokens when they were made in a batch already)."""
        tokenizer, options = self._text_tools_loaded()
        spans = tokenizer if tokens is None else tokens
        chunks = chunk_text(
            doc.text,
            tokenizer=spans,
            options=options,
            format=doc.format,
            page_starts=doc.page_starts,
        )
        return place_chunks(chunks, doc.page_unit, doc.page_names, doc.row_starts)

    def _text_tools_loaded(self) -> tuple[Tokenizer, ChunkingOptions]:
        """The tokenizer and chunking options; loads the model on first use."""
        if self._text_tools is None:
            assert self._embedder is not None
            source = self._chunking_source
            options = source if isinstance(source, ChunkingOptions) else source()
            self._text_tools = (self._embedder.tokenizer, options)
        return self._text_tools

    def _model_dimension(self) -> int:
        if self._dimension is None:
            with self._db.read() as session:
                model = store.embedding_models.get_model(session, self._model_id)
            if model is None:
                raise NotFoundError(f"no embedding model with id {self._model_id}")
            self._dimension = model.dimension
        return self._dimension

    def run(
        self,
        items: Iterable[LoadResult],
        *,
        collection: str,
        dry_run: bool = False,
        prune: bool = False,
        on_progress: ProgressCallback | None = None,
        report: IngestReport | None = None,
        pack: bool = True,
        writes_as: frozenset[str] | None = None,
    ) -> IngestReport:
        """Ingest `items` into `collection`; `prune` deletes documents absent from `items`.

        Pass `report` to keep the counts of the batches committed before an interruption.
        Everything it reads and writes is the pipeline's tenant's, whatever the caller's scope.
        `pack`: once the batches are written, pack the postings blocks the large ones appended
        (`store.postings`); a caller that runs several pipelines packs once after them.
        `writes_as`: the principal set of whoever asked for the ingest (a job's queuer, a
        source's adder; None: every document). A stored document it may not read is not
        replaced, re-permissioned or compared: it fails with `NOT_YOURS`, whatever it holds.
        """
        self._writes_as = writes_as
        with tenancy.as_tenant(self._tenant_id):
            report = self._run(items, collection, dry_run, prune, on_progress, report)
            if pack and not dry_run and report.chunks_written >= store.postings.APPEND_MIN_CHUNKS:
                packing = report.pack_seconds
                pack_postings(self._db, self._collection_id(collection, create=False), report)
                report.seconds += report.pack_seconds - packing
            return report

    def _run(
        self,
        items: Iterable[LoadResult],
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
            else BatchWriter(
                self._db, self._tenant_id, collection_id, self._model_id, self._writes_as
            )
        )
        prepared = Prefetch(
            self._prepared(items, collection_id, seen),
            depth=_PREPARED_AHEAD,
            name="ingest-prepare",
        )
        try:
            for unit in _timed(prepared, report):
                _account_settled(unit, report, progress)
                if not unit.batch:
                    continue
                if writer is None:
                    _count_dry_run(unit.batch, report, progress)
                    continue
                self._embed_and_submit(unit.batch, writer, report)
                writer.collect(report, progress)
            if writer is not None:
                writer.close(report, progress)
                writer = None
            if prune:
                self._prune(collection_id, seen, report, dry_run)
        finally:
            prepared.close()
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

    def _prepared(
        self,
        items: Iterable[LoadResult],
        collection_id: uuid.UUID | None,
        seen: set[str],
    ) -> Iterator[_Prepared]:
        """New and changed documents in batches of about `batch_chunks` chunks, chunked and
        tokenized; and, after each group of documents, those it found unchanged or failed and
        the files skipped. Runs on the preparation thread: it touches no report and calls no
        callback."""
        unit, size = _Prepared(), 0
        loaded = _Prepared()  # the failures and skips `_documents` finds as it reads the items
        for group in _groups(self._documents(items, seen, loaded), self._lookup_batch):
            unit.failed.extend(loaded.failed)
            unit.skipped.extend(loaded.skipped)
            loaded.failed, loaded.skipped = [], []
            unchanged, prepared = self._classify(group, collection_id)
            unit.unchanged.extend(unchanged)
            for pending in prepared:
                if isinstance(pending, LoadFailure):
                    unit.failed.append(pending)
                    continue
                unit.batch.append(pending)
                size += len(pending.chunks)
                if size >= self._batch_chunks:
                    yield unit
                    unit, size = _Prepared(), 0
            if unit.settled:
                yield _Prepared(unchanged=unit.unchanged, failed=unit.failed, skipped=unit.skipped)
                unit.unchanged, unit.failed, unit.skipped = [], [], []
        unit.failed.extend(loaded.failed)
        unit.skipped.extend(loaded.skipped)
        if unit.batch or unit.settled:
            yield unit

    def _documents(
        self,
        items: Iterable[LoadResult],
        seen: set[str],
        loaded: _Prepared,
    ) -> Iterator[LoadedDocument]:
        """The documents of `items`; failures and skipped files go to `loaded`."""
        for item in items:
            if isinstance(item, LoadFailure):
                loaded.failed.append(item)
            elif isinstance(item, SkippedFile):
                loaded.skipped.append(item)
            elif item.external_id in seen:
                reason = f"duplicate external id {item.external_id!r} in this ingest"
                loaded.failed.append(LoadFailure(item.source or item.external_id, reason))
            else:
                seen.add(item.external_id)
                yield item

    def _classify(
        self, docs: Sequence[LoadedDocument], collection_id: uuid.UUID | None
    ) -> tuple[list[str], list[_Pending | LoadFailure]]:
        """The external ids of unchanged documents, and the others prepared (or failed)."""
        stored = self._stored(collection_id, [d.external_id for d in docs])
        failed: list[_Pending | LoadFailure] = []
        unchanged: list[str] = []
        changed: list[tuple[LoadedDocument, str]] = []
        for doc in docs:
            before = stored.get(doc.external_id)
            if before is not None and not may_read(self._writes_as, before.readers):
                failed.append(LoadFailure(doc.source or doc.external_id, NOT_YOURS))
                continue
            if doc.readers is None and before is not None and before.readers:
                # Not named by this ingest: the document keeps who may read it, and is hashed
                # so (an ingest that named them hashed them): unchanged stays unchanged.
                doc = replace(doc, readers=tuple(before.readers))
            digest = document_hash(doc, self._model_id)
            if before is not None and before.content_hash == digest:
                unchanged.append(doc.external_id)
                continue
            changed.append((doc, digest))
        return unchanged, failed + list(self._prepare(changed))

    def _prepare(
        self, docs: Sequence[tuple[LoadedDocument, str]]
    ) -> Iterator[_Pending | LoadFailure]:
        """Each document's chunks (its own, or cut from its text), or why it cannot be taken.
        The texts are tokenized in one batch where the model takes token ids."""
        texts = [doc for doc, _ in docs if doc.precomputed is None]
        batch_tokenizer = self._embedder.batch_tokenizer if self._embedder and texts else None
        tokens = iter(batch_tokenizer.documents([d.text for d in texts]) if batch_tokenizer else [])
        for doc, digest in docs:
            if doc.precomputed is not None:
                yield self._imported(doc, doc.precomputed, digest)
            elif self._embedder is None:
                yield LoadFailure(doc.source or doc.external_id, NO_EMBEDDER)
            else:
                document = next(tokens, None)
                yield self._text_document(doc, digest, document)

    def _text_document(
        self, doc: LoadedDocument, digest: str, tokens: DocumentTokens | None
    ) -> _Pending | LoadFailure:
        chunks = self._chunk(doc, tokens)
        if not chunks:
            return LoadFailure(doc.source or doc.external_id, "no text to index")
        chunks = [flag_injection(chunk) for chunk in chunks]
        inputs = None
        batch_tokenizer = self._embedder.batch_tokenizer if self._embedder else None
        if tokens is not None and batch_tokenizer is not None:
            # A chunk that repeats its table's header is no slice of the document's tokens.
            ranges = [
                None if TABLE_HEADER in c.metadata else (c.start_char, c.end_char) for c in chunks
            ]
            inputs = batch_tokenizer.chunk_inputs(tokens, ranges, [c.text for c in chunks])
        return _Pending(doc, digest, chunks, [text_hash(c.text) for c in chunks], inputs=inputs)

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

    def _stored(
        self, collection_id: uuid.UUID | None, external_ids: list[str]
    ) -> dict[str, store.documents.StoredDocument]:
        if collection_id is None:
            return {}
        with self._db.read() as session:
            return store.documents.stored_documents(session, collection_id, external_ids)

    def _embed_and_submit(
        self, batch: list[_Pending], writer: BatchWriter, report: IngestReport
    ) -> None:
        vectors = self._vectors_for([p for p in batch if p.vectors is None], report)
        report.chunks_imported += sum(len(p.chunks) for p in batch if p.vectors is not None)
        report.restricted = report.restricted or any(p.doc.readers for p in batch)
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
                readers=p.doc.readers,
                embeddings=(
                    p.vectors
                    if p.vectors is not None
                    else np.stack([vectors[h] for h in p.chunk_hashes])
                ),
            )
            for p in batch
        ]
        started = time.perf_counter()
        writer.submit(writes)
        report.write_wait_seconds += time.perf_counter() - started

    def _vectors_for(self, batch: list[_Pending], report: IngestReport) -> dict[str, Any]:
        """One vector per distinct chunk text: stored ones reused, the rest embedded now."""
        wanted = list(dict.fromkeys(h for p in batch for h in p.chunk_hashes))
        if not wanted:
            return {}
        assert self._embedder is not None  # `_prepare` let no text document in without one
        with self._db.read() as session:
            vectors: dict[str, Any] = store.embedding_models.stored_embeddings(
                session, tenant_id=self._tenant_id, model_id=self._model_id, hashes=wanted
            )
        missing = [h for h in wanted if h not in vectors]
        if missing:
            started = time.perf_counter()
            vectors.update(zip(missing, self._embed(batch, missing), strict=True))
            report.embed_seconds += time.perf_counter() - started
        report.chunks_embedded += len(missing)
        report.chunks_reused += sum(len(p.chunk_hashes) for p in batch) - len(missing)
        return vectors

    def _embed(self, batch: list[_Pending], hashes: list[str]) -> Vectors:
        """Vectors of the chunks with these text hashes, from their token ids where the batch
        has them for every one (the model then tokenizes nothing), else from their texts."""
        assert self._embedder is not None
        inputs = _inputs_by_hash(batch)
        if all(h in inputs for h in hashes):
            return self._embedder.embed_tokens([inputs[h] for h in hashes])
        texts = _texts_by_hash(batch)
        return self._embedder.embed([texts[h] for h in hashes])

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
        # Row-level security keeps the documents the asker may not read out of the delete.
        with tenancy.as_tenant(self._tenant_id, self._writes_as), self._db.write() as session:
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


def _timed(units: Iterable[_Prepared], report: IngestReport) -> Iterator[_Prepared]:
    """`units`, adding the time spent waiting for each to `report.prepare_wait_seconds`."""
    iterator = iter(units)
    while True:
        started = time.perf_counter()
        unit = next(iterator, None)
        report.prepare_wait_seconds += time.perf_counter() - started
        if unit is None:
            return
        yield unit


def _account_settled(unit: _Prepared, report: IngestReport, progress: ProgressCallback) -> None:
    """Count the documents the preparation settled without a write (unchanged, failed) and
    the files skipped (inputs done, as a failed one is)."""
    report.unchanged.extend(unit.unchanged)
    report.failed.extend(unit.failed)
    report.skipped.extend(unit.skipped)
    if unit.settled:
        progress(len(unit.unchanged) + len(unit.failed) + len(unit.skipped), 0)


def _inputs_by_hash(batch: list[_Pending]) -> dict[str, TokenIds]:
    return {
        h: ids
        for p in batch
        if p.inputs is not None
        for h, ids in zip(p.chunk_hashes, p.inputs, strict=True)
    }


def _texts_by_hash(batch: list[_Pending]) -> dict[str, str]:
    return {h: c.text for p in batch for h, c in zip(p.chunk_hashes, p.chunks, strict=True)}


def _groups(items: Iterable[LoadedDocument], size: int) -> Iterator[list[LoadedDocument]]:
    iterator = iter(items)
    while group := list(islice(iterator, size)):
        yield group


def pack_postings(db: Database, collection_id: uuid.UUID | None, report: IngestReport) -> None:
    """Pack the collection's postings blocks after a load (`store.postings.pack_postings`)."""
    if collection_id is None:
        return
    with db.write() as session:
        packed = store.postings.pack_postings(session, collection_id)
    report.pack_seconds += packed.seconds
    log.info(
        "packed %d short postings blocks into %d in %.1f s",
        packed.blocks_before,
        packed.blocks_after,
        packed.seconds,
    )
