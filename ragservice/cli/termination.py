"""SIGTERM and SIGHUP end a command the way a normal exit does.

What `timeout`, systemd, Docker and Kubernetes send is SIGTERM, and Python's default for it (and
for SIGHUP) ends the process on the spot: no `finally` block, no exit handler. The embedded
PostgreSQL is released in an exit handler (the last process holding it stops it), so it would
keep running with nobody using it. Here SIGTERM raises SystemExit instead: clean-ups and exit
handlers run as after Ctrl-C. SIGHUP is passed on as SIGTERM, so that whatever handles SIGTERM
at the time handles it too (uvicorn's graceful shutdown, the job worker's stop, an ingest run
stopping after its batch in flight). Once every exit handler has run, the process ends by the
SIGTERM it got, so its parent sees the status it expects (143 in a shell, a clean stop for
systemd).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
from types import FrameType

_received: list[int] = []


def end_cleanly_on_termination() -> None:
    """Install the SIGTERM and SIGHUP handlers (call once, first thing, in the main thread)."""
    atexit.register(_end_by_the_signal)  # registered first, so it runs after every other one
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGHUP, _on_sighup)


def _on_sigterm(signum: int, _frame: FrameType | None) -> None:
    if _received:
        return  # already stopping: a repeated SIGTERM must not break off the clean-up
    _received.append(signum)
    raise SystemExit(128 + signum)


def _on_sighup(_signum: int, _frame: FrameType | None) -> None:
    signal.raise_signal(signal.SIGTERM)


def _end_by_the_signal() -> None:
    if not _received:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
