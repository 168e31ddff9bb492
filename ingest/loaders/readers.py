"""Who may read what a load brings: the readers a command line or an upload names, and the
per-folder sidecar files (`.readers`) of a folder being walked.

A `.readers` file lists principals (`user:ana`, `group:hr`), separated by commas or lines, `#`
starting a comment; it applies to the files of its folder and of the folders below, up to the
folder given to the ingest; the nearest one wins. The most specific list wins overall: a JSONL
row's own readers, then the nearest sidecar, then the command line's or the upload's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path, PurePosixPath

from ingest.loaders.parsing import LoadResult
from ragservice.errors import InvalidInputError
from ragservice.readers import parse_readers
from ragservice.types import LoadedDocument

SIDECAR = ".readers"
MAX_SIDECAR_BYTES = 64 * 1024


def with_readers(
    results: Iterable[LoadResult], readers: tuple[str, ...] | None
) -> Iterator[LoadResult]:
    """`results`, each document that names no readers given `readers` (None: left as is)."""
    for result in results:
        if readers is not None and isinstance(result, LoadedDocument) and result.readers is None:
            yield replace(result, readers=readers)
        else:
            yield result


class Sidecars:
    """The `.readers` files of the folders a walk goes through, each read once."""

    def __init__(self) -> None:
        self._read: dict[Path, tuple[str, ...] | InvalidInputError | None] = {}

    def readers_for(self, path: Path, external_id: str) -> tuple[str, ...] | None:
        """The nearest sidecar's readers for the file `path` (its id relative to the walked
        folder is `external_id`), looking no higher than that folder; None: no sidecar.
        InvalidInputError, naming the sidecar, for one that lists a bad principal."""
        levels = len(PurePosixPath(external_id).parts)
        for folder in [path.parent, *path.parent.parents][:levels]:
            found = self._sidecar(folder)
            if isinstance(found, InvalidInputError):
                raise found
            if found is not None:
                return found
        return None

    def _sidecar(self, folder: Path) -> tuple[str, ...] | InvalidInputError | None:
        if folder not in self._read:
            self._read[folder] = _read_sidecar(folder / SIDECAR)
        return self._read[folder]


def _read_sidecar(path: Path) -> tuple[str, ...] | InvalidInputError | None:
    if not path.is_file():
        return None
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_SIDECAR_BYTES + 1)
    except OSError as exc:
        return InvalidInputError(f"{path}: could not read it: {exc.strerror or exc}")
    if len(raw) > MAX_SIDECAR_BYTES:
        return InvalidInputError(f"{path}: larger than {MAX_SIDECAR_BYTES} bytes")
    lines = (line.partition("#")[0] for line in raw.decode("utf-8", errors="replace").splitlines())
    try:
        return parse_readers([item for line in lines for item in line.split(",")])
    except InvalidInputError as exc:
        return InvalidInputError(f"{path}: {exc}")
