"""The root `ragservice` command: its commands and command groups, in the order `--help`
lists them, and `main()`, the console script."""

from __future__ import annotations

import typer

from ragservice.cli import (
    analysts,
    audit,
    backup,
    db,
    feedback,
    keys,
    models,
    replicas,
    serve,
    tenants,
    training,
)
from ragservice.cli.ingest import ingest_command
from ragservice.cli.termination import end_cleanly_on_termination
from ragservice.config import configure_logging, get_settings

app = typer.Typer(
    help="RAG and vector-search data service on PostgreSQL + pgvector.", no_args_is_help=True
)
app.command("serve")(serve.serve)
app.command("dev-cluster")(replicas.dev_cluster)
app.command("worker")(serve.worker)
app.command("export-feedback")(feedback.export_feedback)
app.command("finetune")(training.finetune)
app.command("reembed")(training.reembed)
app.command("ingest")(ingest_command)
app.command("backup")(backup.backup)
app.command("restore")(backup.restore)
app.add_typer(db.app, name="db")
app.add_typer(keys.app, name="keys")
app.add_typer(tenants.app, name="tenants")
app.add_typer(replicas.app, name="replicas")
app.add_typer(models.app, name="models")
app.add_typer(analysts.app, name="analysts")
app.add_typer(audit.app, name="audit")


def main() -> None:
    end_cleanly_on_termination()
    configure_logging(get_settings().log_level)
    app()
