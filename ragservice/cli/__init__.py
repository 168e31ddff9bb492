"""The `ragservice` command: serve, worker, ingest, keys, export-feedback, finetune, reembed,
models, analysts, db upgrade, replicas, dev-cluster."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from ragservice import store
from ragservice.auth.keys import Role
from ragservice.config import DEFAULT_TENANT_ID, Settings, configure_logging, get_settings
from ragservice.errors import RagServiceError
from ragservice.feedback.exports import ExportFormat

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from ragservice.bootstrap import Runtime
    from ragservice.db import Database
    from ragservice.db.models import EmbeddingModel
    from ragservice.embedding.embedder import SentenceTransformerEmbedder
    from ragservice.embedding.finetune import FinetuneResult
    from ragservice.embedding.registry import ModelStatus, Switch

app = typer.Typer(
    help="RAG and vector-search data service on PostgreSQL + pgvector.", no_args_is_help=True
)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")
keys_app = typer.Typer(help="API keys.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
replicas_app = typer.Typer(help="Read replicas.", no_args_is_help=True)
app.add_typer(replicas_app, name="replicas")
models_app = typer.Typer(help="Embedding model versions.", no_args_is_help=True)
app.add_typer(models_app, name="models")
analysts_app = typer.Typer(
    help="Read-only SQL access to the analytics views (docs/analysts.md).", no_args_is_help=True
)
app.add_typer(analysts_app, name="analysts")
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
    from ragservice.auth.keys import new_key

    key = new_key()
    with _database() as db, db.write() as session:
        tenant_id = store.tenants.ensure_tenant(session, tenant)
        store.tenants.create_api_key(
            session, tenant_id=tenant_id, role=role, prefix=key.prefix, key_hash=key.hash, name=name
        )
    console.print(f"created a {role} key for tenant {tenant!r}; it is shown only this once:")
    typer.echo(key.secret)


@keys_app.command("list")
def keys_list() -> None:
    """List keys (prefix, tenant, role, state); secrets are never shown again."""
    with _database() as db, db.read() as session:
        rows = store.tenants.list_api_keys(session)
    for key, tenant in rows:
        state = "revoked" if key.revoked_at else "active"
        typer.echo(f"{key.prefix}\t{tenant}\t{key.role}\t{state}\t{key.name or ''}")


@keys_app.command("revoke")
def keys_revoke(
    prefix: str = typer.Argument(..., help="The key's prefix, as `keys list` shows."),
) -> None:
    """Revoke a key; requests with it get 401 from then on."""
    with _database() as db, db.write() as session:
        revoked = store.tenants.revoke_api_key(session, prefix)
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

    with _database() as db, db.owner_engine() as engine:
        if revision != "head":
            migrate.upgrade(engine, revision)
        with engine.connect() as conn:
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

    from ragservice.dev.cluster import DevCluster

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
    from ragservice.bootstrap import open_runtime

    settings = get_settings()
    try:
        runtime = open_runtime(settings)
    except RagServiceError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    try:
        runtime.models.start()  # each job embeds with the model active when it starts
        run_until_signalled(JobWorker(runtime, threads=threads or settings.workers or 1))
    finally:
        runtime.close()


@app.command("export-feedback")
def export_feedback(
    format_: Annotated[
        ExportFormat,
        typer.Option("--format", help="openai-sft, openai-dpo, trl-dpo or triplets."),
    ],
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Tenant name (default: the default tenant).")
    ] = None,
    collection: Annotated[
        str | None, typer.Option("--collection", help="Only answers over this collection.")
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="ISO date or time, inclusive (UTC if naive).")
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="ISO date or time, exclusive (UTC if naive).")
    ] = None,
    time_of: Annotated[
        str, typer.Option("--time-of", help="What --since/--until bound: feedback or query.")
    ] = "feedback",
    min_rating: Annotated[
        int | None, typer.Option("--min-rating", help="Lowest latest rating.")
    ] = None,
    max_rating: Annotated[
        int | None, typer.Option("--max-rating", help="Highest latest rating.")
    ] = None,
    negatives: Annotated[
        int, typer.Option("--negatives-per-positive", min=1, help="Triplets per positive.")
    ] = 3,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="File to write (default: stdout).")
    ] = None,
) -> None:
    """Export feedback as fine-tuning data, one JSON record per line (see docs/feedback.md)."""
    from ragservice.feedback import exports

    if time_of not in ("feedback", "query"):
        raise typer.BadParameter("feedback or query", param_hint="--time-of")
    with _database() as db:
        with db.read() as session:
            tenant_id = _tenant_id(session, tenant)
        flt = exports.ExportFilter(
            tenant_id=tenant_id,
            collection=collection,
            since=_iso_time(since, "--since"),
            until=_iso_time(until, "--until"),
            time_of="query" if time_of == "query" else "feedback",
            min_rating=min_rating,
            max_rating=max_rating,
        )
        try:
            pieces = exports.ndjson(db, format_, flt, negatives_per_positive=negatives)
            written = _write_pieces(pieces, output)
        except RagServiceError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(1) from exc
    console.print(f"wrote {written} {format_.value} records to {output or 'stdout'}")


def _tenant_id(session: Session, name: str | None) -> uuid.UUID:
    if name is None:
        return uuid.UUID(DEFAULT_TENANT_ID)
    found = store.tenants.find_tenant(session, name)
    if found is None:
        console.print(f"[red]error:[/red] no tenant named {name!r}")
        raise typer.Exit(1)
    return found


def _iso_time(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is not an ISO date or time", param_hint=option
        ) from None


def _write_pieces(pieces: Iterator[bytes], output: Path | None) -> int:
    """Write the pieces to `output` through a temporary file renamed at the end (a failure
    leaves no half-written file), or to stdout; returns the lines written."""
    lines = 0
    if output is None:
        for piece in pieces:
            typer.echo(piece.decode(), nl=False)
            lines += piece.count(b"\n")
        return lines
    fd, temporary = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            for piece in pieces:
                file.write(piece)
                lines += piece.count(b"\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, output)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return lines


# -- embedding model versions ----------------------------------------------------------------


@app.command()
def finetune(
    out: Annotated[str, typer.Option("--out", help="Name of the new model (a new version).")],
    from_feedback: Annotated[
        bool, typer.Option("--from-feedback", help="Train on triplets from users' feedback.")
    ] = False,
    triplets_file: Annotated[
        Path | None,
        typer.Option("--triplets", help="Train on this JSONL of anchor/positive/negative."),
    ] = None,
    collection: Annotated[
        str | None, typer.Option("--collection", help="Only feedback on this collection.")
    ] = None,
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Tenant name (default: the default tenant).")
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Feedback from this ISO time (UTC if naive).")
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Feedback before this ISO time.")
    ] = None,
    base: Annotated[
        str | None,
        typer.Option("--base", help="NAME[:VERSION], a model folder (default: the active model)."),
    ] = None,
    epochs: Annotated[int, typer.Option("--epochs", min=1)] = 1,
    batch_size: Annotated[int, typer.Option("--batch-size", min=2)] = 32,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", min=1, help="Stop after this many steps.")
    ] = None,
    held_out: Annotated[
        float, typer.Option("--held-out", min=0.0, max=0.9, help="Share of questions held out.")
    ] = 0.1,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    learning_rate: Annotated[float, typer.Option("--learning-rate", min=0.0)] = 2e-5,
) -> None:
    """Fine-tune the embedding model and register it as a new, inactive version of --out.

    Prints held-out figures before and after training, then one JSON line (stdout). Next:
    `ragservice reembed --model OUT`, then `ragservice models activate OUT`.
    """
    from ragservice.embedding import finetune as ft

    if from_feedback == (triplets_file is not None):
        raise typer.BadParameter("give either --from-feedback or --triplets FILE")
    settings = get_settings()
    with _database() as db:
        try:
            ft.check_name(out)
            options = ft.TrainingOptions(
                epochs=epochs,
                batch_size=batch_size,
                max_steps=max_steps,
                learning_rate=learning_rate,
                held_out=held_out,
                seed=seed,
                device=settings.device,
            )
            start = ft.resolve_base(db, settings, base)
            if triplets_file is not None:
                rows, source = _triplets_file(triplets_file), {"file": str(triplets_file)}
            else:
                rows, source = _feedback_triplets(db, tenant, collection, since, until)
            console.print(f"fine-tuning {start.label} on {len(rows)} triplets")
            # The trainer prints its logs on stdout: stdout keeps only the final JSON line.
            with redirect_stdout(sys.stderr):
                result = ft.finetune(
                    db, settings, rows, name=out, base=start, options=options, source=source
                )
        except RagServiceError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(1) from exc
    _print_finetune(result)


def _feedback_triplets(
    db: Database, tenant: str | None, collection: str | None, since: str | None, until: str | None
) -> tuple[list[dict[str, str]], dict[str, Any]]:
    from ragservice.feedback import exports

    with db.read() as session:
        flt = exports.ExportFilter(
            tenant_id=_tenant_id(session, tenant),
            collection=collection,
            since=_iso_time(since, "--since"),
            until=_iso_time(until, "--until"),
        )
        flt = exports.resolve_filter(session, flt)
        rows = list(exports.triplets(session, flt))
    filters = {"tenant": tenant, "collection": collection, "since": since, "until": until}
    return rows, {"feedback": filters}


def _triplets_file(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(encoding="utf-8") as lines:
            return [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc}", param_hint="--triplets") from exc


def _print_finetune(result: FinetuneResult) -> None:
    from rich.table import Table

    held_out = result.details["held_out"]
    table = Table(title=f"{result.model.name}:{result.model.version} on held-out questions")
    for column in ("metric", "before", "after", "change"):
        table.add_column(column, justify="right" if column != "metric" else "left")
    for metric, before in held_out["before"].items():
        after = held_out["after"][metric]
        table.add_row(metric, f"{before:.4f}", f"{after:.4f}", f"{after - before:+.4f}")
    console.print(table)
    if not held_out["before"]:
        console.print("no held-out questions (too few questions, or --held-out 0)")
    console.print(
        f"saved to {result.path}; next: ragservice reembed --model "
        f"{result.model.name}:{result.model.version}"
    )
    typer.echo(json.dumps(result.summary()))


@app.command()
def reembed(
    model: Annotated[str, typer.Option("--model", help="NAME[:VERSION] (default: latest).")],
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size", min=1, help="Chunks per transaction (RAGSERVICE_INGEST_BATCH_CHUNKS)."
        ),
    ] = None,
) -> None:
    """Embed every chunk that has no embedding of MODEL yet, beside the active model; run it
    again after an interruption to finish."""
    from ragservice.embedding import registry
    from ragservice.embedding.reembed import count_missing

    settings = get_settings()
    with _database() as db:
        try:
            with db.read() as session:
                row = registry.find_model(session, model)
            if not registry.loadable(row, settings):
                console.print(f"[red]error:[/red] {row.name}:{row.version} has no folder here")
                raise typer.Exit(1)
            missing = count_missing(db, row.id)
            if not missing:
                console.print(f"every chunk has an embedding of {row.name}:{row.version}")
                return
            embedder = registry.load_embedder(settings, row)
            size = batch_size or settings.ingest_batch_chunks
            _reembed_with_progress(db, settings, row, embedder, size, missing)
        except RagServiceError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(1) from exc


def _reembed_with_progress(
    db: Database,
    settings: Settings,
    row: EmbeddingModel,
    embedder: SentenceTransformerEmbedder,
    size: int,
    missing: int,
) -> None:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from ragservice.embedding.reembed import count_missing, reembed

    label = f"{row.name}:{row.version}"
    with console.status(f"loading {label}"):
        _ = embedder.model  # loaded before the clock starts: the rate is the embedding's
    columns = (
        TextColumn(f"embedding with {label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    try:
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("reembed", total=missing)
            report = reembed(
                db,
                settings,
                row,
                embedder,
                batch_size=size,
                missing=missing,
                on_batch=lambda n: progress.advance(task, n),
            )
    except KeyboardInterrupt:
        left = count_missing(db, row.id)
        console.print(f"interrupted: {left} chunks still to embed; run the command again")
        raise typer.Exit(130) from None
    left = count_missing(db, row.id)
    console.print(
        f"embedded {report.embedded} chunks with {label} in {report.seconds:.1f} s "
        f"({report.chunks_per_second:.1f} chunks/s); {left} missing"
        + (" (written meanwhile: run again)" if left else f"; next: models activate {label}")
    )


@models_app.command("list")
def models_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Registered models: active one, chunks embedded, base, held-out figures."""
    from ragservice.embedding import registry

    with _database() as db, db.read() as session:
        statuses = registry.model_statuses(session)
    rows = [_model_row(status, statuses) for status in statuses]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    _print_models(rows)


def _model_row(status: ModelStatus, statuses: list[ModelStatus]) -> dict[str, Any]:
    model = status.model
    names = {s.model.id: f"{s.model.name}:{s.model.version}" for s in statuses}
    held_out = model.details.get("held_out", {})
    return {
        "id": model.id,
        "name": model.name,
        "version": model.version,
        "dimension": model.dimension,
        "active": model.active,
        "embedded": status.embedded,
        "chunks": status.chunks,
        "base": names.get(model.base_model_id) if model.base_model_id else None,
        "created": model.created_at.isoformat(timespec="seconds"),
        "held_out": {"before": held_out.get("before", {}), "after": held_out.get("after", {})},
        "path": model.path,
    }


def _print_models(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(title="embedding models")
    for column in ("id", "name", "ver", "dim", "active", "embedded", "base", "created"):
        table.add_column(column)
    table.add_column("held-out nDCG@10 before → after")
    for row in rows:
        before, after = row["held_out"]["before"], row["held_out"]["after"]
        figures = (
            f"{before['ndcg@10']:.3f} → {after['ndcg@10']:.3f}"
            if "ndcg@10" in before and "ndcg@10" in after
            else ""
        )
        table.add_row(
            str(row["id"]),
            row["name"],
            str(row["version"]),
            str(row["dimension"]),
            "[green]yes[/green]" if row["active"] else "",
            f"{row['embedded']} / {row['chunks']}",
            row["base"] or "",
            row["created"][:16].replace("T", " "),
            figures,
        )
    Console().print(table)


@models_app.command("activate")
def models_activate(
    model: Annotated[str, typer.Argument(help="NAME[:VERSION] (default: the latest version).")],
    force: Annotated[
        bool, typer.Option("--force", help="Even when chunks lack its embeddings.")
    ] = False,
) -> None:
    """Make MODEL the one every server serves (they switch within
    RAGSERVICE_MODEL_CHECK_SECONDS, after loading it); refused until it embedded every chunk."""
    from ragservice.embedding import registry

    with _database() as db:
        switch = _or_exit(lambda: registry.activate(db, model, force=force))
    _print_switch(switch)


@models_app.command("rollback")
def models_rollback(
    force: Annotated[
        bool, typer.Option("--force", help="Even when chunks lack its embeddings.")
    ] = False,
) -> None:
    """Activate again the model the latest activation replaced."""
    from ragservice.embedding import registry

    with _database() as db:
        switch = _or_exit(lambda: registry.rollback(db, force=force))
    _print_switch(switch)


@models_app.command("drop-embeddings")
def models_drop_embeddings(
    model: Annotated[str, typer.Argument(help="NAME[:VERSION] of a model that is not active.")],
) -> None:
    """Delete a model's chunk embeddings and its HNSW index (refused for the active model);
    `reembed` makes them again."""
    from ragservice.embedding import registry

    with _database() as db:
        row, deleted = _or_exit(lambda: registry.drop_embeddings(db, model))
    console.print(f"deleted {deleted} embeddings of {row.name}:{row.version} and its index")


def _or_exit(action: Callable[[], Any]) -> Any:
    try:
        return action()
    except RagServiceError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc


def _print_switch(switch: Switch) -> None:
    label = f"{switch.model.name}:{switch.model.version} (id {switch.model.id})"
    if not switch.changed:
        console.print(f"{label} is already the active model")
        return
    seconds = get_settings().model_check_seconds
    console.print(
        f"activated {label}, was id {switch.previous_id}; servers switch within {seconds:g} s "
        "plus the model's load"
    )


@analysts_app.command("add")
def analysts_add(
    name: str = typer.Argument(..., help="The role's name: [a-z_][a-z0-9_]{0,62}."),
    password: Annotated[
        str | None, typer.Option("--password", help="Default: generated and printed once.")
    ] = None,
) -> None:
    """Create a login role that may read the views in schema `analytics` and nothing else, and
    print a connection string for it (to the first replica when RAGSERVICE_REPLICAS is set)."""
    import secrets

    secret = password or secrets.token_urlsafe(18)
    with _database() as db:
        with db.owner() as session:  # CREATE ROLE: beyond what the service role may do
            _or_exit(lambda: store.analysts.create_analyst(session, name, secret))
        url = analyst_url(get_settings(), db.url, name, secret)
    console.print(f"created analyst {name!r} (member of {store.analysts.ANALYST_GROUP})")
    if password is None:
        console.print("its generated password is in the URL below; it is shown only this once:")
    typer.echo(url)


def analyst_url(settings: Settings, primary_url: str, name: str, password: str) -> str:
    """A libpq URL for the analyst: host, port, database and options of the first replica when
    any is configured, else of the primary (a Unix-socket URL with the embedded server)."""
    from urllib.parse import quote

    from sqlalchemy.engine import make_url

    replicas = settings.replica_urls()
    base = make_url(replicas[0][1] if replicas else primary_url)
    rest = base._replace(drivername="postgresql", username=None, password=None).render_as_string()
    scheme = "postgresql://"
    userinfo = f"{quote(name, safe='')}:{quote(password, safe='')}@"
    return scheme + userinfo + rest.removeprefix(scheme)


@analysts_app.command("list")
def analysts_list() -> None:
    """List the analyst roles (name, whether it can log in)."""
    with _database() as db, db.read() as session:
        rows = store.analysts.list_analysts(session)
    for name, login in rows:
        typer.echo(f"{name}\t{'login' if login else 'nologin'}")


@analysts_app.command("remove")
def analysts_remove(name: str = typer.Argument(..., help="The analyst's role name.")) -> None:
    """Drop an analyst's role (only members of ragservice_analyst are dropped)."""
    with _database() as db, db.owner() as session:
        removed = _or_exit(lambda: store.analysts.remove_analyst(session, name))
    if not removed:
        console.print(f"[red]error:[/red] no analyst named {name!r}")
        raise typer.Exit(1)
    console.print(f"removed analyst {name!r}")


def _register_ingest() -> None:
    from ragservice.cli.ingest import ingest_command

    app.command("ingest")(ingest_command)


_register_ingest()


def main() -> None:
    configure_logging(get_settings().log_level)
    app()
