"""API fuzzing: schemathesis generates requests from the service's own OpenAPI spec.

Every operation gets a few deterministic examples (Hypothesis derandomized), valid and invalid,
sent in process as the admin of a tenant that owns a collection `fuzz` holding one document, so
that generated requests reach real code rather than stopping at 404. Every response must be no
5xx and must match the spec: a documented status code, content type and body schema. No
operation is left out; failures are collected and listed together at the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.python import asgi
from schemathesis.schemas import APIOperation
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from ragservice import store
from ragservice.api.app import create_app
from ragservice.auth.keys import new_key
from ragservice.config import Settings
from ragservice.db import tenancy
from ragservice.embedding.embedder import SentenceTransformerEmbedder

EXAMPLES = 5  # per operation and generation mode; the whole run stays well under a minute
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# Path parameters that name the seeded collection. Deleting operations get generated names,
# so that one example cannot delete what the rest of the run fuzzes.
SEEDED = {"collection": "fuzz", "name": "fuzz"}


@dataclass
class Tally:
    examples: int = 0
    failures: list[str] = field(default_factory=list)
    no_invalid_input: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Target:
    app: FastAPI
    headers: dict[str, str]


@pytest.fixture
def target(api_settings: Settings, embedder: SentenceTransformerEmbedder) -> Iterator[Target]:
    """The app with its lifespan run by schemathesis' ASGI client (one event loop for all)."""
    from ingest.worker import JobWorker

    # The fuzzer sends requests back to back: the rate limit would answer most of them 429.
    quiet = api_settings.model_copy(update={"rate_limit_per_second": 0.0})
    app = create_app(quiet, embedder=embedder, services=[JobWorker])
    try:
        with asgi.get_client(app) as client:
            headers = _admin_headers(app)
            _seed(client, headers)
        yield Target(app, headers)
    finally:
        asgi.shutdown_lifespans()


def _admin_headers(app: FastAPI) -> dict[str, str]:
    key = new_key()
    with tenancy.as_system(), app.state.runtime.db.write() as session:
        tenant_id = store.tenants.ensure_tenant(session, "fuzz")
        store.tenants.create_api_key(
            session, tenant_id=tenant_id, role="admin", prefix=key.prefix, key_hash=key.hash
        )
    return {"Authorization": f"Bearer {key.secret}"}


def _seed(client: Any, headers: dict[str, str]) -> None:
    assert client.post("/v1/collections", json={"name": "fuzz"}, headers=headers).ok
    docs = {"documents": [{"external_id": "doc", "text": "Fuzzing finds the bugs tests miss."}]}
    job = client.post("/v1/collections/fuzz/documents", json=docs, headers=headers).json()
    deadline = time.monotonic() + 60
    while client.get(f"/v1/jobs/{job['id']}", headers=headers).json()["status"] != "done":
        assert time.monotonic() < deadline, "the seeding job did not finish"
        time.sleep(0.1)


def _fuzz(operation: APIOperation, mode: GenerationMode, target: Target, tally: Tally) -> None:
    deleting = operation.method.upper() == "DELETE"
    names = {p.name for p in operation.path_parameters}
    fixed = {k: v for k, v in SEEDED.items() if k in names and not deleting}
    strategy = operation.as_strategy(generation_mode=mode, path_parameters=fixed or None)

    @given(case=strategy)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # failures are tallied, not shrunk
        suppress_health_check=list(HealthCheck),
    )
    def run(case: schemathesis.Case) -> None:
        tally.examples += 1
        try:
            case.call_and_validate(headers=target.headers, checks=CHECKS, app=target.app)
        except (Exception, BaseExceptionGroup) as exc:  # noted; the run goes on
            tally.failures.append(f"{operation.label} [{mode.value}]: {_summary(exc)}")

    try:
        run()
    except Unsatisfiable:
        # Only negative mode gets here: the operation takes no input that could be invalid.
        tally.no_invalid_input.append(operation.label)


def _summary(exc: BaseException) -> str:
    parts = exc.exceptions if isinstance(exc, BaseExceptionGroup) else (exc,)
    return " | ".join(" ".join(str(part).split())[:400] for part in parts)


def _each_operation(app: FastAPI) -> Iterator[APIOperation]:
    schema = schemathesis.openapi.from_dict(app.openapi())
    for result in schema.get_all_operations():
        yield result.ok()


def test_no_5xx_and_every_response_as_documented(
    target: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    tally = Tally()
    operations = list(_each_operation(target.app))
    started = time.monotonic()
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz(operation, mode, target, tally)
    with capsys.disabled():  # the counts belong in the CI log
        print(
            f"\nfuzz: {len(operations)} operations, {tally.examples} examples, "
            f"{len(tally.failures)} failures in {time.monotonic() - started:.0f} s; "
            f"no invalid input possible for {tally.no_invalid_input}"
        )
    assert len(operations) >= 20
    assert tally.failures == [], "\n".join(tally.failures)
