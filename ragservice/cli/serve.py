"""`ragservice serve` (the REST API, with ingest job threads) and `ragservice worker` (ingest
jobs only).

Both stop on SIGTERM or SIGINT within RAGSERVICE_SHUTDOWN_GRACE_SECONDS (`api/stopping.py`
shares it out): streamed answers end with a last event saying so, running jobs go back to the
queue, and the embedded PostgreSQL (if this process is its last holder) stops as it exits.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ragservice.cli.common import console, exit_on_error
from ragservice.config import JobSettings, ObservabilitySettings, ServerSettings, get_settings

if TYPE_CHECKING:
    import uvicorn

    from ragservice.api.app import ServiceFactory
    from ragservice.api.stopping import Stopping
    from ragservice.metrics import WorkerMetrics

_STARTUP_FAILURE = 3  # uvicorn's exit status when the app did not start


def serve(
    host: str | None = typer.Option(None, help="Bind address (default RAGSERVICE_HOST)."),
    port: int | None = typer.Option(None, help="Port (default RAGSERVICE_PORT)."),
) -> None:
    """Serve the REST API and run ingest jobs (embedded PostgreSQL unless
    RAGSERVICE_DATABASE_URL is set)."""
    import uvicorn

    from ragservice.api.app import create_app

    settings = get_settings()
    bind = host or settings.server.host
    with exit_on_error(2):
        app_ = create_app(
            settings.model_copy(update={"host": bind}), services=_job_workers(settings.jobs)
        )
    if settings.security.auth_disabled:
        console.print(
            "[yellow]authentication is OFF[/yellow] (RAGSERVICE_AUTH_DISABLED): "
            f"anyone who can reach {bind} acts as the default tenant's admin"
        )
    config = uvicorn.Config(
        app_,
        host=bind,
        port=port or settings.server.port,
        log_level=settings.observability.log_level.lower(),
        timeout_graceful_shutdown=_drain_seconds(settings.server),
        **_uvicorn_logging(settings.observability),
    )
    _run(config, app_.state.stopping)


def _run(config: uvicorn.Config, stopping: Stopping) -> None:
    """uvicorn's `run` for one process, with the stop begun at the signal itself."""
    from ragservice.db.embedded import limit_stop_wait

    server = _server_class()(config, stopping)
    try:
        server.run()
    except KeyboardInterrupt:  # SIGINT, passed on by uvicorn once it has shut down
        pass
    finally:
        limit_stop_wait(stopping.remaining())  # what is left of the grace, for PostgreSQL
    if not server.started:
        sys.exit(_STARTUP_FAILURE)


def _server_class() -> type[Any]:
    import uvicorn

    class StoppingServer(uvicorn.Server):
        """uvicorn's server, telling the app of a SIGTERM or SIGINT at once: uvicorn waits for
        open responses before the app's shutdown, and streamed answers must end first."""

        def __init__(self, config: uvicorn.Config, stopping: Stopping) -> None:
            super().__init__(config)
            self._stopping = stopping

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            self._stopping.begin()
            super().handle_exit(sig, frame)

    return StoppingServer


def _drain_seconds(server: ServerSettings) -> int:
    """How long uvicorn waits for responses still open before it cancels them."""
    from ragservice.api.stopping import DRAIN_SHARE

    return max(1, int(server.shutdown_grace_seconds * DRAIN_SHARE))


def job_stop_seconds(server: ServerSettings) -> float:
    """How long `ragservice worker`'s jobs have to go back to the queue after a signal."""
    from ragservice.api.stopping import JOBS_SHARE

    return server.shutdown_grace_seconds * JOBS_SHARE


def _uvicorn_logging(observability: ObservabilitySettings) -> dict[str, Any]:
    """In JSON mode uvicorn's lines go through the service's JSON handler (no config of its
    own) and its access line is off: the app writes one per request, with the request id."""
    if observability.log_format == "json":
        return {"log_config": None, "access_log": False}
    return {}


def _job_workers(jobs: JobSettings) -> list[ServiceFactory]:
    """The server runs RAGSERVICE_WORKERS ingest job threads; 0 leaves jobs to `worker`s."""
    if jobs.workers == 0:
        return []
    from ingest.worker import JobWorker

    return [JobWorker]


def worker(
    threads: Annotated[
        int | None,
        typer.Option(min=1, help="Job threads (default RAGSERVICE_WORKERS, at least 1)."),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="Serve Prometheus metrics on this port (default "
            "RAGSERVICE_WORKER_METRICS_PORT; unset: no metrics).",
        ),
    ] = None,
    metrics_host: Annotated[
        str | None,
        typer.Option(help="Bind address of --metrics-port (default RAGSERVICE_METRICS_HOST)."),
    ] = None,
) -> None:
    """Run queued ingest jobs until SIGINT or SIGTERM; any number of workers may run at once."""
    from ingest.worker import JobWorker, run_until_signalled
    from ragservice.db.embedded import limit_stop_wait
    from ragservice.metrics import WorkerMetrics
    from ragservice.runtime_metrics import runtime_collectors
    from ragservice.services.composition import open_serving_runtime

    settings = get_settings()
    port = settings.observability.worker_metrics_port if metrics_port is None else metrics_port
    with exit_on_error():
        runtime = open_serving_runtime(settings)
    metrics = WorkerMetrics()
    unwatch = metrics.watch(runtime_collectors(runtime))
    stop_serving = None
    try:
        if port is not None:
            with exit_on_error():
                stop_serving = _serve_worker_metrics(
                    metrics, metrics_host or settings.observability.metrics_host, port
                )
        runtime.models.start()  # each job embeds with the model active when it starts
        job_worker = JobWorker(
            runtime, threads=threads or settings.jobs.workers or 1, metrics=metrics.jobs
        )
        run_until_signalled(job_worker, grace_seconds=job_stop_seconds(settings.server))
        grace = settings.server.shutdown_grace_seconds
        limit_stop_wait(grace - job_stop_seconds(settings.server))
    finally:
        if stop_serving is not None:
            stop_serving()
        unwatch()
        runtime.close()


def _serve_worker_metrics(metrics: WorkerMetrics, host: str, port: int) -> Callable[[], None]:
    from ragservice.errors import ConfigurationError

    try:
        return metrics.serve(host, port)
    except OSError as exc:
        raise ConfigurationError(f"cannot serve metrics on {host}:{port}: {exc}") from exc
