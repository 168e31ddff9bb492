"""`ragservice models`: list the embedding model versions, activate one, roll back, drop a
version's embeddings, convert a version's vector storage, rebuild its HNSW index."""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from ragservice.cli.common import (
    IndexBar,
    cli_actor,
    console,
    database,
    exit_on_error,
    fail,
    held_out_change,
)
from ragservice.config import get_settings

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ragservice.embedding.indexing import IndexBuild
    from ragservice.embedding.registry import Switch
    from ragservice.services.embedding_models import BuildProgress

app = typer.Typer(help="Embedding model versions.", no_args_is_help=True)


@app.command("list")
def models_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Registered models: active one, chunks embedded, base, held-out figures."""
    from ragservice.services import embedding_models

    with database() as db:
        rows = embedding_models.registered_models(db)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    _print_models(rows)


def _print_models(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(title="embedding models")
    columns = ("id", "name", "ver", "dim", "storage", "active", "embedded", "base", "created")
    for column in columns:
        table.add_column(column)
    table.add_column("held-out nDCG@10 before → after")
    for row in rows:
        table.add_row(
            str(row["id"]),
            row["name"],
            str(row["version"]),
            str(row["dimension"]),
            row["storage"],
            "[green]yes[/green]" if row["active"] else "",
            f"{row['embedded']} / {row['chunks']}",
            row["base"] or "",
            row["created"][:16].replace("T", " "),
            held_out_change(row["held_out"]),
        )
    Console().print(table)


@app.command("activate")
def models_activate(
    model: Annotated[str, typer.Argument(help="NAME[:VERSION] (default: the latest version).")],
    force: Annotated[
        bool, typer.Option("--force", help="Even when chunks lack its embeddings.")
    ] = False,
) -> None:
    """Make MODEL the one every server serves (they switch within
    RAGSERVICE_MODEL_CHECK_SECONDS, after loading it); refused until it embedded every chunk."""
    from ragservice.services import embedding_models

    with database() as db, exit_on_error():
        switch = embedding_models.switch_to(db, model, force=force, actor=cli_actor())
    _print_switch(switch)


@app.command("rollback")
def models_rollback(
    force: Annotated[
        bool, typer.Option("--force", help="Even when chunks lack its embeddings.")
    ] = False,
) -> None:
    """Activate again the model the latest activation replaced."""
    from ragservice.services import embedding_models

    with database() as db, exit_on_error():
        switch = embedding_models.switch_back(db, force=force, actor=cli_actor())
    _print_switch(switch)


@app.command("drop-embeddings")
def models_drop_embeddings(
    model: Annotated[str, typer.Argument(help="NAME[:VERSION] of a model that is not active.")],
) -> None:
    """Delete a model's chunk embeddings and its HNSW index (refused for the active model);
    `reembed` makes them again."""
    from ragservice.services import embedding_models

    with database() as db, exit_on_error():
        row, deleted = embedding_models.drop_embeddings(db, model, actor=cli_actor())
    console.print(f"deleted {deleted} embeddings of {row.name}:{row.version} and its index")


def _print_switch(switch: Switch) -> None:
    label = f"{switch.model.name}:{switch.model.version} (id {switch.model.id})"
    if not switch.changed:
        console.print(f"{label} is already the active model")
        return
    seconds = get_settings().embedding.model_check_seconds
    console.print(
        f"activated {label}, was id {switch.previous_id}; servers switch within {seconds:g} s "
        "plus the model's load"
    )


@app.command("convert")
def models_convert(
    model: Annotated[str, typer.Argument(help="NAME[:VERSION] (default: the latest version).")],
    storage: Annotated[
        str, typer.Option("--storage", help="float32, halfvec or binary.", show_default=False)
    ],
    force: Annotated[
        bool, typer.Option("--force", help="Even the active model (see the help).")
    ] = False,
) -> None:
    """Keep MODEL's vectors as STORAGE: its rows are rewritten with the registry change in one
    transaction (a failure leaves the old state), then its HNSW index is built again; its
    searches scan without an index until the build ends. The active model only with --force:
    servers search it the new way within RAGSERVICE_MODEL_CHECK_SECONDS, finding nothing by
    dense search meanwhile when the column changes (halfvec to or from the others)."""
    from ragservice.services import embedding_models

    with database() as db, exit_on_error():
        row = embedding_models.model_named(db, model)
        target = _storage(storage)
        if row.active and not force and row.storage != target:
            raise fail(f"{row.name}:{row.version} is the active model; pass --force to convert it")
        label = f"{row.name}:{row.version}"
        with _index_progress(label) as on_index:
            done = embedding_models.convert_storage(db, row, target, progress=on_index)
    if done.build is None:
        console.print(f"{label} is already stored as {target}")
        return
    console.print(
        f"{label}: {done.rows} rows rewritten from {done.previous} to {target} in "
        f"{done.rewrite_seconds:.1f} s"
    )
    _print_build(label, done.build)


@app.command("reindex")
def models_reindex(
    model: Annotated[str, typer.Argument(help="NAME[:VERSION] (default: the latest version).")],
) -> None:
    """Drop and build MODEL's HNSW index again, in one go, with the build memory and workers
    of RAGSERVICE_INDEX_BUILD_MEMORY_MB and RAGSERVICE_INDEX_BUILD_WORKERS; shows its progress.
    Its searches scan without an index until the build ends."""
    from ragservice.services import embedding_models

    with database() as db, exit_on_error():
        row = embedding_models.model_named(db, model)
        label = f"{row.name}:{row.version}"
        with _index_progress(label) as on_index:
            build = embedding_models.rebuild_index(db, row, progress=on_index)
    _print_build(label, build)


def _storage(value: str) -> str:
    from ragservice.services.embedding_models import storage_of

    return storage_of(value)


@contextmanager
def _index_progress(label: str) -> Iterator[Callable[[BuildProgress], None]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        yield IndexBar(progress, label)


def _print_build(label: str, build: IndexBuild) -> None:
    console.print(
        f"built the {build.storage} HNSW index of {label} over {build.rows} rows in "
        f"{build.seconds:.1f} s ({build.index_bytes / 2**20:.1f} MiB; maintenance_work_mem "
        f"{build.memory_mb} MB, {build.workers} parallel workers asked)"
    )
