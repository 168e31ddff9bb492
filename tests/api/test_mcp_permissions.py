"""Per-document readers through the MCP server: a key acting for a user outside a document's
readers never receives the document through any tool (its text, title, external id, id or a
citation of it), in process and over streamable HTTP; a key acting for a reader does.

`restricted_corpus` and `user_keys` are shared with tests/api/test_replica_permissions.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
from fastapi.testclient import TestClient
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy import func, select

from ragservice import store
from ragservice.client import RagserviceClient
from ragservice.db import tenancy
from ragservice.db.models import PromptCacheEntry
from ragservice.mcp_server.server import build_server, fixed_client, http_app, key_check
from tests.api.conftest import Keys, make_key, ok, wait_for_job
from tests.api.test_mcp import BASE, TOOLS, call, rest_client, secret, tool_error

COLLECTION = "people"
RESTRICTED = {
    "external_id": "payroll-2025",
    "title": "Payroll bands",
    "text": "Engineers in band four earn ninety thousand zorkmids a year before bonuses.",
    "readers": ["group:hr"],
}
OPEN = {
    "external_id": "canteen",
    "title": "Canteen hours",
    "text": "The canteen serves lunch from noon until two, and coffee all afternoon.",
}
TOKEN = "X-Consistency-Token"
QUESTION = "How many zorkmids do engineers in band four earn?"


@dataclass(frozen=True)
class Restricted:
    """The restricted document's marks: what an outsider must never receive."""

    document_id: str

    @property
    def marks(self) -> tuple[str, ...]:
        return (
            self.document_id,
            str(RESTRICTED["external_id"]),
            str(RESTRICTED["title"]),
            "ninety thousand",  # of its text, and not of QUESTION (which a prompt holds)
            "before bonuses",
        )

    def hidden_in(self, found: Any) -> bool:
        """Whether nothing of the restricted document is in `found` (any JSON value)."""
        text = json.dumps(found)
        return not any(mark in text for mark in self.marks)


def restricted_corpus(
    client: TestClient, headers: dict[str, str], *, collection: str = COLLECTION
) -> Restricted:
    """A collection with the restricted document (readers `group:hr`) and an unrestricted one,
    made with `headers`, an admin key of no user (it reads every document)."""
    ok(client.post("/v1/collections", json={"name": collection}, headers=headers), 201)
    body = {"documents": [RESTRICTED, OPEN]}
    path = f"/v1/collections/{collection}/documents"
    posted = client.post(path, json=body, headers=headers)
    job = ok(posted, 202)
    # With replicas, the job is read where its creation is (the write's consistency token),
    # and the document once a replica has it.
    token = posted.headers.get(TOKEN)
    reads = headers if token is None else {**headers, TOKEN: token}
    assert wait_for_job(client, job["id"], reads)["status"] == "done"
    stored = client.get(f"{path}/{RESTRICTED['external_id']}", headers=headers)
    deadline = time.monotonic() + 10
    while stored.status_code == 404 and time.monotonic() < deadline:
        time.sleep(0.05)
        stored = client.get(f"{path}/{RESTRICTED['external_id']}", headers=headers)
    assert ok(stored)["readers"] == ["group:hr"]
    return Restricted(document_id=ok(stored)["id"])


def user_keys(client: TestClient, tenant: str = "acme") -> tuple[dict[str, str], dict[str, str]]:
    """Reader keys acting for ana (in group hr) and for bob (in group sales only)."""
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    headers = []
    with tenancy.as_system(), db.write() as session:
        tenant_id = store.tenants.ensure_tenant(session, tenant)
        store.tenants.add_group_members(session, tenant_id, "hr", ["ana"])
        store.tenants.add_group_members(session, tenant_id, "sales", ["bob"])
        for user in ("ana", "bob"):
            headers.append(
                {"Authorization": f"Bearer {make_key(session, tenant_id, 'reader', user)}"}
            )
    return headers[0], headers[1]


def cached_answers(client: TestClient) -> int:
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.read() as session:
        return int(session.scalar(select(func.count()).select_from(PromptCacheEntry)) or 0)


def test_an_outsider_gets_nothing_of_a_restricted_document_through_any_tool(
    client: TestClient, keys: Keys
) -> None:
    restricted = restricted_corpus(client, keys.admin)
    insider, outsider = user_keys(client)
    inside = build_server(fixed_client(rest_client(client, secret(insider))))
    outside = build_server(fixed_client(rest_client(client, secret(outsider))))

    async def scenario() -> None:
        # The insider first: a cached answer built on the document must not reach the outsider.
        async with Client(inside) as mcp:
            for mode in ("dense", "fulltext", "hybrid"):
                found = await call(mcp, "search", query=QUESTION, k=5, mode=mode)
                assert found["hits"][0]["document_id"] == RESTRICTED["external_id"], mode
            answered = await call(mcp, "ask", question=QUESTION, collections=[COLLECTION])
            assert "zorkmids" in answered["answer"]
            assert cached_answers(client) == 1  # the outsider asks the same next
            cited = {c["document_id"] for c in answered["citations"]}
            assert RESTRICTED["external_id"] in cited
            document = await call(
                mcp, "get_document", collection=COLLECTION, document_id="payroll-2025"
            )
            assert document["text"] == RESTRICTED["text"]
            listed = await call(mcp, "list_collections")
            assert listed["collections"][0]["document_count"] == 2

        async with Client(outside) as mcp:
            assert {tool.name for tool in (await mcp.list_tools()).tools} == TOOLS
            for mode in ("dense", "fulltext", "hybrid"):
                found = await call(mcp, "search", query=QUESTION, k=5, mode=mode)
                assert [h["document_id"] for h in found["hits"]] in ([], ["canteen"]), mode
                assert restricted.hidden_in(found), mode
            scoped = await call(mcp, "search", query="zorkmids", collections=[COLLECTION], k=50)
            assert restricted.hidden_in(scoped)
            for question in (QUESTION, "What do engineers earn?"):
                answered = await call(mcp, "ask", question=question, collections=[COLLECTION])
                assert restricted.hidden_in(answered), answered
            listed = await call(mcp, "list_collections")
            assert listed["collections"][0]["document_count"] == 1
            refused = await tool_error(
                mcp, "get_document", collection=COLLECTION, document_id="payroll-2025"
            )
            missing = await tool_error(
                mcp, "get_document", collection=COLLECTION, document_id="payroll-2026"
            )
            assert refused == missing.replace("payroll-2026", "payroll-2025")  # as if not there
            assert "NotFound" in refused
            opened = await call(mcp, "get_document", collection=COLLECTION, document_id="canteen")
            assert opened["text"] == OPEN["text"]

    anyio.run(scenario)


def test_a_reader_is_not_served_an_answer_cached_for_an_outsider(
    client: TestClient, keys: Keys
) -> None:
    """An answer built from the documents an outsider may read leaves out what a reader may
    read: it is not the reader's answer."""
    restricted_corpus(client, keys.admin)
    insider, outsider = user_keys(client)
    outside = build_server(fixed_client(rest_client(client, secret(outsider))))
    inside = build_server(fixed_client(rest_client(client, secret(insider))))

    async def scenario() -> None:
        async with Client(outside) as mcp:
            await call(mcp, "ask", question=QUESTION, collections=[COLLECTION])
        async with Client(inside) as mcp:
            answered = await call(mcp, "ask", question=QUESTION, collections=[COLLECTION])
            cited = {c["document_id"] for c in answered["citations"]}
            assert RESTRICTED["external_id"] in cited, answered

    anyio.run(scenario)


def test_over_streamable_http_each_callers_key_decides_what_it_reads(
    client: TestClient, keys: Keys
) -> None:
    """One HTTP server, two agents in turn: each tool call reads with its own request's key."""
    restricted = restricted_corpus(client, keys.admin)
    insider, outsider = user_keys(client)

    @contextmanager
    def connect(token: str | None) -> Iterator[RagserviceClient]:
        with rest_client(client, token) as rest:
            yield rest

    server = build_server(connect)
    app = http_app(server, host="127.0.0.1", check=key_check(connect))

    async def search(headers: dict[str, str]) -> dict[str, Any]:
        http = httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app), base_url=BASE, headers=headers
        )
        async with http, Client(streamable_http_client(f"{BASE}/mcp", http_client=http)) as mcp:
            return await call(mcp, "search", query=QUESTION, k=5, mode="fulltext")

    async def scenario() -> None:
        async with server.session_manager.run():
            seen = await search(insider)
            assert seen["hits"][0]["document_id"] == RESTRICTED["external_id"]
            assert restricted.hidden_in(await search(outsider))
            assert not restricted.hidden_in(await search(insider))

    anyio.run(scenario)
