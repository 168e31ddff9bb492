"""Background rounds: a function called on a thread of its own every so many seconds. A leaf."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Periodic:
    """Calls `task` every `interval` seconds on a daemon thread named `name` until `stop()`;
    the first call at once with `at_start`, else after one interval. A round that raises is
    logged (`what` failed) and the next round tries again."""

    def __init__(
        self,
        name: str,
        task: Callable[[], object],
        interval: float,
        *,
        what: str,
        at_start: bool = False,
    ) -> None:
        self._task = task
        self._interval = interval
        self._what = what
        self._at_start = at_start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        if not self._at_start and self._stop.wait(self._interval):
            return
        while True:
            try:
                self._task()
            except Exception:
                log.warning("%s failed; the next round tries again", self._what, exc_info=True)
            if self._stop.wait(self._interval):
                return
