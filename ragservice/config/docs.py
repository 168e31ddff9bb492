"""docs/settings.md, written from the settings model: a table per group (variable, type,
default, bounds, description). `python -m ragservice.config.docs [PATH]` writes it (default:
docs/settings.md); a test holds the file equal to `render()`."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from ragservice.config import GROUPS, PREFIX, SettingsGroup, env_name

HEADER = """\
# Settings

<!-- Written by `python -m ragservice.config.docs` from ragservice/config/; do not edit by hand
(tests/unit/test_settings_doc.py fails while this file is not what it writes). -->

Every setting is an environment variable prefixed `RAGSERVICE_`, read once per process
(`ragservice.config.get_settings()`); names are case-insensitive. `.env` files are not read by
the service itself (docker compose reads one for its own variables, docs/production.md).

The settings are grouped by subject, and each group is one object in the code
(`settings.search`, `settings.limits`, …: `ragservice/config/`), handed to the modules that need
that subject. Unset means the variable is absent; an empty value is an empty string.
"""
BOUNDS = (
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Ge, "ge", "≥"),
    (annotated_types.Lt, "lt", "<"),
    (annotated_types.Le, "le", "≤"),
    (annotated_types.MinLen, "min_length", "length ≥"),
)


def type_name(annotation: Any) -> str:
    """A field's type as a reader says it: `int`, `float or unset`, `rrf, minmax`, `secret`."""
    if get_origin(annotation) in (Union, UnionType):
        shown = [type_name(arg) for arg in get_args(annotation) if arg is not NoneType]
        return " or ".join(shown) + (" or unset" if NoneType in get_args(annotation) else "")
    if get_origin(annotation) is Literal:
        return ", ".join(f"`{value}`" for value in get_args(annotation))
    if annotation is SecretStr:
        return "secret"
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    return str(getattr(annotation, "__name__", annotation))


def default_text(value: Any, *, in_bytes: bool = False) -> str:
    """A default as it would be written in the environment (with MiB beside bytes)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Enum):
        value = value.value
    if in_bytes and value >= 2**20:
        return f"`{value}` ({value // 2**20} MiB)"
    return f"`{value}`" if str(value) != "" else "empty"


def bounds_text(field: FieldInfo) -> str:
    """`≥ 1, ≤ 1000` from the field's constraints; empty when it has none."""
    shown = [
        f"{sign} {getattr(item, attribute)}"
        for kind, attribute, sign in BOUNDS
        for item in field.metadata
        if isinstance(item, kind)
    ]
    return ", ".join(shown)


def cell(text: str) -> str:
    """Text fit for one cell of a Markdown table."""
    return text.replace("|", "\\|").replace("\n", " ")


def group_table(name: str, group: type[SettingsGroup]) -> str:
    """One group's section: its heading, what it holds, and a row per field."""
    rows = [
        f"## {name}",
        "",
        f"`settings.{name}` ({group.__name__}): {cell((group.__doc__ or '').strip())}",
        "",
        "| variable | field | type | default | bounds | description |",
        "|---|---|---|---|---|---|",
    ]
    for field_name, field in group.model_fields.items():
        variable = f"{PREFIX}{env_name(field_name, field).upper()}"
        rows.append(
            f"| `{variable}` | `{field_name}` | {cell(type_name(field.annotation))} "
            f"| {cell(default_text(field.default, in_bytes=field_name.endswith('_bytes')))} "
            f"| {bounds_text(field)} "
            f"| {cell(field.description or '')} |"
        )
    return "\n".join(rows)


def render() -> str:
    """The whole of docs/settings.md."""
    sections = [group_table(name, group) for name, group in GROUPS.items()]
    return "\n\n".join([HEADER.rstrip(), *sections]) + "\n"


def main(argv: list[str]) -> None:
    """Write `render()` to the path given, or docs/settings.md."""
    target = Path(argv[0] if argv else "docs/settings.md")
    target.write_text(render())


if __name__ == "__main__":
    main(sys.argv[1:])
