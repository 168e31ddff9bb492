"""The injection detector run again over every stored chunk, its flags updated where they
change (chunks stored before the detector, or after it changed)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from ragservice import store
from ragservice.db import Database
from ragservice.safety import injection
from ragservice.store.documents import ScannedChunk


@dataclass(frozen=True)
class Rescan:
    seen: int = 0
    flagged: int = 0
    """Chunks newly flagged."""
    cleared: int = 0
    """Chunks no longer flagged."""


def count_chunks(db: Database) -> int:
    """The chunks a rescan reads."""
    with db.read() as session:
        return store.documents.count_chunks(session)


def rescan_injection_flags(
    db: Database, *, batch: int, on_page: Callable[[int], None] = lambda n: None
) -> Rescan:
    """Scan every chunk, `batch` chunks a transaction (`on_page` told each page's size)."""
    done, after = Rescan(), None
    while True:
        with db.write() as session:
            page = store.documents.chunks_page(session, after=after, limit=batch)
            changes = flag_changes(page, injection.scan)
            store.documents.set_injection_flags(session, changes)
        if not page:
            return done
        after = page[-1].id
        done = Rescan(
            done.seen + len(page),
            done.flagged + sum(reasons is not None for reasons in changes.values()),
            done.cleared + sum(reasons is None for reasons in changes.values()),
        )
        on_page(len(page))


def flag_changes(
    page: list[ScannedChunk], scan: Callable[[str], injection.Verdict]
) -> dict[uuid.UUID, list[str] | None]:
    """chunk id → its new reasons (None: unflag), for the chunks whose flag changes."""
    changes: dict[uuid.UUID, list[str] | None] = {}
    for chunk in page:
        verdict = scan(chunk.text)
        reasons = list(verdict.reasons) if verdict.flagged else None
        if reasons != chunk.flags:
            changes[chunk.id] = reasons
    return changes
