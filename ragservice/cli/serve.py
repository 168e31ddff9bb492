"""`ragservice serve` (the REST API, with ingest job threads) and `ragservice worker` (ingest
jobs only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ragservice.cli.common import console, exit_on_error
from ragservice.config import Settings, get_settings

if TYPE_CHECKING:
    from ragservice.bootstrap import Runtime


def serve(
    host: str | None = typer.Option(None, help="Bind address (default RAGSERVICE_HOST)."),
    port: int | None = typer.Option(None, help="Port (default RAGSERVICE_PORT)."),
) -> None:
    """Serve the REST API and run ingest jobs (embedded PostgreSQL unless
    RAGSERVICE_DATABASE_URL is set)."""
    import uvicorn

    from ragservice.api.app import create_app

    settings = get_settings()
    bind = host or settings.host
    with exit_on_error(2):
        app_ = create_app(
            settings.model_copy(update={"host": bind}), services=_job_workers(settings)
        )
    if settings.auth_disabled:
        console.print(
            "[yellow]authentication is OFF[/yellow] (RAGSERVICE_AUTH_DISABLED): "
            f"anyone who can reach {bind} acts as the default tenant's admin"
        )
    uvicorn.run(
        app_,
        host=bind,
        port=port or settings.port,
        log_level=settings.log_level.lower(),
        **_uvicorn_logging(settings),
    )


def _uvicorn_logging(settings: Settings) -> dict[str, Any]:
    """In JSON mode uvicorn's lines go through the service's JSON handler (no config of its
    own) and its access line is off: the app writes one per request, with the request id."""
    if settings.log_format == "json":
        return {"log_config": None, "access_log": False}
    return {}


def _job_workers(settings: Settings) -> list[Callable[[Runtime], Any]]:
    """The server runs RAGSERVICE_WORKERS ingest job threads; 0 leaves jobs to `worker`s."""
    if settings.workers == 0:
        return []
    from ingest.worker import JobWorker

    return [JobWorker]


def worker(
    threads: Annotated[
        int | None,
        typer.Option(min=1, help="Job threads (default RAGSERVICE_WORKERS, at least 1)."),
    ] = None,
) -> None:
    """Run queued ingest jobs until SIGINT or SIGTERM; any number of workers may run at once."""
    from ingest.worker import JobWorker, run_until_signalled
    from ragservice.bootstrap import open_runtime, require_unprivileged_login

    settings = get_settings()
    with exit_on_error():
        runtime = open_runtime(settings)
        try:
            require_unprivileged_login(runtime.db, settings)
        except BaseException:
            runtime.close()
            raise
    try:
        runtime.models.start()  # each job embeds with the model active when it starts
        run_until_signalled(JobWorker(runtime, threads=threads or settings.workers or 1))
    finally:
        runtime.close()
