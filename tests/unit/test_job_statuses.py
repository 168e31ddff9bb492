"""The job statuses are `ragservice.types.JobStatus`, and the console's `JobStatus` mirrors it."""

from __future__ import annotations

import re
from pathlib import Path

from ragservice.client import JobStatus as ClientJobStatus
from ragservice.types import ACTIVE_JOB_STATUSES, FINISHED_JOB_STATUSES, JobStatus

ROOT = Path(__file__).resolve().parents[2]
JOBS_JS = ROOT / "ragservice" / "console" / "static" / "js" / "pages" / "jobs.js"


def console_statuses() -> dict[str, str]:
    frozen = re.search(r"JobStatus = Object\.freeze\(\{(.*?)\}\)", JOBS_JS.read_text())
    assert frozen is not None
    return dict(re.findall(r'(\w+): "(\w+)"', frozen.group(1)))


def test_the_console_mirrors_the_statuses() -> None:
    assert console_statuses() == {status.name: status.value for status in JobStatus}


def test_every_status_is_active_or_finished_and_the_client_uses_the_same() -> None:
    assert set(ACTIVE_JOB_STATUSES) | set(FINISHED_JOB_STATUSES) == set(JobStatus)
    assert not set(ACTIVE_JOB_STATUSES) & set(FINISHED_JOB_STATUSES)
    assert ClientJobStatus is JobStatus
    assert [str(s) for s in JobStatus] == ["queued", "running", "done", "failed"]
