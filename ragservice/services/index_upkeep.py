"""How a load keeps a model's HNSW index: row by row as the rows go in, or dropped before the
load and built once after it (far faster for a large load, or for rows nobody searches yet).

`INDEX_MODES`: `kept` keeps the index; `deferred` drops and builds it; `auto` defers it when
the model is not the serving one or has no embeddings yet. The build runs whether the load
ends well or not, so the model is never left without its index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol, TypeVar

from ragservice import store
from ragservice.db import Database
from ragservice.db.models import EmbeddingModel
from ragservice.embedding import indexing

INDEX_MODES = ("auto", "kept", "deferred")

T = TypeVar("T")


class UpkeepView(Protocol):
    """What a caller shows of the upkeep: the drop, the build's progress, the build."""

    def dropped(self, label: str) -> None: ...

    def building(self, label: str) -> AbstractContextManager[indexing.Progress | None]: ...

    def built(self, label: str, build: indexing.IndexBuild) -> None: ...


class Quietly:
    """Shows nothing."""

    def dropped(self, label: str) -> None:
        pass

    def building(self, label: str) -> AbstractContextManager[indexing.Progress | None]:
        return _no_progress()

    def built(self, label: str, build: indexing.IndexBuild) -> None:
        pass


@contextmanager
def _no_progress() -> Iterator[None]:
    yield None


def deferred_index(db: Database, model_id: int, mode: str) -> EmbeddingModel | None:
    """The model whose index a load in `mode` drops and builds after it; None: the index is
    kept up to date row by row (or the model is gone)."""
    with db.read() as session:
        model = store.embedding_models.get_model(session, model_id)
        if model is None or mode == "kept":
            return None
        embedded = store.embedding_models.embedded_counts(session).get(model_id, 0)
    deferred = mode == "deferred" or (not model.active or embedded == 0)
    return model if deferred else None


def with_index_upkeep(
    db: Database,
    model_id: int,
    mode: str,
    load: Callable[[], T],
    *,
    view: UpkeepView | None = None,
) -> tuple[T, bool]:
    """Run `load` with the model's index kept as `mode` says; its result, and whether the
    index was dropped for it and built after it."""
    model = deferred_index(db, model_id, mode)
    if model is None:
        return load(), False
    shown = view or Quietly()
    label = f"{model.name}:{model.version}"
    shown.dropped(label)
    indexing.drop_embedding_index(db, model)
    try:
        result = load()
    finally:
        with shown.building(label) as progress:
            build = indexing.build_embedding_index(db, model, progress=progress)
        shown.built(label, build)
    return result, True
