"""The semantic prompt cache: answers reused within one scope, never across meanings.

A lookup tries the normalized prompt's hash first (exact), then the nearest cached prompts of
the same scope above a similarity threshold, each checked by the meaning guard
(`guard.meaning_differs`: negation, numbers, entities, direction). The scope fingerprint
covers everything that shapes an answer: tenant, collections, the search's resolved options
(filters, embedding model and its storage included), reranking, context and generation. What
crosses to and from the answering side is a typed `CachedAnswer`. Entries expire a fixed
time after creation (hits do not extend them) and are deleted with any change to a document
they were built from, and with any document added to their collections (triggers in
migration 0004), so a cached answer is never older than its sources.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from sqlalchemy.orm import Session

from ragservice import store
from ragservice.answering.context import Source, source_from_json, source_to_json
from ragservice.answering.question import ANSWER_STATUSES, AnswerStatus
from ragservice.cache.guard import meaning_differs, normalize_prompt, prompt_hash
from ragservice.config import CacheSettings
from ragservice.db import Database, tenancy
from ragservice.metrics import Metrics
from ragservice.periodic import Periodic

log = logging.getLogger(__name__)

Vector = npt.NDArray[np.float32]
CacheKind = Literal["exact", "semantic"]


@dataclass(frozen=True)
class CachedAnswer:
    """An answer as the cache keeps it: its text, the model and status it was generated
    with, the numbers of the sources it cites, the sources, and the question it answered."""

    answer: str
    model: str
    status: AnswerStatus
    cited: tuple[int, ...]
    sources: tuple[Source, ...]
    question: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "answer": self.answer,
            "model": self.model,
            "status": self.status,
            "cited": list(self.cited),
            "sources": [source_to_json(source) for source in self.sources],
            "question": self.question,
        }

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> CachedAnswer:
        """An entry's stored response; entries from before a field existed read its default."""
        status = stored.get("status", "ok")
        return cls(
            answer=str(stored.get("answer", "")),
            model=str(stored.get("model", "")),
            status=status if status in ANSWER_STATUSES else "ok",
            cited=tuple(int(number) for number in stored.get("cited", ())),
            sources=tuple(source_from_json(item) for item in stored.get("sources", ())),
            question=str(stored.get("question", "")),
        )


@dataclass(frozen=True)
class CacheInfo:
    """What the cache did for one request, as responses and the query log report it."""

    hit: bool
    kind: CacheKind | None = None
    similarity: float | None = None
    entry_id: uuid.UUID | None = None
    refused: str | None = None  # the meaning guard's reason, when it turned a near match away

    def to_dict(self) -> dict[str, Any]:
        return {
            "hit": self.hit,
            "kind": self.kind,
            "similarity": None if self.similarity is None else round(self.similarity, 4),
            "entry_id": None if self.entry_id is None else str(self.entry_id),
            "refused": self.refused,
        }


@dataclass(frozen=True)
class Lookup:
    """A lookup's outcome: the cached answer on a hit."""

    info: CacheInfo | None  # None: the cache was not consulted
    answer: CachedAnswer | None = None
    elapsed_ms: float = 0.0  # the lookup, the query's embedding left out (`embed` times it)


def scope_fingerprint(parts: Mapping[str, Any]) -> str:
    """A stable hash of everything that shapes an answer; entries never cross scopes."""
    canonical = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class PromptCache:
    """Entries carry the embedding model they were embedded with; lookups and stores name the
    model of their request (the serving model, resolved once per request)."""

    def __init__(
        self,
        db: Database,
        *,
        cache: CacheSettings,
        metrics: Metrics | None = None,
    ) -> None:
        self._db = db
        self._config = cache
        self._metrics = metrics
        # Hit counters are written off the request path: a hit answers without waiting on them.
        self._counter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cache-hits")

    def close(self) -> None:
        self._counter.shutdown(wait=True)

    def lookup(
        self,
        scope: str,
        prompt: str,
        embed: Callable[[], Vector],
        *,
        model_id: int,
        dimension: int,
    ) -> Lookup:
        """Exact match, else the nearest prompts in scope, embedded by the model `model_id`,
        that pass the meaning guard. `embed` gives the prompt's vector (called only past an
        exact match, and then once)."""
        started = time.perf_counter()
        embed_seconds = 0.0

        def timed_embed() -> Vector:
            nonlocal embed_seconds
            embed_started = time.perf_counter()
            vector = embed()
            embed_seconds = time.perf_counter() - embed_started
            return vector

        found = self._lookup(scope, prompt, timed_embed, model_id, dimension)
        seconds = time.perf_counter() - started - embed_seconds
        if self._metrics is not None:
            self._metrics.cache_lookup_seconds.observe(seconds)
        return replace(found, elapsed_ms=seconds * 1000)

    def put(
        self,
        session: Session,
        *,
        tenant_id: uuid.UUID,
        scope: str,
        collection_ids: Sequence[uuid.UUID],
        prompt: str,
        vector: Vector,
        model_id: int,
        answer: CachedAnswer,
        sources: dict[uuid.UUID, int],
        replace: bool = False,
    ) -> uuid.UUID | None:
        """Keep an answer, in `session` (a transaction on the primary); None when an identical
        entry exists or a source changed meanwhile. `vector` is the prompt's by `model_id`;
        `sources` the version of each document the answer was built from."""
        normalized = normalize_prompt(prompt)
        ttl = store.prompt_cache.cache_ttl(session, collection_ids, self._config.ttl_seconds)
        entry = store.prompt_cache.NewCacheEntry(
            tenant_id=tenant_id,
            scope=scope,
            model_id=model_id,
            collection_ids=collection_ids,
            prompt_hash=prompt_hash(normalized),
            prompt=normalized,
            embedding=vector,
            answer=answer.answer,
            response={**answer.to_json(), "question": prompt},
            ttl_seconds=ttl,
            sources=sources,
        )
        return store.prompt_cache.cache_store(session, entry, replace=replace)

    def _lookup(
        self, scope: str, prompt: str, embed: Callable[[], Vector], model_id: int, dimension: int
    ) -> Lookup:
        with self._db.read() as session:
            exact = store.prompt_cache.cache_exact(
                session, scope, prompt_hash(normalize_prompt(prompt))
            )
        refused = None
        if exact is not None:
            # Normalization drops symbols and case: "x > y" and "x < y" share a key, so even
            # an exact match passes the guard.
            refused = meaning_differs(prompt, str(exact.response.get("question", "")))
            if refused is None:
                return self._hit(exact, "exact")
            self._count_refusal(refused)
        vector = embed()
        with self._db.read() as session:
            candidates = store.prompt_cache.cache_nearest(
                session,
                scope=scope,
                model_id=model_id,
                dimension=dimension,
                vector=vector,
                threshold=self._config.similarity_threshold,
            )
        for candidate in candidates:
            if exact is not None and candidate.id == exact.id:
                continue  # the exact match the guard already turned away
            reason = meaning_differs(prompt, str(candidate.response.get("question", "")))
            if reason is None:
                return self._hit(candidate, "semantic")
            refused = refused or reason
            self._count_refusal(reason)
        self._count("miss")
        return Lookup(info=CacheInfo(hit=False, refused=refused))

    def _hit(self, entry: store.prompt_cache.CachedEntry, kind: CacheKind) -> Lookup:
        self._counter.submit(self._record_hit, entry.id, tenancy.current())
        self._count(f"{kind}_hit")
        info = CacheInfo(hit=True, kind=kind, similarity=entry.similarity, entry_id=entry.id)
        return Lookup(info=info, answer=CachedAnswer.from_json(entry.response))

    def _record_hit(self, entry_id: uuid.UUID, whose: tenancy.Tenancy) -> None:
        try:
            with tenancy.within(whose), self._db.write() as session:
                store.prompt_cache.cache_hit(session, entry_id)
        except Exception:  # a lost count is only a statistic
            log.warning("counting a cache hit failed", exc_info=True)

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.cache_lookups.labels(result=result).inc()

    def _count_refusal(self, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.cache_guard_refusals.labels(reason=reason).inc()


class CachePurger:
    """Deletes expired entries every `interval` seconds (they are never served meanwhile)."""

    def __init__(self, db: Database, *, interval: float) -> None:
        self._db = db
        # A lost round costs only disk: the next one deletes what it left.
        self._rounds = Periodic(
            "cache-purger", self.purge_once, interval, what="purging expired cache entries"
        )

    def start(self) -> None:
        self._rounds.start()

    def stop(self, timeout: float) -> None:
        self._rounds.stop(timeout)

    def purge_once(self) -> int:
        with tenancy.as_system(), self._db.write() as session:  # every tenant's entries
            purged = store.prompt_cache.purge_expired_cache(session)
        if purged:
            log.info("purged %d expired cache entries", purged)
        return purged
