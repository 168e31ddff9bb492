"""Real formats over HTTP: a deck, a workbook, an e-mail with attachments and an EPUB, uploaded
as files, are searched and cited by slide, by sheet and rows, by page, by chapter."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ragservice.config import Settings
from tests.api.conftest import Keys, ok, wait_for_job
from tests.corpus_mail import make_email, make_epub
from tests.corpus_office import make_deck, make_workbook, q3_item
from tests.corpus_pdf import (
    LEFT_COLUMN,
    RIGHT_COLUMN,
    SCAN_LINES,
    TABLE_HEADER,
    long_table_pdf,
    scanned_pdf,
    table_pdf,
    two_column_pdf,
)

Q3_HEADER = "| Item | Amount | Note |"


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"job_poll_seconds": 0.2, "workers": 1, "context_neighbours": 0}
    )


def test_each_format_is_found_and_cited_where_it_lies(office: TestClient, keys: Keys) -> None:
    """One upload of every format, then each format's checks (an upload costs seconds)."""
    a_slide_is_cited_by_its_number(office, keys)
    a_sheets_rows_are_cited_with_their_header(office, keys)
    an_attachment_is_its_own_document_linked_to_its_message(office, keys)
    a_chapter_is_the_heading_path_of_its_chunks(office, keys)
    a_pdf_tables_rows_come_with_its_header_and_page(office, keys)
    an_unruled_table_is_a_table(office, keys)
    two_columns_read_in_order(office, keys)
    a_scanned_page_is_read_and_cited_by_its_page(office, keys)


@pytest.fixture
def office(client: TestClient, keys: Keys) -> TestClient:
    ok(client.post("/v1/collections", json={"name": "office"}, headers=keys.writer), 201)
    files = [
        ("files", ("deck.pptx", make_deck(), "application/octet-stream")),
        ("files", ("book.xlsx", make_workbook(), "application/octet-stream")),
        ("files", ("mail.eml", make_email(), "message/rfc822")),
        ("files", ("tales.epub", make_epub(), "application/epub+zip")),
        ("files", ("stock.pdf", long_table_pdf(120), "application/pdf")),
        ("files", ("sales.pdf", table_pdf(ruled=False), "application/pdf")),
        ("files", ("columns.pdf", two_column_pdf(), "application/pdf")),
        # A blank sheet scanned before the page with text: the text is cited on page 2.
        ("files", ("scan.pdf", scanned_pdf([[" "], SCAN_LINES]), "application/pdf")),
    ]
    url = "/v1/collections/office/documents/files"
    job = ok(client.post(url, files=files, headers=keys.writer), 202)
    done = wait_for_job(client, job["id"], keys.reader)
    # The e-mail's two attachments are documents of their own.
    assert done["counts"]["new"] == 10, done
    return client


def ask(client: TestClient, keys: Keys, question: str) -> dict[str, Any]:
    body = {"question": question, "collections": ["office"], "mode": "fulltext", "k": 1}
    answer: dict[str, Any] = ok(client.post("/v1/query", json=body, headers=keys.reader))
    return answer


def a_slide_is_cited_by_its_number(office: TestClient, keys: Keys) -> None:
    answer = ask(office, keys, "Mention the Europe numbers")
    [citation] = answer["citations"]
    assert citation["cited_as"] == "Quarterly Review (deck.pptx, slide 2)"
    assert citation["pages"] == [2]
    assert "Notes: Mention the Europe numbers." in answer["sources"][0]["text"]


def a_sheets_rows_are_cited_with_their_header(office: TestClient, keys: Keys) -> None:
    answer = ask(office, keys, q3_item(37))
    [source] = answer["sources"]
    match = re.fullmatch(
        r'Results 2024 \(book\.xlsx, sheet "Q3", rows (\d+)\u2013(\d+)\)', source["cited_as"]
    )
    assert match, source["cited_as"]
    first, last = int(match[1]), int(match[2])
    assert first <= 37 <= last and first > 2  # a later chunk of the sheet
    assert source["text"].startswith(Q3_HEADER)  # the column names come with the rows
    assert f"| {q3_item(37)} | 360 |" in source["text"]
    document = ok(
        office.get("/v1/collections/office/documents/book.xlsx?chunks=true", headers=keys.reader)
    )
    q3_chunks = [c for c in document["chunks"] if c["metadata"].get("sheet") == "Q3"]
    assert len(q3_chunks) > 1
    for chunk in q3_chunks:
        assert Q3_HEADER in chunk["text"]  # never a row without its column names
        rows = [line for line in chunk["text"].splitlines() if line.startswith("| item ")]
        # Every row whole: four cell borders, an escaped `\|` inside a cell aside.
        assert all(line.replace("\\|", "").count("|") == 4 for line in rows)


def an_attachment_is_its_own_document_linked_to_its_message(office: TestClient, keys: Keys) -> None:
    answer = ask(office, keys, "three crates of apples")
    [citation] = answer["citations"]
    assert citation["document"]["external_id"] == "mail.eml/invoice.pdf"
    assert citation["cited_as"].endswith("(mail.eml/invoice.pdf, p. 1)")
    url = "/v1/collections/office/documents/mail.eml%2Finvoice.pdf"
    attachment = ok(office.get(url, headers=keys.reader))
    assert attachment["metadata"]["parent"] == "mail.eml"
    message = ok(office.get("/v1/collections/office/documents/mail.eml", headers=keys.reader))
    assert message["metadata"]["subject"] == "Quarterly figures"
    assert "mail.eml/invoice.pdf" in message["metadata"]["attachments"]


def a_chapter_is_the_heading_path_of_its_chunks(office: TestClient, keys: Keys) -> None:
    body = {"query": "Waves broke over the pier", "mode": "fulltext", "k": 1}
    [hit] = ok(office.post("/v1/search", json=body, headers=keys.reader))["results"]
    assert hit["document"]["external_id"] == "tales.epub"
    assert hit["metadata"]["headings"][:1] == ["The Storm"]


def hit(client: TestClient, keys: Keys, query: str) -> dict[str, Any]:
    body = {"query": query, "collections": ["office"], "mode": "fulltext", "k": 1}
    [found] = ok(client.post("/v1/search", json=body, headers=keys.reader))["results"]
    result: dict[str, Any] = found
    return result


def a_pdf_tables_rows_come_with_its_header_and_page(office: TestClient, keys: Keys) -> None:
    answer = ask(office, keys, "part number 1097")
    [source] = answer["sources"]
    assert source["document"]["external_id"] == "stock.pdf"
    assert source["text"].startswith("| Item | Part | Stock |\n| --- | --- | --- |")
    assert "| item 097 | part number 1097 | 89 units |" in source["text"]
    page = source["pages"][0]
    assert page > 1 and re.match(rf"stock\.pdf, pp?\. {page}\b", source["cited_as"])


def an_unruled_table_is_a_table(office: TestClient, keys: Keys) -> None:
    found = hit(office, keys, "Gaskets")
    assert found["document"]["external_id"] == "sales.pdf"
    assert "| " + " | ".join(TABLE_HEADER) + " |" in found["text"]
    assert "| Coast | Gaskets | 133 | 1475 |" in found["text"]


def two_columns_read_in_order(office: TestClient, keys: Keys) -> None:
    url = "/v1/collections/office/documents/columns.pdf?chunks=true"
    text = " ".join(c["text"] for c in ok(office.get(url, headers=keys.reader))["chunks"])
    text = " ".join(text.split())
    places = [text.index(" ".join(line.split()[:2])) for line in (*LEFT_COLUMN, *RIGHT_COLUMN)]
    assert places == sorted(places)  # the left column's sentences, then the right's


def a_scanned_page_is_read_and_cited_by_its_page(office: TestClient, keys: Keys) -> None:
    answer = ask(office, keys, "forty copper pipes")
    [citation] = answer["citations"]
    assert citation["cited_as"] == "scan.pdf, p. 2"
    document = ok(office.get("/v1/collections/office/documents/scan.pdf", headers=keys.reader))
    assert document["metadata"]["ocr"] is True and document["metadata"]["pages"] == 2
