"""Which form of BM25 a database runs full text with, asked once per searcher.

- The `ragservice_bm25` extension's C function (exact, with block-max pruning) where the
  database has it;
- the SQL statement of `statements.BM25_SCORES` otherwise, with its per-term budget of
  postings; on a Citus coordinator (the function cannot read postings from within a shard's
  query) with every posting read when an unfiltered search must be exact, so that it scores as
  the function would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragservice.retrieval.options import SearchOptions

EVERY_POSTING = 2**31 - 1
"""The SQL statement's per-term budget that reads every posting (exact BM25)."""

Probe = Callable[[], tuple[bool, bool]]
"""Asks the database: (has the extension, is a Citus coordinator)."""


@dataclass
class FullTextEngine:
    function: bool | None = None
    """Whether the C function runs searches (None: not asked yet; False given: never)."""
    distributed: bool = False

    def exact(self, options: SearchOptions, probe: Probe) -> bool:
        """Whether an unfiltered full-text search runs the exact function."""
        return options.bm25_exact and self.has_function(probe)

    def has_function(self, probe: Probe) -> bool:
        if self.function is None:
            extension, citus = probe()
            self.distributed = bool(citus)
            self.function = bool(extension) and not self.distributed
        return self.function

    def budget(self, options: SearchOptions, probe: Probe) -> int:
        """Postings the SQL statement reads per term."""
        self.has_function(probe)
        if options.bm25_exact and options.filters is None and self.distributed:
            return EVERY_POSTING
        return options.bm25_postings_per_term
