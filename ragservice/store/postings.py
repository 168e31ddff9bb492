"""BM25 postings upkeep beyond the triggers: the append mode of large loads and the pack after.

The statement triggers on `chunks` (migrations 0014, 0020, 0021) keep the postings blocks and
totals exact on every write. An ordinary write merges its postings into each key's open block
(n < 128), taking turns per collection. A large batch writes in append mode instead: its
blocks are added beside the open ones, with no rewrite and no turn-taking, and `pack_postings`
merges each key's short blocks once, at the end of the load.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.orm import Session

from ragservice.db.engine import driver_connection
from ragservice.store import bulk

log = logging.getLogger(__name__)

APPEND_MIN_CHUNKS = 512
"""A batch of at least this many chunks is written in append mode (see `append_postings`)."""


@dataclass(frozen=True, slots=True)
class PackResult:
    """What `pack_postings` did: short blocks taken, blocks written in their place."""

    collections: int
    blocks_before: int
    blocks_after: int
    seconds: float


def append_postings(session: Session) -> None:
    """Until the transaction ends, chunk inserts append their postings blocks (no merge into
    open blocks, no per-collection lock): for large batches, packed afterwards. Not on a
    distributed store, where no pack follows (`pack_postings`): there every load merges its
    postings into the open blocks, so that searches read packed blocks as on one server."""
    if bulk.on_citus(driver_connection(session)):
        return
    session.execute(text("SET LOCAL ragservice.postings_append = on"))


def pack_postings(session: Session, collection_id: uuid.UUID | None) -> PackResult:
    """Merge each postings key's short blocks into blocks of 128, in one collection or (None)
    in every collection the transaction sees; also folds the totals rows no live transaction
    holds. Waits for the collection's ordinary writers (and makes them wait), never for
    loaders in append mode."""
    started = time.perf_counter()
    if bulk.on_citus(driver_connection(session)):
        # The pack locks and rewrites a collection's blocks by collection alone, which Citus
        # cannot route to one shard; loads there merge their blocks as they go instead
        # (`append_postings`).
        log.info("postings not packed: a distributed store")
        return PackResult(0, 0, 0, time.perf_counter() - started)
    if collection_id is None:
        ids = list(session.scalars(text("SELECT id FROM collections ORDER BY id")))
    else:
        ids = [collection_id]
    before = after = 0
    for cid in ids:
        row = session.execute(
            text("SELECT blocks_before, blocks_after FROM ragservice_pack_postings(:c)"),
            {"c": cid},
        ).one()
        before += int(row.blocks_before)
        after += int(row.blocks_after)
    return PackResult(len(ids), before, after, time.perf_counter() - started)
