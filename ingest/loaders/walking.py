"""Walking folders: which files under the given paths to load, with include/exclude globs."""

from __future__ import annotations

import errno
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ragservice.types import SUPPORTED_SUFFIXES


@dataclass(frozen=True)
class _Filters:
    include: tuple[re.Pattern[str], ...]
    exclude: tuple[re.Pattern[str], ...]


def iter_files(
    paths: Sequence[Path],
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> Iterator[tuple[Path, str]]:
    """Yield `(file, external id base)` for the files under `paths`, in a stable order.

    Folders are walked recursively in sorted order; the id base is the path relative to the
    folder given (posix), or the file name for a file given directly. Globs (`*`, `?`, `[..]`,
    `**`) match the relative path or the bare file name; `exclude` also prunes folders. With no
    `include`, a folder yields only files with a supported suffix; a file given directly is
    taken whatever its suffix, so an unsupported one is reported instead of silently skipped.
    Names starting with "." are skipped inside folders.

    Raises FileNotFoundError, before yielding anything, when a path does not exist.
    """
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(errno.ENOENT, "no such file or directory", str(path))
    filters = _Filters(_compile_globs(include), _compile_globs(exclude))
    return _iter_paths(paths, filters)


def _iter_paths(paths: Sequence[Path], filters: _Filters) -> Iterator[tuple[Path, str]]:
    for path in paths:
        if path.is_dir():
            yield from _walk(path, path, filters, frozenset())
        elif _passes(path.name, filters):
            yield path, path.name


def _walk(
    root: Path, folder: Path, filters: _Filters, ancestors: frozenset[Path]
) -> Iterator[tuple[Path, str]]:
    real = folder.resolve()
    if real in ancestors:
        return  # a symlink back up the tree; following it would never end
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.startswith("."):
            continue
        relative = entry.relative_to(root).as_posix()
        if entry.is_dir():
            if not _matches(filters.exclude, relative):
                yield from _walk(root, entry, filters, ancestors | {real})
        elif entry.is_file() and _wanted(relative, filters):
            yield entry, relative


def _wanted(relative: str, filters: _Filters) -> bool:
    # An include list is the user's own choice of files; without one, take what we can parse.
    chosen = bool(filters.include) or relative.lower().endswith(SUPPORTED_SUFFIXES)
    return chosen and _passes(relative, filters)


def _passes(relative: str, filters: _Filters) -> bool:
    if _matches(filters.exclude, relative):
        return False
    return not filters.include or _matches(filters.include, relative)


def _matches(globs: Sequence[re.Pattern[str]], relative: str) -> bool:
    name = relative.rsplit("/", 1)[-1]
    return any(glob.fullmatch(relative) or glob.fullmatch(name) for glob in globs)


_GLOB_TOKENS = re.compile(r"(\*\*/|\*\*|\*|\?|\[!?\]?[^\]]*\])")
_GLOB_REGEX = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}


def _compile_globs(patterns: Sequence[str]) -> tuple[re.Pattern[str], ...]:
    return tuple(_glob_to_regex(pattern) for pattern in patterns)


def _glob_to_regex(pattern: str) -> re.Pattern[str]:
    """Translate a path glob: `*` and `?` stay inside one folder, `**` crosses folders."""
    pieces = _GLOB_TOKENS.split(pattern.removeprefix("./"))
    # re.split with a group alternates literal text (even indexes) and glob tokens (odd).
    regex = "".join(
        _glob_token(piece) if index % 2 else re.escape(piece) for index, piece in enumerate(pieces)
    )
    return re.compile(regex)


def _glob_token(token: str) -> str:
    if token in _GLOB_REGEX:
        return _GLOB_REGEX[token]
    body = token[1:-1].replace("\\", "\\\\").replace("[", "\\[")
    if body.startswith("^"):
        body = "\\" + body
    return "[^" + body[1:] + "]" if body.startswith("!") else "[" + body + "]"
