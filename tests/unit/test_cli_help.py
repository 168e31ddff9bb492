"""Every command's --help shows its texts as written: no part of them read as markup."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from ragservice.cli import app

# Words that markup could eat or change: brackets, braces, angle brackets, stars, underscores.
_SPECIAL = re.compile(r"\S*[\[\]{}<>*_|]\S*")


def commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The paths of every command and group under `group` (typer's own click types)."""
    for name, command in group.commands.items():
        yield (*path, name)
        if hasattr(command, "commands"):
            yield from commands(command, (*path, name))


def command_of(path: tuple[str, ...]) -> Any:
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return command


def texts(command: Any) -> list[str]:
    found = [command.help or ""]
    found += [getattr(param, "help", None) or "" for param in command.params]
    return found


def special_words(text: str) -> set[str]:
    words = {w.replace("`", "").rstrip(".,;:)").lstrip("(") for w in _SPECIAL.findall(text)}
    return {w for w in words if w}


ALL = sorted(commands(typer.main.get_command(app)))


@pytest.mark.parametrize("path", ALL, ids=" ".join)
def test_help_shows_the_texts_as_written(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    shown = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())
    for text in texts(command_of(path)):
        for word in special_words(text):
            assert word in shown, f"{word!r} of {' '.join(path)} --help is not shown as written"


def test_analyst_name_help_has_no_pattern_left_over() -> None:
    result = CliRunner().invoke(app, ["analysts", "add", "--help"], env={"COLUMNS": "200"})
    assert "{0,62}" not in result.output
    assert "up to 63 lowercase letters" in result.output
