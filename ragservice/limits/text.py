"""What text can be stored: PostgreSQL text holds no NUL character and UTF-8 no lone
surrogate. The checks that refuse such text (`text_problem`, `json_text_problem`) and the
replacements that store it anyway (`storable_text`, `storable_json`)."""

from __future__ import annotations

import re
from collections.abc import Mapping

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored or encoded (a NUL character, a lone UTF-16 surrogate such
    as JSON's `"\\ud800"`), or None when it can. The message never quotes the value."""
    found = _UNSTORABLE.search(value)
    if found is None:
        return None
    if found.group() == "\x00":
        return "must not contain NUL characters (U+0000)"
    return (
        f"must not contain a lone UTF-16 surrogate (U+{ord(found.group()):04X} at character "
        f"{found.start()}); send valid Unicode"
    )


def storable_text(value: str) -> str:
    """`value` with every NUL and lone surrogate replaced by U+FFFD: what can always be stored."""
    return _UNSTORABLE.sub("\ufffd", value)


def storable_json(value: object) -> object:
    """A JSON value with `storable_text` applied to every string in it, keys included."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, Mapping):
        return {storable_text(str(k)): storable_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable_json(item) for item in value]
    return value


def json_text_problem(value: object) -> str | None:
    """`text_problem` of the first string (key or value) in a JSON value that has one;
    iterative, so it costs no more than the value's size whatever its depth."""
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            strings: list[object] = [item]
        elif isinstance(item, Mapping):
            strings = list(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
            continue
        else:
            continue
        for text in strings:
            problem = text_problem(text) if isinstance(text, str) else None
            if problem:
                return problem
    return None
