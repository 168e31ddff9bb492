"""A Citus cluster of the embedded PostgreSQL for the tests that need one: a coordinator and two
workers on loopback (`ragservice.dev.citus.CitusCluster`), started once per session.

Citus is AGPL and no Debian or PyPI package carries it for PostgreSQL 18, so the project ships
none: the session installs it into the embedded PostgreSQL with the installer named by
`CITUS_INSTALLER` (default: `shared/citus/install` beside the checkout; it takes the
server's `pg_config` and is idempotent). Where there is no installer, or it fails, the cluster
tests are skipped with the reason.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragservice.db.embedded import postgres_bin_dir
from ragservice.dev.citus import CitusCluster, citus_installed

INSTALLER_VARIABLE = "CITUS_INSTALLER"
_DEFAULT_INSTALLER = Path(__file__).resolve().parents[2].parent / "shared" / "citus" / "install"


def _install_citus() -> str | None:
    """Install Citus into the embedded PostgreSQL when it is not there: None when it is
    installed, else why not."""
    if citus_installed():
        return None
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


@pytest.fixture(scope="session")
def citus_available() -> None:
    """Citus installed in the embedded PostgreSQL, or the test skipped with the reason."""
    problem = _install_citus()
    if problem is not None:
        pytest.skip(problem)


@pytest.fixture(scope="session")
def citus_cluster(citus_available: None) -> Iterator[CitusCluster]:
    """A coordinator and two workers, the store migrated on the coordinator with the service's
    login. A short path under /tmp (Unix socket paths are limited to about 107 bytes); at the
    end the nodes stop and the folder is deleted."""
    cluster = CitusCluster(Path(tempfile.mkdtemp(prefix="ragservice-citus-")), workers=2)
    try:
        cluster.start()
        cluster.prepare_store()
        yield cluster
    finally:
        cluster.destroy()
        cluster.root.parent.rmdir()
