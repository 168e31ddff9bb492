"""Search, as every interface runs it: the limits on the query, the caller's collections, the
filter compiled and the options resolved (settings, then the request's overrides), then the
searcher on the serving model. The REST router and `ragservice search` both call `search`."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragservice import store
from ragservice.config import LimitSettings, SearchSettings
from ragservice.db import Database
from ragservice.embedding.registry import ModelRegistry, ServingModel
from ragservice.limits.request_bounds import check_query
from ragservice.limits.results import SEARCH_K
from ragservice.retrieval.filters import parse_and_compile
from ragservice.retrieval.search import Mode, Searcher, SearchHit, SearchOptions


@dataclass(frozen=True)
class SearchQuery:
    """What a caller asks for: the query and where to look, in the interface's own terms
    (collection names, the JSON filter, option overrides by name)."""

    text: str
    collections: Sequence[str] | None = None
    mode: Mode = Mode.HYBRID
    k: int = SEARCH_K
    filters: object | None = None
    group_documents: bool = False
    overrides: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Found:
    """A search's hits, best first, with the model it ran with."""

    mode: Mode
    hits: list[SearchHit]
    timings_ms: dict[str, float]
    model: ServingModel


def collection_ids(
    db: Database, tenant_id: uuid.UUID, names: Sequence[str] | None
) -> list[uuid.UUID]:
    """Ids of the tenant's collections by name (all of them for None); 404 for a missing one."""
    with db.read() as session:
        return store.collections.require_collection_ids(
            session, tenant_id, None if names is None else list(names)
        )


def resolve_options(query: SearchQuery, search: SearchSettings) -> SearchOptions:
    """The search `query` asks for: the settings' options, then its own."""
    return SearchOptions.from_settings(
        search,
        mode=query.mode,
        k=query.k,
        filters=parse_and_compile(query.filters),
        group_documents=query.group_documents,
        **query.overrides,
    )


def open_searcher(db: Database, models: ModelRegistry) -> Searcher:
    """A searcher on the serving model, resolved as each search starts (close it after)."""
    return Searcher(db, models=models.current)


class SearchService:
    """Searches of one process: its database, its serving model, its settings."""

    def __init__(
        self,
        db: Database,
        models: ModelRegistry,
        *,
        search: SearchSettings,
        limits: LimitSettings,
        searcher: Searcher,
    ) -> None:
        self._db = db
        self._models = models
        self._search = search
        self._limits = limits
        self._searcher = searcher

    @property
    def searcher(self) -> Searcher:
        return self._searcher

    def search(self, tenant_id: uuid.UUID, query: SearchQuery, *, field: str = "query") -> Found:
        """The tenant's best chunks for `query` (or documents, grouped); `field` names the
        query in a limit's error."""
        check_query(query.text, query.k, self._limits, field=field)
        options = resolve_options(query, self._search)
        ids = collection_ids(self._db, tenant_id, query.collections)
        model = self._models.current()
        result = self._searcher.search(
            collection_ids=ids, query=query.text, options=options, model=model
        )
        return Found(mode=options.mode, hits=result.hits, timings_ms=result.timings_ms, model=model)
