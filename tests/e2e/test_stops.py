"""A real `ragservice serve` stopped with SIGTERM while answers stream, on an embedded store.

The signal ends both open streams at once with their last event saying that the server is
stopping (`/v1/query`: an `error` event `ServiceStopping`; `/v1/chat/completions`: a chunk with
that `error`, then `[DONE]`), and the process and its embedded PostgreSQL are gone within
RAGSERVICE_SHUTDOWN_GRACE_SECONDS (10) and a little: 12 s. The test prints a `STOPS {json}`
line with the figures (pytest -s).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.e2e.embedded import embedded_env, holders, postmasters
from tests.e2e.test_faults import Server
from tests.upstream import FakeOpenAI
from tests.upstream import ok as answer

STOP_LIMIT_S = 12.0
WORDS = " ".join(f"word{n}" for n in range(40))


class Stream:
    """A streamed answer read line by line on a thread of its own."""

    def __init__(self, base: str, path: str, body: dict[str, Any]) -> None:
        self.lines: list[str] = []
        self.ended = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._read, args=(base + path, body), daemon=True)
        self._thread.start()

    def _read(self, url: str, body: dict[str, Any]) -> None:
        try:
            with httpx.stream("POST", url, json=body, timeout=60) as response:
                assert response.status_code == 200, response.read()
                for line in response.iter_lines():
                    if line:
                        self.lines.append(line)
        except BaseException as exc:  # shown by the assertions
            self.error = exc
        finally:
            self.ended.set()

    def wait_for(self, prefix: str) -> None:
        deadline = time.monotonic() + 60
        while not any(line.startswith(prefix) for line in list(self.lines)):
            assert not self.ended.is_set(), (self.error, self.lines)
            assert time.monotonic() < deadline, f"no {prefix!r} line: {self.lines}"
            time.sleep(0.02)

    def data(self) -> list[str]:
        return [line.removeprefix("data: ") for line in self.lines if line.startswith("data: ")]


def wait_gone(process: psutil.Process) -> None:
    """Until `process` has exited (a zombie counts: its parent, not this test, reaps it)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.02)
    raise AssertionError(f"process {process.pid} still runs")


def test_sigterm_ends_open_streams_and_stops_the_embedded_server_in_time(
    embedded_dir: Path,
) -> None:
    never = threading.Event()  # the upstream sends three words, then holds the rest
    with FakeOpenAI() as upstream:
        upstream.enqueue(*(answer(WORDS, hold=never, hold_after=3) for _ in range(2)))
        server = Server(embedded_env(embedded_dir, RAGSERVICE_INFERENCE_URL=upstream.base_url))
        try:
            server.start()
            assert httpx.post(f"{server.base}/v1/collections", json={"name": "notes"}).is_success
            question = "What do the notes say?"
            query = Stream(
                server.base,
                "/v1/query",
                {"question": question, "collections": ["notes"], "stream": True, "cache": False},
            )
            chat = Stream(
                server.base,
                "/v1/chat/completions",
                {
                    "model": "rag:notes",
                    "messages": [{"role": "user", "content": question}],
                    "stream": True,
                    "cache": False,
                },
            )
            query.wait_for("event: token")
            chat.wait_for('data: {"id"')
            [postmaster] = postmasters(embedded_dir)
            assert server.process is not None
            signalled = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            streams_ended = [stream.ended.wait(STOP_LIMIT_S) for stream in (query, chat)]
            streams_s = time.monotonic() - signalled
            server.process.wait(timeout=60)
            exited_s = time.monotonic() - signalled
            wait_gone(postmaster)
            postgres_s = time.monotonic() - signalled
        finally:
            never.set()
            server.kill()
    stderr = server.stderr()
    print(
        "STOPS "
        + json.dumps(
            {
                "scenario": "sigterm_with_two_streams",
                "streams_ended_s": round(streams_s, 2),
                "process_gone_s": round(exited_s, 2),
                "postgres_gone_s": round(postgres_s, 2),
            }
        )
    )
    assert streams_ended == [True, True], (query.lines, chat.lines)
    assert query.error is None and chat.error is None, (query.error, chat.error)
    assert query.lines[-2:] == ["event: error", query.lines[-1]]
    stopped = json.loads(query.lines[-1].removeprefix("data: "))
    assert (stopped["error"], stopped["request_id"] != "") == ("ServiceStopping", True)
    assert "stopping" in stopped["detail"]
    *_, last_chunk, done = chat.data()
    assert done == "[DONE]"
    assert json.loads(last_chunk)["error"] == "ServiceStopping"
    assert server.process.returncode == -signal.SIGTERM, stderr[-4000:]
    assert "Application shutdown complete" in stderr
    assert postgres_s <= STOP_LIMIT_S and exited_s <= STOP_LIMIT_S, stderr[-4000:]
    assert postmasters(embedded_dir) == [] and holders(embedded_dir) == []
