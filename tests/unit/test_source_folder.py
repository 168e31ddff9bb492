"""The folder source: the names `ingest PATH` gives, and unchanged files left unread."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from ingest.loaders.walking import iter_files
from ingest.sources.base import (
    Changed,
    Failed,
    ItemState,
    ScanEvent,
    Skipped,
    SourceError,
    Unchanged,
)
from ingest.sources.folder import FolderReader


def _tree(root: Path, count: int = 20) -> None:
    for index in range(count):
        folder = root / f"part{index % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"doc{index:02}.md").write_text(f"# Doc {index}\n\nbody {index}\n")
    (root / "skip.bin").write_bytes(b"\0\1")  # no loader reads it: skipped, and said so
    (root / ".hidden.txt").write_text("hidden")


def _states(events: list[ScanEvent]) -> dict[str, ItemState]:
    return {e.key: e.state for e in events if isinstance(e, Changed | Unchanged)}


def _scan(reader: FolderReader, known: Mapping[str, ItemState]) -> list[ScanEvent]:
    return list(reader.scan(known))


def test_a_first_scan_reads_every_file_under_the_names_ingest_gives(tmp_path: Path) -> None:
    _tree(tmp_path)
    reader = FolderReader(tmp_path)
    *events, skipped = _scan(reader, {})
    assert all(isinstance(e, Changed) for e in events)
    assert [e.key for e in events] == [key for _, key in iter_files([tmp_path])]
    assert len(events) == 20 and reader.complete
    assert skipped == Skipped("skip.bin", "unsupported file type .bin")  # not read, and said so
    assert reader.stats.skipped == 1 and reader.stats.read == 20
    first = events[0]
    assert isinstance(first, Changed)
    assert first.name == Path(first.key).name
    assert first.data == (tmp_path / first.key).read_bytes()
    assert first.origin == {"path": str(tmp_path / first.key)}


def test_a_rescan_reads_nothing_and_touching_writes_nothing(tmp_path: Path) -> None:
    _tree(tmp_path)
    known = _states(_scan(FolderReader(tmp_path), {}))
    reader = FolderReader(tmp_path)
    again = _scan(reader, known)
    assert [type(e) for e in again] == [Unchanged] * 20 + [Skipped]
    assert reader.stats.read == 0
    touched = tmp_path / "part0" / "doc00.md"
    stat = touched.stat()
    os.utime(touched, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    events = _scan(reader, known)
    assert [type(e) for e in events] == [Unchanged] * 20 + [Skipped]
    assert reader.stats.read == 1
    new_state = next(
        e.state for e in events if isinstance(e, Unchanged) and e.key.endswith("00.md")
    )
    assert new_state.etag != known["part0/doc00.md"].etag  # next time known by size and time


def test_changed_and_removed_files_are_told_apart(tmp_path: Path) -> None:
    _tree(tmp_path)
    known = _states(_scan(FolderReader(tmp_path), {}))
    for index in (1, 4):
        (tmp_path / f"part{index % 3}" / f"doc{index:02}.md").write_text("new and longer text")
    (tmp_path / "part2" / "doc02.md").unlink()
    events = _scan(FolderReader(tmp_path), known)
    changed = sorted(e.key for e in events if isinstance(e, Changed))
    assert changed == ["part1/doc01.md", "part1/doc04.md"]
    assert sum(isinstance(e, Unchanged) for e in events) == 17
    assert set(known) - {e.key for e in events} == {"part2/doc02.md"}


def test_include_exclude_and_size_limit(tmp_path: Path) -> None:
    _tree(tmp_path)
    events = _scan(FolderReader(tmp_path, include=["*.md"], exclude=["part1"]), {})
    assert {e.key.split("/")[0] for e in events} == {"part0", "part2"}
    big = _scan(FolderReader(tmp_path, max_bytes=5), {})
    read = [e for e in big if not isinstance(e, Skipped)]
    assert read and all(isinstance(e, Failed) and "over the limit" in e.reason for e in read)


def test_a_missing_folder_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        FolderReader(tmp_path / "gone").scan({})
