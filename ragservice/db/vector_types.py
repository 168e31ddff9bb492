"""pgvector's types on an engine's connections, described once and copied to each connection.

`pgvector.psycopg.register_vector` looks the four types up (four queries) and makes new dumper
classes on every call. Classes made at run time are never freed: psycopg keeps every dumper and
loader class it has seen in a class-level map (`AdaptersMap._optimised`), and subclasses of its
C types are not collected either (psycopg issue 647). Called on each new connection, it cost
about 22 KB a connection for the life of the process; a pool that overflows under load opens
connections all the time, which made the API server's memory grow with its traffic.

`VectorTypes` registers pgvector's adapters once, on a template copied from the engine's first
connection, and then hands that template to every later connection as psycopg's `context`
(the way SQLAlchemy hands its own adapters): a new connection starts with the types known, at
no query and no new class. The template holds the first connection's type OIDs, which stay
those of the database's extension (an engine talks to one database; a standby has the
primary's catalog).
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from pgvector.psycopg.bit import register_bit_info
from pgvector.psycopg.halfvec import register_halfvec_info
from pgvector.psycopg.sparsevec import register_sparsevec_info
from pgvector.psycopg.vector import register_vector_info
from psycopg.adapt import AdaptersMap
from psycopg.types import TypeInfo
from sqlalchemy import Engine, event

# The types `register_vector` knows, in its order; the last two come with pgvector 0.7.
_REQUIRED = ("vector", "bit")
_OPTIONAL = ("halfvec", "sparsevec")


class VectorTypes:
    """The pgvector adapters of one engine: `prepare` sends the template to a new connection
    (SQLAlchemy's `do_connect`), `register` makes sure a new connection knows the types."""

    def __init__(self) -> None:
        self._template: AdaptersMap | None = None
        self._lock = threading.Lock()

    def install(self, engine: Engine) -> None:
        """Hand the template to each connection `engine` opens, once there is one."""
        event.listen(engine, "do_connect", self._prepare)

    def _prepare(
        self, _dialect: Any, _record: Any, _cargs: list[Any], cparams: dict[str, Any]
    ) -> None:
        if self._template is not None:
            cparams["context"] = self._template

    def register(self, connection: psycopg.Connection[Any]) -> None:
        """The types on `connection`: known already when it was made from the template; else
        looked up, registered, and kept as the template for the connections to come."""
        if connection.adapters.types.get("vector") is not None:
            return
        infos = _fetch(connection)
        with self._lock:
            if self._template is None:
                template = AdaptersMap(connection.adapters)
                _register(template, infos)
                self._template = template
        _register(connection, infos)

    @property
    def ready(self) -> bool:
        """Whether new connections get the template (tests)."""
        return self._template is not None


def _fetch(connection: psycopg.Connection[Any]) -> dict[str, TypeInfo | None]:
    infos = {name: TypeInfo.fetch(connection, name) for name in (*_REQUIRED, *_OPTIONAL)}
    if infos["vector"] is None:
        raise psycopg.ProgrammingError("vector type not found in the database")
    return infos


def _register(context: Any, infos: dict[str, TypeInfo | None]) -> None:
    """pgvector's own registrations (what `register_vector` does), on a connection or a map."""
    register_vector_info(context, infos["vector"])
    register_bit_info(context, infos["bit"])
    if infos["halfvec"] is not None:
        register_halfvec_info(context, infos["halfvec"])
    if infos["sparsevec"] is not None:
        register_sparsevec_info(context, infos["sparsevec"])
