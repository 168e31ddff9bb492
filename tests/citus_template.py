"""Citus for the tests: installing it into the embedded PostgreSQL, and a cluster whose
distributed store is the template of every test's database.

Citus is AGPL and no Debian or PyPI package carries it for PostgreSQL 18, so the project ships
none: it is installed with the installer named by `CITUS_INSTALLER` (default:
`shared/citus/install` beside the checkout; it takes the server's `pg_config` and is
idempotent).

With `CITUS_TEST_CLUSTER=1` the whole session runs on a Citus cluster instead of one server
(`tests/conftest.py`): a coordinator and two workers whose `ragservice` database is migrated
and distributed once, then frozen (no connections) as the template. Each test's database is a
clone of it made on every node under the same name: Citus's metadata names the workers by host
and port and connects to the database of the same name on each, so the clones form a
distributed store of their own (shards, placements and all), ready in well under a second.
`make test-citus-leaks` runs the leak suites of one server so.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import tempfile
from pathlib import Path

import psycopg
from psycopg import sql

from ragservice.db import distribution
from ragservice.db.embedded import DATABASE_NAME, postgres_bin_dir
from ragservice.dev.citus import LOOPBACK, CitusCluster, citus_installed

INSTALLER_VARIABLE = "CITUS_INSTALLER"
CLUSTER_VARIABLE = "CITUS_TEST_CLUSTER"
_DEFAULT_INSTALLER = Path(__file__).resolve().parents[1].parent / "shared" / "citus" / "install"


def on_citus() -> bool:
    """Whether this session runs every database test on a Citus cluster."""
    return os.environ.get(CLUSTER_VARIABLE) == "1"


def install_citus() -> str | None:
    """Install Citus into the embedded PostgreSQL when it is not there: None when it is
    installed, else why not."""
    if citus_installed():
        return None
    # One installer at a time: pytest-xdist's workers may all need Citus at once.
    lock_path = postgres_bin_dir().parent / ".citus-install.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if citus_installed():  # another worker installed it meanwhile
            return None
        return _run_installer()


def _run_installer() -> str | None:
    installer = Path(os.environ.get(INSTALLER_VARIABLE) or _DEFAULT_INSTALLER)
    if not installer.is_file():
        return (
            f"Citus is not installed in the embedded PostgreSQL and there is no installer at "
            f"{installer} (set {INSTALLER_VARIABLE})"
        )
    result = subprocess.run(
        [str(installer), str(postgres_bin_dir() / "pg_config")],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if result.returncode != 0 or not citus_installed():
        output = (result.stdout + result.stderr).strip()[-2000:]
        return f"installing Citus with {installer} failed: {output}"
    return None


def template_cluster() -> CitusCluster:
    """A started cluster whose `ragservice` database is migrated, distributed and frozen as
    the template (see above)."""
    cluster = CitusCluster(Path(tempfile.mkdtemp(prefix="ragservice-test-citus-")), workers=2)
    try:
        cluster.start()
        cluster.prepare_store()
        with cluster.coordinator_connection() as conn:
            distribution.distribute(conn)
        for url in admin_urls(cluster):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(
                        sql.Identifier(DATABASE_NAME)
                    )
                )
                # Citus's maintenance daemon too: a template must have no session.
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (DATABASE_NAME,),
                )
    except BaseException:
        cluster.destroy()
        raise
    return cluster


def admin_urls(cluster: CitusCluster) -> list[str]:
    """libpq URLs of every node's maintenance database, the coordinator first."""
    return [f"postgresql://postgres@{LOOPBACK}:{node.port}/postgres" for node in cluster.nodes]
