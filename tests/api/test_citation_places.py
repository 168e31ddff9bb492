"""Citations as precise as the hit, over HTTP: a deck and a multi-page PDF are cited by the
slide and the page the hit lies on, not by the span of the passage around it, whether that
passage grew by the neighbouring chunks added for context or by the weak hits next to the
strong one (the 8 best chunks of a 4-slide deck are all its slides); alike in `/v1/query`, in
the chat route's source lines and in an answer replayed from the prompt cache."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from ragservice.config import Settings
from tests.api.conftest import Keys, ok, wait_for_job
from tests.corpus_office import make_deck
from tests.pdfs import REPORT_CHUNK_TOKENS, report_pdf


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    # Two neighbours on each side: a hit's passage reaches over most of the document.
    return settings.model_copy(
        update={
            "job_poll_seconds": 0.2,
            "workers": 1,
            "chunk_max_tokens": REPORT_CHUNK_TOKENS,
            "chunk_overlap_tokens": 0,
            "context_neighbours": 2,
        }
    )


@pytest.fixture
def places(client: TestClient, keys: Keys) -> TestClient:
    ok(client.post("/v1/collections", json={"name": "places"}, headers=keys.writer), 201)
    files = [
        ("files", ("deck.pptx", make_deck(), "application/octet-stream")),
        ("files", ("report.pdf", report_pdf(), "application/pdf")),
    ]
    url = "/v1/collections/places/documents/files"
    job = ok(client.post(url, files=files, headers=keys.writer), 202)
    assert wait_for_job(client, job["id"], keys.reader)["counts"]["new"] == 2
    return client


def ask(client: TestClient, keys: Keys, question: str, **options: Any) -> dict[str, Any]:
    body = {"question": question, "collections": ["places"], **options}
    answer: dict[str, Any] = ok(client.post("/v1/query", json=body, headers=keys.reader))
    return answer


def test_a_hit_is_cited_by_its_slide_and_page_not_its_neighbours(
    places: TestClient, keys: Keys
) -> None:
    deck = ask(places, keys, "Mention the Europe numbers", mode="fulltext", k=1)
    [source] = deck["sources"]
    # The passage reaches from the title slide to the closing one ...
    assert "Finance team" in source["text"] and "Closing remarks" in source["text"]
    # ... and is cited where the hit lies: the speaker notes of slide 2.
    assert (source["pages"], source["cited_as"]) == ([2], "Quarterly Review (deck.pptx, slide 2)")
    [citation] = deck["citations"]
    assert (citation["pages"], citation["cited_as"]) == (source["pages"], source["cited_as"])

    report = ask(places, keys, "How many zebras did volunteers count?", mode="fulltext", k=1)
    [source] = report["sources"]
    assert len(source["chunk_ids"]) > 1  # page 3's chunk and its neighbours
    assert (source["pages"], source["cited_as"]) == ([3], "Annual Report (report.pdf, p. 3)")

    again = ask(places, keys, "How many zebras did volunteers count?", mode="fulltext", k=1)
    assert again["cache"]["hit"] is True
    assert again["sources"] == report["sources"] and again["citations"] == report["citations"]


def test_weak_hits_beside_the_hit_widen_no_citation(places: TestClient, keys: Keys) -> None:
    # The default search: hybrid, the 8 best chunks, which are every chunk of both files.
    report, deck = ask(places, keys, "How many zebras did volunteers count?")["sources"]
    assert report["cited_as"] == "Annual Report (report.pdf, p. 3)"
    assert len(report["chunk_ids"]) == 4 and "Outlook" in report["text"]  # pages 1 to 5
    assert deck["document"]["external_id"] == "deck.pptx" and len(deck["pages"]) == 1

    [closing, _] = ask(places, keys, "Closing remarks")["sources"]
    assert "Finance team" in closing["text"]  # the passage holds every slide ...
    assert closing["cited_as"] == "Quarterly Review (deck.pptx, slide 4)"  # ... the hit one


def test_the_chat_routes_source_lines_name_the_hits_place(places: TestClient, keys: Keys) -> None:
    chat = {
        "model": "rag:places",
        "messages": [{"role": "user", "content": "How many zebras did volunteers count?"}],
    }
    reply = ok(places.post("/v1/chat/completions", json=chat, headers=keys.reader))
    content = reply["choices"][0]["message"]["content"]
    lines = "\n[1] Annual Report (report.pdf, p. 3)\n[2] Quarterly Review (deck.pptx, slide 3)"
    assert content.endswith("\n\nSources:" + lines)
    assert [c["pages"] for c in reply["citations"]] == [[3], [3]]
