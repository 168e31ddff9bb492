"""Every error status the API promises, each with a clear message in one shape."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from fastapi import Request
from fastapi.testclient import TestClient
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from ragservice.api.app import create_app
from ragservice.api.error_handlers import INTERNAL_DETAIL, stream_error
from ragservice.config import Settings
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from ragservice.errors import InvalidInputError, UpstreamTimeoutError
from tests.api.conftest import Keys, ok


@pytest.fixture
def collection(client: TestClient, keys: Keys) -> str:
    ok(client.post("/v1/collections", json={"name": "c"}, headers=keys.writer), 201)
    return "c"


def error(response: object, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text  # type: ignore[attr-defined]
    body: dict[str, object] = response.json()  # type: ignore[attr-defined]
    assert set(body) >= {"error", "detail", "request_id"}
    return body


def test_400_for_a_body_that_is_not_json(client: TestClient, keys: Keys, collection: str) -> None:
    headers = {**keys.reader, "Content-Type": "application/json"}
    body = error(client.post("/v1/search", content=b"{not json", headers=headers), 400)
    assert body["detail"] == "request body is not valid JSON"
    upload = client.post(
        f"/v1/collections/{collection}/documents/files",
        files=[("files", ("a.txt", b"x", "text/plain"))],
        data={"metadata": "[1, 2"},
        headers=keys.writer,
    )
    assert "metadata" in str(error(upload, 400)["detail"])


def test_404_for_unknown_things(client: TestClient, keys: Keys, collection: str) -> None:
    assert "nope" in str(
        error(client.get("/v1/collections/nope", headers=keys.reader), 404)["detail"]
    )
    error(client.get(f"/v1/collections/{collection}/documents/none", headers=keys.reader), 404)
    error(client.get("/v1/jobs/00000000-0000-0000-0000-00000000abcd", headers=keys.reader), 404)
    docs = {"documents": [{"text": "x"}]}
    error(client.post("/v1/collections/nope/documents", json=docs, headers=keys.writer), 404)
    error(client.get("/v1/no-such-route", headers=keys.reader), 404)


def test_409_for_a_duplicate_collection(client: TestClient, keys: Keys, collection: str) -> None:
    body = error(
        client.post("/v1/collections", json={"name": collection}, headers=keys.writer), 409
    )
    assert body["error"] == "Conflict"


def test_413_for_oversized_files_and_bodies(
    settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    small = settings.model_copy(
        update={"auth_disabled": True, "max_body_bytes": 4096, "max_file_bytes": 100}
    )
    with TestClient(create_app(small, embedder=embedder)) as client:
        ok(client.post("/v1/collections", json={"name": "c"}), 201)
        big_file = client.post(
            "/v1/collections/c/documents/files",
            files=[("files", ("a.txt", b"x" * 101, "text/plain"))],
        )
        assert "a.txt" in str(error(big_file, 413)["detail"])
        big_body = client.post(
            "/v1/collections/c/documents", json={"documents": [{"text": "y" * 5000}]}
        )
        assert "RAGSERVICE_MAX_BODY_BYTES" in str(error(big_body, 413)["detail"])

        def stream() -> Iterator[bytes]:  # no Content-Length: counted while it arrives
            yield b'{"documents": [{"text": "'
            for _ in range(10):
                yield b"z" * 1000
            yield b'"}]}'

        streamed = client.post(
            "/v1/collections/c/documents",
            content=stream(),
            headers={"Content-Type": "application/json"},
        )
        error(streamed, 413)
        assert ok(client.get("/v1/jobs"))["jobs"] == []


def test_415_for_an_unsupported_file_type(client: TestClient, keys: Keys, collection: str) -> None:
    files = [
        ("files", ("ok.txt", b"fine", "text/plain")),
        ("files", ("tool.exe", b"MZ", "application/octet-stream")),
    ]
    response = client.post(
        f"/v1/collections/{collection}/documents/files", files=files, headers=keys.writer
    )
    assert "tool.exe" in str(error(response, 415)["detail"])
    # Nothing was queued: the whole upload is refused.
    assert ok(client.get("/v1/jobs", headers=keys.reader))["jobs"] == []


def test_422_for_invalid_fields(
    client: TestClient, keys: Keys, collection: str, api_settings: Settings
) -> None:
    def search(body: dict[str, object]) -> dict[str, object]:
        return error(client.post("/v1/search", json=body, headers=keys.reader), 422)

    assert "k" in str(search({"query": "q", "k": api_settings.limits.max_k + 1})["detail"])
    assert "k:" in str(search({"query": "q", "k": 0})["detail"])
    long_query = "word " * (api_settings.limits.max_query_chars // 5 + 1)
    assert "RAGSERVICE_MAX_QUERY_CHARS" in str(search({"query": long_query})["detail"])
    assert "mode" in str(search({"query": "q", "mode": "fuzzy"})["detail"])
    assert "$regex" in str(search({"query": "q", "filters": {"year": {"$regex": "x"}}})["detail"])
    search({"query": "   "})
    search({"query": "q", "unknown": 1})
    bad_name = client.post("/v1/collections", json={"name": "no spaces"}, headers=keys.writer)
    assert "name" in str(error(bad_name, 422)["detail"])
    no_docs = client.post(
        f"/v1/collections/{collection}/documents", json={"documents": []}, headers=keys.writer
    )
    error(no_docs, 422)


def test_500_hides_internals_and_gives_a_request_id(
    client: TestClient, keys: Keys, collection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(**_: object) -> None:
        raise RuntimeError("password=hunter2 at db.internal:5432")

    searcher = client.app.state.search.searcher  # type: ignore[attr-defined]
    monkeypatch.setattr(searcher, "search", explode)
    response = client.post(
        "/v1/search", json={"query": "q"}, headers={**keys.reader, "X-Request-ID": "req-42"}
    )
    body = error(response, 500)
    assert body["request_id"] == "req-42"
    assert "hunter2" not in response.text
    assert "db.internal" not in response.text


def test_every_response_carries_a_request_id(client: TestClient) -> None:
    response = client.get("/healthz")
    assert len(response.headers["x-request-id"]) == 32
    echoed = client.get("/healthz", headers={"X-Request-ID": "abc-123"})
    assert echoed.headers["x-request-id"] == "abc-123"
    unsafe = client.get("/healthz", headers={"X-Request-ID": "<script>alert(1)</script>"})
    assert len(unsafe.headers["x-request-id"]) == 32


def test_503_when_the_database_is_unreachable(client: TestClient, keys: Keys) -> None:
    state = client.app.state  # type: ignore[attr-defined]
    unreachable = create_engine("postgresql+psycopg://x@127.0.0.1:1/none")
    db = replace(state.runtime.db, read_sessions=sessionmaker(unreachable))
    state.runtime = replace(state.runtime, db=db)
    body = error(client.get("/v1/collections", headers=keys.reader), 503)
    assert body["detail"] == "the database is unavailable"
    assert "127.0.0.1" not in str(body)


def test_422_for_values_postgresql_cannot_hold(
    client: TestClient, keys: Keys, collection: str
) -> None:
    body = error(
        client.post("/v1/search", json={"query": "nul \u0000 here"}, headers=keys.reader), 422
    )
    assert "NUL" in str(body["detail"])
    error(client.get("/v1/collections/h%00r", headers=keys.reader), 422)
    error(
        client.get(f"/v1/collections/{collection}/documents?after=a%00", headers=keys.reader), 422
    )


@pytest.mark.parametrize(
    ("raised", "name", "detail"),
    [
        (InvalidInputError("k: too large"), "InvalidInput", "k: too large"),
        (UpstreamTimeoutError("no answer in 30 s"), "UpstreamTimeout", "no answer in 30 s"),
        (RuntimeError("secret internals"), "InternalError", INTERNAL_DETAIL),
    ],
)
def test_a_failed_stream_ends_with_the_error_handlers_body(
    raised: Exception, name: str, detail: str
) -> None:
    request = Request({"type": "http", "state": {"request_id": "r-1"}})
    assert stream_error(request, raised) == {"error": name, "detail": detail, "request_id": "r-1"}
