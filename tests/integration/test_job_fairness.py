"""The queue shared between tenants: a claim takes the job of the tenant with the fewest jobs
running (then the oldest), so that one tenant's runs cannot hold every worker while another's
uploads wait; a job abandoned by its worker counts as running, so taking it over does not jump
ahead of another tenant's queued job."""

from __future__ import annotations

import uuid

from sqlalchemy import text

from ragservice import store
from ragservice.runtime import Runtime
from tests.integration.test_jobs import UPLOAD, age_heartbeat, claim, execute


def tenant(runtime: Runtime, name: str) -> uuid.UUID:
    with runtime.db.write() as session:
        found: uuid.UUID = session.execute(
            text("INSERT INTO tenants (name) VALUES (:name) RETURNING id"), {"name": name}
        ).scalar_one()
    return found


def enqueue_for(runtime: Runtime, tenant_id: uuid.UUID, kind: str = "upload") -> uuid.UUID:
    with runtime.db.write() as session:
        collection_id = store.collections.ensure_collection(session, tenant_id, "uploads")
        return store.jobs.enqueue_job(
            session,
            tenant_id=tenant_id,
            collection_id=collection_id,
            kind=kind,
            params={"items": 1},
            items=UPLOAD[:1],
        )


def test_the_tenant_with_fewer_running_jobs_is_served_first(runtime: Runtime) -> None:
    busy, other = runtime.default_tenant_id, tenant(runtime, "other")
    first = enqueue_for(runtime, busy)
    second = enqueue_for(runtime, busy)
    third = enqueue_for(runtime, busy)
    theirs = enqueue_for(runtime, other)

    taken = [claim(runtime, f"w{i}") for i in range(4)]

    assert [job.id if job else None for job in taken] == [first, theirs, second, third]


def test_a_job_abandoned_by_its_worker_does_not_jump_ahead_of_another_tenants(
    runtime: Runtime,
) -> None:
    stuck_tenant, other = runtime.default_tenant_id, tenant(runtime, "other")
    stuck = enqueue_for(runtime, stuck_tenant, kind="source")
    assert claim(runtime, "before-the-restart") is not None
    age_heartbeat(runtime, stuck)  # its worker is gone: the job is abandoned
    upload = enqueue_for(runtime, other)

    after = [claim(runtime, "after-the-restart") for _ in range(2)]

    assert [job.id if job else None for job in after] == [upload, stuck]
    assert after[1] is not None and after[1].attempts == 2


def test_among_equals_the_oldest_goes_first(runtime: Runtime) -> None:
    one, two = runtime.default_tenant_id, tenant(runtime, "two")
    a = enqueue_for(runtime, two)
    b = enqueue_for(runtime, one)
    execute(
        runtime,
        "UPDATE ingest_jobs SET created_at = now() - interval '1 minute' WHERE id = :id",
        id=b,
    )

    assert [claim(runtime, "w").id for _ in range(2)] == [b, a]  # type: ignore[union-attr]
