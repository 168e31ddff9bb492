"""The pure parts of read routing: settings, WAL positions, names, lag from the checker's memory
and the order in which replicas are tried."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sqlalchemy import create_engine

from ragservice.config import Settings, parse_replicas
from ragservice.db.routing import Health, ReadRouter, Replica, _ReplicaState, replica_names
from ragservice.db.scope import format_lsn, parse_lsn, parse_token
from ragservice.errors import BadRequestError


def test_replicas_setting_is_region_url_pairs() -> None:
    assert parse_replicas(
        " eu=postgresql://a/db , us=postgresql+psycopg://b/db,eu=postgres://c/db"
    ) == [
        ("eu", "postgresql://a/db"),
        ("us", "postgresql+psycopg://b/db"),
        ("eu", "postgres://c/db"),
    ]
    assert parse_replicas("") == []
    assert Settings(replicas="eu=postgresql://a/db").replication.replica_urls() == [
        ("eu", "postgresql://a/db")
    ]


@pytest.mark.parametrize(
    "value", ["postgresql://a/db", "=postgresql://a/db", "eu=", "eu=mysql://a/db"]
)
def test_a_malformed_replicas_setting_is_refused_at_start(value: str) -> None:
    with pytest.raises(ValidationError, match="RAGSERVICE_REPLICAS"):
        Settings(replicas=value)


def test_wal_positions_round_trip() -> None:
    assert parse_lsn("0/0") == 0
    assert parse_lsn("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert format_lsn(parse_lsn("16/B374D848")) == "16/B374D848"
    with pytest.raises(ValueError):
        parse_lsn("16-B374D848")
    with pytest.raises(BadRequestError, match="x-consistency-token"):
        parse_token("'; DROP TABLE documents; --")


def test_replica_names_count_within_a_region() -> None:
    assert replica_names(["eu", "eu", "us"]) == ["eu-1", "eu-2", "us-1"]


def _router(regions: list[str], *, max_lag: float = 1.0) -> ReadRouter:
    engine = create_engine("postgresql+psycopg://u@127.0.0.1:1/none")  # never connected to
    replicas = [
        Replica(name, region, engine)
        for name, region in zip(replica_names(regions), regions, strict=True)
    ]
    return ReadRouter(
        engine,
        replicas,
        region="eu",
        max_lag_seconds=max_lag,
        wait_seconds=0.1,
        check_seconds=1.0,
        check_timeout=1.0,
    )


def _state(replay_lsn: int, clock_lag: float | None = None) -> _ReplicaState:
    return _ReplicaState(in_recovery=True, replay_lsn=replay_lsn, paused=False, clock_lag=clock_lag)


def test_lag_is_the_time_since_the_primary_passed_what_the_replica_replayed() -> None:
    router = _router(["eu"])
    router._checks.history.extend([(100.0, 10), (101.0, 20), (102.0, 30)])
    assert router._lag_seconds(_state(30), now=105.0) == 0.0  # replayed everything seen
    assert router._lag_seconds(_state(40), now=105.0) == 0.0  # ahead of the last check
    assert router._lag_seconds(_state(25), now=105.0) == 3.0  # the primary passed 25 at 102
    assert router._lag_seconds(_state(10), now=105.0) == 4.0  # ... and 10 at 101
    # Behind everything the checker remembers: the replica's own clock, or at least that long.
    assert router._lag_seconds(_state(5, clock_lag=60.0), now=105.0) == 60.0
    assert router._lag_seconds(_state(5, clock_lag=None), now=105.0) == 5.0


def test_an_idle_primary_does_not_make_a_current_replica_lag() -> None:
    router = _router(["eu"])
    router._checks.history.append((0.0, 10))  # no write for an hour
    assert router._lag_seconds(_state(10, clock_lag=3600.0), now=3600.0) == 0.0


def test_candidates_are_local_first_and_only_those_that_serve() -> None:
    router = _router(["us", "eu", "eu", "ap"], max_lag=1.0)
    us, eu1, eu2, ap = router.replicas
    for replica in router.replicas:
        replica.health = Health(healthy=True, lag_seconds=0.0, lsn=100)
    ap.health = Health(healthy=True, lag_seconds=5.0, lsn=90)  # too far behind
    orders = {tuple(r.name for r in router._candidates()) for _ in range(50)}
    assert orders == {("eu-1", "eu-2", "us-1"), ("eu-2", "eu-1", "us-1")}  # local ones shared
    eu1.health = eu2.health = Health(healthy=False, error="down")
    assert [r.name for r in router._candidates()] == ["us-1"]
    us.health = Health(healthy=False, error="down")
    assert router._candidates() == []  # the primary then
    assert us.known_replayed(100) is False and ap.known_replayed(90) is True
