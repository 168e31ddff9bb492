"""The sized settings in the embedded server's data directory, and the running values.

Before every start of the embedded server, `write_planned` writes the plan of `db.sizing`
into `pgdata/ragservice.conf`, which `postgresql.conf` includes (`include_if_exists`, added
once at its end). PostgreSQL reads it as it starts: no restart is ever needed for it. A process
that joins a server already running rewrites the file and asks for a reload when it changed;
settings read only at start (`shared_buffers`, ...) then wait for the server's next start, and
pg_settings says so (`pending_restart`). `ALTER SYSTEM` (postgresql.auto.conf, read after)
still wins over the file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragservice.db.sizing import Planned

SIZED_FILE = "ragservice.conf"
INCLUDE_LINE = (
    f"include_if_exists = '{SIZED_FILE}'\t# ragservice: sized for this machine, rewritten "
    "before every start (RAGSERVICE_EMBEDDED_PG_SETTINGS overrides)\n"
)
_HEADER = (
    "# Written by ragservice before every start of the embedded server (ragservice/db/sizing.py).\n"
    "# Edits here are lost: set RAGSERVICE_EMBEDDED_PG_SETTINGS instead; `ragservice db settings`\n"
    "# shows the running values.\n"
)
_LINE = re.compile(r"^(\w+) = '([^']*)'\s*# (\w+)$")


def write_planned(pgdata: Path, planned: Iterable[Planned]) -> bool:
    """Write `planned` as `pgdata/ragservice.conf` (and include it from postgresql.conf);
    True when the file changed."""
    _include_from_main_config(pgdata / "postgresql.conf")
    text = _HEADER + "".join(f"{p.name} = '{p.value}'\t# {p.origin}\n" for p in planned)
    path = pgdata / SIZED_FILE
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    partial = path.with_suffix(".conf.partial")
    partial.write_text(text)
    _same_owner_as(pgdata, partial)
    partial.replace(path)
    return True


def read_planned(pgdata: Path) -> dict[str, Planned]:
    """The settings of `pgdata/ragservice.conf` by name (none when it is missing)."""
    try:
        lines = (pgdata / SIZED_FILE).read_text().splitlines()
    except OSError:
        return {}
    found = (_LINE.match(line.replace("\t", " ")) for line in lines)
    return {m[1]: Planned(m[1], m[2], m[3]) for m in found if m is not None}


def _include_from_main_config(config: Path) -> None:
    text = config.read_text()
    if INCLUDE_LINE.split("\t", 1)[0] in text:
        return
    with config.open("a") as out:
        out.write(("" if text.endswith("\n") else "\n") + INCLUDE_LINE)


def _same_owner_as(reference: Path, path: Path) -> None:
    """As root, the file belongs to whom the data directory belongs (PostgreSQL's user)."""
    path.chmod(0o600)
    if os.geteuid() == 0:
        owner = reference.stat()
        os.chown(path, owner.st_uid, owner.st_gid)


# -- what runs ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Running:
    """One setting as the server runs it."""

    name: str
    value: str
    """As SHOW prints it (`6GB`)."""
    source: str
    """Where it came from: `sized` or `override` (the embedded server's file), `server
    default`, `ALTER SYSTEM`, or pg_settings' own word (`configuration file`, ...)."""
    pending_restart: bool


_RUNNING = (
    "SELECT name, current_setting(name), source, sourcefile, pending_restart "
    "FROM pg_settings WHERE name = ANY(%s)"
)


def running_settings(conn: Any, names: Iterable[str], pgdata: Path | None = None) -> list[Running]:
    """The running values of `names` (in that order) on the psycopg connection `conn`; with
    `pgdata` (the embedded server's), its sized file says whether they were sized or set."""
    planned = read_planned(pgdata) if pgdata is not None else {}
    order = {name: i for i, name in enumerate(names)}
    rows = sorted(conn.execute(_RUNNING, (list(order),)).fetchall(), key=lambda r: order[r[0]])
    return [
        Running(name, value, _source(name, source, sourcefile, planned), bool(pending))
        for name, value, source, sourcefile, pending in rows
    ]


def _source(name: str, source: str, sourcefile: str | None, planned: Mapping[str, Planned]) -> str:
    if source == "default":
        return "server default"
    if sourcefile and Path(sourcefile).name == SIZED_FILE and name in planned:
        return planned[name].origin
    if sourcefile and Path(sourcefile).name == "postgresql.auto.conf":
        return "ALTER SYSTEM"
    return str(source)


def reload_configuration(conn: Any) -> list[str]:
    """Have the server read its configuration files again (as a superuser); the settings of
    the files that wait for a restart."""
    conn.execute("SELECT pg_reload_conf()")
    # pg_file_settings reads the files now: a setting read only at start whose value there
    # differs from the running one "could not be applied".
    rows = conn.execute(
        "SELECT DISTINCT name FROM pg_file_settings WHERE NOT applied AND error IS NOT NULL"
    ).fetchall()
    return sorted(str(row[0]) for row in rows)


def server_wal_compressions(conn: Any) -> frozenset[str]:
    """The WAL compression methods the server on `conn` was built with (its enum values)."""
    row = conn.execute("SELECT enumvals FROM pg_settings WHERE name = 'wal_compression'").fetchone()
    values = set(row[0] or ()) if row is not None else set()
    return frozenset(values & {"pglz", "lz4", "zstd"} | {"pglz"})
