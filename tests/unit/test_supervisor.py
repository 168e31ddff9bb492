"""The embedded PostgreSQL's supervisor: its back-off, and its rounds over a fake server (the
real one is stopped and restarted in tests/e2e/test_embedded_supervision.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from ragservice.db.supervisor import EmbeddedSupervisor, Postmaster, RestartBackoff
from ragservice.metrics import EmbeddedCollector


def test_the_first_attempt_is_at_once_then_the_waits_double_up_to_the_maximum() -> None:
    backoff = RestartBackoff(base=1.0, maximum=10.0, stable=60.0)
    assert backoff.due_in(0.0) == 0.0
    waits = []
    now = 0.0
    for _ in range(7):
        now += backoff.due_in(now)
        backoff.attempted(now)
        waits.append(backoff.delay())
    assert waits == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    assert backoff.due_in(now + 3.0) == 7.0


def test_a_huge_streak_stays_at_the_maximum() -> None:
    backoff = RestartBackoff(base=1.0, maximum=30.0, streak=10_000)
    assert backoff.delay() == 30.0


def test_the_streak_is_forgotten_only_after_the_server_stayed_up() -> None:
    backoff = RestartBackoff(base=1.0, maximum=30.0, stable=60.0)
    backoff.attempted(0.0)
    backoff.attempted(1.0)
    backoff.up(2.0)
    backoff.up(50.0)  # up 48 s: not yet
    assert backoff.streak == 2
    backoff.down()  # died again: the time up starts over
    backoff.up(70.0)
    backoff.up(100.0)
    assert backoff.streak == 2
    backoff.up(130.0)  # up 60 s
    assert backoff.streak == 0
    assert backoff.due_in(130.0) == 0.0


@dataclass
class FakeServer:
    """A postmaster the test kills and whose restarts fail `failures` times first."""

    pid: int | None = 100
    ready: bool = True
    failures: int = 0
    dies: int = 0
    attempts: list[float] = field(default_factory=list)
    clock: list[float] = field(default_factory=lambda: [0.0])

    def probe(self) -> Postmaster:
        return Postmaster(self.pid, ready=self.ready)

    def restart(self) -> bool:
        self.attempts.append(self.clock[0])
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("pre-existing shared memory block is still in use")
        if self.dies > 0:  # starts, then dies before anyone sees it up
            self.dies -= 1
            return True
        self.pid = 200 + len(self.attempts)
        return True


def supervised(server: FakeServer, resets: list[int]) -> EmbeddedSupervisor:
    return EmbeddedSupervisor(
        Path("unused"),
        backoff=RestartBackoff(base=1.0, maximum=4.0, stable=60.0),
        on_restart=lambda: resets.append(1),
        probe=server.probe,
        restart=server.restart,
        clock=lambda: server.clock[0],
    )


def advance(server: FakeServer, supervisor: EmbeddedSupervisor, seconds: float) -> None:
    """Rounds every 0.5 s for `seconds`."""
    for _ in range(int(seconds / 0.5)):
        server.clock[0] += 0.5
        supervisor.check_once()


def test_an_exit_is_restarted_at_once_and_the_pools_reset() -> None:
    server, resets = FakeServer(), []
    supervisor = supervised(server, resets)
    supervisor.check_once()
    assert supervisor.status().up and supervisor.status().pid == 100
    server.pid = None
    advance(server, supervisor, 0.5)
    status = supervisor.status()
    assert server.attempts == [0.5]
    assert (status.state, status.pid, status.exits, status.restarts) == ("running", 201, 1, 1)
    assert status.last_restart_seconds == 0.0
    assert resets == [1]


def test_failed_starts_back_off_and_are_reported() -> None:
    server, resets = FakeServer(failures=3), []
    supervisor = supervised(server, resets)
    supervisor.check_once()
    server.pid = None
    advance(server, supervisor, 0.5)
    status = supervisor.status()
    assert (status.state, status.restart_failures, status.next_attempt_in) == ("down", 1, 1.0)
    assert "shared memory" in (status.last_error or "")
    advance(server, supervisor, 10.0)
    # at once, then after 1, 2 and 4 seconds; the fourth works
    assert server.attempts == [0.5, 1.5, 3.5, 7.5]
    status = supervisor.status()
    assert (status.state, status.exits, status.restarts, status.restart_failures) == (
        "running",
        1,
        1,
        3,
    )
    assert status.last_error is None and status.last_restart_seconds == 7.0
    assert resets == [1]


def test_a_server_that_keeps_dying_backs_off_until_it_stays_up() -> None:
    server, resets = FakeServer(dies=3), []
    supervisor = supervised(server, resets)
    supervisor.check_once()
    server.pid = None
    advance(server, supervisor, 10.0)
    assert server.attempts == [0.5, 1.5, 3.5, 7.5]
    assert supervisor.status().restarts == 4 and supervisor.status().up
    advance(server, supervisor, 61.0)  # stays up: the next exit is restarted at once again
    server.pid = None
    before = server.clock[0]
    advance(server, supervisor, 0.5)
    assert server.attempts[-1] == before + 0.5
    assert supervisor.status().exits == 2


def test_a_server_started_by_another_holder_is_adopted_not_restarted() -> None:
    server, resets = FakeServer(), []
    supervisor = supervised(server, resets)
    supervisor.check_once()
    # Between two looks, another holder saw it gone and started it: in crash recovery now.
    server.pid, server.ready = 300, False
    advance(server, supervisor, 0.5)
    assert supervisor.status().state == "starting" and not supervisor.status().up
    server.ready = True
    advance(server, supervisor, 0.5)
    status = supervisor.status()
    assert (status.state, status.pid, status.exits, status.restarts) == ("running", 300, 1, 0)
    assert status.last_restart_seconds == 0.5
    assert server.attempts == []


def test_a_stopped_supervisor_restarts_nothing() -> None:
    server, resets = FakeServer(), []
    supervisor = supervised(server, resets)
    supervisor.start()
    supervisor.stop()
    server.pid = None
    advance(server, supervisor, 2.0)
    assert server.attempts == [] and supervisor.status().state == "stopped"


def test_the_metrics_report_the_supervisors_status() -> None:
    server, resets = FakeServer(failures=1), []
    supervisor = supervised(server, resets)
    supervisor.check_once()
    server.pid = None
    advance(server, supervisor, 0.5)
    registry = CollectorRegistry()
    registry.register(EmbeddedCollector(lambda: supervisor.status().describe()))
    text = generate_latest(registry).decode()
    assert "ragservice_embedded_postgres_up 0.0" in text
    assert "ragservice_embedded_postgres_exits_total 1.0" in text
    assert "ragservice_embedded_postgres_restart_failures_total 1.0" in text
    assert "ragservice_embedded_postgres_backoff_seconds 1.0" in text
    advance(server, supervisor, 1.0)
    text = generate_latest(registry).decode()
    assert "ragservice_embedded_postgres_up 1.0" in text
    assert "ragservice_embedded_postgres_restarts_total 1.0" in text
