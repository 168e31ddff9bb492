"""Helpers shared by the command groups: the stderr console, the database, error exits, and
the options that pick feedback (tenant, collection, time span)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from ragservice.config import DEFAULT_TENANT_ID, DEFAULT_TENANT_NAME, get_settings
from ragservice.errors import RagServiceError

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID
    from sqlalchemy import Engine
    from sqlalchemy.orm import Session

    from ragservice.client import RagserviceClient
    from ragservice.db import Database
    from ragservice.db.maintenance import StepResult
    from ragservice.feedback.exports import ExportFilter, TimeOf
    from ragservice.services.embedding_models import BuildProgress

console = Console(stderr=True)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `error: MESSAGE` on stderr and return the exit (status `code`) to raise. The
    message is shown as written (`[mcp]` of a `pip install` line is no markup)."""
    from rich.markup import escape

    console.print(f"[red]error:[/red] {escape(message)}")
    return typer.Exit(code)


@contextmanager
def exit_on_error(code: int = 1) -> Iterator[None]:
    """Turn a RagServiceError raised inside into `error: ...` on stderr and exit `code`."""
    try:
        yield
    except RagServiceError as exc:
        raise fail(str(exc), code) from exc


@contextmanager
def database() -> Iterator[Database]:
    """The service's database, on the primary, for one command (exit 1 if it cannot open).

    Operator commands work across tenants: within, this thread's transactions see every
    tenant's rows (`tenancy.as_system()`); a command that works for one tenant narrows that
    with `tenancy.as_tenant(...)`."""
    from ragservice.db import open_database, tenancy

    with exit_on_error():
        db = open_database(get_settings(), route_reads=False)
    try:
        with tenancy.as_system():
            yield db
    finally:
        db.dispose()


def run_optimize_steps(engine: Engine) -> list[StepResult]:
    """`ragservice db optimize` on `engine` (the owner's login), a line per step on the
    console and the total at the end; PermissionDeniedError when the login does not own the
    tables."""
    from ragservice.db import maintenance

    def done(result: StepResult) -> None:
        console.print(
            f"  {result.step.table}: {byte_size(result.bytes_before)} → "
            f"{byte_size(result.bytes_after)} in {result.seconds:.1f} s"
        )

    results = maintenance.run_optimize(
        engine, on_start=lambda step: console.print(f"{step.label} …"), on_done=done
    )
    before = sum(r.bytes_before for r in results)
    after = sum(r.bytes_after for r in results)
    console.print(f"optimized: {byte_size(before)} → {byte_size(after)}")
    return results


def byte_size(n: int) -> str:
    """`n` bytes for people: 512 B, 1.5 MiB, 2.0 GiB."""
    if n < 1024:
        return f"{n} B"
    value = n / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


class IndexBar:
    """An HNSW index build's progress (`indexing.Progress`) as a task of a rich Progress
    whose first column shows `{task.description}`: the phase, and tuples (or blocks) done."""

    def __init__(self, progress: Progress, label: str) -> None:
        self._progress, self._label = progress, label
        self._task: TaskID | None = None

    def __call__(self, seen: BuildProgress) -> None:
        done, total = (
            (seen.tuples_done, seen.tuples_total)
            if seen.tuples_total
            else (seen.blocks_done, seen.blocks_total)
        )
        description = f"indexing {self._label}: {seen.phase}"
        if self._task is None:
            self._task = self._progress.add_task(description, total=total or None)
        self._progress.update(
            self._task, description=description, completed=done, total=total or None
        )


def cli_actor() -> str:
    """Who runs this command, as the audit log names operators: `cli:<OS user>`."""
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no name for this uid (a bare container)
        import os

        return f"cli:uid-{os.getuid()}"


def tenant_id(session: Session, name: str | None) -> uuid.UUID:
    """The tenant named `name`, or the default tenant's id for None (exit 1 if none)."""
    if name is None:
        return uuid.UUID(DEFAULT_TENANT_ID)
    return tenant_named(session, name)


def tenant_id_of(db: Database, name: str, hint: str = "") -> uuid.UUID:
    """`tenant_named` in a transaction of its own that sees every tenant."""
    from ragservice.services import tenants

    with exit_on_error():
        return tenants.tenant_id_of(db, name, hint=hint)


def tenant_named(session: Session, name: str, hint: str = "") -> uuid.UUID:
    """The id of the tenant named `name`; exit 1 with `error: no tenant named 'NAME'` and
    `hint` (what to do about it) when there is none."""
    from ragservice.services import tenants

    with exit_on_error():
        return tenants.require_tenant_id(session, name, hint=hint)


UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="Ask the server at this URL (e.g. http://127.0.0.1:8000) instead of the local store.",
    ),
]
ApiKeyOption = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="RAGSERVICE_API_KEY",
        show_envvar=True,
        help="The API key sent with --url.",
    ),
]


@contextmanager
def remote_client(url: str, api_key: str | None, tenant: str | None) -> Iterator[RagserviceClient]:
    """A client of the server at `url` for one command; with `--url`, the key names the
    tenant, so `--tenant` is refused."""
    from ragservice.client import RagserviceClient

    if tenant is not None:
        raise typer.BadParameter(
            "with --url the API key decides the tenant; leave --tenant out", param_hint="--tenant"
        )
    with RagserviceClient.connect(url, api_key=api_key) as client:
        yield client


def local_tenant(name: str | None) -> str:
    """The tenant a command works for in the local store: `name`, or the default tenant."""
    return DEFAULT_TENANT_NAME if name is None else name


def iso_time(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is not an ISO date or time", param_hint=option
        ) from None


def feedback_filter(
    session: Session,
    tenant: str | None,
    collection: str | None,
    since: str | None,
    until: str | None,
    *,
    time_of: TimeOf | None = None,
    min_rating: int | None = None,
    max_rating: int | None = None,
) -> ExportFilter:
    """The feedback the --tenant, --collection, --since and --until options pick (`time_of`
    None: they bound the feedback's time)."""
    from ragservice.feedback.exports import ExportFilter, TimeOf

    return ExportFilter(
        tenant_id=tenant_id(session, tenant),
        collection=collection,
        since=iso_time(since, "--since"),
        until=iso_time(until, "--until"),
        time_of=TimeOf.FEEDBACK if time_of is None else time_of,
        min_rating=min_rating,
        max_rating=max_rating,
    )


def held_out_change(held_out: dict[str, Any]) -> str:
    """`0.612 → 0.655`: a trained version's held-out nDCG@10 before and after training, or ''
    when either is missing (`models list`, `rerankers list`)."""
    before, after = held_out.get("before", {}), held_out.get("after", {})
    if "ndcg@10" in before and "ndcg@10" in after:
        return f"{before['ndcg@10']:.3f} → {after['ndcg@10']:.3f}"
    return ""
