"""Embedding model versions: which one a process serves, and switching between them.

A `ModelRegistry` holds the serving model (its row and the loaded embedder). A background
thread reads the active row every `RAGSERVICE_MODEL_CHECK_SECONDS`; when another model became
active it loads and warms that model first, then swaps one reference. Requests go on with the
old model meanwhile and never wait for a load. A request resolves `current()` once at its start
and uses that model throughout (query embedding, search, cache), so a switch never mixes two
models within one request. The previously served model stays loaded, so a rollback is instant.

The operator's side (`activate`, `rollback`, `drop_embeddings`) changes rows only; every server
follows within one check interval.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from ragservice import store
from ragservice.config import EmbeddingSettings, Settings
from ragservice.db import Database, tenancy
from ragservice.db.models import EmbeddingModel
from ragservice.embedding.embedder import (
    SentenceTransformerEmbedder,
    Vector,
    known_names,
    make_embedder,
)
from ragservice.errors import ConflictError, EmbeddingError, InvalidInputError, NotFoundError
from ragservice.limits.shape import MAX_INT4
from ragservice.store.audit import SYSTEM_ACTOR

log = logging.getLogger(__name__)

_KEEP_LOADED = 2  # the serving model and the one before it (an instant rollback)


@dataclass(frozen=True)
class ServingModel:
    """A registered model, loaded: what one request embeds, searches and caches with."""

    id: int
    name: str
    version: int
    dimension: int
    embedder: SentenceTransformerEmbedder
    storage: str = "float32"
    """How its chunk vectors are stored (float32, halfvec, binary): how search reads them."""

    def embed_query(self, text: str) -> Vector:
        return self.embedder.embed_query(text)

    def count_tokens(self, text: str) -> int:
        return self.embedder.count_tokens(text)

    @property
    def names(self) -> frozenset[str]:
        """What clients may call it: its name (and the bundled model's other name), each with
        or without `:VERSION`."""
        bare = known_names(self.name)
        return bare | {f"{name}:{self.version}" for name in bare}

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "version": self.version,
            "dimension": self.dimension,
            "storage": self.storage,
            "precision": self.embedder.precision,
            "query_encoder": self.embedder.query_backend,
        }


Loader = Callable[[EmbeddingModel], SentenceTransformerEmbedder]


class ModelRegistry:
    """The model this process serves, following the database's active model once started."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        initial: ServingModel,
        *,
        loader: Loader | None = None,
    ) -> None:
        self._db = db
        self._settings = settings
        self._load = loader or (lambda row: load_embedder(settings, row))
        self._current = initial
        self._loaded: OrderedDict[int, ServingModel] = OrderedDict({initial.id: initial})
        self._failed: set[int] = set()
        self._refresh_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def current(self) -> ServingModel:
        """The serving model; resolve it once per request and keep it for the request."""
        return self._current

    def loaded(self) -> list[ServingModel]:
        """The models this process holds loaded, the serving one first (the one before it stays
        loaded for an instant rollback): what a request may embed with at no loading cost."""
        current = self._current
        held = tuple(self._loaded.values())  # one C-level copy: the refresh thread may swap
        return [current, *(m for m in reversed(held) if m.id != current.id)]

    def refresh(self) -> bool:
        """Check the active model once; load it (outside any request) and switch to it when it
        changed. True when this call switched."""
        with self._refresh_lock:
            with self._db.read() as session:
                row = store.embedding_models.active_model(session)
            if row is not None and row.id == self._current.id:
                return self._follow_storage(row)
            if row is None or row.id in self._failed:
                return False
            model = self._loaded.get(row.id) or self._load_row(row)
            if model is None:
                return False
            self._use(model)
            return True

    def _follow_storage(self, row: EmbeddingModel) -> bool:
        """The serving model's storage was converted (`ragservice models convert`): search it
        the new way from now on (the loaded model stays)."""
        if row.storage == self._current.storage:
            return False
        log.info("embedding model %s v%d is now stored as %s", row.name, row.version, row.storage)
        self._use(replace(self._current, storage=row.storage))
        return True

    def start(self) -> None:
        """Follow the active model in a background thread (a no-op while it runs)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="model-registry", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            # A model load in progress is not interrupted; the daemon thread ends with it.
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self._settings.embedding.model_check_seconds):
            try:
                self.refresh()
            except Exception:  # the next check tries again; meanwhile the current model serves
                log.warning("checking the active embedding model failed", exc_info=True)

    def _load_row(self, row: EmbeddingModel) -> ServingModel | None:
        log.info("loading embedding model %s v%d (id %d)", row.name, row.version, row.id)
        try:
            embedder = self._load(row)
            embedder.warm_up()
            if embedder.dimension != row.dimension:
                raise EmbeddingError(
                    f"it gives {embedder.dimension} dimensions, its row says {row.dimension}"
                )
        except Exception as exc:
            # Tried again only after another model was active: a broken row is logged once.
            self._failed.add(row.id)
            log.error("cannot serve embedding model %s v%d: %s", row.name, row.version, exc)
            return None
        return _serving(row, embedder)

    def _use(self, model: ServingModel) -> None:
        previous = self._current
        self._current = model  # one reference swap: requests resolve either model, whole
        self._failed.clear()
        self._loaded[model.id] = model
        self._loaded.move_to_end(model.id)
        while len(self._loaded) > _KEEP_LOADED:
            self._loaded.popitem(last=False)
        log.info(
            "serving embedding model %s v%d (id %d), was %s v%d (id %d)",
            model.name,
            model.version,
            model.id,
            previous.name,
            previous.version,
            previous.id,
        )


def _serving(row: EmbeddingModel, embedder: SentenceTransformerEmbedder) -> ServingModel:
    return ServingModel(
        id=row.id,
        name=row.name,
        version=row.version,
        dimension=row.dimension,
        embedder=embedder,
        storage=row.storage,
    )


# -- loading ---------------------------------------------------------------------------------


def loadable(row: EmbeddingModel, embedding: EmbeddingSettings) -> bool:
    """Whether this process can load the model without fetching anything: its folder exists,
    or it is the configured model (which the operator chose to load by name)."""
    return bool(row.path and Path(row.path).exists()) or row.name == embedding.model


def load_embedder(settings: Settings, row: EmbeddingModel) -> SentenceTransformerEmbedder:
    """The row's model with the configured device, batch size and query encoder, not yet
    loaded (call `warm_up`, or just `embed`)."""
    if row.name == settings.embedding.model or not (row.path and Path(row.path).exists()):
        name = row.name
    else:
        name = row.path
    settings = settings.model_copy(update={"embedding_model": name})
    return make_embedder(settings, owner=tenancy.current_tenant_id)


def serve_row(settings: Settings, row: EmbeddingModel) -> ServingModel:
    """Load and warm the row's model (seconds)."""
    embedder = load_embedder(settings, row)
    embedder.warm_up()
    return _serving(row, embedder)


def serve_embedder(row: EmbeddingModel, embedder: SentenceTransformerEmbedder) -> ServingModel:
    return _serving(row, embedder)


# -- the operator's side ---------------------------------------------------------------------


def parse_model_ref(ref: str) -> tuple[str, int | None]:
    """`NAME` (its latest version) or `NAME:VERSION` → (name, version or None)."""
    name, sep, version = ref.rpartition(":")
    if sep and name and version.isdigit():
        if len(version) > len(str(MAX_INT4)) or int(version) > MAX_INT4:
            raise InvalidInputError(f"model: the version is above the limit of {MAX_INT4}")
        return name, int(version)
    return ref, None


def get_model_by_name(session: Session, ref: str) -> EmbeddingModel:
    """The registered model `NAME[:VERSION]`; NotFoundError naming the known ones otherwise."""
    name, version = parse_model_ref(ref)
    model = store.embedding_models.get_model_by_name(session, name, version)
    if model is None:
        known = sorted(
            {f"{m.name}:{m.version}" for m in store.embedding_models.list_models(session)}
        )
        raise NotFoundError(
            f"no embedding model {ref!r}; registered: {', '.join(known) or 'none'} "
            "(`ragservice models list`)"
        )
    return model


@dataclass(frozen=True)
class ModelStatus:
    """A model row with how much of the corpus it has embedded."""

    model: EmbeddingModel
    embedded: int
    chunks: int

    @property
    def complete(self) -> bool:
        return self.embedded >= self.chunks


def model_statuses(session: Session) -> list[ModelStatus]:
    """Every registered model, with the chunks the transaction sees and how many it embedded."""
    counts = store.embedding_models.embedded_counts(session)
    total = store.embedding_models.chunk_total(session)
    return [
        ModelStatus(m, counts.get(m.id, 0), total)
        for m in store.embedding_models.list_models(session)
    ]


def model_row(status: ModelStatus, statuses: Sequence[ModelStatus]) -> dict[str, Any]:
    """One model as `ragservice models list --json` and `GET /v1/admin/models` show it: the
    same fields in both (the CLI adds the path; the API does not tell where files lie). `base`
    names the model it was fine-tuned from, as `NAME:VERSION` (`statuses` holds the names)."""
    model = status.model
    names = {s.model.id: f"{s.model.name}:{s.model.version}" for s in statuses}
    held_out = model.details.get("held_out", {})
    return {
        "id": model.id,
        "name": model.name,
        "version": model.version,
        "dimension": model.dimension,
        "storage": model.storage,
        "active": model.active,
        "embedded": status.embedded,
        "chunks": status.chunks,
        "base": names.get(model.base_model_id) if model.base_model_id else None,
        "created": model.created_at.isoformat(timespec="seconds"),
        "held_out": {"before": held_out.get("before", {}), "after": held_out.get("after", {})},
    }


@dataclass(frozen=True)
class Switch:
    """What `activate` or `rollback` did: the model now active, and the one before."""

    model: EmbeddingModel
    previous_id: int | None
    changed: bool


def activate(
    db: Database,
    ref: str,
    *,
    force: bool = False,
    actor: str = SYSTEM_ACTOR,
    key_id: uuid.UUID | None = None,
) -> Switch:
    """Make `NAME[:VERSION]` the active model. Refused while chunks lack its embeddings
    (searches would miss them) unless `force`. Cross-tenant: it counts every tenant's chunks.
    Recorded in the audit log as `actor`'s (and its API key's, `key_id`, when it has one)."""
    with tenancy.as_system(), db.write() as session:
        model = get_model_by_name(session, ref)
        switch = _switch(session, model, force=force)
        _audit(session, actor, key_id, "model.activate", switch, force=force)
        return switch


def rollback(
    db: Database,
    *,
    force: bool = False,
    actor: str = SYSTEM_ACTOR,
    key_id: uuid.UUID | None = None,
) -> Switch:
    """Activate the model that was active before the latest activation (see `activate`)."""
    with tenancy.as_system(), db.write() as session:
        last = store.embedding_models.last_activation(session)
        if last is None or last.previous_model_id is None:
            raise ConflictError("nothing to roll back to: no activation replaced another model")
        model = store.embedding_models.get_model(session, last.previous_model_id)
        assert model is not None  # the foreign key sets it null when the row goes
        switch = _switch(session, model, force=force)
        _audit(session, actor, key_id, "model.rollback", switch, force=force)
        return switch


def _audit(
    session: Session,
    actor: str,
    key_id: uuid.UUID | None,
    action: str,
    switch: Switch,
    *,
    force: bool,
) -> None:
    """Model changes concern every tenant: their entries have none (operators read them)."""
    store.audit.record(
        session,
        tenant_id=None,
        actor=actor,
        key_id=key_id,
        action=action,
        target=f"{switch.model.name}:{switch.model.version}",
        details={"previous_id": switch.previous_id, "changed": switch.changed, "force": force},
    )


def _switch(session: Session, model: EmbeddingModel, *, force: bool) -> Switch:
    if not force:
        missing = store.embedding_models.missing_embeddings(session, model.id)
        if missing:
            raise ConflictError(
                f"{model.name}:{model.version} has no embedding for {missing} chunks; run "
                f"`ragservice reembed --model {model.name}:{model.version}` first "
                '(or force it, `--force` or `"force": true` over the API, to serve it anyway, '
                "those chunks unseen by dense search)"
            )
    previous = store.embedding_models.activate_model(session, model.id)
    return Switch(model=model, previous_id=previous, changed=previous != model.id)


def drop_embeddings(
    db: Database, ref: str, *, actor: str = SYSTEM_ACTOR
) -> tuple[EmbeddingModel, int]:
    """Delete a model's chunk embeddings (every tenant's) and its HNSW index; refused for the
    active model."""
    with tenancy.as_system(), db.write() as session:
        model = get_model_by_name(session, ref)
        if model.active:
            raise ConflictError(
                f"{model.name}:{model.version} is the active model; activate another first"
            )
        deleted = store.embedding_models.drop_model_embeddings(session, model.id)
        store.audit.record(
            session,
            tenant_id=None,
            actor=actor,
            action="model.drop_embeddings",
            target=f"{model.name}:{model.version}",
            details={"deleted": deleted},
        )
        return model, deleted
