"""The `ragservice` command: serve, worker, ingest, keys, db upgrade, replicas, dev-cluster."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from ragservice import store
from ragservice.config import Settings, configure_logging, get_settings
from ragservice.errors import RagServiceError
from ragservice.keys import Role

if TYPE_CHECKING:
    from ragservice.db import Database
    from ragservice.runtime import Runtime

app = typer.Typer(
    help="RAG and vector-search data service on PostgreSQL + pgvector.", no_args_is_help=True
)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")
keys_app = typer.Typer(help="API keys.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
replicas_app = typer.Typer(help="Read replicas.", no_args_is_help=True)
app.add_typer(replicas_app, name="replicas")
console = Console(stderr=True)


@app.command()
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
    try:
        app_ = create_app(
            settings.model_copy(update={"host": bind}), services=_job_workers(settings)
        )
    except RagServiceError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    if settings.auth_disabled:
        console.print(
            "[yellow]authentication is OFF[/yellow] (RAGSERVICE_AUTH_DISABLED): "
            f"anyone who can reach {bind} acts as the default tenant's admin"
        )
    uvicorn.run(app_, host=bind, port=port or settings.port, log_level=settings.log_level.lower())


def _job_workers(settings: Settings) -> list[Callable[[Runtime], Any]]:
    """The server runs RAGSERVICE_WORKERS ingest job threads; 0 leaves jobs to `worker`s."""
    if settings.workers == 0:
        return []
    from ingest.worker import JobWorker

    return [JobWorker]


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant name; created if new.")],
    role: Annotated[Role, typer.Option("--role", help="reader, writer or admin.")],
    name: Annotated[str | None, typer.Option("--name", help="A label for the key.")] = None,
) -> None:
    """Create an API key and print it once; only its hash is stored."""
    from ragservice.keys import new_key

    key = new_key()
    with _database() as db, db.write() as session:
        tenant_id = store.ensure_tenant(session, tenant)
        store.create_api_key(
            session, tenant_id=tenant_id, role=role, prefix=key.prefix, key_hash=key.hash, name=name
        )
    console.print(f"created a {role} key for tenant {tenant!r}; it is shown only this once:")
    typer.echo(key.secret)


@keys_app.command("list")
def keys_list() -> None:
    """List keys (prefix, tenant, role, state); secrets are never shown again."""
    with _database() as db, db.read() as session:
        rows = store.list_api_keys(session)
    for key, tenant in rows:
        state = "revoked" if key.revoked_at else "active"
        typer.echo(f"{key.prefix}\t{tenant}\t{key.role}\t{state}\t{key.name or ''}")


@keys_app.command("revoke")
def keys_revoke(
    prefix: str = typer.Argument(..., help="The key's prefix, as `keys list` shows."),
) -> None:
    """Revoke a key; requests with it get 401 from then on."""
    with _database() as db, db.write() as session:
        revoked = store.revoke_api_key(session, prefix)
    if not revoked:
        console.print(f"[red]error:[/red] no active key with prefix {prefix!r}")
        raise typer.Exit(1)
    console.print(f"revoked {revoked} key(s)")


@contextmanager
def _database() -> Iterator[Database]:
    from ragservice.db import open_database

    try:
        db = open_database(get_settings(), route_reads=False)
    except RagServiceError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    try:
        yield db
    finally:
        db.dispose()


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head")) -> None:
    """Apply the schema migrations (the server and the CLI also do this on start)."""
    from ragservice.db import migrate

    with _database() as db:
        if revision != "head":
            migrate.upgrade(db.write_engine, revision)
        with db.write_engine.connect() as conn:
            console.print(f"schema at revision {migrate.current_revision(conn)}")


@replicas_app.command("status")
def replicas_status(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Each node's role, region, health, replay lag and WAL position (exit 1 if a replica does
    not serve reads)."""
    from ragservice.db.engine import make_router

    settings = get_settings()
    if not settings.replica_urls():
        console.print("no replicas configured (RAGSERVICE_REPLICAS); every read is on the primary")
        return
    with _database() as db:
        router = make_router(settings, db.write_engine)
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
        _print_nodes(nodes, settings.region)
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


@app.command("dev-cluster")
def dev_cluster(
    replicas: Annotated[int, typer.Option(min=1, max=8, help="Streaming standbys to run.")] = 1,
    regions: Annotated[
        str, typer.Option(help="Comma-separated region names, given to the standbys in turn.")
    ] = "local",
    first_port: Annotated[int, typer.Option(help="Port of the first standby.")] = 5433,
) -> None:
    """Run the embedded primary with streaming standbys (pg_basebackup -R) until Ctrl-C, and
    print the settings that point a server at them. At exit the standbys are stopped and
    removed, with their replication slots (which would otherwise keep WAL on the primary)."""
    import signal
    import threading

    from ragservice.db.cluster import DevCluster

    settings = get_settings()
    if settings.database_url:
        console.print(
            "[red]error:[/red] dev-cluster runs standbys of the embedded server; "
            "unset RAGSERVICE_DATABASE_URL"
        )
        raise typer.Exit(2)
    names = [region.strip() for region in regions.split(",") if region.strip()]
    cluster = DevCluster(
        settings.data_dir, replicas=replicas, regions=names or ["local"], first_port=first_port
    )
    try:
        cluster.start()
    except RagServiceError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        for standby in cluster.standbys:
            console.print(f"standby {standby.name} ({standby.region}) on port {standby.port}")
        console.print("serve reads from them with (Ctrl-C stops the standbys):")
        typer.echo(f"RAGSERVICE_REGION={cluster.standbys[0].region}")
        typer.echo(f"RAGSERVICE_REPLICAS={cluster.replicas_setting()}")
        while not stop.wait(1.0):
            pass
    finally:
        cluster.destroy()
        console.print("standbys stopped and removed")


@app.command()
def worker(
    threads: Annotated[
        int | None,
        typer.Option(min=1, help="Job threads (default RAGSERVICE_WORKERS, at least 1)."),
    ] = None,
) -> None:
    """Run queued ingest jobs until SIGINT or SIGTERM; any number of workers may run at once."""
    from ingest.worker import JobWorker, run_until_signalled
    from ragservice.runtime import open_runtime

    settings = get_settings()
    try:
        runtime = open_runtime(settings)
    except RagServiceError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    try:
        run_until_signalled(JobWorker(runtime, threads=threads or settings.workers or 1))
    finally:
        runtime.close()


def _register_ingest() -> None:
    from ingest.cli import ingest_command

    app.command("ingest")(ingest_command)


_register_ingest()


def main() -> None:
    configure_logging(get_settings().log_level)
    app()
