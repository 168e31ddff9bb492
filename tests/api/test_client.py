"""`ragservice.client.RagserviceClient` against the app: typed responses, the answer's
stream as events, and the service's own errors for error responses."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from ragservice import client as rest
from ragservice.api.schemas.audit import AuditEntryOut, AuditPage
from ragservice.api.schemas.collections import CacheStats, CollectionOut
from ragservice.api.schemas.documents import ChunkOut, DocumentDetail, DocumentOut, DocumentPage
from ragservice.api.schemas.feedback import FeedbackOut
from ragservice.api.schemas.jobs import JobOut
from ragservice.client import Citations, Done, RagserviceClient, Token
from ragservice.errors import (
    AuthenticationError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
    ServiceUnreachableError,
)
from ragservice.services.views import (
    CitationOut,
    QueryResponse,
    SearchHitOut,
    SearchResponse,
    SourceOut,
)
from tests.api.conftest import Keys
from tests.api.test_job_retry import failed_job
from tests.api.test_query import add_corpus


@pytest.fixture
def as_key(client: TestClient) -> Iterator[typing.Callable[[dict[str, str]], RagserviceClient]]:
    """A RagserviceClient of the running app sending the given key's headers."""
    made: list[RagserviceClient] = []

    def make(headers: dict[str, str]) -> RagserviceClient:
        http = TestClient(client.app, headers=headers, raise_server_exceptions=False)
        made.append(RagserviceClient(http))
        return made[-1]

    yield make
    for each in made:
        each.close()


def test_search_and_a_streamed_answer(client: TestClient, keys: Keys, as_key: typing.Any) -> None:
    add_corpus(client, keys.writer)
    reader = as_key(keys.reader)
    found = reader.search("parental leave weeks", collections=["hr"], k=2, mode="hybrid")
    assert found["mode"] == "hybrid" and len(found["results"]) == 2
    assert found["results"][0]["document"]["external_id"] == "leave"

    events = list(reader.ask("How long is parental leave?", collections=["hr"], k=3))
    tokens = [e.text for e in events if isinstance(e, Token)]
    assert tokens and isinstance(events[-2], Citations) and isinstance(events[-1], Done)
    whole = events[-1].response
    assert "".join(tokens) == whole["answer"] and "sixteen weeks" in whole["answer"]
    assert whole["citations"] == events[-2].citations
    assert whole["citations"][0]["document"]["external_id"] == "leave"
    assert len(whole["sources"]) == 3
    answered = reader.answer("How long is parental leave?", collections=["hr"], k=3)
    assert answered["answer"] == whole["answer"]


def test_jobs_and_a_retry(client: TestClient, keys: Keys, as_key: typing.Any) -> None:
    job_id = failed_job(client, "acme")
    writer = as_key(keys.writer)
    (listed,) = writer.jobs(status="failed", collection="docs")
    assert listed["id"] == str(job_id) and listed["errors"][0]["error"] == "database error"
    assert writer.job(job_id)["status"] == "failed"
    assert writer.retry_job(job_id)["status"] == "queued"
    assert writer.jobs(status="failed") == []


def test_error_responses_raise_the_services_errors(
    client: TestClient, keys: Keys, as_key: typing.Any
) -> None:
    job_id = failed_job(client, "acme")
    with pytest.raises(NotFoundError, match=f"job {job_id} not found"):
        as_key(keys.other_tenant).job(job_id)
    with pytest.raises(PermissionDeniedError, match="needs a writer key"):
        as_key(keys.reader).retry_job(job_id)
    with pytest.raises(AuthenticationError):
        as_key({}).jobs()
    with pytest.raises(InvalidInputError, match="k"):
        as_key(keys.reader).search("x", k=0)
    with pytest.raises(NotFoundError, match="nope"):
        list(as_key(keys.reader).ask("x", collections=["nope"]))
    writer = as_key(keys.writer)
    writer.retry_job(job_id)
    with pytest.raises(ConflictError, match="only a failed job can be retried"):
        writer.retry_job(job_id)


def test_a_server_that_cannot_be_reached() -> None:
    with RagserviceClient.connect("http://127.0.0.1:9", timeout=5) as unreachable:
        with pytest.raises(ServiceUnreachableError, match="cannot reach"):
            unreachable.jobs()
        with pytest.raises(ServiceUnreachableError):
            list(unreachable.ask("anything"))


@pytest.mark.parametrize(
    ("typed", "schema"),
    [
        (rest.Job, JobOut),
        (rest.SearchHit, SearchHitOut),
        (rest.SearchResponse, SearchResponse),
        (rest.QueryResponse, QueryResponse),
        (rest.Citation, CitationOut),
        (rest.Source, SourceOut),
        (rest.Collection, CollectionOut),
        (rest.CacheStats, CacheStats),
        (rest.Document, DocumentOut),
        (rest.DocumentDetail, DocumentDetail),
        (rest.Chunk, ChunkOut),
        (rest.DocumentPage, DocumentPage),
        (rest.Feedback, FeedbackOut),
        (rest.AuditEntry, AuditEntryOut),
        (rest.AuditPage, AuditPage),
    ],
)
def test_the_client_types_name_fields_the_api_has(typed: type, schema: type[BaseModel]) -> None:
    """Each key the client types is a field of the API's schema; `NotRequired` ones may be
    absent (older servers)."""
    hints = typing.get_type_hints(typed, include_extras=True)
    required = {k for k, v in hints.items() if typing.get_origin(v) is not typing.NotRequired}
    assert len(required) >= 2 and required <= set(schema.model_fields)


def test_collections_and_documents(
    client: TestClient, keys: Keys, as_key: typing.Any, tmp_path: Path
) -> None:
    writer, admin = as_key(keys.writer), as_key(keys.admin)
    made = writer.create_collection("manuals", description="pumps", flagged_chunks="mark")
    assert made["name"] == "manuals" and made["flagged_chunks"] == "mark"
    with pytest.raises(ConflictError):
        writer.create_collection("manuals")
    odd = "specs/../v2?.txt"  # an external id that looks like a path and a query
    texts: list[rest.DocumentIn] = [
        {"external_id": odd, "title": "Specs", "text": "The impeller turns at 3000 rpm."},
        {"text": "Seals keep the water in.", "metadata": {"part": "seal"}},
    ]
    assert writer.wait_job(writer.add_documents("manuals", texts)["id"])["status"] == "done"
    guide = tmp_path / "guide.md"
    guide.write_text("# Priming\n\nFill the casing with water before starting the pump.\n")
    job = writer.upload_files(
        "manuals", [guide, ("notes.txt", b"Bearings need grease.")], metadata={"shelf": 3}
    )
    done = writer.wait_job(job["id"], interval=0.1)
    assert done["status"] == "done" and done["counts"]["new"] == 2, done

    first = writer.documents("manuals", limit=3)
    assert len(first["documents"]) == 3 and first["next_after"] is not None
    rest_page = writer.documents("manuals", limit=3, after=first["next_after"])
    assert len(rest_page["documents"]) == 1 and rest_page["next_after"] is None
    every = [d["external_id"] for d in writer.iter_documents("manuals", page_size=2)]
    assert len(every) == 4 and {odd, "guide.md", "notes.txt"} <= set(every)
    specs = writer.document("manuals", odd)
    assert specs["title"] == "Specs" and specs["chunks"] is not None
    assert "3000 rpm" in specs["chunks"][0]["text"]
    assert writer.document("manuals", "guide.md", chunks=False)["chunks"] is None
    assert writer.document("manuals", "notes.txt")["metadata"]["shelf"] == 3
    assert [c["document_count"] for c in writer.collections()] == [4]

    writer.delete_document("manuals", odd)
    with pytest.raises(NotFoundError, match="not found in 'manuals'"):
        writer.document("manuals", odd)
    assert writer.collection("manuals")["document_count"] == 3

    assert admin.update_collection("manuals", cache_ttl_seconds=60)["cache_ttl_seconds"] == 60
    kept = admin.update_collection("manuals", flagged_chunks="drop")
    assert (kept["cache_ttl_seconds"], kept["flagged_chunks"]) == (60, "drop")
    assert admin.update_collection("manuals", cache_ttl_seconds=None)["cache_ttl_seconds"] is None
    assert admin.cache_stats("manuals")["entries"] == 0 and admin.purge_cache("manuals") == 0
    with pytest.raises(PermissionDeniedError):
        writer.delete_collection("manuals")
    admin.delete_collection("manuals")
    assert writer.collections() == []
    actions = [entry["action"] for entry in admin.audit(limit=10)["entries"]]
    assert actions[0] == "collection.delete" and "cache.purge" in actions


def test_another_tenants_key_reaches_none_of_its_collections(
    client: TestClient, keys: Keys, as_key: typing.Any
) -> None:
    add_corpus(client, keys.writer)  # acme's `hr`, with the document `leave`
    other = as_key(keys.other_tenant)  # globex's admin key
    for attempt in (
        lambda: other.collection("hr"),
        lambda: other.documents("hr"),
        lambda: other.document("hr", "leave"),
        lambda: other.delete_document("hr", "leave"),
        lambda: other.add_documents("hr", [{"text": "planted"}]),
        lambda: other.upload_files("hr", [("planted.txt", b"planted")]),
        lambda: other.cache_stats("hr"),
        lambda: other.delete_collection("hr"),
    ):
        with pytest.raises(NotFoundError, match="'hr'"):
            attempt()
    assert other.collections() == []
    mine = as_key(keys.reader)
    assert mine.collection("hr")["document_count"] == len(mine.documents("hr")["documents"])
    assert mine.document("hr", "leave")["chunks"]


def test_feedback_on_an_answer_and_the_admin_reads(
    client: TestClient, keys: Keys, as_key: typing.Any
) -> None:
    add_corpus(client, keys.writer)
    reader, admin = as_key(keys.reader), as_key(keys.admin)
    answer = reader.answer("How long is parental leave?", collections=["hr"], cache=False)
    assert answer["cache"] is None
    chunk = answer["citations"][0]["chunk_ids"][0]
    other = next(c for s in answer["sources"] for c in s["chunk_ids"] if c != chunk)
    given = reader.feedback(
        answer["query_id"],
        rating=1,
        comment="clear",
        relevant_chunk_ids=[chunk],
        irrelevant_chunk_ids=[other],
    )
    assert given["query_id"] == answer["query_id"] and given["relevant_chunk_ids"] == [chunk]
    assert given["irrelevant_chunk_ids"] == [other] and given["scale"] == "thumbs"
    with pytest.raises(NotFoundError):
        as_key(keys.other_tenant).feedback(answer["query_id"], rating=-1)
    records = list(admin.export_feedback("triplets", collection="hr"))
    assert records and all(r["anchor"] == "How long is parental leave?" for r in records)
    with pytest.raises(PermissionDeniedError):
        list(reader.export_feedback("triplets"))
    health = admin.health()
    assert health["ready"] and all(health["checks"].values()) and health["model"]


def test_connect_sends_its_headers_and_from_env_reads_the_server_and_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"collections": []})

    headers = {"X-Request-ID": "nightly-42"}
    with RagserviceClient.connect(
        "http://rag.test", api_key="rsk_a", headers=headers, transport=httpx.MockTransport(answer)
    ) as client:
        assert client.collections() == []
    monkeypatch.setenv("RAGSERVICE_URL", "http://env.test:9000")
    monkeypatch.setenv("RAGSERVICE_API_KEY", "rsk_b")
    with RagserviceClient.from_env(transport=httpx.MockTransport(answer)) as client:
        client.collections()
    first, second = seen
    assert first.headers["x-request-id"] == "nightly-42"
    assert first.headers["authorization"] == "Bearer rsk_a"
    assert str(second.url) == "http://env.test:9000/v1/collections"
    assert second.headers["authorization"] == "Bearer rsk_b"
