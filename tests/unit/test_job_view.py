"""A job as JSON: `ragservice jobs --json` (the service's `JobView.to_json`) and the REST
API's `JobOut` write the same document."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from ragservice.api.schemas.jobs import job_out
from ragservice.services.jobs import JobError, JobView, PlacedJob
from ragservice.types import JobStatus


def a_job(**changes: object) -> JobView:
    fields: dict[str, object] = {
        "id": uuid.UUID(int=7),
        "status": JobStatus.FAILED,
        "kind": "upload",
        "collection_id": uuid.UUID(int=9),
        "counts": {"new": 2, "failed": 1},
        "errors": [JobError("a.pdf", "encrypted"), JobError(None, "gave up")],
        "attempts": 3,
        "created_at": datetime(2026, 12, 6, 7, 0, 1, 250000, tzinfo=UTC),
        "started_at": datetime(2026, 12, 6, 7, 0, 2, tzinfo=UTC),
        "finished_at": None,
    }
    return JobView(**{**fields, **changes})  # type: ignore[arg-type]


def test_the_cli_and_the_api_write_a_job_alike() -> None:
    job = a_job()
    assert job.to_json() == job_out(job).model_dump(mode="json")
    assert list(job.to_json()) == list(job_out(job).model_dump(mode="json"))
    assert job.to_json()["created_at"] == "2026-12-06T07:00:01.250000Z"


def test_a_placed_job_adds_its_tenant_and_collection_last() -> None:
    placed = PlacedJob(a_job(collection_id=None), "default", None)
    assert list(placed.to_json())[-2:] == ["tenant", "collection"]
    assert placed.to_json()["collection"] is None
    assert placed.to_json()["errors"] == [
        {"source": "a.pdf", "error": "encrypted"},
        {"source": None, "error": "gave up"},
    ]
