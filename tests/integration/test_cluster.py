"""Real streaming replication: the dev cluster's standbys follow the embedded primary.

Every test writes to one table of this module's own (a unique name, dropped at the end) and
waits for what it wrote with a timeout, so the tests pass in any order on the shared cluster.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import psycopg
import pytest
from psycopg import sql

from ragservice.dev.cluster import DevCluster, Standby, libpq_url

REPLICATION_TIMEOUT_S = 15.0


def _connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(libpq_url(url), autocommit=True)


def _wait_for(condition: Callable[[], bool], timeout: float = REPLICATION_TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _insert(cluster: DevCluster, table: sql.Identifier) -> str:
    """Write a new row on the primary; return its value."""
    value = uuid.uuid4().hex
    with _connect(cluster.primary_url) as conn:
        conn.execute(sql.SQL("INSERT INTO {} VALUES (%s)").format(table), (value,))
    return value


def _has_row(standby: Standby, table: sql.Identifier, value: str) -> bool:
    with _connect(standby.url) as conn:
        query = sql.SQL("SELECT 1 FROM {} WHERE value = %s").format(table)
        return conn.execute(query, (value,)).fetchone() is not None


def _table_exists(standby: Standby, table: sql.Identifier) -> bool:
    with _connect(standby.url) as conn:
        row = conn.execute("SELECT to_regclass(%s)", (table.as_string(conn),)).fetchone()
        return row is not None and row[0] is not None


def _primary_lsn(cluster: DevCluster) -> str:
    with _connect(cluster.primary_url) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def _received(standby: Standby, lsn: str) -> bool:
    """Whether the standby has received (not necessarily replayed) the WAL up to `lsn`."""
    with _connect(standby.url) as conn:
        row = conn.execute("SELECT pg_last_wal_receive_lsn() >= %s::pg_lsn", (lsn,)).fetchone()
    return row is not None and bool(row[0])


def _replay_paused(standby: Standby) -> bool:
    with _connect(standby.url) as conn:
        row = conn.execute("SELECT pg_get_wal_replay_pause_state()").fetchone()
    return row is not None and row[0] == "paused"


def _streaming_to(cluster: DevCluster) -> set[str]:
    with _connect(cluster.primary_url) as conn:
        rows = conn.execute(
            "SELECT application_name FROM pg_stat_replication WHERE state = 'streaming'"
        ).fetchall()
    return {row[0] for row in rows}


@pytest.fixture(scope="module")
def table(dev_cluster: DevCluster) -> Iterator[sql.Identifier]:
    """A table of this module's own on the primary (and, once replayed, on every standby),
    dropped at the end."""
    name = sql.Identifier(f"cluster_test_{uuid.uuid4().hex[:12]}")
    with _connect(dev_cluster.primary_url) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (value text PRIMARY KEY)").format(name))
    for standby in dev_cluster.standbys:
        assert _wait_for(partial(_table_exists, standby, name)), standby.name
    yield name
    with _connect(dev_cluster.primary_url) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(name))


def test_cluster_has_one_standby_per_region(dev_cluster: DevCluster) -> None:
    assert [(s.region, s.name) for s in dev_cluster.standbys] == [("eu", "eu-1"), ("us", "us-1")]
    assert len({s.port for s in dev_cluster.standbys}) == 2
    setting = dev_cluster.replicas_setting()
    assert setting == ",".join(f"{s.region}={s.url}" for s in dev_cluster.standbys)
    assert all(s.is_running() for s in dev_cluster.standbys)


def test_table_and_row_reach_every_standby(dev_cluster: DevCluster, table: sql.Identifier) -> None:
    value = _insert(dev_cluster, table)
    for standby in dev_cluster.standbys:
        assert _wait_for(partial(_has_row, standby, table, value)), standby.name


def test_standbys_are_in_recovery_and_the_primary_is_not(dev_cluster: DevCluster) -> None:
    for standby in dev_cluster.standbys:
        with _connect(standby.url) as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                conn.execute("CREATE TABLE must_fail_on_a_standby (x int)")
    with _connect(dev_cluster.primary_url) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)


def test_primary_streams_to_both_standbys_through_their_slots(dev_cluster: DevCluster) -> None:
    names = {standby.name for standby in dev_cluster.standbys}
    assert _wait_for(lambda: _streaming_to(dev_cluster) >= names), _streaming_to(dev_cluster)
    with _connect(dev_cluster.primary_url) as conn:
        slots = dict(
            conn.execute(
                "SELECT slot_name, slot_type FROM pg_replication_slots WHERE slot_name = ANY(%s)",
                ([standby.slot_name for standby in dev_cluster.standbys],),
            ).fetchall()
        )
    assert slots == {standby.slot_name: "physical" for standby in dev_cluster.standbys}


def test_stopped_standby_catches_up_after_restart(
    dev_cluster: DevCluster, table: sql.Identifier
) -> None:
    standby = dev_cluster.standbys[0]
    standby.stop()
    try:
        assert not standby.is_running()
        written = [_insert(dev_cluster, table) for _ in range(3)]
    finally:
        standby.start()
    assert standby.is_running()
    assert _wait_for(lambda: all(_has_row(standby, table, value) for value in written))


def test_paused_replay_holds_rows_back_until_resumed(
    dev_cluster: DevCluster, table: sql.Identifier
) -> None:
    standby = dev_cluster.standbys[-1]
    with _connect(standby.url) as conn:
        conn.execute("SELECT pg_wal_replay_pause()")
    try:
        assert _wait_for(lambda: _replay_paused(standby))
        value = _insert(dev_cluster, table)
        written_up_to = _primary_lsn(dev_cluster)
        # The WAL with the row has arrived: only the paused replay keeps it out of sight.
        assert _wait_for(lambda: _received(standby, written_up_to))
        assert not _has_row(standby, table, value)
    finally:
        with _connect(standby.url) as conn:
            conn.execute("SELECT pg_wal_replay_resume()")
    assert _wait_for(lambda: _has_row(standby, table, value))
