"""Page spans against a real PostgreSQL: a PDF's chunks are stored with the pages they lie
on, other documents with none; re-ingesting is idempotent; migration 0016 goes down and up
on a database with data."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, text

from ingest.loaders import load_documents
from ingest.pipeline import IngestPipeline, IngestReport, document_hash
from ragservice.chunking import ChunkingOptions
from ragservice.config import Settings
from ragservice.db import migrate
from ragservice.retrieval.search import Mode, Searcher, SearchOptions
from ragservice.runtime import Runtime
from ragservice.types import LoadedDocument, PageSpan
from tests.pdfs import REPORT_CHUNK_TOKENS, report_pdf

COLLECTION = "reports"


@pytest.fixture
def files(tmp_path: Path) -> Path:
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "report.pdf").write_bytes(report_pdf())
    (folder / "notes.txt").write_text("The zebra census notes are kept in plain text.")
    return folder


def ingest(runtime: Runtime, folder: Path) -> IngestReport:
    pipeline = IngestPipeline(
        runtime.db,
        runtime.embedder,
        model_id=runtime.model_id,
        tenant_id=runtime.default_tenant_id,
        chunking=ChunkingOptions(max_tokens=REPORT_CHUNK_TOKENS, overlap_tokens=0),
    )
    return pipeline.run(load_documents([folder]), collection=COLLECTION)


def stored_pages(runtime: Runtime) -> dict[str, list[tuple[int | None, int | None]]]:
    query = text(
        "SELECT d.external_id, c.page_start, c.page_end FROM chunks c "
        "JOIN documents d ON d.id = c.document_id ORDER BY d.external_id, c.ordinal"
    )
    pages: dict[str, list[tuple[int | None, int | None]]] = {}
    with runtime.db.read() as session:
        for external_id, first, last in session.execute(query):
            pages.setdefault(external_id, []).append((first, last))
    return pages


def test_pdf_chunks_are_stored_with_their_pages(runtime: Runtime, files: Path) -> None:
    report = ingest(runtime, files)
    assert sorted(report.new) == ["notes.txt", "report.pdf"]
    assert stored_pages(runtime) == {
        "notes.txt": [(None, None)],
        "report.pdf": [(1, 1), (2, 2), (3, 3), (4, 5)],  # the last straddles a page break
    }


def test_search_finds_the_page_a_text_is_on(runtime: Runtime, files: Path) -> None:
    ingest(runtime, files)
    model = runtime.models.current()
    with runtime.db.read() as session:
        collection = session.execute(text("SELECT id FROM collections")).scalar_one()
    with Searcher(runtime.db, models=lambda: model) as searcher:
        result = searcher.search(
            collection_ids=[collection],
            query="volunteers counted herds",
            options=SearchOptions(mode=Mode.FULLTEXT, k=5),
        )
    assert [(h.external_id, h.pages) for h in result.hits] == [("report.pdf", PageSpan(3, 3))]


def test_reingesting_an_unchanged_pdf_changes_nothing(runtime: Runtime, files: Path) -> None:
    ingest(runtime, files)
    again = ingest(runtime, files)
    assert (sorted(again.unchanged), again.new, again.updated) == (
        ["notes.txt", "report.pdf"],
        [],
        [],
    )
    assert stored_pages(runtime)["report.pdf"] == [(1, 1), (2, 2), (3, 3), (4, 5)]


def test_a_document_without_pages_hashes_as_before() -> None:
    doc = LoadedDocument("a.txt", "Some text.", title="A", metadata={"k": 1})
    before = [doc.title, doc.text, doc.metadata]
    expected = hashlib.sha256(json.dumps(before, sort_keys=True, ensure_ascii=False).encode())
    assert document_hash(doc) == expected.hexdigest()
    paged = LoadedDocument("a.pdf", "Some text.", title="A", metadata={"k": 1}, page_starts=(0,))
    assert document_hash(paged) != document_hash(doc)


def test_migration_down_and_up_keeps_the_chunks_and_brings_the_pages_back(
    runtime: Runtime, files: Path, settings: Settings
) -> None:
    ingest(runtime, files)
    runtime.db.dispose()
    engine = create_engine(settings.database.owner_url.get_secret_value())  # type: ignore[union-attr]
    config = migrate.alembic_config()
    with engine.connect() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0015")
        conn.commit()
        columns = conn.execute(
            text("SELECT column_name FROM information_schema.columns WHERE table_name = 'chunks'")
        ).scalars()
        kept = conn.execute(text("SELECT count(*) FROM chunks")).scalar()
        assert "page_start" not in set(columns)
        command.upgrade(config, "head")
        conn.commit()
    engine.dispose()
    assert kept == 5
    assert stored_pages(runtime)["report.pdf"] == [(None, None)] * 4
    again = ingest(runtime, files)  # the PDF's pages went with the downgrade: it is rewritten
    assert (again.updated, again.unchanged) == (["report.pdf"], ["notes.txt"])
    assert again.chunks_embedded == 0  # its chunks' vectors are reused
    assert stored_pages(runtime)["report.pdf"] == [(1, 1), (2, 2), (3, 3), (4, 5)]
