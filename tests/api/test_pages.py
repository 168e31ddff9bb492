"""Pages over HTTP: a PDF uploaded as a file is searched, answered from and cited by page;
the chunk that runs across a page break has two pages; other documents have none."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from ragservice.config import Settings
from tests.api.conftest import Keys, ok, wait_for_job
from tests.pdfs import REPORT_CHUNK_TOKENS, report_pdf


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "job_poll_seconds": 0.2,
            "workers": 1,
            "chunk_max_tokens": REPORT_CHUNK_TOKENS,
            "chunk_overlap_tokens": 0,
            "context_neighbours": 0,
        }
    )


@pytest.fixture
def reports(client: TestClient, keys: Keys) -> TestClient:
    ok(client.post("/v1/collections", json={"name": "reports"}, headers=keys.writer), 201)
    files = [
        ("files", ("report.pdf", report_pdf(), "application/pdf")),
        ("files", ("notes.txt", b"Notes on the census, kept as plain text.", "text/plain")),
    ]
    job = ok(
        client.post("/v1/collections/reports/documents/files", files=files, headers=keys.writer),
        202,
    )
    assert wait_for_job(client, job["id"], keys.reader)["counts"]["new"] == 2
    return client


def search(client: TestClient, keys: Keys, query: str) -> list[dict[str, Any]]:
    body = {"query": query, "mode": "fulltext", "k": 3}
    response = client.post("/v1/search", json=body, headers=keys.reader)
    results: list[dict[str, Any]] = ok(response)["results"]
    return results


def test_search_results_and_chunks_carry_their_pages(reports: TestClient, keys: Keys) -> None:
    [on_page_3] = search(reports, keys, "volunteers counted herds")
    assert (on_page_3["document"]["external_id"], on_page_3["pages"]) == ("report.pdf", [3])
    [straddling] = search(reports, keys, "customers adopt platform Asia")
    assert straddling["pages"] == [4, 5]
    assert straddling["text"].startswith("Outlook:")
    [notes] = search(reports, keys, "notes kept")
    assert (notes["document"]["external_id"], notes["pages"]) == ("notes.txt", None)
    url = "/v1/collections/reports/documents/report.pdf?chunks=true"
    document = ok(reports.get(url, headers=keys.reader))
    assert document["metadata"]["pages"] == 5
    assert [c["pages"] for c in document["chunks"]] == [[1], [2], [3], [4, 5]]


def test_answers_cite_the_pages(reports: TestClient, keys: Keys) -> None:
    body = {"question": "How many zebras did volunteers count?", "mode": "fulltext", "k": 1}
    answer = ok(reports.post("/v1/query", json=body, headers=keys.reader))
    assert answer["status"] == "extractive"
    [citation] = answer["citations"]
    assert citation["document"]["external_id"] == "report.pdf"
    assert citation["pages"] == [3]
    assert citation["cited_as"] == "Annual Report (report.pdf, p. 3)"
    assert [(s["pages"], s["cited_as"]) for s in answer["sources"]] == [
        ([3], "Annual Report (report.pdf, p. 3)")
    ]

    chat = {
        "model": "rag:reports",
        "messages": [{"role": "user", "content": "Where will customers adopt the platform?"}],
    }
    reply = ok(reports.post("/v1/chat/completions", json=chat, headers=keys.reader))
    content = reply["choices"][0]["message"]["content"]
    # All four chunks of the report are retrieved (k=8) and read as one passage, cited where
    # its strong hit lies: the chunk across pages 4 and 5; the others only came along.
    assert content.endswith(
        "\n\nSources:\n[1] Annual Report (report.pdf, pp. 4\u20135)\n[2] notes.txt"
    )
    assert [c["pages"] for c in reply["citations"]] == [[4, 5], None]
    assert content.startswith("The annual report opens with a letter")  # the whole passage
