"""The registered reranker versions (trained by `ragservice finetune --reranker`)."""

from __future__ import annotations

from ragservice import store
from ragservice.db import Database
from ragservice.db.models import RerankerModel


def list_rerankers(db: Database) -> list[RerankerModel]:
    """Every registered reranker version."""
    with db.read() as session:
        return store.rerankers.list_rerankers(session)
