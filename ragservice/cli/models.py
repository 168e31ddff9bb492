"""`ragservice models`: list the embedding model versions, activate one, roll back, drop a
version's embeddings."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from ragservice.cli.common import cli_actor, console, database, exit_on_error
from ragservice.config import get_settings

if TYPE_CHECKING:
    from ragservice.embedding.registry import ModelStatus, Switch

app = typer.Typer(help="Embedding model versions.", no_args_is_help=True)


@app.command("list")
def models_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Registered models: active one, chunks embedded, base, held-out figures."""
    from ragservice.embedding import registry

    with database() as db, db.read() as session:
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


@app.command("activate")
def models_activate(
    model: Annotated[str, typer.Argument(help="NAME[:VERSION] (default: the latest version).")],
    force: Annotated[
        bool, typer.Option("--force", help="Even when chunks lack its embeddings.")
    ] = False,
) -> None:
    """Make MODEL the one every server serves (they switch within
    RAGSERVICE_MODEL_CHECK_SECONDS, after loading it); refused until it embedded every chunk."""
    from ragservice.embedding import registry

    with database() as db, exit_on_error():
        switch = registry.activate(db, model, force=force, actor=cli_actor())
    _print_switch(switch)


@app.command("rollback")
def models_rollback(
    force: Annotated[
        bool, typer.Option("--force", help="Even when chunks lack its embeddings.")
    ] = False,
) -> None:
    """Activate again the model the latest activation replaced."""
    from ragservice.embedding import registry

    with database() as db, exit_on_error():
        switch = registry.rollback(db, force=force, actor=cli_actor())
    _print_switch(switch)


@app.command("drop-embeddings")
def models_drop_embeddings(
    model: Annotated[str, typer.Argument(help="NAME[:VERSION] of a model that is not active.")],
) -> None:
    """Delete a model's chunk embeddings and its HNSW index (refused for the active model);
    `reembed` makes them again."""
    from ragservice.embedding import registry

    with database() as db, exit_on_error():
        row, deleted = registry.drop_embeddings(db, model, actor=cli_actor())
    console.print(f"deleted {deleted} embeddings of {row.name}:{row.version} and its index")


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
