"""`ragservice --help` builds every command without loading the library behind them: no
SQLAlchemy, no torch, no loaders; the choices the options declare are the library's own."""

from __future__ import annotations

import subprocess
import sys
from enum import StrEnum

import pytest

from ragservice.cli import choices
from ragservice.feedback import exports
from ragservice.retrieval import options
from ragservice.store import feedback

HEAVY = ("sqlalchemy", "torch", "numpy", "ingest.loaders")

# Every command's --help in one process: what building any of them imports stays out.
_PROBE = """
import contextlib
import io
import sys
import typer
from typer.testing import CliRunner
from ragservice.cli import app, main

def paths(group, path=()):
    for name, command in group.commands.items():
        yield (*path, name)
        if hasattr(command, "commands"):
            yield from paths(command, (*path, name))

sys.argv = ["ragservice", "--help"]
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(prog_name="ragservice")
    except SystemExit:
        pass
for path in paths(typer.main.get_command(app)):
    assert CliRunner().invoke(app, [*path, "--help"]).exit_code == 0, path
print(" ".join(sorted(name for name in sys.modules if name.split(".")[0] in {heavy}
                      or name.startswith("ingest.loaders"))))
"""


def test_help_imports_neither_sqlalchemy_nor_torch_nor_the_loaders() -> None:
    probe = _PROBE.replace("{heavy}", repr({name.split(".")[0] for name in HEAVY} - {"ingest"}))
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


@pytest.mark.parametrize(
    ("mirror", "original"),
    [
        (choices.Mode, options.Mode),
        (choices.TimeOf, feedback.TimeOf),
        (choices.ExportFormat, exports.ExportFormat),
    ],
    ids=lambda enum: enum.__name__,
)
def test_the_options_offer_the_library_choices(
    mirror: type[StrEnum], original: type[StrEnum]
) -> None:
    assert [(m.name, m.value) for m in mirror] == [(m.name, m.value) for m in original]


def test_the_options_bound_as_the_library_does() -> None:
    assert (
        choices.DEFAULT_NEGATIVES_PER_POSITIVE,
        choices.MAX_NEGATIVES_PER_POSITIVE,
        choices.LOWEST_RATING,
        choices.HIGHEST_RATING,
    ) == (
        exports.DEFAULT_NEGATIVES_PER_POSITIVE,
        exports.MAX_NEGATIVES_PER_POSITIVE,
        exports.LOWEST_RATING,
        exports.HIGHEST_RATING,
    )
