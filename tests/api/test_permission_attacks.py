"""The permission model attacked through every write path: a writer outside a document's
readers cannot overwrite it, re-permission it, delete it, or learn what it holds — by JSON
ingest, by an upload (a file, a JSONL row, an empty `readers` field), by a source whose pages
bear its id, by PATCH or DELETE; the refusal is the same whatever the document holds. Those
who may read it still can; widening a document's readers drops the narrower cached answers;
jobs that may name readers are hidden from others from the start."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from ingest.pipeline import NOT_YOURS
from ragservice import store
from ragservice.config import Settings
from ragservice.db import tenancy
from ragservice.db.models import Document
from tests.api.conftest import People, make_key, ok
from tests.api.test_permissions import QUESTION, SECRET, SECRET_TEXT
from tests.api.test_sources_api import run_jobs
from tests.slow_site import slow_site

PRIVATE = "review-ana.txt"
PRIVATE_TEXT = "Ana's performance review: exceeds expectations."


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    """No job threads: each test runs the jobs it queues, so what a queued job shows is seen."""
    return settings.model_copy(
        update={"workers": 0, "sources_allow_private": True, "crawl_rate": 100.0}
    )


def queue_texts(client: TestClient, headers: dict[str, str], docs: list[dict[str, Any]]) -> str:
    job = ok(
        client.post(
            "/v1/collections/policies/documents", json={"documents": docs}, headers=headers
        ),
        202,
    )
    return str(job["id"])


def finished(client: TestClient, job_id: str, headers: dict[str, str]) -> dict[str, Any]:
    run_jobs(client)
    job: dict[str, Any] = ok(client.get(f"/v1/jobs/{job_id}", headers=headers))
    assert job["status"] in ("done", "failed"), job
    return job


@pytest.fixture
def hidden(client: TestClient, people: People) -> None:
    """`salaries` (group hr), `review-ana.txt` (user ana), and an open handbook."""
    ok(client.post("/v1/collections", json={"name": "policies"}, headers=people.admin), 201)
    job = queue_texts(
        client,
        people.hr_writer,
        [
            {"external_id": SECRET, "text": SECRET_TEXT, "readers": ["group:hr"]},
            {"external_id": "handbook", "text": "Staff engineers get a laptop; pay is monthly."},
        ],
    )
    assert finished(client, job, people.hr_writer)["counts"]["new"] == 2
    upload = ok(
        client.post(
            "/v1/collections/policies/documents/files",
            files=[("files", (PRIVATE, PRIVATE_TEXT.encode(), "text/plain"))],
            data={"readers": "user:ana"},
            headers=people.hr_writer,
        ),
        202,
    )
    assert finished(client, upload["id"], people.hr_writer)["counts"]["new"] == 1


def stored(client: TestClient, external_id: str) -> tuple[str, list[str] | None, int]:
    """The document's text (its chunks'), readers and version, read as the system."""
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.read() as session:
        doc = session.scalar(select(Document).where(Document.external_id == external_id))
        assert doc is not None
        chunks = store.documents.document_chunks(session, doc.id)
        return " ".join(c.text for c in chunks), doc.readers, doc.version


def refusal(job: dict[str, Any]) -> tuple[dict[str, int], list[str]]:
    """What a job says of its documents: the counts that tell new from updated from unchanged,
    and its errors' texts."""
    counts = {key: job["counts"].get(key, 0) for key in ("new", "updated", "unchanged", "failed")}
    return counts, [error["error"] for error in job["errors"]]


OUTSIDERS = ["outsider_writer", "writer"]
ATTACKS: dict[str, dict[str, Any]] = {
    "take-over": {"text": "Nothing to see.", "readers": ["user:bob"]},
    "overwrite": {"text": "Nothing to see."},
    "open": {"text": SECRET_TEXT, "readers": []},
    "same-text": {"text": SECRET_TEXT, "readers": ["group:hr"]},  # a probe of its content
}


@pytest.mark.parametrize("attack", list(ATTACKS))
@pytest.mark.parametrize("who", OUTSIDERS)
def test_json_ingest_cannot_replace_or_probe_a_document_its_writer_may_not_read(
    client: TestClient, people: People, hidden: None, who: str, attack: str
) -> None:
    before = stored(client, SECRET)
    headers = getattr(people, who)
    job = finished(
        client, queue_texts(client, headers, [{"external_id": SECRET, **ATTACKS[attack]}]), headers
    )
    # The same refusal whatever was sent and whatever the document holds: no `updated` or
    # `unchanged` that would tell its content, nothing of it in the error.
    assert refusal(job) == ({"new": 0, "updated": 0, "unchanged": 0, "failed": 1}, [NOT_YOURS])
    assert "ninety" not in json.dumps(job) and "group:hr" not in json.dumps(job)
    assert stored(client, SECRET) == before
    found = ok(
        client.post(
            "/v1/search",
            json={"query": "salary bands", "collections": ["policies"], "mode": "fulltext"},
            headers=people.hr,
        )
    )
    assert SECRET in [hit["document"]["external_id"] for hit in found["results"]]


@pytest.mark.parametrize("form", [{"readers": ""}, {"readers": "user:bob"}, {}])
def test_an_upload_cannot_replace_a_document_its_writer_may_not_read(
    client: TestClient, people: People, hidden: None, form: dict[str, str]
) -> None:
    before = stored(client, PRIVATE)
    rows = json.dumps({"_id": SECRET, "text": "Rows can bear ids too."}).encode()
    job = ok(
        client.post(
            "/v1/collections/policies/documents/files",
            files=[
                ("files", (PRIVATE, b"Replaced by someone else.", "text/plain")),
                ("files", ("rows.jsonl", rows, "application/jsonl")),
                ("files", ("mine.txt", b"A note of my own.", "text/plain")),
            ],
            data=form,
            headers=people.writer,
        ),
        202,
    )
    done = finished(client, job["id"], people.writer)
    counts, errors = refusal(done)
    assert counts == {"new": 1, "updated": 0, "unchanged": 0, "failed": 2}
    assert errors == [NOT_YOURS, NOT_YOURS]
    assert stored(client, PRIVATE) == before
    assert stored(client, SECRET)[0] == SECRET_TEXT


def test_those_who_may_read_a_document_still_rewrite_and_re_permission_it(
    client: TestClient, people: People, hidden: None
) -> None:
    job = queue_texts(
        client,
        people.hr_writer,
        [
            {
                "external_id": SECRET,
                "text": "New bands: ninety-five thousand.",
                "readers": ["group:hr"],
            }
        ],
    )
    assert refusal(finished(client, job, people.hr_writer))[0]["updated"] == 1
    opened = queue_texts(client, people.admin, [{"external_id": PRIVATE, "text": "Open now."}])
    counts = refusal(finished(client, opened, people.admin))[0]
    assert counts["updated"] == 1 and stored(client, PRIVATE)[1] == ["user:ana"]  # kept


def test_patch_delete_and_get_are_the_same_404_as_for_a_missing_document(
    client: TestClient, people: People, hidden: None
) -> None:
    def attempts(external_id: str) -> list[tuple[int, str]]:
        path = f"/v1/collections/policies/documents/{external_id}"
        answers = [
            client.patch(path, json={"readers": ["user:bob"]}, headers=people.outsider_writer),
            client.patch(path, json={"readers": None}, headers=people.writer),
            client.delete(path, headers=people.outsider_writer),
            client.get(path, headers=people.outsider),
        ]
        return [(a.status_code, a.json()["detail"].replace(external_id, "ID")) for a in answers]

    assert attempts(SECRET) == attempts("no-such-document")
    assert all(status == 404 for status, _ in attempts(SECRET))
    assert stored(client, SECRET)[1] == ["group:hr"]


def test_a_writer_may_give_away_a_document_it_reads(
    client: TestClient, people: People, hidden: None
) -> None:
    """Readers that leave the calling writer out are set (an ingest may name such readers
    too); the writer no longer reads the document afterwards."""
    path = f"/v1/collections/policies/documents/{SECRET}"
    changed = ok(client.patch(path, json={"readers": ["group:board"]}, headers=people.hr_writer))
    assert changed["readers"] == ["group:board"]
    assert stored(client, SECRET)[1] == ["group:board"]
    assert client.get(path, headers=people.hr_writer).status_code == 404
    assert ok(client.get(path, headers=people.admin))["readers"] == ["group:board"]


def test_widening_readers_drops_the_cached_answers_built_without_the_document(
    client: TestClient, people: People, hidden: None
) -> None:
    ask = {"question": QUESTION, "collections": ["policies"], "k": 5}
    narrow = ok(client.post("/v1/query", json=ask, headers=people.outsider))
    assert SECRET not in json.dumps(narrow["sources"])
    assert ok(client.post("/v1/query", json=ask, headers=people.outsider))["cache"]["hit"]
    # ana's answer (built with the salary bands) and the admin's stay apart from this change.
    ok(
        client.patch(
            f"/v1/collections/policies/documents/{SECRET}",
            json={"readers": ["group:hr", "user:bob"]},
            headers=people.admin,
        )
    )
    widened = ok(client.post("/v1/query", json=ask, headers=people.outsider))
    assert widened["cache"]["hit"] is False
    assert SECRET in [s["document"]["external_id"] for s in widened["sources"]]
    # An unrelated asker's narrow answer survives a change that shows it nothing new.
    other = ok(client.post("/v1/query", json=ask, headers=people.no_user))
    ok(
        client.patch(
            f"/v1/collections/policies/documents/{SECRET}",
            json={"readers": ["group:hr", "user:bob", "group:board"]},
            headers=people.admin,
        )
    )
    again = ok(client.post("/v1/query", json=ask, headers=people.no_user))
    assert again["cache"]["hit"] is True and again["answer"] == other["answer"]


def test_an_upload_whose_rows_may_name_readers_is_hidden_from_others_from_the_start(
    client: TestClient, people: People
) -> None:
    ok(client.post("/v1/collections", json={"name": "policies"}, headers=people.admin), 201)
    rows = "\n".join(
        json.dumps({"_id": f"pay-{i}", "text": "", "readers": ["group:hr"]}) for i in range(3)
    )
    job = ok(
        client.post(
            "/v1/collections/policies/documents/files",
            files=[("files", ("payroll-2027.jsonl", rows.encode(), "application/jsonl"))],
            headers=people.writer,
        ),
        202,
    )

    def seen_by_others() -> bool:
        listed = json.dumps(ok(client.get("/v1/jobs", headers=people.outsider)))
        one = client.get(f"/v1/jobs/{job['id']}", headers=people.no_user)
        return job["id"] in listed or "payroll-2027" in listed or one.status_code != 404

    assert not seen_by_others()  # queued
    done = finished(client, job["id"], people.writer)  # every restricted row fails
    assert done["counts"]["failed"] == 3 and done["counts"]["new"] == 0
    assert not seen_by_others()
    assert ok(client.get(f"/v1/jobs/{job['id']}", headers=people.admin))["id"] == job["id"]


@pytest.fixture
def site() -> Iterator[str]:
    page = b"<html><head><title>Bands</title></head><body><p>The bands are public now.</p></body>"
    with slow_site({"/page.html": page + b"</html>"}) as (_site, base):
        yield f"{base}/page.html"


def test_a_source_cannot_replace_or_delete_a_document_its_adder_may_not_read(
    client: TestClient, people: People, site: str
) -> None:
    """hr stored a page under its URL; bob's source fetching that URL is refused the document
    and, once the page is gone, deletes nothing of hr's."""
    ok(client.post("/v1/collections", json={"name": "policies"}, headers=people.admin), 201)
    job = queue_texts(
        client,
        people.hr_writer,
        [{"external_id": site, "text": SECRET_TEXT, "readers": ["group:hr"]}],
    )
    assert refusal(finished(client, job, people.hr_writer))[0]["new"] == 1
    source = ok(
        client.post(
            "/v1/collections/policies/sources",
            json={"location": site, "options": {"depth": 0}},
            headers=people.outsider_writer,
        ),
        201,
    )
    run_jobs(client)
    path = f"/v1/collections/policies/sources/{source['id']}"
    shown = ok(client.get(path, headers=people.outsider_writer))
    assert shown["last_run"]["counts"]["added"] == 0
    assert NOT_YOURS in json.dumps(shown["last_run"])
    assert stored(client, site)[:2] == (SECRET_TEXT, ["group:hr"])
    removed = client.delete(
        path,
        params={"delete_documents": "true"},
        headers=people.outsider_writer,
    )
    assert removed.status_code in (200, 204), removed.text
    assert stored(client, site)[:2] == (SECRET_TEXT, ["group:hr"])


def test_an_admin_of_a_user_cannot_delete_a_collection_holding_what_it_may_not_read(
    client: TestClient, people: People, hidden: None
) -> None:
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.write() as session:
        bob_admin, ana_admin = (
            {"Authorization": f"Bearer {make_key(session, people.tenant_id, 'admin', user)}"}
            for user in ("bob", "ana")
        )
    refused = client.delete("/v1/collections/policies", headers=bob_admin)
    assert refused.status_code == 403 and "may not read" in refused.json()["detail"]
    assert stored(client, SECRET)[0] == SECRET_TEXT
    # ana reads both restricted documents: she may.
    assert client.delete("/v1/collections/policies", headers=ana_admin).status_code == 204
