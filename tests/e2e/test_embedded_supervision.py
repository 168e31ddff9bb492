"""The embedded PostgreSQL killed from outside while its holders run: started again by them.

- `ragservice serve` under a loop of searches, its postmaster killed with SIGKILL (as the kernel's
  OOM killer does): searches fail while it is gone, readiness says 503, and within 15 s the
  service answers again by itself, with no failure after; health and metrics count the restart,
  and SIGTERM then stops the new server.
- Two supervising holders of one store: the postmaster killed, exactly one of them starts it
  again (the other adopts it), and the last one out stops it.

Each scenario prints a `FAULTS {json}` line with its figures (`pytest -s`).
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from tests.e2e.embedded import DEADLINE_S, embedded_env, postmasters, start_holder
from tests.e2e.test_faults import SearchLoop, Server, _load_manuals, report

pytestmark = pytest.mark.slow

RECOVERY_LIMIT_S = 15.0
SEARCH_THREADS = 4


def kill_postmaster(data_dir: Path) -> psutil.Process:
    [postmaster] = postmasters(data_dir)
    postmaster.kill()
    return postmaster


def new_postmaster(data_dir: Path, old: psutil.Process) -> psutil.Process:
    """The postmaster started after `old` was killed (fails if there is none within 15 s)."""
    deadline = time.monotonic() + RECOVERY_LIMIT_S
    while time.monotonic() < deadline:
        found = [p for p in postmasters(data_dir) if p.pid != old.pid and p.is_running()]
        if found:
            assert len(found) == 1, found
            return found[0]
        time.sleep(0.05)
    raise AssertionError("no new postmaster within 15 s")


@dataclass
class ReadinessLoop:
    """`GET /readyz` every 0.1 s: (when answered, status) until stopped."""

    client: httpx.Client
    seen: list[tuple[float, int]] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stopping.wait(0.1):
            try:
                status = self.client.get("/readyz").status_code
            except httpx.TransportError:
                status = 0
            self.seen.append((time.monotonic(), status))

    def first_ready_after(self, moment: float) -> float | None:
        down = [t for t, status in self.seen if t > moment and status != 200]
        if not down:
            return None
        ready = [t for t, status in self.seen if t > down[0] and status == 200]
        return ready[0] if ready else None


def wait_until_ready_again(client: httpx.Client, killed_at: float) -> float:
    """Seconds from the kill to `/readyz` answering 200 (fails past 15 s, with the health)."""
    while client.get("/readyz").status_code != 200:
        if time.monotonic() - killed_at > RECOVERY_LIMIT_S:
            raise AssertionError(f"not ready 15 s after: {client.get('/v1/admin/health').text}")
        time.sleep(0.05)
    return time.monotonic() - killed_at


def test_a_killed_postmaster_under_search_load_is_restarted_and_service_resumes(
    embedded_dir: Path,
) -> None:
    server = Server(
        embedded_env(
            embedded_dir,
            RAGSERVICE_RATE_LIMIT_PER_SECOND="0",
            RAGSERVICE_EMBEDDED_CHECK_SECONDS="0.5",
        )
    )
    try:
        server.start()
        with server.client() as client:
            _load_manuals(client)
            loop = SearchLoop(server.client())
            readiness = ReadinessLoop(server.client())
            threads = [
                threading.Thread(target=loop.run, name=f"search-{n}", daemon=True)
                for n in range(SEARCH_THREADS)
            ] + [threading.Thread(target=readiness.run, name="readyz", daemon=True)]
            for thread in threads:
                thread.start()
            try:
                loop.first_success_after(time.monotonic() - 1.0)  # the load runs
                killed_at = time.monotonic()
                old = kill_postmaster(embedded_dir)
                readiness_while_down = client.get("/readyz").status_code
                # A search may still succeed just after the kill, on a server process that has
                # not yet noticed its postmaster is gone (later on a busy machine): recovery
                # is the first success once the new postmaster runs, which it can only do
                # when every process of the old one has ended.
                new = new_postmaster(embedded_dir, old)
                recovered = loop.first_success_after(time.monotonic(), timeout=RECOVERY_LIMIT_S)
                # Keep searching a while after the recovery: every one must succeed.
                after = time.monotonic()
                while len([p for p in loop.probes if p.sent > after]) < 100:
                    time.sleep(0.05)
            finally:
                loop.stopping.set()
                readiness.stopping.set()
                for thread in threads:
                    thread.join(timeout=30)
                loop.client.close()
                readiness.client.close()
            wait_until_ready_again(client, killed_at)
            ready_at = readiness.first_ready_after(killed_at)
            health = client.get("/v1/admin/health").json()
            metrics = client.get("/metrics").text
        stderr = server.stop()  # SIGTERM: the process lets go of the new server too
    finally:
        server.kill()

    failed = [p for p in loop.probes if not p.ok]
    after_recovery = [p for p in failed if p.sent >= recovered.done]
    recovery_s = recovered.done - killed_at
    supervised = health["embedded_postgres"]
    report(
        "embedded_postmaster_killed",
        {
            "search_threads": SEARCH_THREADS,
            "searches": len(loop.probes),
            "failed_during_outage": len(failed) - len(after_recovery),
            "failed_after_recovery": len(after_recovery),
            "statuses": sorted({p.status for p in failed}),
            "recovery_s": round(recovery_s, 3),
            "supervisor_restart_s": supervised["last_restart_seconds"],
            "ready_again_s": None if ready_at is None else round(ready_at - killed_at, 3),
            "readyz_503_after_ready": len(
                [t for t, status in readiness.seen if ready_at and t > ready_at and status != 200]
            ),
        },
    )
    assert readiness_while_down == 503
    assert recovery_s < RECOVERY_LIMIT_S
    assert ready_at is not None and ready_at - killed_at < RECOVERY_LIMIT_S
    assert after_recovery == [], after_recovery[:5]
    assert {(p.status, p.error) for p in failed} <= {(503, "DatabaseUnavailable")}
    assert new.pid != old.pid
    assert health["checks"]["embedded_postgres"] is True
    assert (supervised["state"], supervised["exits"], supervised["restarts"]) == ("running", 1, 1)
    assert "ragservice_embedded_postgres_up 1.0" in metrics
    assert "ragservice_embedded_postgres_restarts_total 1.0" in metrics
    assert "is ready again" in stderr
    assert postmasters(embedded_dir) == []  # stopped with the server


SUPERVISED_HOLDER = """
import json, sys
from pathlib import Path
from ragservice.config import Settings
from ragservice.db.embedded import embedded_database_url
from ragservice.db.supervisor import supervise_embedded
data_dir = Path(sys.argv[1])
embedded_database_url(data_dir)
supervisor = supervise_embedded(Settings(data_dir=data_dir, embedded_check_seconds=0.2).database)
print("held", flush=True)
for line in sys.stdin:  # one status line per line the test sends; its end: a normal exit
    print(json.dumps(supervisor.status().describe()), flush=True)
supervisor.stop()
"""


def start_supervised_holder(data_dir: Path) -> subprocess.Popen[str]:
    """A process holding the embedded store and supervising it (no model, no API)."""
    return start_holder(data_dir, SUPERVISED_HOLDER)


def holder_status(process: subprocess.Popen[str]) -> dict[str, object]:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write("status\n")
    process.stdin.flush()
    status: dict[str, object] = json.loads(process.stdout.readline())
    return status


def test_two_supervising_holders_restart_it_once_and_the_last_out_stops_it(
    embedded_dir: Path,
) -> None:
    first = start_supervised_holder(embedded_dir)
    second = start_supervised_holder(embedded_dir)
    try:
        old = kill_postmaster(embedded_dir)
        new = new_postmaster(embedded_dir, old)
        deadline = time.monotonic() + RECOVERY_LIMIT_S
        while not all(holder_status(p)["state"] == "running" for p in (first, second)):
            assert time.monotonic() < deadline, "the holders never saw it running again"
            time.sleep(0.1)
        statuses = [holder_status(p) for p in (first, second)]
        assert sorted(int(str(s["restarts"])) for s in statuses) == [0, 1], statuses
        assert [s["exits"] for s in statuses] == [1, 1]
        assert postmasters(embedded_dir) == [new]
        first.communicate(timeout=DEADLINE_S)  # closes stdin: a normal exit
        assert postmasters(embedded_dir) == [new]  # the second still holds it
        second.communicate(timeout=DEADLINE_S)
    finally:
        for process in (first, second):
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.communicate()
    assert first.returncode == 0 and second.returncode == 0
    assert postmasters(embedded_dir) == []  # whichever restarted it, the last out stopped it
