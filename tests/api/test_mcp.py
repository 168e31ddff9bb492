"""The MCP server through the `mcp` client: its tools call the app's REST API with a key, so
the key scopes them; in process, and over streamable HTTP (the ASGI app, no socket), where the
door refuses a key the API refuses before any MCP message and ends idle streams."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import httpx2
import pytest
from fastapi.testclient import TestClient
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from pydantic import BaseModel

from ragservice import client as rest
from ragservice import store
from ragservice.api.schemas.collections import CollectionOut
from ragservice.api.schemas.documents import ChunkOut, DocumentDetail
from ragservice.auth.keys import public_prefix
from ragservice.client import RagserviceClient
from ragservice.db import tenancy
from ragservice.mcp_server.door import Door, KeyCheck
from ragservice.mcp_server.server import build_server, fixed_client, http_app, key_check
from ragservice.mcp_server.tools import document_text
from tests.api.conftest import Keys
from tests.api.test_query import DOCUMENTS, add_corpus

TOOLS = {"search", "ask", "list_collections", "get_document"}


def rest_client(client: TestClient, token: str | None) -> RagserviceClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return RagserviceClient(TestClient(client.app, headers=headers, raise_server_exceptions=False))


def secret(headers: dict[str, str]) -> str:
    return headers["Authorization"].removeprefix("Bearer ")


async def call(mcp: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await mcp.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def tool_error(mcp: Client, tool: str, **arguments: Any) -> str:
    result = await mcp.call_tool(tool, arguments)
    assert result.is_error
    return str(getattr(result.content[0], "text", ""))


def test_the_tools_search_answer_list_and_read(client: TestClient, keys: Keys) -> None:
    add_corpus(client, keys.writer)
    reader = build_server(fixed_client(rest_client(client, secret(keys.reader))))
    stranger = build_server(fixed_client(rest_client(client, secret(keys.other_tenant))))

    async def scenario() -> None:
        async with Client(reader) as mcp:
            listed = await mcp.list_tools()
            assert {tool.name for tool in listed.tools} == TOOLS
            schema = next(t for t in listed.tools if t.name == "search").input_schema
            assert schema["required"] == ["query"] and schema["properties"]["k"]["maximum"] == 50

            found = await call(mcp, "search", query="parental leave weeks", collections=["hr"], k=2)
            best = found["hits"][0]
            assert len(found["hits"]) == 2
            assert (best["document_id"], best["title"], best["collection"]) == (
                "leave",
                "Parental leave",
                "hr",
            )
            assert "sixteen weeks" in best["text"] and best["score"] > 0

            answered = await call(mcp, "ask", question="How long is parental leave?")
            assert "sixteen weeks" in answered["answer"] and "[1]" in answered["answer"]
            first = answered["citations"][0]
            assert (first["number"], first["document_id"]) == (1, "leave")
            assert first["title"] == "Parental leave" and "Parental leave" in first["cited_as"]

            collections = (await call(mcp, "list_collections"))["collections"]
            assert [(c["name"], c["document_count"]) for c in collections] == [("hr", 3)]

            document = await call(mcp, "get_document", collection="hr", document_id="travel")
            assert document["text"] == DOCUMENTS[1][2] and document["title"] == "Travel"
            assert document["metadata"] == {"year": 2024}

            missing = await tool_error(mcp, "get_document", collection="hr", document_id="nope")
            assert missing.endswith("NotFound: document 'nope' not found in 'hr'")
            refused = await mcp.call_tool("search", {"query": "x", "k": 0})
            assert refused.is_error  # the input schema, before the service is asked

        async with Client(stranger) as mcp:
            assert (await call(mcp, "list_collections"))["collections"] == []
            hidden = await tool_error(mcp, "get_document", collection="hr", document_id="leave")
            assert "NotFound: collection 'hr'" in hidden
            assert (await call(mcp, "search", query="parental leave"))["hits"] == []

    anyio.run(scenario)


def test_over_streamable_http_each_request_brings_its_own_key(
    client: TestClient, keys: Keys
) -> None:
    add_corpus(client, keys.writer)

    @contextmanager
    def connect(token: str | None) -> Iterator[RagserviceClient]:
        with rest_client(client, token) as rest:
            yield rest

    server = build_server(connect)
    app = http_app(server, host="127.0.0.1", check=key_check(connect))

    async def list_collections(headers: dict[str, str]) -> Any:
        http = httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app), base_url=BASE, headers=headers
        )
        async with http, Client(streamable_http_client(f"{BASE}/mcp", http_client=http)) as mcp:
            return await mcp.call_tool("list_collections", {})

    async def collections_seen(headers: dict[str, str]) -> list[str]:
        result = await list_collections(headers)
        assert not result.is_error, result.content
        return [c["name"] for c in result.structured_content["collections"]]

    async def scenario() -> None:
        async with server.session_manager.run():
            assert await collections_seen(keys.reader) == ["hr"]
            assert await collections_seen(keys.other_tenant) == []
            async with httpx2.AsyncClient(
                transport=httpx2.ASGITransport(app=app), base_url=BASE
            ) as bare:
                refused = await bare.post(
                    "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}
                )
            assert refused.status_code == 401
            assert refused.headers["WWW-Authenticate"] == "Bearer"

    anyio.run(scenario)


BASE = "http://127.0.0.1:8001"
TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
ACCEPT = {"Accept": "application/json, text/event-stream"}


def test_the_door_refuses_unknown_and_revoked_keys_before_any_mcp_message(
    client: TestClient, keys: Keys
) -> None:
    """A key is checked with the API (`GET /v1/me`) before the MCP server reads the request;
    a good answer is trusted for the TTL, a refusal for a second, so a revocation holds within
    the TTL."""
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    secret_key = secret(keys.reader)
    now = [0.0]
    asked: list[str] = []

    @contextmanager
    def connect(token: str | None) -> Iterator[RagserviceClient]:
        with rest_client(client, token) as rest:
            yield rest

    def verify(token: str) -> None:
        asked.append(token)
        with connect(token) as rest:
            rest.me()

    server = build_server(connect)
    check = KeyCheck(verify, ttl=5, refused_ttl=1, clock=lambda: now[0])
    app = http_app(server, host="127.0.0.1", check=check)

    async def request(token: str, method: str = "POST") -> httpx2.Response:
        headers = {**ACCEPT, "Authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app), base_url=BASE, headers=headers
        ) as http:
            if method == "GET":
                return await http.get("/mcp")
            return await http.post("/mcp", json=TOOLS_LIST)

    def refused(response: httpx2.Response) -> bool:
        return (
            response.status_code == 401
            and response.headers["WWW-Authenticate"] == "Bearer"
            and response.json()["error"] == "Authentication"
            and "jsonrpc" not in response.text
        )

    async def scenario() -> None:
        async with server.session_manager.run():
            listed = await request(secret_key)
            assert listed.status_code == 200 and '"search"' in listed.text
            assert (await request(secret_key)).status_code == 200
            assert asked == [secret_key]  # the second time from memory

            for token in ("rsk_wrong", "rsk_wrong", "not-even-a-key"):
                assert refused(await request(token))
                assert refused(await request(token, "GET"))  # no stream held open
            assert asked == [secret_key, "rsk_wrong", "not-even-a-key"]
            now[0] += 1.5  # a refusal is remembered for a second only
            assert refused(await request("rsk_wrong")) and asked[-1] == "rsk_wrong"

            with tenancy.as_system(), db.write() as session:
                assert store.tenants.revoke_api_key(session, public_prefix(secret_key))
            now[0] += 5  # within the TTL the key was still trusted; past it, asked again
            assert refused(await request(secret_key)) and asked[-1] == secret_key

    anyio.run(scenario)


def test_an_idle_event_stream_is_ended(client: TestClient, keys: Keys) -> None:
    """The GET stream of a stateless server carries no message: it ends after the idle
    timeout, and keep-alive comments do not keep a stream alive."""

    @contextmanager
    def connect(token: str | None) -> Iterator[RagserviceClient]:
        with rest_client(client, token) as rest:
            yield rest

    server = build_server(connect)
    app = http_app(server, host="127.0.0.1", check=key_check(connect), idle_timeout=0.3)

    async def pinging(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        while True:
            await send({"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True})
            await anyio.sleep(0.02)

    async def stream(asgi: Any) -> httpx2.Response:
        async with httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=asgi),
            base_url=BASE,
            headers={**keys.reader, "Accept": "text/event-stream"},
        ) as http:
            with anyio.fail_after(30):  # without the timeout: never
                async with http.stream("GET", "/mcp") as response:
                    await response.aread()
                    return response

    async def scenario() -> None:
        async with server.session_manager.run():
            ended = await stream(app)
            assert ended.status_code == 200
            assert ended.headers["content-type"].startswith("text/event-stream")
        pings = await stream(Door(pinging, check=KeyCheck(lambda _: None), idle_timeout=0.3))
        assert pings.status_code == 200 and pings.text.startswith(": ping")

    anyio.run(scenario)


@pytest.mark.parametrize(
    ("spans", "text"),
    [
        ([(0, 5, "alpha"), (6, 10, "beta")], "alpha\nbeta"),
        ([(0, 8, "one two "), (4, 12, "two three")], "one two three"),
        ([(0, 9, "one three"), (4, 9, "three")], "one three"),
        ([], ""),
    ],
)
def test_a_documents_text_from_its_chunks(spans: list[tuple[int, int, str]], text: str) -> None:
    chunks: Any = [
        {"start_char": s, "end_char": e, "text": t, "ordinal": i}
        for i, (s, e, t) in enumerate(spans)
    ]
    assert document_text(chunks) == text


def test_a_documents_text_leaves_out_the_table_header_later_chunks_repeat() -> None:
    header = "| a | b |\n| --- | --- |"
    first = header + "\n| 1 | 2 |"
    chunks: Any = [
        {"start_char": 0, "end_char": len(first), "text": first, "metadata": {}},
        {
            "start_char": len(first) + 1,
            "end_char": len(first) + 10,
            "text": header + "\n| 3 | 4 |",
            "metadata": {"table_header": header},
        },
    ]
    assert document_text(chunks) == first + "\n| 3 | 4 |"


@pytest.mark.parametrize(
    ("typed", "schema"),
    [
        (rest.Collection, CollectionOut),
        (rest.DocumentDetail, DocumentDetail),
        (rest.Chunk, ChunkOut),
    ],
)
def test_the_client_types_the_tools_read_are_the_apis_fields(
    typed: type, schema: type[BaseModel]
) -> None:
    assert set(typing.get_type_hints(typed)) <= set(schema.model_fields)
