"""Stage timings in milliseconds, as the search and answer paths report them. A leaf.

Timings are a plain `dict[str, float]` (stage name → milliseconds) so they travel into
responses, the query log and metrics as they are. A stage that runs twice adds up: the answer
path embeds once for the cache lookup and may embed again for retrieval.

While tracing is on (`observability.tracing`), each `timed` block is also a span named after
its stage; off, `timed` checks one module-level name and nothing more.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

StageSpan = Callable[[str], AbstractContextManager[object]]

# Opens a span for a stage; set by `observability.tracing` while tracing is on, else None.
_stage_span: StageSpan | None = None


def set_stage_span(factory: StageSpan | None) -> None:
    """Have `timed` open a span per stage with `factory` (None: no spans)."""
    global _stage_span
    _stage_span = factory


def ms_since(started: float) -> float:
    """Milliseconds since `started`, a `time.perf_counter()` reading."""
    return (time.perf_counter() - started) * 1000


def add_ms(timings: dict[str, float], name: str, ms: float) -> None:
    timings[name] = timings.get(name, 0.0) + ms


@contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    """Adds the milliseconds the block took to `timings[name]`, also when it raises; a span
    named `name` around the block while tracing is on."""
    span = _stage_span
    started = time.perf_counter()
    try:
        if span is None:
            yield
        else:
            with span(name):
                yield
    finally:
        add_ms(timings, name, ms_since(started))


def with_total(timings: dict[str, float], started: float, *, digits: int = 3) -> dict[str, float]:
    """The stages rounded, plus `total`: the milliseconds since `started`."""
    rounded = {name: round(ms, digits) for name, ms in timings.items()}
    return rounded | {"total": round(ms_since(started), digits)}
