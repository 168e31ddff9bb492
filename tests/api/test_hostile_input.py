"""Hostile input over HTTP: a clear 4xx, or a per-file error in the job, and nothing half-written.

Each upload mixes the hostile file with a good one: the job must report the bad file by name,
store the good one, and leave no document (hence no chunk) of the bad one.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from psycopg import DataError as DriverDataError
from sqlalchemy import select

from ragservice import store
from ragservice.config import Settings
from ragservice.db import tenancy
from ragservice.db.models import QueryLog
from tests.api.conftest import Keys, ok, wait_for_job
from tests.unit.test_loaders import encrypt_pdf, make_pdf, zip_bomb_docx

GOOD = ("good.txt", b"A perfectly ordinary document about kittens.", "text/plain")


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    # Many requests in a row: the rate limit is not what these tests are about. Page and
    # character limits small enough to test; the job worker reads them from these settings.
    update = {
        "job_poll_seconds": 0.2,
        "workers": 1,
        "rate_limit_per_second": 0.0,
        "max_document_pages": 2,
        "max_document_chars": 300_000,
    }
    return settings.model_copy(update=update)


@pytest.fixture
def kb(client: TestClient, keys: Keys) -> str:
    ok(client.post("/v1/collections", json={"name": "kb"}, headers=keys.writer), 201)
    return "kb"


def error(response: Any, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) >= {"error", "detail", "request_id"}
    return str(body["detail"])


def upload(client: TestClient, keys: Keys, *files: tuple[str, bytes, str]) -> dict[str, Any]:
    response = client.post(
        "/v1/collections/kb/documents/files",
        files=[("files", file) for file in files],
        headers=keys.writer,
    )
    job = wait_for_job(
        client, ok(response, 202)["id"], keys.writer
    )  # rows may name readers: its own
    assert job["status"] == "done", job
    return job


def stored_ids(client: TestClient, keys: Keys) -> list[str]:
    page = ok(client.get("/v1/collections/kb/documents", headers=keys.reader))
    return [doc["external_id"] for doc in page["documents"]]


def file_errors(job: dict[str, Any]) -> dict[str, str]:
    return {e["source"]: e["error"] for e in job["errors"]}


def chunks_of(client: TestClient, keys: Keys, external_id: str) -> list[dict[str, Any]]:
    url = f"/v1/collections/kb/documents/{quote(external_id, safe='')}?chunks=true"
    detail = ok(client.get(url, headers=keys.reader))
    chunks: list[dict[str, Any]] = detail["chunks"]
    return chunks


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# --------------------------------------------------------------------------- files in jobs


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("bomb.docx", zip_bomb_docx(), "refused: 'word/media/zeros.bin' is compressed"),
        ("secret.pdf", encrypt_pdf(make_pdf(["Secret."]), "hunter2"), "PDF is encrypted"),
        ("cut.pdf", make_pdf(["Hello PDF world."])[:150], "not a valid PDF: "),
        ("text.pdf", b"I am plain text, not a PDF.", "not a valid PDF: it has no %PDF- header"),
    ],
    ids=["docx-zip-bomb", "encrypted-pdf", "truncated-pdf", "text-named-pdf"],
)
def test_a_hostile_file_is_a_per_file_error_and_the_good_one_is_stored(
    client: TestClient, keys: Keys, kb: str, name: str, data: bytes, reason: str
) -> None:
    job = upload(client, keys, (name, data, "application/octet-stream"), GOOD)
    assert file_errors(job)[name].startswith(reason)
    assert (job["counts"]["new"], job["counts"]["failed"]) == (1, 1)
    assert stored_ids(client, keys) == ["good.txt"]


def test_nul_bytes_and_invalid_utf8_are_cleaned_not_stored(
    client: TestClient, keys: Keys, kb: str
) -> None:
    latin1 = (
        "latin1.txt",
        "Caf\u00e9 cr\u00e8me, tr\u00e8s bon.\x00".encode("cp1252"),
        "text/plain",
    )
    rows = b'{"_id": "row\\u0000", "text": "nul\\u0000row"}\n{"_id": "bad", "text": "caf\xe9"}\n'
    job = upload(client, keys, latin1, ("rows.jsonl", rows, "application/jsonl"))
    assert job["errors"] == []
    assert stored_ids(client, keys) == ["bad", "latin1.txt", "row"]
    texts = [chunks_of(client, keys, i)[0]["text"] for i in ("latin1.txt", "row", "bad")]
    assert texts == ["Caf\u00e9 cr\u00e8me, tr\u00e8s bon.", "nulrow", "caf\u00e9"]


def test_nul_in_a_json_document_text_is_dropped_and_in_its_id_refused(
    client: TestClient, keys: Keys, kb: str
) -> None:
    docs = {"documents": [{"external_id": "n", "text": "a\x00b"}]}
    job = ok(client.post("/v1/collections/kb/documents", json=docs, headers=keys.writer), 202)
    assert wait_for_job(client, job["id"], keys.reader)["status"] == "done"
    assert chunks_of(client, keys, "n")[0]["text"] == "ab"
    bad = {"documents": [{"external_id": "x\x00y", "text": "t"}]}
    detail = error(client.post("/v1/collections/kb/documents", json=bad, headers=keys.writer), 422)
    assert "documents.0.external_id" in detail and "NUL" in detail
    assert stored_ids(client, keys) == ["n"]


def test_a_huge_single_line_chunks_and_one_over_the_limit_fails(
    client: TestClient, keys: Keys, kb: str
) -> None:
    words = "kitten " * 40_000  # 280,000 characters and not one newline
    line = ("line.txt", words.encode(), "text/plain")
    over = ("over.txt", (words + "x" * 30_000).encode(), "text/plain")
    job = upload(client, keys, line, over)
    assert file_errors(job) == {
        "over.txt": "the text has 310000 characters; the limit is 300000 "
        "(RAGSERVICE_MAX_DOCUMENT_CHARS)"
    }
    chunks = chunks_of(client, keys, "line.txt")
    assert len(chunks) > 100
    assert max(c["token_count"] for c in chunks) <= 256
    assert stored_ids(client, keys) == ["line.txt"]


def test_a_pdf_over_the_page_limit_is_a_per_file_error(
    client: TestClient, keys: Keys, kb: str
) -> None:
    pdf = ("long.pdf", make_pdf(["One.", "Two.", "Three."]), "application/pdf")
    job = upload(client, keys, pdf, GOOD)
    assert file_errors(job) == {
        "long.pdf": "the PDF has 3 pages; the limit is 2 (RAGSERVICE_MAX_DOCUMENT_PAGES)"
    }
    assert stored_ids(client, keys) == ["good.txt"]


def test_a_deeply_nested_jsonl_row_fails_alone(client: TestClient, keys: Keys, kb: str) -> None:
    deep = b'{"_id": "deep", "text": "t", "metadata": {"a": ' + nested(10_000).encode() + b"}}"
    rows = deep + b'\n{"_id": "fine", "text": "Fine."}\n'
    job = upload(client, keys, ("rows.jsonl", rows, "application/jsonl"))
    assert file_errors(job) == {"rows.jsonl:1": "invalid JSON: nested too deeply"}
    assert stored_ids(client, keys) == ["fine"]


# --------------------------------------------------------------------------- request bodies


def test_deeply_nested_json_is_a_clear_4xx(client: TestClient, keys: Keys, kb: str) -> None:
    headers = {**keys.writer, "Content-Type": "application/json"}
    body = '{"documents": [{"text": "t", "metadata": {"a": ' + nested(10_000) + "}}]}"
    post = client.post("/v1/collections/kb/documents", content=body.encode(), headers=headers)
    assert error(post, 400) == "request body is nested too deeply to parse"
    docs = {"documents": [{"text": "t", "metadata": {"a": json_nested(100)}}]}
    detail = error(client.post("/v1/collections/kb/documents", json=docs, headers=keys.writer), 422)
    assert "documents.0.metadata" in detail and "deeper than 32 levels" in detail
    for deep in (json_nested(100), json_nested(500)):
        search = {"query": "kittens", "filters": {"a": deep}}
        detail = error(client.post("/v1/search", json=search, headers=keys.reader), 422)
        assert "filters" in detail and "deeper than 32 levels" in detail
    collection = {"name": "deep", "metadata": {"a": json_nested(100)}}
    error(client.post("/v1/collections", json=collection, headers=keys.writer), 422)
    form = client.post(
        "/v1/collections/kb/documents/files",
        files=[("files", GOOD)],
        data={"metadata": '{"a": ' + nested(10_000) + "}"},
        headers=keys.writer,
    )
    assert "metadata" in error(form, 400)
    assert stored_ids(client, keys) == []


def json_nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_wrong_content_types_are_415(client: TestClient, keys: Keys, kb: str) -> None:
    as_text = client.post(
        "/v1/search",
        content=b'{"query": "kittens"}',
        headers={**keys.reader, "Content-Type": "text/plain"},
    )
    assert error(as_text, 415) == "send the request body as application/json, not text/plain"
    as_form = client.post("/v1/search", data={"query": "kittens"}, headers=keys.reader)
    assert "application/json" in error(as_form, 415)
    json_upload = client.post(
        "/v1/collections/kb/documents/files", json={"files": ["a.txt"]}, headers=keys.writer
    )
    assert "multipart/form-data" in error(json_upload, 415)
    unsupported = client.post(
        "/v1/collections/kb/documents/files",
        files=[("files", ("tool.exe", b"MZ", "application/octet-stream"))],
        headers=keys.writer,
    )
    assert "unsupported file type" in error(unsupported, 415)
    assert stored_ids(client, keys) == []


# --------------------------------------------------------------------------- ids and filters


def test_path_like_external_ids_are_opaque_strings(client: TestClient, keys: Keys, kb: str) -> None:
    ids = ["../../etc/passwd", "/abs/path", "a\\b", "C:\\Windows\\win.ini", "é" * 512]
    docs = {"documents": [{"external_id": i, "text": f"Document {n}."} for n, i in enumerate(ids)]}
    job = ok(client.post("/v1/collections/kb/documents", json=docs, headers=keys.writer), 202)
    assert wait_for_job(client, job["id"], keys.reader)["counts"]["new"] == len(ids)
    assert sorted(stored_ids(client, keys)) == sorted(ids)
    for n, external_id in enumerate(ids):
        assert chunks_of(client, keys, external_id)[0]["text"] == f"Document {n}."
    url = f"/v1/collections/kb/documents/{quote('../../etc/passwd', safe='')}"
    ok(client.delete(url, headers=keys.writer), 204)
    assert "../../etc/passwd" not in stored_ids(client, keys)


def test_over_long_ids_and_file_names_are_refused(client: TestClient, keys: Keys, kb: str) -> None:
    emoji = "\U0001f600" * 257  # 257 characters, 1028 bytes: the byte limit decides
    docs = {"documents": [{"external_id": emoji, "text": "t"}]}
    detail = error(client.post("/v1/collections/kb/documents", json=docs, headers=keys.writer), 422)
    assert "longer than 1024 bytes" in detail
    name = "n" * 1100 + ".txt"
    response = client.post(
        "/v1/collections/kb/documents/files",
        files=[("files", (name, b"text", "text/plain")), ("files", GOOD)],
        headers=keys.writer,
    )
    assert "longer than 1024 bytes" in error(response, 422)
    # An upload's path is not kept: only its base name, so `..` cannot climb anywhere.
    job = upload(client, keys, ("../../etc/passwd.txt", b"Not a password file.", "text/plain"))
    assert job["errors"] == []
    assert stored_ids(client, keys) == ["passwd.txt"]


@pytest.mark.parametrize(
    "filters",
    [
        {"year": {"$gte": "1; DROP TABLE documents"}},
        {"a'); DROP TABLE documents; --": 1},
        {'document.x" OR 1=1 --': {"$in": ["'; DELETE FROM chunks; --"]}},
        {"chunk.') OR true --": {"$exists": True}},
    ],
)
def test_filters_that_try_sql_are_plain_values(
    client: TestClient, keys: Keys, kb: str, filters: dict[str, Any]
) -> None:
    job = upload(client, keys, GOOD)
    assert job["counts"]["new"] == 1
    search = {"query": "kittens", "filters": filters, "mode": "fulltext"}
    assert ok(client.post("/v1/search", json=search, headers=keys.reader))["results"] == []
    plain = {"query": "kittens", "mode": "fulltext"}
    hits = ok(client.post("/v1/search", json=plain, headers=keys.reader))["results"]
    assert [hit["document"]["external_id"] for hit in hits] == ["good.txt"]


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        ({"a": {"$where": "1=1"}}, "unknown filter operator '$where'"),
        ({"a": {"$regex": ".*"}}, "unknown filter operator '$regex'"),
        ({"$or": [{"a": 1}]}, "unknown filter field '$or'"),
        ({"a": {"$gte": [1]}}, "$gte on 'a' takes a number or a string"),
        ({"a": {"$gt": 1, "b": 2}}, "cannot mix operators and plain keys"),
    ],
)
def test_unknown_or_malformed_filter_operators_are_422(
    client: TestClient, keys: Keys, kb: str, filters: dict[str, Any], message: str
) -> None:
    search = {"query": "kittens", "filters": filters}
    assert message in error(client.post("/v1/search", json=search, headers=keys.reader), 422)


# --------------------------------------------------------------------------- unstorable text

SURROGATE = "\ud800"  # valid JSON ("\ud800"), but no UTF-8 can hold it


def post_json(client: TestClient, url: str, body: Any, headers: dict[str, str]) -> Any:
    """`body` as JSON with escapes (a lone surrogate stays the `\\ud800` a client sends)."""
    raw = json.dumps(body).encode()
    return client.post(url, content=raw, headers={**headers, "Content-Type": "application/json"})


def chat_body(messages: list[dict[str, Any]], model: str = "rag:kb") -> dict[str, Any]:
    return {"model": model, "messages": messages}


@pytest.mark.parametrize("bad", [SURROGATE, "\x00"], ids=["surrogate", "nul"])
def test_unstorable_text_is_a_422_naming_the_field_everywhere(
    client: TestClient, keys: Keys, kb: str, bad: str
) -> None:
    text = f"a{bad}b"
    user = [{"role": "user", "content": "hello"}]
    cases: list[tuple[str, Any, str]] = [
        ("/v1/embeddings", {"input": text}, "input"),
        ("/v1/embeddings", {"input": ["fine", text]}, "input"),
        ("/v1/embeddings", {"input": "fine", "model": text}, "model"),
        ("/v1/chat/completions", chat_body([{"role": "user", "content": text}]), "messages.0"),
        (
            "/v1/chat/completions",
            chat_body([{"role": "user", "content": [{"type": "text", "text": text}]}]),
            "messages.0.content",
        ),
        ("/v1/chat/completions", chat_body(user, model=f"rag:{text}"), "model"),
        (  # an earlier turn, which used to be answered and then not logged
            "/v1/chat/completions",
            chat_body(
                [{"role": "user", "content": text}, {"role": "assistant", "content": "x"}, *user]
            ),
            "messages.0.content",
        ),
        (
            "/v1/collections/kb/documents",
            {"documents": [{"external_id": text, "text": "t"}]},
            "documents.0.external_id",
        ),
        (
            "/v1/collections/kb/documents",
            {"documents": [{"title": text, "text": "t"}]},
            "documents.0.title",
        ),
        (
            "/v1/collections/kb/documents",
            {"documents": [{"text": "t", "metadata": {text: 1}}]},
            "documents.0.metadata",
        ),
        (
            "/v1/collections/kb/documents",
            {"documents": [{"text": "t", "metadata": {"k": [text]}}]},
            "documents.0.metadata",
        ),
        ("/v1/search", {"query": text}, "query"),
        ("/v1/search", {"query": "q", "filters": {"k": {"$in": [text]}}}, "filters"),
        ("/v1/search", {"query": "q", "collections": ["kb", text]}, "collections.1"),
        ("/v1/query", {"question": text}, "question"),
        ("/v1/collections", {"name": "c", "description": text}, "description"),
        ("/v1/collections", {"name": "c", "metadata": {"k": text}}, "metadata"),
    ]
    problem = "lone UTF-16 surrogate" if bad == SURROGATE else "NUL"
    for url, body, field in cases:
        response = post_json(client, url, body, keys.admin)
        detail = error(response, 422)
        assert detail.startswith(field) and problem in detail, (url, body, detail)
    form = client.post(
        "/v1/collections/kb/documents/files",
        files=[("files", GOOD)],
        data={"metadata": json.dumps({"k": text}), "jsonl_fields": "id=x"},
        headers=keys.writer,
    )
    assert error(form, 422).startswith("metadata: a key or string value")
    assert stored_ids(client, keys) == []


def test_a_nul_in_a_path_or_query_parameter_is_a_422_naming_it(
    client: TestClient, keys: Keys, kb: str
) -> None:
    detail = error(client.get("/v1/collections/kb%00x", headers=keys.reader), 422)
    assert detail == "name: must not contain NUL characters (U+0000)"
    listing = client.get("/v1/collections/kb/documents?after=a%00", headers=keys.reader)
    assert error(listing, 422).startswith("after: must not contain NUL")
    assert error(client.get("/v1/jobs?collection=%00", headers=keys.reader), 422).startswith(
        "collection:"
    )


def test_a_file_type_is_judged_alike_at_upload_and_in_the_job(
    client: TestClient, keys: Keys, kb: str
) -> None:
    for name in (".txt", "evil.exe", "noext"):
        response = client.post(
            "/v1/collections/kb/documents/files",
            files=[("files", (name, b"text", "text/plain"))],
            headers=keys.writer,
        )
        assert "unsupported file type" in error(response, 415), name
    job = upload(client, keys, ("notes.TXT", b"Upper case suffixes are fine.", "text/plain"))
    assert job["errors"] == [] and stored_ids(client, keys) == ["notes.TXT"]


def test_a_failed_query_log_write_is_counted_and_logged_without_user_text(
    client: TestClient,
    keys: Keys,
    kb: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "my-very-private-question"

    def refuse(_session: Any, record: Any) -> None:
        # What PostgreSQL says of a value it cannot take: it quotes the value.
        raise DriverDataError(f'invalid input syntax for type json\nCONTEXT: "{record.question}"')

    monkeypatch.setattr(store.query_log, "log_query", refuse)
    caplog.set_level(logging.INFO)
    answer = ok(client.post("/v1/query", json={"question": secret}, headers=keys.reader))
    failures = client.app.state.metrics.query_log_failures  # type: ignore[attr-defined]
    assert failures._value.get() == 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        f"query log write of {answer['query_id']} failed: DataError"
    ]
    assert not any(secret in r.getMessage() or r.exc_info for r in caplog.records)
    metrics = client.get("/metrics", headers=keys.admin).text
    assert "ragservice_query_log_write_failures_total 1.0" in metrics


def test_text_the_query_log_cannot_hold_is_stored_replaced(client: TestClient) -> None:
    runtime = client.app.state.runtime  # type: ignore[attr-defined]
    record = store.query_log.QueryRecord(
        tenant_id=runtime.default_tenant_id,
        endpoint="chat.completions",
        question=f"q{SURROGATE}\x00",
        collection_ids=[],
        params={"mode": "hybrid"},
        retrieved=[],
        answer="a\x00",
        citations=[],
        timings={},
        upstream_model=None,
        status="ok",
        messages=[{"role": "user", "content": f"earlier {SURROGATE}", f"k{SURROGATE}": "\x00"}],
    )
    with tenancy.as_system(), runtime.db.write() as session:
        store.query_log.log_query(session, record)
    with tenancy.as_system(), runtime.db.read() as session:
        row = session.scalar(select(QueryLog).where(QueryLog.id == record.id))
        assert row is not None
        assert (row.question, row.answer) == ("q\ufffd\ufffd", "a\ufffd")
        assert row.messages == [{"role": "user", "content": "earlier \ufffd", "k\ufffd": "\ufffd"}]


def test_an_unexpected_error_is_answered_and_logged_once(
    client: TestClient, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    def boom() -> None:
        raise RuntimeError("a bug")

    app = client.app
    app.add_api_route("/v1/boom", boom)  # type: ignore[attr-defined]
    # Raising server exceptions: one that escaped the app (to be logged again by the server)
    # would fail the call.
    strict = TestClient(app, raise_server_exceptions=True)
    response = strict.get("/v1/boom", headers=keys.reader)
    assert error(response, 500) == "internal error; quote the request id when reporting it"
    logged = [r for r in caplog.records if r.exc_info]
    assert len(logged) == 1 and response.json()["request_id"] in logged[0].getMessage()
