"""Which form of BM25 a database runs full text with, asked once per searcher.

- The `ragservice_bm25` extension's C function (exact, with block-max pruning) where the
  database has it: over the public tables, or on a store distributed on Citus over the shards of
  the asker's tenant (`ragservice_bm25_topk_tenant`, defined by `ragservice db distribute`);
- the SQL statement of `statements.BM25_SCORES` otherwise, with its per-term budget of
  postings; on a Citus coordinator without the tenant's function with every posting read when
  an unfiltered search must be exact, so that it scores as the function would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ragservice.db import tenancy

if TYPE_CHECKING:
    from ragservice.retrieval.options import SearchOptions

EVERY_POSTING = 2**31 - 1
"""The SQL statement's per-term budget that reads every posting (exact BM25)."""

Probe = Callable[[], tuple[bool, bool, bool]]
"""Asks the database: (has the extension, is a Citus coordinator, has the tenant's function)."""


@dataclass
class FullTextEngine:
    function: bool | None = None
    """Whether the C function runs searches (None: not asked yet; False given: never)."""
    distributed: bool = False
    of_tenant: bool = False
    """Whether the function runs as the tenant's (`ragservice_bm25_topk_tenant`): on Citus."""

    def exact(self, options: SearchOptions, probe: Probe) -> bool:
        """Whether a full-text search in this transaction's tenancy runs the exact
        function (on Citus not across tenants: the function reads one tenant's shards)."""
        function = options.bm25_exact and self.has_function(probe)
        return function and not (self.distributed and tenancy.current().tenant_id is None)

    def has_function(self, probe: Probe) -> bool:
        if self.function is None:
            extension, citus, tenant_function = probe()
            self.distributed = bool(citus)
            self.of_tenant = self.distributed and bool(tenant_function)
            self.function = bool(extension) and (not self.distributed or self.of_tenant)
        return self.function

    def budget(self, options: SearchOptions, probe: Probe) -> int:
        """Postings the SQL statement reads per term: every one on Citus where an unfiltered
        search must be exact and the function cannot run."""
        function = self.exact(options, probe)
        if options.bm25_exact and options.filters is None and self.distributed and not function:
            return EVERY_POSTING
        return options.bm25_postings_per_term
