"""An app per test on its own database, with job workers running and keys for two tenants."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from ragservice import store
from ragservice.api.app import create_app
from ragservice.auth.keys import new_key
from ragservice.config import Settings
from ragservice.db import tenancy
from ragservice.embedding.embedder import SentenceTransformerEmbedder


@dataclass(frozen=True)
class Keys:
    reader: dict[str, str]
    writer: dict[str, str]
    admin: dict[str, str]
    other_tenant: dict[str, str]


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"job_poll_seconds": 0.2, "workers": 1})


@pytest.fixture
def client(api_settings: Settings, embedder: SentenceTransformerEmbedder) -> Iterator[TestClient]:
    from ingest.worker import JobWorker

    app = create_app(api_settings, embedder=embedder, services=[JobWorker])
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture
def keys(client: TestClient) -> Keys:
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.write() as session:  # the four keys in one transaction

        def make(tenant: str, role: str) -> dict[str, str]:
            secret = make_key(session, store.tenants.ensure_tenant(session, tenant), role)
            return {"Authorization": f"Bearer {secret}"}

        return Keys(
            reader=make("acme", "reader"),
            writer=make("acme", "writer"),
            admin=make("acme", "admin"),
            other_tenant=make("globex", "admin"),
        )


def make_key(session: Session, tenant_id: uuid.UUID, role: str, user: str | None = None) -> str:
    """A new key of the tenant (acting for `user`, if one is given); its secret."""
    key = new_key()
    store.tenants.create_api_key(
        session,
        tenant_id=tenant_id,
        role=role,
        prefix=key.prefix,
        key_hash=key.hash,
        user_name=user,
    )
    return key.secret


def wait_for_job(client: TestClient, job_id: str, headers: dict[str, str]) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
        if job["status"] in ("done", "failed"):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish: {job}")


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json() if response.content else None


@dataclass(frozen=True)
class People:
    """Keys of one tenant (`acme`) for the permission tests: users ana (in group hr) and bob
    (in none), and keys of no user."""

    hr: dict[str, str]
    """A reader key of user `ana`, in group `hr`."""
    outsider: dict[str, str]
    """A reader key of user `bob`, in no group."""
    no_user: dict[str, str]
    """A reader key of no user: unrestricted documents only."""
    admin: dict[str, str]
    """An admin key of no user: every document of the tenant."""
    writer: dict[str, str]
    outsider_writer: dict[str, str]
    """A writer key of user `bob`."""
    hr_writer: dict[str, str]
    """A writer key of user `ana`, in group `hr`."""
    tenant_id: uuid.UUID


@pytest.fixture
def people(client: TestClient, keys: Keys) -> People:
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.write() as session:
        tenant_id = store.tenants.ensure_tenant(session, "acme")
        store.tenants.add_group_members(session, tenant_id, "hr", ["ana"])

        def make(role: str, user: str | None) -> dict[str, str]:
            return {"Authorization": f"Bearer {make_key(session, tenant_id, role, user)}"}

        return People(
            hr=make("reader", "ana"),
            outsider=make("reader", "bob"),
            no_user=keys.reader,
            admin=keys.admin,
            writer=keys.writer,
            outsider_writer=make("writer", "bob"),
            hr_writer=make("writer", "ana"),
            tenant_id=tenant_id,
        )
