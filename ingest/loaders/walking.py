"""Walking folders: which files under the given paths to load, with include/exclude globs,
and which found there are skipped (a type no loader reads)."""

from __future__ import annotations

import errno
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ingest.loaders.formats import SUPPORTED_SUFFIXES


@dataclass(frozen=True)
class _Filters:
    include: tuple[_Glob, ...]
    exclude: tuple[_Glob, ...]


@dataclass(frozen=True, slots=True)
class Found:
    """A file the walk found: its path, its external id base, and why it is skipped ("": it
    is to be loaded)."""

    path: Path
    external_id: str
    skipped: str = ""


def iter_files(
    paths: Sequence[Path],
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> Iterator[tuple[Path, str]]:
    """Yield `(file, external id base)` for the files under `paths` to load, in a stable
    order (`walk_files`, less the files it skips)."""
    found = walk_files(paths, include, exclude)
    return ((item.path, item.external_id) for item in found if not item.skipped)


def walk_files(
    paths: Sequence[Path],
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> Iterator[Found]:
    """Yield every file found under `paths`, in a stable order: those to load, and those
    skipped with the reason.

    Folders are walked recursively in sorted order; the id base is the path relative to the
    folder given (posix), or the file name for a file given directly. Globs (`*`, `?`, `[..]`,
    `**`) match the relative path or the bare file name; `exclude` also prunes folders. With no
    `include`, a folder's files with a suffix no loader reads are skipped (and said so); a file
    given directly is taken whatever its suffix, so an unsupported one is reported as a
    failure. What the globs leave out is the user's choice, and not reported; nor are names
    starting with "." inside folders (hidden files, `.readers` sidecars).

    Raises FileNotFoundError, before yielding anything, when a path does not exist.
    """
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(errno.ENOENT, "no such file or directory", str(path))
    filters = _Filters(_compile_globs(include), _compile_globs(exclude))
    return _iter_paths(paths, filters)


def _iter_paths(paths: Sequence[Path], filters: _Filters) -> Iterator[Found]:
    for path in paths:
        if path.is_dir():
            yield from _walk(path, path, filters, frozenset())
        elif _passes(path.name, filters):
            yield Found(path, path.name)


def _walk(
    root: Path, folder: Path, filters: _Filters, ancestors: frozenset[Path]
) -> Iterator[Found]:
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
        elif entry.is_file() and _passes(relative, filters):
            yield Found(entry, relative, _skipped(relative, filters))


def _skipped(relative: str, filters: _Filters) -> str:
    """Why a file the globs let through is not loaded: without an include list (the user's
    own choice of files, taken whatever their type), one of a type no loader reads."""
    if filters.include or relative.lower().endswith(SUPPORTED_SUFFIXES):
        return ""
    suffix = PurePosixPath(relative).suffix.lower()
    return f"unsupported file type {suffix or '(no suffix)'}"


def _passes(relative: str, filters: _Filters) -> bool:
    if _matches(filters.exclude, relative):
        return False
    return not filters.include or _matches(filters.include, relative)


def _matches(globs: Sequence[_Glob], relative: str) -> bool:
    name = relative.rsplit("/", 1)[-1]
    return any(glob.fullmatch(relative) or glob.fullmatch(name) for glob in globs)


_GLOB_TOKENS = re.compile(r"(\*\*/|\*\*|\*|\?|\[!?\]?[^\]]*\])")


def _compile_globs(patterns: Sequence[str]) -> tuple[_Glob, ...]:
    return tuple(_Glob(pattern) for pattern in patterns)


_STARS = ("**/", "**", "*")


class _Glob:
    """A path glob: `*` and `?` stay inside one folder, `**` crosses folders.

    It matches what the regex it translates to would (`**/` reads `(?:.*/)?`, `**` `.*`, `*`
    `[^/]*`, `?` `[^/]`, `[!..]` `[^..]`), but it is run as an automaton: the set of steps
    reached so far, advanced once per character, so a match costs at most the path's length
    times the pattern's. The backtracking regex tried every way of sharing the path among
    the stars: `**/**/**/*a*a*a*b` took 13 s against a 194-character path, and 82 s
    against a 284-character one. Each `[..]` is compiled on its own, so an empty one (`[]`,
    `[!]`) is an error (re.error), as it was already unless a later token's `]` closed it.
    """

    __slots__ = ("_after", "_steps")

    def __init__(self, pattern: str) -> None:
        pieces = _GLOB_TOKENS.split(pattern.removeprefix("./"))
        # re.split with a group alternates literal text (even indexes) and glob tokens (odd).
        steps: list[str | re.Pattern[str]] = []
        for index, piece in enumerate(pieces):
            if index % 2 == 0:
                steps.extend(piece)  # one step per character
            elif piece in _STARS:
                steps.append(piece)
            else:
                steps.append(re.compile("[^/]" if piece == "?" else _glob_class(piece)))
        self._steps = steps
        # State i: the first i steps have matched. A star may match nothing, so reaching
        # state i also reaches the states just past the stars that follow it.
        self._after = [_reach(steps, i) for i in range(len(steps) + 1)]

    def fullmatch(self, text: str) -> bool:
        """Whether the glob matches all of `text`."""
        steps, done = self._steps, len(self._steps)
        # Ints are states; a `**/` step part-way through its folders is the negative ~i.
        states = set(self._after[0])
        for char in text:
            reached: set[int] = set()
            for state in states:
                i = ~state if state < 0 else state
                if i == done:
                    continue
                step = steps[i]
                if state < 0 or step == "**/":  # `.*/`: any character, and / may end it
                    if char != "\n":
                        reached.add(~i)
                    if char == "/":
                        reached.update(self._after[i + 1])
                elif step == "**":
                    if char != "\n":
                        reached.update(self._after[i])
                elif step == "*":
                    if char != "/":
                        reached.update(self._after[i])
                elif step == char if isinstance(step, str) else step.fullmatch(char):
                    reached.update(self._after[i + 1])
            if not reached:
                return False
            states = reached
        return done in states


def _reach(steps: Sequence[str | re.Pattern[str]], i: int) -> tuple[int, ...]:
    """State i and the states a run of stars right after step i reaches matching nothing."""
    end = i
    while end < len(steps) and steps[end] in _STARS:
        end += 1
    return tuple(range(i, end + 1))


def _glob_class(token: str) -> str:
    """The regex of a `[..]` or `[!..]` glob token: a character class."""
    body = token[1:-1].replace("\\", "\\\\").replace("[", "\\[")
    if body.startswith("^"):
        body = "\\" + body
    return "[^" + body[1:] + "]" if body.startswith("!") else "[" + body + "]"
