"""The FastAPI application. Routes stay thin: parse, call the store or pipeline, shape the reply."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ragservice.config import Settings, get_settings
from ragservice.db import migrate
from ragservice.embedding import SentenceTransformerEmbedder
from ragservice.errors import RagServiceError
from ragservice.runtime import Runtime, open_runtime


def create_app(
    settings: Settings | None = None, *, embedder: SentenceTransformerEmbedder | None = None
) -> FastAPI:
    """Build the app; the database and the model open in the lifespan, not at import.

    `embedder` shares an already loaded model (tests); by default the configured one loads.
    """
    resolved = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = open_runtime(resolved, embedder=embedder)
        app.state.runtime = runtime
        try:
            yield
        finally:
            runtime.close()

    app = FastAPI(title="ragservice", version="0.1.0", lifespan=lifespan)
    app.add_exception_handler(RagServiceError, _service_error)  # type: ignore[arg-type]

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    def readyz(request: Request) -> JSONResponse:
        """Readiness: database reachable, schema current, model loaded."""
        runtime: Runtime = request.app.state.runtime
        checks = {"database": False, "migrations": False, "model": runtime.embedder.dimension > 0}
        try:
            checks["migrations"] = migrate.is_current(runtime.db.write_engine)
            checks["database"] = True
        except Exception:  # reported as not ready, never as a 500
            pass
        ready = all(checks.values())
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)

    return app


async def _service_error(_request: Request, exc: RagServiceError) -> JSONResponse:
    return JSONResponse(
        {"error": type(exc).__name__, "detail": str(exc)}, status_code=exc.status_code
    )
