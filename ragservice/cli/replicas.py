"""`ragservice replicas status` (the read replicas' health and lag) and `ragservice
dev-cluster` (streaming standbys of the embedded server, or a Citus cluster of it, for
development)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from ragservice.cli.common import console, database, exit_on_error, fail
from ragservice.config import get_settings

app = typer.Typer(help="Read replicas.", no_args_is_help=True)


@app.command("status")
def replicas_status(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Each node's role, region, health, replay lag and WAL position (exit 1 if a replica does
    not serve reads)."""
    from ragservice.db.engine import make_router

    replication = get_settings().replication
    if not replication.replica_urls():
        console.print("no replicas configured (RAGSERVICE_REPLICAS); every read is on the primary")
        return
    with database() as db:
        router = make_router(replication, db.write_engine)
        try:
            router.check()
            nodes = router.status()
        finally:
            router.stop()
            for replica in router.replicas:
                replica.engine.dispose()
    if as_json:
        typer.echo(json.dumps(nodes, indent=2))
    else:
        _print_nodes(nodes, replication.region)
    if not all(node["serving"] for node in nodes if node["role"] == "replica"):
        raise typer.Exit(1)


def _print_nodes(nodes: list[dict[str, Any]], region: str | None) -> None:
    from rich.table import Table

    table = Table(title=f"nodes (this server's region: {region or 'unset'})")
    for column in ("node", "role", "region", "state", "lag", "WAL position", "detail"):
        table.add_column(column)
    for node in nodes:
        if not node["healthy"]:
            state = "[red]down[/red]"
        elif node["role"] == "replica" and not node["serving"]:
            state = "[yellow]lagging[/yellow]"
        else:
            state = "[green]ok[/green]"
        lag = "" if node["lag_seconds"] is None else f"{node['lag_seconds']:.2f} s"
        if node["lag_bytes"]:
            lag += f" / {node['lag_bytes']} B"
        detail = node["error"] or ("replay paused" if node["replay_paused"] else "")
        table.add_row(
            node["name"], node["role"], node["region"] or "", state, lag, node["lsn"] or "", detail
        )
    Console().print(table)


def dev_cluster(
    replicas: Annotated[int, typer.Option(min=1, max=8, help="Streaming standbys to run.")] = 1,
    regions: Annotated[
        str, typer.Option(help="Comma-separated region names, given to the standbys in turn.")
    ] = "local",
    first_port: Annotated[
        int, typer.Option(help="Port of the first standby (with --citus: the coordinator's).")
    ] = 5433,
    citus: Annotated[
        bool,
        typer.Option(
            "--citus",
            help="Run a Citus cluster instead: a coordinator and --workers workers on loopback "
            "(Citus installed into the embedded PostgreSQL; docs/scaling.md#a-local-cluster).",
        ),
    ] = False,
    workers: Annotated[int, typer.Option(min=1, max=8, help="Citus workers (--citus).")] = 2,
) -> None:
    """Run the embedded primary with streaming standbys (pg_basebackup -R) until Ctrl-C, and
    print the settings that point a server at them. At exit the standbys are stopped and
    removed, with their replication slots (which would otherwise keep WAL on the primary)."""
    from ragservice.dev.cluster import DevCluster

    settings = get_settings()
    if citus:
        _run_citus_cluster(settings.database.data_dir, workers=workers, first_port=first_port)
        return
    if settings.database.url:
        raise fail(
            "dev-cluster runs standbys of the embedded server; unset RAGSERVICE_DATABASE_URL", 2
        )
    names = [region.strip() for region in regions.split(",") if region.strip()]
    cluster = DevCluster(
        settings.database.data_dir,
        replicas=replicas,
        regions=names or ["local"],
        first_port=first_port,
    )
    with exit_on_error():
        cluster.start()
    stop = _stop_on_signals()
    try:
        for standby in cluster.standbys:
            console.print(f"standby {standby.name} ({standby.region}) on port {standby.port}")
        console.print("serve reads from them with (Ctrl-C stops the standbys):")
        typer.echo(f"RAGSERVICE_REGION={cluster.standbys[0].region}")
        typer.echo(f"RAGSERVICE_REPLICAS={cluster.replicas_setting()}")
        stop.wait()
    finally:
        cluster.destroy()
        console.print("standbys stopped and removed")


def _run_citus_cluster(data_dir: Path, *, workers: int, first_port: int) -> None:
    """A Citus coordinator and `workers` workers until Ctrl-C: migrated, with the service's
    login, and the settings that point a server at it printed."""
    from ragservice.dev.citus import CitusCluster

    cluster = CitusCluster(data_dir, workers=workers, first_port=first_port)
    with exit_on_error():
        cluster.start()
        service_url = cluster.prepare_store()
    stop = _stop_on_signals()
    try:
        for node in cluster.nodes:
            console.print(f"citus {node.name} on {node.port} ({node.data_dir})")
        console.print(
            "serve from the coordinator with (then `ragservice db distribute`; Ctrl-C stops "
            "the nodes, their data stays):"
        )
        typer.echo(f"RAGSERVICE_DATABASE_URL={service_url}")
        typer.echo(f"RAGSERVICE_OWNER_DATABASE_URL={cluster.url}")
        stop.wait()
    finally:
        cluster.stop()
        console.print("citus nodes stopped")


class _Stop:
    """Set by SIGINT or SIGTERM; `wait` returns then."""

    def __init__(self) -> None:
        import threading

        self._event = threading.Event()

    def wait(self) -> None:
        while not self._event.wait(1.0):  # a timeout: the main thread must run the handler
            pass

    def set(self, *_: object) -> None:
        self._event.set()


def _stop_on_signals() -> _Stop:
    import signal

    stop = _Stop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop.set)
    return stop
