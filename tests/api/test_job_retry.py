"""`POST /v1/jobs/{id}/retry`: a writer of the job's tenant queues a failed job again."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient

from ragservice import store
from ragservice.db import tenancy
from tests.api.conftest import Keys, ok, wait_for_job


def failed_job(client: TestClient, tenant: str) -> uuid.UUID:
    """A queued upload of one text that fails in the transaction that queued it, so that no
    worker takes it first (its items are kept, as after a worker's failure)."""
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    item = store.jobs.JobItem(kind="text", name="pumps", title=None, body=b"Pumps move water.")
    with tenancy.as_system(), db.write() as session:
        tenant_id = store.tenants.ensure_tenant(session, tenant)
        job_id = store.jobs.enqueue_job(
            session,
            tenant_id=tenant_id,
            collection_id=store.collections.ensure_collection(session, tenant_id, "docs"),
            kind="upload",
            params={"items": 1},
            items=[item],
        )
        store.jobs.finish_job(
            session, job_id, status="failed", counts={}, errors=[{"error": "database error"}]
        )
    return job_id


def test_a_writer_retries_a_failed_job_of_its_tenant(client: TestClient, keys: Keys) -> None:
    job_id = failed_job(client, "acme")
    url = f"/v1/jobs/{job_id}/retry"
    assert client.post(url, headers=keys.other_tenant).status_code == 404
    assert client.post(url, headers=keys.reader).status_code == 403
    assert client.post(url).status_code == 401

    retried = client.post(url, headers=keys.writer)
    queued = ok(retried, 202)
    assert retried.headers["Location"] == f"/v1/jobs/{job_id}"
    assert (queued["status"], queued["attempts"], queued["errors"]) == ("queued", 0, [])
    done = wait_for_job(client, str(job_id), keys.reader)
    assert (done["status"], done["counts"]["new"], done["attempts"]) == ("done", 1, 1)
    assert ok(client.get("/v1/collections/docs/documents/pumps", headers=keys.reader))

    again = client.post(url, headers=keys.writer)
    assert again.status_code == 409
    assert "only a failed job can be retried" in again.json()["detail"]
    assert client.post(f"/v1/jobs/{uuid.uuid4()}/retry", headers=keys.writer).status_code == 404
