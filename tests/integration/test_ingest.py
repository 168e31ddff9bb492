"""Ingestion against a real PostgreSQL: writes, idempotence, updates, deletes, failures, reuse."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from ingest.pipeline import IngestPipeline, IngestReport
from ragservice import store
from ragservice.embedding.embedder import SentenceTransformerEmbedder, Vectors
from ragservice.runtime import Runtime
from ragservice.types import LoadedDocument, LoadFailure

COLLECTION = "papers"


class CountingEmbedder:
    """The real model, counting how many texts it was asked to embed."""

    def __init__(self, inner: SentenceTransformerEmbedder) -> None:
        self.inner = inner
        self.texts: list[str] = []

    name = property(lambda self: self.inner.name)
    dimension = property(lambda self: self.inner.dimension)
    max_tokens = property(lambda self: self.inner.max_tokens)
    tokenizer = property(lambda self: self.inner.tokenizer)
    batch_tokenizer = None  # texts only: `embed` sees every text the pipeline embeds

    def embed(self, texts: Sequence[str]) -> Vectors:
        self.texts.extend(texts)
        return self.inner.embed(texts)


@pytest.fixture
def counting(embedder: SentenceTransformerEmbedder) -> CountingEmbedder:
    return CountingEmbedder(embedder)


def make_pipeline(runtime: Runtime, embedder: object, batch_chunks: int = 512) -> IngestPipeline:
    return IngestPipeline(
        runtime.db,
        embedder,  # type: ignore[arg-type]
        model_id=runtime.model_id,
        tenant_id=runtime.default_tenant_id,
        chunking=runtime.chunking_options(),
        batch_chunks=batch_chunks,
    )


def doc(external_id: str, body: str, **metadata: object) -> LoadedDocument:
    return LoadedDocument(
        external_id=external_id, text=body, title=f"Title {external_id}", metadata=dict(metadata)
    )


LONG = " ".join(f"Sentence number {i} talks about protein folding in cells." for i in range(120))
DOCS = [
    doc("a", "Aspirin reduces the risk of heart attacks in adults.", year=2020),
    doc("b", "Vitamin D deficiency is linked to bone fractures.", year=2021),
    doc("c", LONG, year=2019),
]


def ingest(
    runtime: Runtime, items: Sequence[LoadedDocument | LoadFailure], **kw: object
) -> IngestReport:
    embedder = kw.pop("embedder", runtime.embedder)
    batch = int(kw.pop("batch_chunks", 512))  # type: ignore[call-overload]
    return make_pipeline(runtime, embedder, batch).run(items, collection=COLLECTION, **kw)  # type: ignore[arg-type]


def scalar(runtime: Runtime, query: str, **params: object) -> object:
    with runtime.db.read() as session:
        return session.execute(text(query), params).scalar()


def fetch_all(runtime: Runtime, query: str) -> list[Any]:
    with runtime.db.read() as session:
        return list(session.execute(text(query)).all())


def chunk_ids(runtime: Runtime, external_id: str) -> list[str]:
    with runtime.db.read() as session:
        rows = session.execute(
            text(
                "SELECT c.id::text FROM chunks c JOIN documents d ON d.id = c.document_id "
                "WHERE d.external_id = :e ORDER BY c.ordinal"
            ),
            {"e": external_id},
        )
        return [r[0] for r in rows]


def test_ingest_writes_documents_chunks_and_embeddings(runtime: Runtime) -> None:
    report = ingest(runtime, DOCS)

    assert sorted(report.new) == ["a", "b", "c"]
    assert report.failed == []
    chunks = scalar(runtime, "SELECT count(*) FROM chunks")
    assert chunks == report.chunks_written
    assert int(chunks) > 3  # type: ignore[call-overload]  # the long document is split
    assert scalar(runtime, "SELECT count(*) FROM chunk_embeddings") == chunks
    assert scalar(runtime, "SELECT bool_and(vector_dims(embedding) = 384) FROM chunk_embeddings")
    assert scalar(runtime, "SELECT count(DISTINCT seq) FROM chunks") == chunks
    assert scalar(runtime, "SELECT sum(n) FROM chunk_postings") == scalar(
        runtime, "SELECT sum(length(to_tsvector('english', text))) FROM chunks"
    )
    assert scalar(runtime, "SELECT sum(chunk_count) FROM documents") == chunks
    assert (
        scalar(runtime, "SELECT metadata->>'year' FROM documents WHERE external_id = 'b'") == "2021"
    )
    # Every chunk's text is the slice of its document it says it is, and under the model's limit.
    assert scalar(runtime, "SELECT max(token_count) FROM chunks") <= runtime.embedder.max_tokens  # type: ignore[operator]
    assert scalar(runtime, "SELECT bool_and(length(text) = end_char - start_char) FROM chunks")


def test_hnsw_index_serves_nearest_neighbour(runtime: Runtime) -> None:
    ingest(runtime, DOCS)
    index = f"chunk_embeddings_hnsw_model_{runtime.model_id}"
    assert scalar(runtime, "SELECT count(*) FROM pg_indexes WHERE indexname = :i", i=index) == 1
    query = runtime.embedder.embed(["Does aspirin prevent heart attacks?"])[0]
    with runtime.db.read() as session:
        # A table this small is cheaper to sort than to probe, row-level security's filter
        # included: take the alternatives away (at scale the planner picks HNSW itself).
        session.execute(text("SET LOCAL enable_seqscan = off"))
        session.execute(text("SET LOCAL enable_bitmapscan = off"))
        sql = (
            "SELECT d.external_id FROM chunk_embeddings e JOIN chunks c ON c.id = e.chunk_id "
            f"JOIN documents d ON d.id = c.document_id WHERE e.model_id = {runtime.model_id} "
            "ORDER BY e.embedding::vector(384) <=> CAST(:q AS vector(384)) LIMIT 3"
        )
        plan = "\n".join(
            r[0] for r in session.execute(text("EXPLAIN " + sql), {"q": str(query.tolist())})
        )
        top = session.execute(text(sql), {"q": str(query.tolist())}).scalars().all()
    assert index in plan
    assert top[0] == "a"


def test_stored_vectors_are_the_models_normalized_output(runtime: Runtime) -> None:
    ingest(runtime, DOCS[:1])
    [row] = fetch_all(
        runtime,
        "SELECT c.text, e.embedding FROM chunks c JOIN chunk_embeddings e ON e.chunk_id = c.id",
    )
    stored = row[1].to_numpy()
    assert np.linalg.norm(stored) == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(stored, runtime.embedder.embed([row[0]])[0], atol=1e-5)


def test_chunks_embedded_from_sliced_token_ids_equal_the_model_on_their_texts(
    runtime: Runtime,
) -> None:
    """Ingest tokenizes each document once and cuts its chunks' model inputs out of it; the
    vectors are what the model's own `encode` gives for the chunk texts."""
    hyphens = " ".join(
        f"Well-known anti-inflammatory drug no. {i} (e.g. ibuprofen)." for i in range(80)
    )
    ingest(runtime, [*DOCS, doc("d", hyphens)])
    rows = fetch_all(
        runtime,
        "SELECT c.text, e.embedding FROM chunks c JOIN chunk_embeddings e ON e.chunk_id = c.id",
    )
    assert len(rows) > 6
    expected = runtime.embedder.model.encode([r[0] for r in rows], normalize_embeddings=True)
    stored = np.stack([r[1].to_numpy() for r in rows])
    np.testing.assert_allclose(stored, expected, atol=1e-5)


def test_reingest_is_a_no_op(runtime: Runtime, counting: CountingEmbedder) -> None:
    ingest(runtime, DOCS)
    before = {d.external_id: chunk_ids(runtime, d.external_id) for d in DOCS}

    report = ingest(runtime, DOCS, embedder=counting)

    assert sorted(report.unchanged) == ["a", "b", "c"]
    assert report.new == report.updated == []
    assert counting.texts == []
    assert report.chunks_written == 0
    assert {d.external_id: chunk_ids(runtime, d.external_id) for d in DOCS} == before
    assert scalar(runtime, "SELECT max(version) FROM documents") == 1


def test_changed_document_replaces_chunks_and_bumps_version(runtime: Runtime) -> None:
    ingest(runtime, DOCS)
    old_a, old_c = chunk_ids(runtime, "a"), chunk_ids(runtime, "c")

    changed = doc("a", "Aspirin does not reduce the risk of strokes in adults.", year=2020)
    report = ingest(runtime, [changed, DOCS[1], DOCS[2]])

    assert report.updated == ["a"]
    assert sorted(report.unchanged) == ["b", "c"]
    assert scalar(runtime, "SELECT version FROM documents WHERE external_id = 'a'") == 2
    assert scalar(runtime, "SELECT version FROM documents WHERE external_id = 'c'") == 1
    new_a = chunk_ids(runtime, "a")
    assert set(new_a).isdisjoint(old_a)
    assert chunk_ids(runtime, "c") == old_c
    assert "strokes" in str(
        scalar(
            runtime,
            "SELECT string_agg(text, ' ') FROM chunks c "
            "JOIN documents d ON d.id = c.document_id WHERE d.external_id = 'a'",
        )
    )
    # No embedding is left behind by the replaced chunks.
    assert scalar(runtime, "SELECT count(*) FROM chunk_embeddings") == scalar(
        runtime, "SELECT count(*) FROM chunks"
    )


def test_metadata_change_updates_without_embedding_again(
    runtime: Runtime, counting: CountingEmbedder
) -> None:
    ingest(runtime, DOCS)
    report = ingest(runtime, [doc("b", DOCS[1].text, year=1999)], embedder=counting)
    assert report.updated == ["b"]
    assert counting.texts == []  # same chunk texts: vectors reused by content hash
    assert report.chunks_reused == 1
    assert (
        scalar(runtime, "SELECT metadata->>'year' FROM documents WHERE external_id = 'b'") == "1999"
    )


def test_deleting_documents_takes_chunks_and_embeddings(runtime: Runtime) -> None:
    ingest(runtime, DOCS)
    with runtime.db.write() as session:
        collection_id = store.collections.find_collection_id(
            session, runtime.default_tenant_id, COLLECTION
        )
        assert collection_id is not None
        assert store.documents.delete_documents(session, collection_id, ["c"]) == 1
    assert chunk_ids(runtime, "c") == []
    remaining = scalar(runtime, "SELECT count(*) FROM chunks")
    assert remaining == 2
    assert scalar(runtime, "SELECT count(*) FROM chunk_embeddings") == 2


def test_prune_deletes_documents_missing_from_the_source(runtime: Runtime) -> None:
    ingest(runtime, DOCS)
    report = ingest(runtime, DOCS[:2], prune=True)
    assert report.deleted == ["c"]
    assert scalar(runtime, "SELECT count(*) FROM documents") == 2
    assert chunk_ids(runtime, "c") == []


def test_prune_is_skipped_when_an_input_failed(runtime: Runtime) -> None:
    ingest(runtime, DOCS)
    report = ingest(runtime, [DOCS[0], LoadFailure("broken.pdf", "PDF is encrypted")], prune=True)
    assert report.deleted == []
    assert scalar(runtime, "SELECT count(*) FROM documents") == 3


def test_identical_texts_are_embedded_once(runtime: Runtime, counting: CountingEmbedder) -> None:
    same = "Identical abstracts appear in many corpora."
    report = ingest(
        runtime, [doc("x1", same), doc("x2", same), doc("x3", "Something else.")], embedder=counting
    )
    assert sorted(report.new) == ["x1", "x2", "x3"]
    assert sorted(counting.texts) == sorted([same, "Something else."])
    assert report.chunks_embedded == 2 and report.chunks_reused == 1

    counting.texts.clear()
    report = ingest(runtime, [doc("x4", same)], embedder=counting)
    assert report.new == ["x4"]
    assert counting.texts == []  # found stored by content hash and model
    assert (
        scalar(
            runtime,
            "SELECT count(DISTINCT embedding::text) FROM chunk_embeddings e "
            "JOIN chunks c ON c.id = e.chunk_id WHERE c.text = :t",
            t=same,
        )
        == 1
    )


def test_failures_are_reported_and_the_batch_goes_on(runtime: Runtime) -> None:
    items = [
        DOCS[0],
        LoadFailure("bad.pdf", "not a valid PDF"),
        doc("a", "Same id again."),
        DOCS[1],
    ]
    report = ingest(runtime, items)
    assert sorted(report.new) == ["a", "b"]
    assert [f.source for f in report.failed] == ["bad.pdf", "a"]
    assert "duplicate external id" in report.failed[1].reason
    assert not report.ok


def test_dry_run_writes_nothing(runtime: Runtime, counting: CountingEmbedder) -> None:
    report = ingest(runtime, DOCS, dry_run=True, embedder=counting)
    assert sorted(report.new) == ["a", "b", "c"]
    assert counting.texts == []
    assert scalar(runtime, "SELECT count(*) FROM documents") == 0
    assert scalar(runtime, "SELECT count(*) FROM collections") == 0


def test_failure_mid_batch_leaves_nothing_half_written(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = [doc(f"d{i}", f"Document {i} is about topic {i}.") for i in range(6)]
    real_copy = store.bulk.copy_rows
    calls = {"n": 0}

    def failing_copy(conn, table, columns, types, rows):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        # Batches of two documents: COPY calls 1-2 (chunks, then embeddings) are batch one;
        # call 4 is batch two's embeddings, after its documents and chunks were already sent.
        if calls["n"] == 4:
            raise RuntimeError("disk full")
        real_copy(conn, table, columns, types, rows)

    monkeypatch.setattr(store.bulk, "copy_rows", failing_copy)
    with pytest.raises(RuntimeError, match="disk full"):
        ingest(runtime, docs, batch_chunks=2)

    stored = scalar(
        runtime, "SELECT string_agg(external_id, ',' ORDER BY external_id) FROM documents"
    )
    assert stored == "d0,d1"
    assert scalar(runtime, "SELECT count(*) FROM chunks") == 2
    assert scalar(runtime, "SELECT count(*) FROM chunk_embeddings") == 2

    monkeypatch.setattr(store.bulk, "copy_rows", real_copy)
    report = ingest(runtime, docs, batch_chunks=2)
    assert sorted(report.unchanged) == ["d0", "d1"]
    assert sorted(report.new) == ["d2", "d3", "d4", "d5"]
    assert scalar(runtime, "SELECT count(*) FROM chunk_embeddings") == 6


def test_concurrent_writer_of_same_content_is_not_duplicated(runtime: Runtime) -> None:
    """The write is authoritative: a document stored between classify and write is left alone."""
    ingest(runtime, DOCS[:1])
    with runtime.db.write() as session:
        collection_id = store.collections.find_collection_id(
            session, runtime.default_tenant_id, COLLECTION
        )
        assert collection_id is not None
        vec = runtime.embedder.embed([DOCS[0].text])
        from ingest.pipeline import document_hash, text_hash
        from ragservice.chunking import chunk_text

        chunks = chunk_text(
            DOCS[0].text, tokenizer=runtime.embedder.tokenizer, options=runtime.chunking_options()
        )
        result = store.documents.write_documents(
            session,
            tenant_id=runtime.default_tenant_id,
            collection_id=collection_id,
            model_id=runtime.model_id,
            documents=[
                store.documents.DocumentWrite(
                    external_id="a",
                    title=DOCS[0].title,
                    source="",
                    metadata=DOCS[0].metadata,
                    content_hash=document_hash(DOCS[0]),
                    char_count=len(DOCS[0].text),
                    chunks=chunks,
                    chunk_hashes=[text_hash(c.text) for c in chunks],
                    embeddings=vec,
                )
            ],
        )
    assert result.written == [] and result.unchanged == ["a"]
    assert scalar(runtime, "SELECT count(*) FROM chunks") == 1


def test_heading_paths_and_offsets_are_stored(runtime: Runtime) -> None:
    body = "# Guide\n\nIntro text.\n\n## Install\n\nRun the installer.\n\n## Use\n\nAsk questions."
    markdown = LoadedDocument(external_id="guide.md", text=body, format="markdown")
    ingest(runtime, [markdown])
    rows = fetch_all(
        runtime,
        "SELECT metadata->'headings', start_char, end_char, text FROM chunks ORDER BY ordinal",
    )
    assert [row[0] for row in rows] == [["Guide"], ["Guide", "Install"], ["Guide", "Use"]]
    assert all(body[start:end] == chunk for _, start, end, chunk in rows)
    assert rows[1][3].startswith("## Install")
