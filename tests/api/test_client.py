"""`ragservice.client.RagserviceClient` against the app: typed responses, the answer's
stream as events, and the service's own errors for error responses."""

from __future__ import annotations

import typing
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from ragservice import client as rest
from ragservice.api.schemas.answers import CitationOut, QueryResponse, SourceOut
from ragservice.api.schemas.jobs import JobOut
from ragservice.api.schemas.search import SearchHitOut, SearchResponse
from ragservice.client import Citations, Done, RagserviceClient, Token
from ragservice.errors import (
    AuthenticationError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
    ServiceUnreachableError,
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
    ],
)
def test_the_client_types_name_fields_the_api_has(typed: type, schema: type[BaseModel]) -> None:
    """Each key the client types is a field of the API's schema; `NotRequired` ones may be
    absent (older servers)."""
    hints = typing.get_type_hints(typed, include_extras=True)
    required = {k for k, v in hints.items() if typing.get_origin(v) is not typing.NotRequired}
    assert len(required) >= 4 and required <= set(schema.model_fields)
