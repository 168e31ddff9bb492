"""The bounds on what one request may ask: chat history and max_tokens, /v1/embeddings input,
filter size, collection lists, numbers, files per upload; and the rate-limit cost of an
embeddings request. Each refusal names its limit."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from ragservice.config import Settings
from ragservice.limits.rate_limits import RateLimiter
from tests.api.conftest import Keys, ok


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "rate_limit_per_second": 0.0,
            "max_chat_messages": 4,
            "max_chat_chars": 100,
            "max_answer_tokens": 64,
            "max_embedding_inputs": 40,
            "max_embedding_input_chars": 30,
            "max_embedding_request_chars": 300,
            "max_files_per_upload": 1001,  # above Starlette's own default of 1,000
            "workers": 0,  # nothing here needs its uploads ingested
        }
    )


def refused(response: httpx.Response, status: int, *needles: str) -> None:
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    for needle in needles:
        assert needle in detail, detail


def chat(client: TestClient, keys: Keys, messages: list[dict[str, str]], **extra: Any) -> Any:
    body = {"model": "rag:kb", "messages": messages, **extra}
    return client.post("/v1/chat/completions", json=body, headers=keys.reader)


def turns(count: int, chars: int = 5) -> list[dict[str, str]]:
    roles = ["user", "assistant"]
    return [{"role": roles[(count - 1 - i) % 2], "content": "x" * chars} for i in range(count)]


def test_chat_history_and_max_tokens_are_bounded(client: TestClient, keys: Keys) -> None:
    ok(client.post("/v1/collections", json={"name": "kb"}, headers=keys.writer), 201)
    ok(chat(client, keys, turns(4, chars=25), max_tokens=64))  # at every limit: fine
    refused(chat(client, keys, turns(5)), 422, "5 in one request", "RAGSERVICE_MAX_CHAT_MESSAGES")
    refused(chat(client, keys, turns(3, chars=34)), 422, "102 characters", "MAX_CHAT_CHARS")
    refused(
        chat(client, keys, turns(1), max_tokens=65),
        422,
        "max_tokens: 65 is above the limit of 64",
        "RAGSERVICE_MAX_ANSWER_TOKENS",
    )
    refused(chat(client, keys, turns(1), max_completion_tokens=32768), 422, "MAX_ANSWER_TOKENS")


def test_embeddings_input_is_bounded_by_count_and_characters(
    client: TestClient, keys: Keys
) -> None:
    def embed(texts: list[str]) -> httpx.Response:
        return client.post("/v1/embeddings", json={"input": texts}, headers=keys.reader)

    assert len(ok(embed(["y" * 30] * 10))["data"]) == 10  # 300 characters: at both limits
    refused(embed(["a"] * 41), 413, "41 texts", "RAGSERVICE_MAX_EMBEDDING_INPUTS")
    refused(embed(["a", "b" * 31]), 422, "input[1]: 31 characters", "MAX_EMBEDDING_INPUT_CHARS")
    refused(embed(["y" * 30] * 10 + ["z"]), 413, "301 characters", "MAX_EMBEDDING_REQUEST_CHARS")


def test_a_filter_with_too_many_in_values_in_all_is_refused(client: TestClient, keys: Keys) -> None:
    ok(client.post("/v1/collections", json={"name": "kb"}, headers=keys.writer), 201)
    filters = {f"f{i}": {"$in": list(range(600))} for i in range(2)}
    for route, field in (("/v1/search", "query"), ("/v1/query", "question")):
        body = {field: "anything", "collections": ["kb"], "filters": filters}
        refused(client.post(route, json=body, headers=keys.reader), 422, "1200 $in/$nin values")


def test_embeddings_are_charged_a_token_per_sixteen_texts(client: TestClient, keys: Keys) -> None:
    # Next to no refill during the test: the bucket is what the requests leave of it.
    limiter = RateLimiter(per_second=0.001, burst=6)
    client.app.state.rate_limiter = limiter  # type: ignore[attr-defined]
    ok(client.post("/v1/embeddings", json={"input": ["a"] * 33}, headers=keys.reader))  # 3
    ok(client.post("/v1/embeddings", json={"input": ["a"] * 17}, headers=keys.reader))  # 2
    over = client.post("/v1/embeddings", json={"input": ["a"] * 17}, headers=keys.reader)
    refused(over, 429, "17 texts costs 2 rate-limit tokens", "Retry-After")
    ok(client.post("/v1/embeddings", json={"input": ["a"] * 17}, headers=keys.writer))


def test_lists_and_numbers_name_their_bounds(client: TestClient, keys: Keys) -> None:
    ok(client.post("/v1/collections", json={"name": "kb"}, headers=keys.writer), 201)
    many = ["kb"] * 65535  # once a 503: more parameters than a statement takes
    for route, field in (("/v1/search", "query"), ("/v1/query", "question")):
        body = {field: "anything", "collections": many}
        response = client.post(route, json=body, headers=keys.reader)
        refused(response, 422, "collections: List should have at most 1000 items")
    refused(chat(client, keys, turns(1), model="rag:" + ",".join(many)), 422, "the limit is 1000")
    refused(
        client.get("/v1/audit?before=99999999999999999999", headers=keys.admin),
        422,
        "before: Input should be less than or equal to 9223372036854775807",
    )
    nan = b'{"query": "q", "ranking": {"text_weight": NaN}}'
    headers = {**keys.reader, "Content-Type": "application/json"}
    refused(
        client.post("/v1/search", content=nan, headers=headers),
        422,
        "ranking.text_weight: must be a finite number",
    )
    hot = (
        b'{"model": "rag:kb", "messages": [{"role": "user", "content": "x"}], "temperature": 1e999}'
    )
    refused(
        client.post("/v1/chat/completions", content=hot, headers=headers),
        422,
        "temperature: must be a finite number",
    )
    version = client.post(
        "/v1/collections/kb/documents/files",
        files=[("files", ("a.txt", b"text", "text/plain"))],
        data={"model": "NAME:99999999999999999999999"},
        headers=keys.writer,
    )
    refused(version, 422, "model: the version is above the limit of 2147483647")
    refused(client.get("/v1/audit", headers=keys.reader), 403, "this needs an admin key")


def test_the_files_per_upload_follow_the_setting(client: TestClient, keys: Keys) -> None:
    ok(client.post("/v1/collections", json={"name": "kb"}, headers=keys.writer), 201)

    def upload(count: int) -> httpx.Response:
        files = [("files", (f"f{i}.txt", b"x", "text/plain")) for i in range(count)]
        return client.post("/v1/collections/kb/documents/files", files=files, headers=keys.writer)

    assert ok(upload(1001), 202)["status"] == "queued"
    refused(upload(1002), 413, "the limit is 1001 (RAGSERVICE_MAX_FILES_PER_UPLOAD)")
