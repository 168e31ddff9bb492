"""`ragservice_pack_postings` reads only its lexeme range and plans without nested loops.

A pack runs right after a load, before autovacuum has analyzed `chunk_postings`: the planner
then sees none of the new collection's blocks and may join the keys to be packed with the
collection's short blocks by a nested loop that scans all of them once per key. Measured on
SciFact loads (9,832 chunks, ~100,000 short blocks) with the statistics taken before them: one
pack still running after 6 minutes, another past a 60 s statement timeout, against 1.2 s with
nested loops off. Every join in the pack is a bulk join, so hash joins are right whatever the
statistics say; and the blocks a range deletes are now bounded by that range too (0021 bounded
only the keys), so each pass reads its own range, not all of the collection's short blocks.
Custom plans always: the range bounds are NULL at the ends, which a generic plan cannot fold.
The size of a range (200,000 short blocks) becomes an argument with that default, so a test can
pack a small collection in many ranges.

Revision ID: 0022
Revises: 0021
Create Date: 2027-03-08
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

_SIGNATURE = (
    "ragservice_pack_postings(target uuid,",
    "ragservice_pack_postings(target uuid, range_blocks integer DEFAULT 200000,",
)
_RANGE_SIZE = ("WHERE r % 200000 = 0", "WHERE r % range_blocks = 0")
_SETTINGS = (
    "LANGUAGE plpgsql SET work_mem = '256MB'",
    "LANGUAGE plpgsql SET work_mem = '256MB' SET enable_nestloop = off\n"
    "    SET plan_cache_mode = force_custom_plan",
)
_TAKEN = (
    """        WHERE p.collection_id = target AND p.lexeme = k.lexeme AND p.tier = k.tier
          AND p.n < 128
""",
    """        WHERE p.collection_id = target AND p.lexeme = k.lexeme AND p.tier = k.tier
          AND p.n < 128
          AND (range_lo IS NULL OR p.lexeme >= range_lo)
          AND (range_hi IS NULL OR p.lexeme < range_hi)
""",
)


def upgrade() -> None:
    op.execute("DROP FUNCTION ragservice_pack_postings(uuid)")
    op.execute(_pack(_revision_0021()._PACK))


def downgrade() -> None:
    op.execute("DROP FUNCTION ragservice_pack_postings(uuid, integer)")
    op.execute(_revision_0021()._PACK)


def _pack(previous: str) -> str:
    """0021's function with the changes above."""
    changed = previous
    for old, new in (_SIGNATURE, _RANGE_SIZE, _SETTINGS, _TAKEN):
        assert changed.count(old) == 1, old
        changed = changed.replace(old, new)
    return changed


def _revision_0021() -> ModuleType:
    """Migration 0021, whose pack function this one changes."""
    path = Path(__file__).with_name("0021_bulk_postings.py")
    spec = importlib.util.spec_from_file_location("ragservice_migration_0021", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
