"""API fuzzing: schemathesis generates requests from the service's own OpenAPI spec.

Every operation gets a few deterministic examples (Hypothesis derandomized), valid and invalid,
sent in process as the admin of a tenant that owns a collection `fuzz` holding one document, so
that generated requests reach real code rather than stopping at 404. Every response must be no
5xx and must match the spec: a documented status code, content type and body schema. No
operation is left out; failures are collected and listed together at the end.

The second test makes valid requests hostile: one value of each (a body's string, number,
array or object, a query or path parameter) is swapped for what no schema generator sends but
clients do: lone UTF-16 surrogates, NUL characters, long strings, huge arrays, extreme and
non-finite numbers (`NaN`, which Python's JSON parser takes). Again no 5xx, and in both tests
nothing is logged as an error (an unhandled exception, a failed write).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
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
    statuses: Counter[int] = field(default_factory=Counter)


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
    target: Target, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
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
    assert_nothing_logged_as_error(caplog)


def assert_nothing_logged_as_error(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [f"{r.name}: {r.getMessage()[:300]}" for r in errors]


# -- hostile values ------------------------------------------------------------------------------

HOSTILE_EXAMPLES = 30  # per operation with a JSON body; 4 for the others
HUGE = 70_000  # more elements than a statement takes parameters (65,535)
HUGE_OBJECTS = 5_000  # more documents, messages, ... than any limit allows
TEXTS = st.one_of(
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "nul\x00inside", "x" * 100_000, "", " "]),
    st.text(st.characters(categories=["Cs", "Cc", "Zs", "Lo"]), min_size=1, max_size=12),
)
NUMBERS = st.sampled_from(
    [
        float("nan"),
        float("inf"),
        float("-inf"),
        1e308,
        -1e308,
        5e-324,
        2**63,
        -(2**63) - 1,
        10**30,
        2**31,
        -1,
        0,
    ]
)
# Parameters are text on the wire: the same, as a URL carries them (a surrogate as UTF-8 that
# is not valid, which the server decodes with a replacement character).
PARAMETERS = st.one_of(
    st.sampled_from(["%00", "a%00b", "%ED%A0%80", "x" * 5000, "NaN", "1e999", "-1", "0"]),
    NUMBERS.map(lambda n: quote(str(n))),
    st.text(st.characters(categories=["Cc", "Lo", "Zs"]), min_size=1, max_size=12).map(
        lambda t: quote(t, safe="")
    ),
)


# Realistic bodies to make hostile as well as the generated ones: a generated chat request
# names no `rag:` model and no user turn, so it never gets past its first check.
REALISTIC: dict[str, Any] = {
    "POST /v1/chat/completions": {
        "model": "rag:fuzz,fuzz",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "What do tests miss?"}]},
            {"role": "assistant", "content": "Bugs."},
            {"role": "user", "content": "Which ones?"},
        ],
        "temperature": 0.5,
        "max_tokens": 16,
    },
    "POST /v1/embeddings": {"input": ["a text", "another"], "model": ""},
    "POST /v1/search": {
        "query": "bugs",
        "collections": ["fuzz"],
        "k": 5,
        "filters": {"year": {"$gte": 2020}, "tags": {"$in": ["a", "b"]}},
        "ranking": {"text_weight": 0.5, "rrf_k": 60},
    },
    "POST /v1/query": {
        "question": "What do tests miss?",
        "collections": ["fuzz"],
        "filters": {"lang": "en"},
        "on_upstream_error": "extractive",
    },
    "POST /v1/collections/{collection}/documents": {
        "documents": [
            {"external_id": "d", "title": "T", "text": "A text.", "metadata": {"k": ["v"]}}
        ]
    },
    "POST /v1/collections": {"name": "made", "description": "d", "metadata": {"k": "v"}},
    "POST /v1/feedback": {
        "query_id": "00000000-0000-0000-0000-000000000000",
        "rating": 1,
        "comment": "good",
    },
}


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON value, the value itself first."""
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*path, i))


def _hostile(value: Any, data: st.DataObject) -> Any:
    """A hostile value in place of `value`, of its kind (text for text, ...), or any kind."""
    if isinstance(value, str):
        return data.draw(TEXTS)
    if isinstance(value, bool) or value is None:
        return data.draw(st.one_of(TEXTS, NUMBERS))
    if isinstance(value, int | float):
        return data.draw(NUMBERS)
    if isinstance(value, list):
        item = value[0] if value else data.draw(TEXTS)
        # Scalars past a statement's parameters; objects past every batch limit, as time allows.
        huge = [item] * (HUGE if not isinstance(item, dict | list) else HUGE_OBJECTS)
        return data.draw(st.sampled_from([huge, [data.draw(TEXTS)], [*value, None]]))
    if isinstance(value, dict):
        return {**value, data.draw(TEXTS): data.draw(st.one_of(TEXTS, NUMBERS))}
    return data.draw(TEXTS)


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    return [_replace(item, rest, new) if i == head else item for i, item in enumerate(value)]


def _hostile_request(case: schemathesis.Case, data: st.DataObject) -> dict[str, Any]:
    """The request of `case` with one value swapped for a hostile one; JSON bodies as raw
    bytes (NaN and `\\ud800` escapes included), other bodies left out."""
    body = case.body if case.media_type == "application/json" else None
    realistic = REALISTIC.get(case.operation.label)
    if realistic is not None and data.draw(st.booleans()):
        body = realistic
    query = {k: quote(str(v), safe="") for k, v in (case.query or {}).items()}
    path_params = {k: quote(str(v), safe="") for k, v in (case.path_parameters or {}).items()}
    places = [("body", p) for p in _paths(body) if p] if body is not None else []
    places += [("query", (k,)) for k in query] + [("path", (k,)) for k in path_params]
    if body is not None and data.draw(st.booleans()):  # every string of the body at once
        body = _every_string(body, data.draw(TEXTS))
    elif places:
        where, path = data.draw(st.sampled_from(places))
        if where == "body":
            body = _replace(body, path, _hostile(_get(body, path), data))
        else:
            (query if where == "query" else path_params)[path[0]] = data.draw(PARAMETERS)
    url = case.operation.path.format(**path_params)
    if query:
        url += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    raw = None if body is None else json.dumps(body).encode()  # NaN stays NaN, \ud800 escaped
    return {"method": case.method, "url": url, "data": raw}


def _every_string(value: Any, text: str) -> Any:
    if isinstance(value, str):
        return text
    if isinstance(value, dict):
        return {k: _every_string(v, text) for k, v in value.items()}
    if isinstance(value, list):
        return [_every_string(item, text) for item in value]
    return value


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        value = value[part]
    return value


def _fuzz_hostile(operation: APIOperation, target: Target, client: Any, tally: Tally) -> None:
    names = {p.name for p in operation.path_parameters}
    deleting = operation.method.upper() == "DELETE"
    fixed = {k: v for k, v in SEEDED.items() if k in names and not deleting}
    strategy = operation.as_strategy(
        generation_mode=GenerationMode.POSITIVE, path_parameters=fixed or None
    )

    @given(case=strategy, data=st.data())
    @settings(
        max_examples=HOSTILE_EXAMPLES if _takes_json(operation) else 4,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: schemathesis.Case, data: st.DataObject) -> None:
        tally.examples += 1
        request = _hostile_request(case, data)
        headers = {**target.headers, "Content-Type": "application/json"}
        sent = {**request, "data": (request["data"] or b"")[:300]}
        try:  # an exception that escaped the app (a 500 logged twice) fails the call here
            status = client.request(**request, headers=headers).status_code
        except Exception as exc:
            status = 500
            sent["raised"] = repr(exc)[:200]
        tally.statuses[status] += 1
        if status >= 500:
            tally.failures.append(f"{operation.label}: {status} for {sent}")

    run()


def _takes_json(operation: APIOperation) -> bool:
    return any(body.media_type == "application/json" for body in operation.body)


def test_hostile_values_get_no_5xx(
    target: Target, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    tally = Tally()
    operations = list(_each_operation(target.app))
    started = time.monotonic()
    with asgi.get_client(target.app) as client:
        for operation in operations:
            _fuzz_hostile(operation, target, client, tally)
    with capsys.disabled():
        print(
            f"\nhostile fuzz: {len(operations)} operations, {tally.examples} examples, "
            f"{len(tally.failures)} failures in {time.monotonic() - started:.0f} s; "
            f"statuses {dict(sorted(tally.statuses.items()))}"
        )
    assert tally.failures == [], "\n".join(tally.failures)
    assert_nothing_logged_as_error(caplog)
