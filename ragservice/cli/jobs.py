"""`ragservice jobs`: list ingest jobs, show one, queue a failed one again; in the local
store (every tenant's, or one's) or on a server (`--url`, the API key's tenant)."""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ragservice.cli.common import (
    ApiKeyOption,
    UrlOption,
    console,
    database,
    exit_on_error,
    remote_client,
    tenant_id,
)
from ragservice.types import JobStatus

if TYPE_CHECKING:
    from ragservice.db import Database

app = typer.Typer(
    help="Ingest jobs: uploads queued for workers, and runs of `ragservice ingest`.",
    no_args_is_help=True,
)


TenantOption = Annotated[
    str | None,
    typer.Option(
        "--tenant",
        help="Without --url: only this tenant's jobs (default: every tenant's). With --url the "
        "API key decides.",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead.")]
JobIdArgument = Annotated[uuid.UUID, typer.Argument(help="The job's id.", show_default=False)]


@app.command("list")
def jobs_list(
    status: Annotated[
        JobStatus | None, typer.Option("--status", help="Only jobs in this state.")
    ] = None,
    collection: Annotated[
        str | None, typer.Option("--collection", "-c", help="Only jobs of this collection.")
    ] = None,
    tenant: TenantOption = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """The newest jobs first: id, status, kind, tenant and collection, attempts, when it was
    created, documents new / updated / failed."""
    state = status
    with exit_on_error():
        if url is not None:
            with remote_client(url, api_key, tenant) as client:
                listed = [
                    dict(job)
                    for job in client.jobs(collection=collection, status=state, limit=limit)
                ]
        else:
            listed = _local_jobs(tenant, collection, state, limit)
    if as_json:
        typer.echo(json.dumps(listed, indent=2))
        return
    _print_jobs(listed)


@app.command("show")
def jobs_show(
    job_id: JobIdArgument,
    tenant: TenantOption = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """A job's status, counts and every per-file error."""
    with exit_on_error():
        if url is not None:
            with remote_client(url, api_key, tenant) as client:
                job = dict(client.job(job_id))
        else:
            job = _local_job(job_id, tenant)
    if as_json:
        typer.echo(json.dumps(job, indent=2))
        return
    _print_job(job)


@app.command("retry")
def jobs_retry(
    job_id: JobIdArgument,
    tenant: TenantOption = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Queue a failed upload job again, as new (attempts, counts and errors reset): a worker
    (`ragservice serve` or `ragservice worker`) runs its files and texts again, skipping what
    is already stored. Refused for a job that did not fail, one `ragservice ingest` ran (run
    that again), or one whose uploads were purged (RAGSERVICE_JOB_PAYLOAD_RETENTION_HOURS)."""
    with exit_on_error():
        if url is not None:
            with remote_client(url, api_key, tenant) as client:
                job = dict(client.retry_job(job_id))
        else:
            job = _retry_locally(job_id, tenant)
    if as_json:
        typer.echo(json.dumps(job, indent=2))
        return
    console.print(f"job {job_id} is queued again; a worker takes it from there")


# -- local mode ----------------------------------------------------------------------------


def _local_jobs(
    tenant: str | None, collection: str | None, status: JobStatus | None, limit: int
) -> list[dict[str, Any]]:
    from ragservice.services import jobs

    with database() as db:
        found = jobs.list_placed_jobs(
            db, _tenant_id(db, tenant), collection=collection, status=status, limit=limit
        )
    return [job.to_json() for job in found]


def _local_job(job_id: uuid.UUID, tenant: str | None) -> dict[str, Any]:
    from ragservice.services import jobs

    with database() as db:
        return jobs.get_placed_job(db, _tenant_id(db, tenant), job_id).to_json()


def _retry_locally(job_id: uuid.UUID, tenant: str | None) -> dict[str, Any]:
    from ragservice.services import jobs

    with database() as db:
        return jobs.retry_placed_job(db, _tenant_id(db, tenant), job_id).to_json()


def _tenant_id(db: Database, tenant: str | None) -> uuid.UUID | None:
    """The tenant named `tenant`, or None (every tenant's jobs) when none is named."""
    if tenant is None:
        return None
    with db.read() as session:
        return tenant_id(session, tenant)


# -- output ----------------------------------------------------------------------------------


def _print_jobs(jobs: list[dict[str, Any]]) -> None:
    if not jobs:
        console.print("no jobs")
        return
    for job in jobs:
        counts = job["counts"]
        documents = "/".join(str(counts.get(k, 0)) for k in ("new", "updated", "failed"))
        fields = (
            job["id"],
            job["status"],
            job["kind"],
            _where(job),
            str(job["attempts"]),
            job["created_at"][:19],
            documents,
        )
        typer.echo("\t".join(fields))


def _where(job: dict[str, Any]) -> str:
    """`tenant/collection` locally; the collection's id from a server (its tenant is the key's)."""
    if "tenant" in job:
        return f"{job['tenant']}/{job['collection'] or '-'}"
    return job["collection_id"] or "-"


def _print_job(job: dict[str, Any]) -> None:
    lines = [
        ("job", job["id"]),
        ("status", job["status"]),
        ("kind", job["kind"]),
        ("where", _where(job)),
        ("attempts", str(job["attempts"])),
        ("created", job["created_at"]),
        ("started", job["started_at"] or "-"),
        ("finished", job["finished_at"] or "-"),
        ("counts", ", ".join(f"{k} {v}" for k, v in job["counts"].items()) or "-"),
    ]
    for label, value in lines:
        typer.echo(f"{label + ':':<10} {value}")
    for error in job["errors"]:
        typer.echo(f"error:     {error['source'] or '(the job)'}: {error['error']}")
