"""`ragservice rerankers`: the cross-encoders `finetune --reranker` trained and registered."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console

from ragservice.cli.common import database, held_out_change

app = typer.Typer(
    help="Reranker versions (RAGSERVICE_RERANKER=NAME:VERSION).", no_args_is_help=True
)


@app.command("list")
def rerankers_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Registered rerankers: base model, training and held-out figures."""
    from ragservice.services import rerankers

    with database() as db:
        rows = [
            {
                "id": row.id,
                "name": row.name,
                "version": row.version,
                "reference": f"{row.name}:{row.version}",
                "base": row.base,
                "created": row.created_at.isoformat(timespec="seconds"),
                "held_out": row.details.get("held_out", {}),
                "training": row.details.get("training", {}),
                "path": row.path,
            }
            for row in rerankers.list_rerankers(db)
        ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    _print(rows)


def _print(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(title="rerankers")
    for column in ("id", "reference", "base", "created", "train s"):
        table.add_column(column)
    table.add_column("held-out nDCG@10 base cosine → reranker")
    for row in rows:
        table.add_row(
            str(row["id"]),
            row["reference"],
            row["base"],
            row["created"][:16].replace("T", " "),
            str(row["training"].get("seconds", "")),
            held_out_change(row["held_out"]),
        )
    Console().print(table)
