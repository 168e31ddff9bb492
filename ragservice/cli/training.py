"""`ragservice finetune` (a new embedding model version from feedback or triplets) and
`ragservice reembed` (embeddings of every chunk with a model version)."""

from __future__ import annotations

import json
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ragservice.cli.common import (
    IndexBar,
    console,
    database,
    exit_on_error,
    fail,
    feedback_filter,
)
from ragservice.config import IndexSettings, Settings, get_settings

if TYPE_CHECKING:
    from ragservice.db import Database
    from ragservice.db.models import EmbeddingModel
    from ragservice.embedding.embedder import SentenceTransformerEmbedder
    from ragservice.embedding.finetune import BaseModel, FinetuneResult
    from ragservice.embedding.reranker_finetune import RerankerResult


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
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", min=2, help="Default 32 (16 with --reranker).")
    ] = None,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", min=1, help="Stop after this many steps.")
    ] = None,
    held_out: Annotated[
        float, typer.Option("--held-out", min=0.0, max=0.9, help="Share of questions held out.")
    ] = 0.1,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    learning_rate: Annotated[
        float | None,
        typer.Option("--learning-rate", min=0.0, help="Default 2e-5 (3e-5 with --reranker)."),
    ] = None,
    reranker: Annotated[
        bool,
        typer.Option(
            "--reranker", help="Train a cross-encoder reranker from the base model instead."
        ),
    ] = False,
    loss: Annotated[
        str, typer.Option("--loss", help="--reranker: bce (pairs) or mnrl (listwise).")
    ] = "bce",
    negatives: Annotated[
        int, typer.Option("--negatives", min=1, help="--reranker: hard negatives per question.")
    ] = 4,
    max_length: Annotated[
        int, typer.Option("--max-length", min=16, help="--reranker: tokens per pair.")
    ] = 256,
    max_minutes: Annotated[
        float | None,
        typer.Option("--max-minutes", min=0.0, help="--reranker: stop training after this."),
    ] = None,
) -> None:
    """Fine-tune the embedding model and register it as a new, inactive version of --out;
    with --reranker, train a cross-encoder from it and register a reranker version of --out.

    Prints held-out figures before and after training, then one JSON line (stdout). Next:
    `ragservice reembed --model OUT`, then `ragservice models activate OUT`; for a reranker,
    `RAGSERVICE_RERANKER=OUT:VERSION` and a restart.
    """
    from ragservice.embedding import finetune as ft

    if from_feedback == (triplets_file is not None):
        raise typer.BadParameter("give either --from-feedback or --triplets FILE")
    settings = get_settings()
    with database() as db, exit_on_error():
        ft.check_name(out)
        common: dict[str, Any] = {
            "epochs": epochs,
            "max_steps": max_steps,
            "held_out": held_out,
            "seed": seed,
        }
        options: Any
        if reranker:
            options = _reranker_options(
                common, batch_size, learning_rate, loss, negatives, max_length, max_minutes
            )
        else:
            options = ft.TrainingOptions(
                **common,
                batch_size=batch_size or 32,
                learning_rate=learning_rate or 2e-5,
                device=settings.embedding.device,
            )
        start = ft.resolve_base(db, settings.embedding, base)
        if triplets_file is not None:
            rows, source = _triplets_file(triplets_file), {"file": str(triplets_file)}
        else:
            rows, source = _feedback_triplets(db, tenant, collection, since, until)
        what = "a reranker from" if reranker else "fine-tuning"
        console.print(f"{what} {start.label} on {len(rows)} triplets")
        # The trainer prints its logs on stdout: stdout keeps only the final JSON line.
        with redirect_stdout(sys.stderr):
            result = _train(db, settings, rows, out, start, options, source)
    _print_finetune(result)


def _reranker_options(
    common: dict[str, Any],
    batch_size: int | None,
    learning_rate: float | None,
    loss: str,
    negatives: int,
    max_length: int,
    max_minutes: float | None,
) -> Any:
    from ragservice.embedding import reranker_finetune as rf

    if loss not in rf.LOSSES:
        raise typer.BadParameter(f"one of {', '.join(rf.LOSSES)}", param_hint="--loss")
    return rf.RerankerOptions(
        **common,
        batch_size=batch_size or 16,
        learning_rate=learning_rate or 3e-5,
        loss=loss,  # checked against LOSSES above
        negatives=negatives,
        max_length=max_length,
        max_minutes=max_minutes,
        device=get_settings().embedding.device,
    )


def _train(
    db: Database,
    settings: Settings,
    rows: list[dict[str, str]],
    out: str,
    start: BaseModel,
    options: Any,
    source: dict[str, Any],
) -> FinetuneResult | RerankerResult:
    from ragservice.embedding import finetune as ft
    from ragservice.embedding import reranker_finetune as rf

    if isinstance(options, rf.RerankerOptions):
        return rf.finetune_reranker(
            db, settings.database, rows, name=out, base=start, options=options, source=source
        )
    return ft.finetune(db, settings, rows, name=out, base=start, options=options, source=source)


def _feedback_triplets(
    db: Database, tenant: str | None, collection: str | None, since: str | None, until: str | None
) -> tuple[list[dict[str, str]], dict[str, Any]]:
    from ragservice.feedback import exports

    with db.read() as session:
        flt = feedback_filter(session, tenant, collection, since, until)
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


def _print_finetune(result: FinetuneResult | RerankerResult) -> None:
    from rich.table import Table

    from ragservice.embedding.reranker_finetune import RerankerResult

    held_out = result.details["held_out"]
    label = f"{result.model.name}:{result.model.version}"
    title = f"{label} on held-out questions"
    if isinstance(result, RerankerResult):
        title += " (before: the base model's cosine; after: the reranker)"
    table = Table(title=title)
    for column in ("metric", "before", "after", "change"):
        table.add_column(column, justify="right" if column != "metric" else "left")
    for metric, before in held_out["before"].items():
        after = held_out["after"][metric]
        table.add_row(metric, f"{before:.4f}", f"{after:.4f}", f"{after - before:+.4f}")
    console.print(table)
    if not held_out["before"]:
        console.print("no held-out questions (too few questions, or --held-out 0)")
    if isinstance(result, RerankerResult):
        console.print(f"saved to {result.path}; next: RAGSERVICE_RERANKER={label}")
    else:
        console.print(f"saved to {result.path}; next: ragservice reembed --model {label}")
    typer.echo(json.dumps(result.summary()))


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
    with database() as db, exit_on_error():
        with db.read() as session:
            row = registry.get_model_by_name(session, model)
        if not registry.loadable(row, settings.embedding):
            raise fail(f"{row.name}:{row.version} has no folder here")
        missing = count_missing(db, row.id)
        if not missing:
            console.print(f"every chunk has an embedding of {row.name}:{row.version}")
            return
        embedder = registry.load_embedder(settings, row)
        size = batch_size or settings.ingest.batch_chunks
        _reembed_with_progress(db, settings.indexing, row, embedder, size, missing)


def _reembed_with_progress(
    db: Database,
    index: IndexSettings,
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
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    try:
        with Progress(*columns, console=console) as progress:
            task = progress.add_task(f"embedding with {label}", total=missing)
            report = reembed(
                db,
                index,
                row,
                embedder,
                batch_size=size,
                missing=missing,
                on_batch=lambda n: progress.advance(task, n),
                on_index=IndexBar(progress, label),
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
    if report.index is not None:
        console.print(
            f"built its {report.index.storage} HNSW index in {report.index.seconds:.1f} s"
        )
