"""Per-document permissions through the REST API: a user outside a document's readers never
receives its text, title, id, a citation of it or an answer built from it — by search (every
mode, filtered too), /v1/query, chat completions, the documents endpoints, the cache, feedback
and its export; and searches still return k results when most chunks are hidden."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from ragservice import store
from ragservice.db import tenancy
from ragservice.db.models import Chunk, Document, PromptCacheEntry, QueryLog
from tests.api.conftest import Keys, People, ok, wait_for_job

SECRET = "salaries"
SECRET_TITLE = "Salary bands"
SECRET_TEXT = "The board approved the salary bands: staff engineers earn ninety thousand euros."
SECRET_WORDS = ("ninety thousand", "salary bands", SECRET_TITLE)
QUESTION = "What do staff engineers earn in the salary bands?"


def ingest(client: TestClient, headers: dict[str, str], documents: list[dict[str, Any]]) -> None:
    job = ok(
        client.post(
            "/v1/collections/policies/documents", json={"documents": documents}, headers=headers
        ),
        202,
    )
    assert wait_for_job(client, job["id"], headers)["status"] == "done", job


@pytest.fixture
def corpus(client: TestClient, people: People) -> None:
    ok(client.post("/v1/collections", json={"name": "policies"}, headers=people.admin), 201)
    ingest(
        client,
        people.writer,
        [
            {
                "external_id": SECRET,
                "title": SECRET_TITLE,
                "text": SECRET_TEXT,
                "metadata": {"kind": "pay"},
                "readers": ["group:hr"],
            },
            {
                "external_id": "handbook",
                "title": "Handbook",
                "text": "Staff engineers receive a laptop on their first day; pay is monthly.",
                "metadata": {"kind": "pay"},
            },
            {
                "external_id": "minutes",
                "title": "Board minutes",
                "text": "The board discussed the salary bands of staff engineers in private.",
                "readers": ["user:ceo"],
            },
        ],
    )


def leaks(payload: Any, external_id: str = SECRET) -> list[str]:
    """What of the document `external_id` a response shows: its words, title or ids."""
    text = json.dumps(payload)
    found = [word for word in SECRET_WORDS if external_id == SECRET and word in text]
    if f'"{external_id}"' in text:
        found.append(external_id)
    return found


def document_id(client: TestClient, external_id: str) -> str:
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.read() as session:
        found = session.scalar(select(Document.id).where(Document.external_id == external_id))
    assert found is not None
    return str(found)


@pytest.mark.parametrize("mode", ["dense", "fulltext", "hybrid"])
@pytest.mark.parametrize("filtered", [False, True], ids=["all", "filtered"])
def test_search_shows_a_document_to_its_readers_only(
    client: TestClient, people: People, corpus: None, mode: str, filtered: bool
) -> None:
    body: dict[str, Any] = {"query": QUESTION, "collections": ["policies"], "mode": mode, "k": 5}
    if filtered:
        body["filters"] = {"kind": "pay"}
    secret_id = document_id(client, SECRET)

    def search(headers: dict[str, str]) -> dict[str, Any]:
        result: dict[str, Any] = ok(client.post("/v1/search", json=body, headers=headers))
        return result

    for outsider in (people.outsider, people.no_user):
        found = search(outsider)
        assert leaks(found) == [] and secret_id not in json.dumps(found)
        assert leaks(found, "minutes") == []
        assert found["results"], "the unrestricted document is still found"
    assert SECRET in [hit["document"]["external_id"] for hit in search(people.hr)["results"]]
    assert leaks(search(people.hr), "minutes") == []  # ana is not the ceo
    admin = [hit["document"]["external_id"] for hit in search(people.admin)["results"]]
    assert SECRET in admin
    if not filtered:
        assert "minutes" in admin


@pytest.mark.parametrize("mode", ["dense", "fulltext", "hybrid"])
def test_searches_return_k_results_when_most_chunks_are_hidden(
    client: TestClient, people: People, mode: str
) -> None:
    """40 restricted documents on the topic and 6 open ones: the outsider still gets k = 5."""
    ok(client.post("/v1/collections", json={"name": "policies"}, headers=people.admin), 201)
    hidden = [
        {
            "external_id": f"secret-{i}",
            "text": f"Expense policy {i}: travel expenses are refunded within {i + 3} days.",
            "readers": ["group:finance"],
        }
        for i in range(40)
    ]
    open_ = [
        {"external_id": f"open-{i}", "text": f"Open note {i}: travel expenses need a receipt."}
        for i in range(6)
    ]
    ingest(client, people.writer, hidden + open_)
    body = {"query": "travel expenses refunded", "collections": ["policies"], "mode": mode, "k": 5}
    found = ok(client.post("/v1/search", json=body, headers=people.outsider))["results"]
    assert len(found) == 5
    assert all(hit["document"]["external_id"].startswith("open-") for hit in found)
    everyone = ok(client.post("/v1/search", json=body, headers=people.admin))["results"]
    assert any(hit["document"]["external_id"].startswith("secret-") for hit in everyone)


def test_query_and_chat_answer_from_readable_documents_only(
    client: TestClient, people: People, corpus: None
) -> None:
    ask = {"question": QUESTION, "collections": ["policies"], "k": 5, "cache": False}
    outsider = ok(client.post("/v1/query", json=ask, headers=people.outsider))
    assert leaks(outsider) == [] and leaks(outsider, "minutes") == []
    assert document_id(client, SECRET) not in json.dumps(outsider)
    insider = ok(client.post("/v1/query", json=ask, headers=people.hr))
    assert SECRET in [s["document"]["external_id"] for s in insider["sources"]]

    chat = {"model": "rag:policies", "messages": [{"role": "user", "content": QUESTION}]}
    reply = ok(client.post("/v1/chat/completions", json=chat, headers=people.outsider))
    assert leaks(reply) == [] and leaks(reply, "minutes") == []
    streamed = client.post(
        "/v1/chat/completions", json={**chat, "stream": True}, headers=people.outsider
    )
    assert streamed.status_code == 200
    assert all(word not in streamed.text for word in SECRET_WORDS)
    insider_chat = ok(client.post("/v1/chat/completions", json=chat, headers=people.hr))
    assert "ninety thousand" in json.dumps(insider_chat)


def test_documents_endpoints_hide_what_the_caller_may_not_read(
    client: TestClient, people: People, corpus: None
) -> None:
    listed = ok(client.get("/v1/collections/policies/documents", headers=people.outsider))
    assert [d["external_id"] for d in listed["documents"]] == ["handbook"]
    for method, path, body in (
        ("GET", f"/v1/collections/policies/documents/{SECRET}", None),
        ("GET", f"/v1/collections/policies/documents/{SECRET}?chunks=true", None),
        ("PATCH", f"/v1/collections/policies/documents/{SECRET}", {"readers": None}),
        ("DELETE", f"/v1/collections/policies/documents/{SECRET}", None),
    ):
        headers = people.writer if method != "GET" else people.outsider
        refused = client.request(method, path, json=body, headers=headers)
        assert refused.status_code == 404, (method, path, refused.text)
        assert all(word not in refused.text for word in SECRET_WORDS)
    mine = ok(
        client.get(f"/v1/collections/policies/documents/{SECRET}?chunks=true", headers=people.hr)
    )
    assert mine["readers"] == ["group:hr"] and "ninety thousand" in mine["chunks"][0]["text"]
    everything = ok(client.get("/v1/collections/policies/documents", headers=people.admin))
    assert [d["external_id"] for d in everything["documents"]] == ["handbook", "minutes", SECRET]


def test_changing_readers_takes_effect_at_once_without_reembedding(
    client: TestClient, people: People, corpus: None
) -> None:
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.read() as session:
        before = session.scalar(select(Document.version).where(Document.external_id == SECRET))
    changed = ok(
        client.patch(
            f"/v1/collections/policies/documents/{SECRET}",
            json={"readers": ["user:bob", "group:hr"]},
            headers=people.admin,
        )
    )
    assert changed["readers"] == ["group:hr", "user:bob"] and changed["version"] == before
    with tenancy.as_system(), db.read() as session:
        chunk_readers = session.scalars(
            select(Chunk.readers).join(Document).where(Document.external_id == SECRET)
        ).all()
    assert chunk_readers and all(r == ["group:hr", "user:bob"] for r in chunk_readers)
    body = {"query": QUESTION, "collections": ["policies"], "k": 5}
    found = ok(client.post("/v1/search", json=body, headers=people.outsider))
    assert SECRET in [hit["document"]["external_id"] for hit in found["results"]]
    # To the whole tenant, then back; bad readers are a 422 that names the problem.
    opened = client.patch(
        f"/v1/collections/policies/documents/{SECRET}", json={"readers": []}, headers=people.admin
    )
    assert ok(opened)["readers"] is None
    bad = client.patch(
        f"/v1/collections/policies/documents/{SECRET}",
        json={"readers": ["hr"]},
        headers=people.admin,
    )
    assert bad.status_code == 422 and "user:<name> or group:<name>" in bad.text
    audit = ok(client.get("/v1/audit", params={"action": "document.readers"}, headers=people.admin))
    assert len([e for e in audit["entries"] if e["action"] == "document.readers"]) == 2


def test_a_cached_answer_is_served_only_to_askers_who_may_read_its_sources(
    client: TestClient, people: People, corpus: None
) -> None:
    ask = {"question": QUESTION, "collections": ["policies"], "k": 5}
    first = ok(client.post("/v1/query", json=ask, headers=people.hr))
    assert first["cache"]["hit"] is False and "ninety thousand" in json.dumps(first)
    again = ok(client.post("/v1/query", json=ask, headers=people.hr))
    assert again["cache"]["hit"] is True

    outsider = ok(client.post("/v1/query", json=ask, headers=people.outsider))
    assert outsider["cache"]["hit"] is False
    assert leaks(outsider) == []
    # The outsider's own answer (from the open document) is an entry of its own ...
    assert ok(client.post("/v1/query", json=ask, headers=people.outsider))["cache"]["hit"]
    # ... never served to ana, who reads more (her own search finds better sources) ...
    assert "ninety thousand" in json.dumps(
        ok(client.post("/v1/query", json=ask, headers=people.hr))
    )
    # ... nor to the admin, who reads every document: its answer is made afresh, and kept.
    admin = ok(client.post("/v1/query", json=ask, headers=people.admin))
    assert admin["cache"]["hit"] is False
    # A key of no user reads less than bob: it is served bob's entry (all its sources are
    # open), never the admin's or ana's (built on the salary bands).
    narrow = ok(client.post("/v1/query", json=ask, headers=people.no_user))
    assert narrow["cache"]["hit"] is True and narrow["answer"] == outsider["answer"]
    assert leaks(narrow) == []

    db = client.app.state.runtime.db  # type: ignore[attr-defined]

    def entries() -> int:
        with tenancy.as_system(), db.read() as session:
            return int(session.scalar(select(func.count()).select_from(PromptCacheEntry)) or 0)

    built_on_secret = entries()
    ok(
        client.patch(
            f"/v1/collections/policies/documents/{SECRET}",
            json={"readers": ["group:finance"]},
            headers=people.admin,
        )
    )
    assert entries() == built_on_secret - 2  # ana's and the admin's went with the change
    now = ok(client.post("/v1/query", json=ask, headers=people.hr))
    assert leaks(now) == []


def test_the_query_log_and_feedback_record_the_asker_and_exports_keep_to_readers(
    client: TestClient, people: People, corpus: None
) -> None:
    ask = {"question": QUESTION, "collections": ["policies"], "k": 5, "cache": False}
    insider = ok(client.post("/v1/query", json=ask, headers=people.hr))
    outsider = ok(client.post("/v1/query", json=ask, headers=people.outsider))
    for answer, headers in ((insider, people.hr), (outsider, people.outsider)):
        ok(
            client.post(
                "/v1/feedback", json={"query_id": answer["query_id"], "rating": 1}, headers=headers
            ),
            201,
        )
    # bob may not give feedback on (nor learn of) ana's answer: it was built from her documents.
    on_insider = {"query_id": insider["query_id"], "rating": -1}
    refused = client.post("/v1/feedback", json=on_insider, headers=people.outsider)
    assert refused.status_code == 404
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.read() as session:
        askers = dict(session.execute(select(QueryLog.id, QueryLog.asker)).all())
    assert askers[uuid.UUID(insider["query_id"])] == "user:ana"
    assert askers[uuid.UUID(outsider["query_id"])] == "user:bob"
    export = client.get(
        "/v1/feedback/export", params={"format": "openai-sft"}, headers=people.admin
    )
    assert export.status_code == 200 and "ninety thousand" in export.text


def test_the_database_hides_restricted_rows_from_a_transaction_that_names_no_reader(
    client: TestClient, people: People, corpus: None
) -> None:
    """Row-level security, not Python: raw reads in each tenancy."""
    db = client.app.state.runtime.db  # type: ignore[attr-defined]

    def visible(readers: frozenset[str] | None) -> set[str]:
        with (
            tenancy.within(tenancy.Tenancy(tenant_id=people.tenant_id, readers=readers)),
            db.read() as session,
        ):
            documents = set(session.scalars(select(Document.external_id)))
            chunks = {
                external_id
                for external_id in session.scalars(
                    select(Document.external_id).join(
                        Chunk,
                        (Chunk.document_id == Document.id)
                        & (Chunk.tenant_id == Document.tenant_id),
                    )
                )
            }
            raw = session.scalar(select(func.count()).select_from(Chunk))
        assert len(chunks) <= len(documents) and raw is not None
        return documents

    assert visible(frozenset()) == {"handbook"}  # fail closed: no principal named
    assert visible(frozenset({"group:hr", "user:ana"})) == {"handbook", SECRET}
    assert visible(frozenset({"user:ceo"})) == {"handbook", "minutes"}
    assert visible(None) == {"handbook", "minutes", SECRET}  # every document of the tenant
    with db.read() as session:  # no tenancy at all: nothing
        assert session.scalar(select(func.count()).select_from(Document)) == 0


def test_group_membership_is_read_at_each_request(
    client: TestClient, people: People, corpus: None
) -> None:
    body = {"query": QUESTION, "collections": ["policies"], "k": 5}
    assert SECRET in json.dumps(ok(client.post("/v1/search", json=body, headers=people.hr)))
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.write() as session:
        store.tenants.remove_group_members(session, people.tenant_id, "hr", ["ana"])
    assert leaks(ok(client.post("/v1/search", json=body, headers=people.hr))) == []


def test_readers_on_upload_and_jsonl_rows(client: TestClient, people: People) -> None:
    ok(client.post("/v1/collections", json={"name": "policies"}, headers=people.admin), 201)
    rows = "\n".join(
        json.dumps(row)
        for row in (
            {"_id": "row-open", "text": "Lunch is served at noon in the canteen."},
            {"_id": "row-hr", "text": "Lunch vouchers for hr only.", "readers": ["group:hr"]},
            {"_id": "row-bad", "text": "Lunch.", "readers": ["nobody"]},
        )
    )
    job = ok(
        client.post(
            "/v1/collections/policies/documents/files",
            files=[
                ("files", ("rows.jsonl", rows.encode(), "application/jsonl")),
                ("files", ("note.txt", b"Lunch is free on Fridays.", "text/plain")),
            ],
            data={"readers": "user:ana"},
            headers=people.writer,
        ),
        202,
    )
    done = wait_for_job(client, job["id"], people.writer)
    assert [e["source"] for e in done["errors"]] and "user:<name>" in done["errors"][0]["error"]
    listed = ok(client.get("/v1/collections/policies/documents", headers=people.admin))
    readers = {d["external_id"]: d["readers"] for d in listed["documents"]}
    assert readers == {
        "row-open": ["user:ana"],  # the upload's readers
        "row-hr": ["group:hr"],  # the row's own win
        "note.txt": ["user:ana"],
    }
    bad_form = client.post(
        "/v1/collections/policies/documents/files",
        files=[("files", ("x.txt", b"x", "text/plain"))],
        data={"readers": "everyone"},
        headers=people.writer,
    )
    assert bad_form.status_code == 422, bad_form.text


def test_another_tenant_cannot_change_readers(
    client: TestClient, people: People, keys: Keys, corpus: None
) -> None:
    refused = client.patch(
        "/v1/collections/policies/documents/handbook",
        json={"readers": ["user:mallory"]},
        headers=keys.other_tenant,
    )
    assert refused.status_code == 404
    handbook = ok(client.get("/v1/collections/policies/documents/handbook", headers=people.admin))
    assert handbook["readers"] is None


def test_a_writer_who_may_not_read_every_source_still_cleans_up_after_a_deletion(
    client: TestClient, people: People, corpus: None
) -> None:
    """ana's answer was built on the salary bands (hidden from bob) and the handbook. When bob
    deletes the handbook, her cached answer and the logged answer go too, though bob may not
    see them: the documents' triggers reach every row built on the deleted document."""
    ask = {"question": QUESTION, "collections": ["policies"], "k": 5}
    answer = ok(client.post("/v1/query", json=ask, headers=people.hr))
    assert {s["document"]["external_id"] for s in answer["sources"]} >= {SECRET, "handbook"}
    db = client.app.state.runtime.db  # type: ignore[attr-defined]

    def state() -> tuple[int, Any]:
        with tenancy.as_system(), db.read() as session:
            entries = session.scalar(select(func.count()).select_from(PromptCacheEntry))
            logged = session.scalar(
                select(QueryLog).where(QueryLog.id == uuid.UUID(answer["query_id"]))
            )
            assert logged is not None
            return int(entries or 0), logged.redacted_at

    assert state()[0] == 1 and state()[1] is None
    deleted = client.delete(
        "/v1/collections/policies/documents/handbook", headers=people.outsider_writer
    )
    assert deleted.status_code == 204
    entries, redacted_at = state()
    assert entries == 0 and redacted_at is not None
    # The readers trigger reaches hidden entries too: an admin's answer built on the salary
    # bands goes when a writer who may read them changes their readers.
    ok(client.post("/v1/query", json=ask, headers=people.admin))
    assert state()[0] == 1
    ok(
        client.patch(
            f"/v1/collections/policies/documents/{SECRET}",
            json={"readers": ["group:hr", "user:bob"]},
            headers=people.admin,
        )
    )
    assert state()[0] == 0


def test_a_job_that_names_readers_is_shown_to_its_asker_and_to_those_who_read_everything(
    client: TestClient, people: People
) -> None:
    ok(client.post("/v1/collections", json={"name": "policies"}, headers=people.admin), 201)
    job = ok(
        client.post(
            "/v1/collections/policies/documents/files",
            files=[
                ("files", ("payroll-secret.txt", b"Payroll.", "text/plain")),
                ("files", ("broken.pdf", b"not a pdf", "application/pdf")),
            ],
            data={"readers": "group:hr"},
            headers=people.writer,
        ),
        202,
    )
    done = wait_for_job(client, job["id"], people.writer)  # its asker sees it
    assert done["errors"] and done["counts"]["new"] == 1
    assert ok(client.get(f"/v1/jobs/{job['id']}", headers=people.admin))["id"] == job["id"]
    for outsider in (people.outsider, people.no_user):
        assert client.get(f"/v1/jobs/{job['id']}", headers=outsider).status_code == 404
        listed = ok(client.get("/v1/jobs", headers=outsider))
        assert job["id"] not in json.dumps(listed) and "payroll-secret" not in json.dumps(listed)
    # A job of open documents stays visible to every reader.
    ingest(client, people.writer, [{"external_id": "open", "text": "Open to all."}])
    assert ok(client.get("/v1/jobs", headers=people.outsider))["jobs"]


def test_restricted_exact_full_text_reads_deeper_until_enough_chunks_are_visible(
    client: TestClient, people: People, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exact extension's top is taken deeper while too few of it are visible: from a
    depth of k (every chunk in it hidden) to 8 k, then 64 k."""
    from ragservice.retrieval import restricted

    ok(client.post("/v1/collections", json={"name": "policies"}, headers=people.admin), 201)
    hidden = [
        {
            "external_id": f"secret-{i}",
            "text": f"Travel expenses, travel expenses and travel refunds, case {i}.",
            "readers": ["group:finance"],
        }
        for i in range(60)
    ]
    visible = [{"external_id": "open", "text": "A note on travel among other things."}]
    ingest(client, people.writer, hidden + visible)
    monkeypatch.setattr(restricted, "DEPTH_FACTOR", 1)
    body = {"query": "travel expenses", "collections": ["policies"], "mode": "fulltext", "k": 1}
    found = ok(client.post("/v1/search", json=body, headers=people.outsider))["results"]
    assert [hit["document"]["external_id"] for hit in found] == ["open"]
    hybrid = ok(client.post("/v1/search", json=body | {"mode": "hybrid"}, headers=people.outsider))
    assert [hit["document"]["external_id"] for hit in hybrid["results"]] == ["open"]
