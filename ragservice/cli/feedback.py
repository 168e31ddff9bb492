"""`ragservice export-feedback`: users' feedback as fine-tuning data."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from ragservice.cli.choices import (
    DEFAULT_NEGATIVES_PER_POSITIVE,
    HIGHEST_RATING,
    LOWEST_RATING,
    MAX_NEGATIVES_PER_POSITIVE,
    ExportFormat,
    TimeOf,
)
from ragservice.cli.common import console, database, exit_on_error, feedback_filter


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
        TimeOf, typer.Option("--time-of", help="What --since/--until bound: feedback or query.")
    ] = TimeOf.FEEDBACK,
    min_rating: Annotated[
        int | None,
        typer.Option(
            "--min-rating", min=LOWEST_RATING, max=HIGHEST_RATING, help="Lowest latest rating."
        ),
    ] = None,
    max_rating: Annotated[
        int | None,
        typer.Option(
            "--max-rating", min=LOWEST_RATING, max=HIGHEST_RATING, help="Highest latest rating."
        ),
    ] = None,
    negatives: Annotated[
        int,
        typer.Option(
            "--negatives-per-positive",
            min=1,
            max=MAX_NEGATIVES_PER_POSITIVE,
            help="Triplets per positive.",
        ),
    ] = DEFAULT_NEGATIVES_PER_POSITIVE,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="File to write (default: stdout).")
    ] = None,
) -> None:
    """Export feedback as fine-tuning data, one JSON record per line (see docs/feedback.md)."""
    from ragservice.feedback import exports

    with database() as db:
        with db.read() as session:
            flt = feedback_filter(
                session,
                tenant,
                collection,
                since,
                until,
                time_of=exports.TimeOf(time_of),
                min_rating=min_rating,
                max_rating=max_rating,
            )
        with exit_on_error():
            pieces = exports.ndjson(
                db, exports.ExportFormat(format_), flt, negatives_per_positive=negatives
            )
            written = _write_pieces(pieces, output)
    console.print(f"wrote {written} {format_.value} records to {output or 'stdout'}")


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
