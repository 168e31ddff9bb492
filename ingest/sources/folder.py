"""A local folder as a source: the files `ragservice ingest PATH` would load, by the same names."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ingest.loaders.readers import Sidecars
from ingest.loaders.walking import Found, walk_files
from ingest.sources.base import (
    Changed,
    Failed,
    ItemState,
    ScanEvent,
    Skipped,
    SourceError,
    Unchanged,
)
from ragservice.errors import InvalidInputError


@dataclass
class FolderStats:
    """What the last scan did: files seen, files read (the others were known by size and
    time), files too large to read, and files of a type no loader reads."""

    files: int = 0
    read: int = 0
    too_large: int = 0
    skipped: int = 0


class FolderReader:
    """Walks a folder (or one file) with `walk_files`, so a document's key is the external id
    `ingest PATH` gives it (the path relative to the folder) and both name it alike, and both
    skip the same files (a type no loader reads: a `Skipped` event, counted in `skipped`).

    A file whose size and modification time (its `etag`, `size:mtime_ns`) are what `known`
    holds is unchanged without being read; one that was touched but holds the same bytes
    (same SHA-256) is unchanged too, with its new etag, so touching files writes nothing.

    A file's readers come from the nearest `.readers` sidecar up to the root, as for `ingest
    PATH` (`ingest.loaders.readers.Sidecars`); they are part of its etag and hash, so a file
    whose sidecar changed is read again and its document re-permissioned."""

    def __init__(
        self,
        path: str | Path,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        *,
        max_bytes: int | None = None,
    ) -> None:
        self.root = Path(path)
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        self.max_bytes = max_bytes
        self.complete = False
        self.stats = FolderStats()
        self._sidecars = Sidecars()

    def scan(self, known: Mapping[str, ItemState]) -> Iterator[ScanEvent]:
        """One event per file selected; raises SourceError (before yielding) when the root is
        missing or unreadable, so a run over a vanished folder deletes nothing."""
        self.complete = False
        self.stats = FolderStats()
        self._sidecars = Sidecars()
        files = self._files()
        return self._events(files, known)

    def _files(self) -> Iterator[Found]:
        try:
            if not self.root.exists():
                raise SourceError(f"the folder {self.root} does not exist")
            return walk_files([self.root], self.include, self.exclude)
        except OSError as exc:
            raise SourceError(f"the folder {self.root} cannot be read: {exc.strerror}") from exc

    def _events(
        self, files: Iterator[Found], known: Mapping[str, ItemState]
    ) -> Iterator[ScanEvent]:
        try:
            for found in files:
                if found.skipped:
                    self.stats.skipped += 1
                    yield Skipped(found.external_id, found.skipped)
                    continue
                self.stats.files += 1
                yield self._event(found.path, found.external_id, known.get(found.external_id))
        except OSError as exc:
            # A folder that vanished or became unreadable mid-walk: not a complete scan.
            raise SourceError(f"the folder {self.root} cannot be read: {exc}") from exc
        self.complete = True

    def _event(self, path: Path, key: str, prior: ItemState | None) -> ScanEvent:
        try:
            readers = self._sidecars.readers_for(path, key)
        except InvalidInputError as exc:
            return Failed(key, str(exc))
        try:
            status = path.stat()
        except OSError as exc:
            return Failed(key, f"cannot read {path}: {exc.strerror}")
        etag = f"{status.st_size}:{status.st_mtime_ns}{_readers_mark(readers)}"
        if prior is not None and prior.etag == etag:
            return Unchanged(key, prior)
        if self.max_bytes is not None and status.st_size > self.max_bytes:
            self.stats.too_large += 1
            return Failed(key, f"{status.st_size} bytes, over the limit of {self.max_bytes}")
        try:
            data = path.read_bytes()
        except OSError as exc:
            return Failed(key, f"cannot read {path}: {exc.strerror}")
        self.stats.read += 1
        digest = hashlib.sha256(data).hexdigest() + _readers_mark(readers)
        state = ItemState(etag=etag, content_hash=digest)
        if prior is not None and prior.content_hash == state.content_hash:
            return Unchanged(key, state)
        if readers is None and prior is not None and _MARK in (prior.content_hash or ""):
            readers = ()  # its sidecar is gone: the readers it gave go with it
        return Changed(key, path.name, data, state, origin={"path": str(path)}, readers=readers)


_MARK = ":r"
"""Starts what a sidecar adds to a file's etag and hash (a hex digest holds no colon)."""


def _readers_mark(readers: tuple[str, ...] | None) -> str:
    """What a file's sidecar readers add to its etag and hash: nothing without a sidecar (so
    the states of folders with none stay as they were), else a digest of the list."""
    if readers is None:
        return ""
    return _MARK + hashlib.sha256("\n".join(readers).encode()).hexdigest()[:16]
