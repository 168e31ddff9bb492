"""A Citus cluster of the embedded PostgreSQL for the tests that need one: a coordinator and two
workers on loopback (`ragservice.dev.citus.CitusCluster`), started once per test module.

The session installs Citus into the embedded PostgreSQL (`tests.citus_template.install_citus`:
the installer named by `CITUS_INSTALLER`). Where there is no installer, or it fails, the
cluster tests are skipped with the reason.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragservice.dev.citus import CitusCluster
from tests.citus_template import install_citus


@pytest.fixture(scope="session")
def citus_available() -> None:
    """Citus installed in the embedded PostgreSQL, or the test skipped with the reason."""
    problem = install_citus()
    if problem is not None:
        pytest.skip(problem)


@pytest.fixture(scope="module")
def citus_cluster(citus_available: None) -> Iterator[CitusCluster]:
    """A coordinator and two workers, the store migrated on the coordinator with the service's
    login; one per test module, which may add workers and distribute the store (the modules
    run in any order, on any pytest-xdist worker). A short path under /tmp (Unix socket paths
    are limited to about 107 bytes); at the end the nodes stop and the folder is deleted."""
    cluster = CitusCluster(Path(tempfile.mkdtemp(prefix="ragservice-citus-")), workers=2)
    try:
        cluster.start()
        cluster.prepare_store()
        yield cluster
    finally:
        cluster.destroy()
        cluster.root.parent.rmdir()
