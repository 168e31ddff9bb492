"""Whether this server is ready, and the details an admin reads (`/readyz`,
`GET /v1/admin/health`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ragservice.db import Database, migrate
from ragservice.db.supervisor import EmbeddedSupervisor
from ragservice.embedding.registry import ModelRegistry


@dataclass(frozen=True)
class Readiness:
    ready: bool
    details: dict[str, Any]
    """The checks, the model, the nodes and the embedded server's supervision, as JSON."""


def readiness(
    db: Database, models: ModelRegistry, supervisor: EmbeddedSupervisor | None
) -> Readiness:
    """Ready when the primary is reachable, the schema current, the model loaded, and the
    embedded PostgreSQL running when this process supervises it (`supervisor`). A replica that
    is down does not make the server unready."""
    model = models.current()
    checks = {"database": False, "migrations": False, "model": model.embedder.dimension > 0}
    try:
        checks["migrations"] = migrate.is_current(db.write_engine)
        checks["database"] = True
    except Exception:  # reported as not ready, never as a 500
        pass
    supervised = None if supervisor is None else supervisor.status()
    if supervised is not None:
        checks["embedded_postgres"] = supervised.up
    ready = all(checks.values())
    details: dict[str, Any] = {"ready": ready, "checks": checks, "model": model.describe()}
    if db.router is not None:
        details["nodes"] = db.router.status()
    if supervised is not None:
        details["embedded_postgres"] = supervised.describe()
    return Readiness(ready, details)
