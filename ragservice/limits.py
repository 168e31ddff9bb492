"""Limits shared across the service. A leaf.

Fixed limits on input shape, shared by the API, the filters and the loaders. They are not
settings: each protects something that has a hard limit of its own. A B-tree index entry holds
about 2.7 kB, so a longer external id fails its whole write batch; JSON nested thousands deep
overflows Python's recursion limit (and PostgreSQL's stack) on the way; a statement takes at
most 65,535 parameters; PostgreSQL text holds no NUL character and UTF-8 no lone surrogate.

`FairSlots`: a bounded number of things at once (upstream calls, embedding computations),
shared fairly between owners (tenants) instead of first come, first served.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

MAX_EXTERNAL_ID_BYTES = 1024
"""The longest external id (or uploaded file name), in UTF-8 bytes."""

MAX_JSON_DEPTH = 32
"""The deepest nesting of arrays and objects in metadata and filters."""

MAX_COLLECTIONS_PER_REQUEST = 1000
"""The most collection names one search or answer may list (`rag:a,b,...` in chat too)."""

MAX_INT4 = 2**31 - 1
"""The largest PostgreSQL `integer` (a model version, a TTL)."""

MAX_INT8 = 2**63 - 1
"""The largest PostgreSQL `bigint` (an audit entry's id)."""

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored or encoded (a NUL character, a lone UTF-16 surrogate such
    as JSON's `"\\ud800"`), or None when it can. The message never quotes the value."""
    found = _UNSTORABLE.search(value)
    if found is None:
        return None
    if found.group() == "\x00":
        return "must not contain NUL characters (U+0000)"
    return (
        f"must not contain a lone UTF-16 surrogate (U+{ord(found.group()):04X} at character "
        f"{found.start()}); send valid Unicode"
    )


def storable_text(value: str) -> str:
    """`value` with every NUL and lone surrogate replaced by U+FFFD: what can always be stored."""
    return _UNSTORABLE.sub("\ufffd", value)


def storable_json(value: object) -> object:
    """A JSON value with `storable_text` applied to every string in it, keys included."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, Mapping):
        return {storable_text(str(k)): storable_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable_json(item) for item in value]
    return value


def json_text_problem(value: object) -> str | None:
    """`text_problem` of the first string (key or value) in a JSON value that has one;
    iterative, so it costs no more than the value's size whatever its depth."""
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            strings: list[object] = [item]
        elif isinstance(item, Mapping):
            strings = list(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
            continue
        else:
            continue
        for text in strings:
            problem = text_problem(text) if isinstance(text, str) else None
            if problem:
                return problem
    return None


def json_depth(value: object) -> int:
    """How deep `value` nests lists and mappings (a scalar: 0); iterative, so any depth is fine.

    Stops counting once past `MAX_JSON_DEPTH`, so a hostile value costs no more than a fine one.
    """
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack and deepest <= MAX_JSON_DEPTH:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: list[object] = list(item.values())
        elif isinstance(item, list | tuple):
            children = list(item)
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def too_deep(value: object) -> bool:
    return json_depth(value) > MAX_JSON_DEPTH


def external_id_too_long(external_id: str) -> bool:
    return len(external_id.encode("utf-8", errors="surrogatepass")) > MAX_EXTERNAL_ID_BYTES


# -- fair slots ----------------------------------------------------------------------------------


_NOBODY = object()  # no owner may be served now (None is an owner: work of no tenant)


@dataclass(eq=False, slots=True)
class _Waiter:
    owner: Hashable
    wake: Callable[[], None]
    granted: bool = False


class FairSlots:
    """At most `capacity` holders at once; waiters are served by owner, fairly.

    When a slot frees it goes to the waiting owner that holds the fewest slots now (among
    equals, the one served least recently), so one owner's flood of waiters cannot push
    another owner's request to the back of the line: a newcomer waits for the next free slot,
    not for the flood. Each owner's own waiters are served in the order they came. With
    `per_owner`, no owner holds more than that many slots at once, even when others wait for
    none (a reserve that is always left for the others).

    Safe to use from many threads (`hold`, `acquire`) and from event loops (`hold_async`).
    With a single owner it behaves as a plain FIFO semaphore.
    """

    def __init__(self, capacity: int, *, per_owner: int | None = None) -> None:
        if capacity < 1 or (per_owner is not None and per_owner < 1):
            raise ValueError("slots need capacity >= 1 and per_owner >= 1")
        self.capacity = capacity
        self.per_owner = per_owner
        self._lock = threading.Lock()
        self._in_use = 0
        self._held: Counter[Hashable] = Counter()
        # Owners with waiters, least recently served first: the round-robin order among equals.
        self._waiting: OrderedDict[Hashable, deque[_Waiter]] = OrderedDict()

    @property
    def in_use(self) -> int:
        return self._in_use

    def held(self, owner: Hashable) -> int:
        """Slots `owner` holds now."""
        with self._lock:
            return self._held[owner]

    def waiting(self, owner: Hashable | None = None) -> int:
        """Waiters of `owner` (of every owner when None)."""
        with self._lock:
            if owner is not None:
                return len(self._waiting.get(owner, ()))
            return sum(len(queue) for queue in self._waiting.values())

    # -- threads ---------------------------------------------------------------------------------

    def acquire(self, owner: Hashable, timeout: float | None = None) -> bool:
        """Take a slot for `owner`, waiting up to `timeout` seconds (None: as long as it takes);
        False when the time ran out (nothing is held then)."""
        event = threading.Event()
        waiter = _Waiter(owner, event.set)
        if self._submit(waiter) or event.wait(timeout):
            return True
        return not self._withdraw(waiter)  # granted while timing out: keep it

    def release(self, owner: Hashable) -> None:
        """Give back one of `owner`'s slots; the next waiter (see the class) gets it."""
        with self._lock:
            if self._held[owner] < 1:
                raise ValueError(f"{owner!r} holds no slot")
            self._held[owner] -= 1
            if not self._held[owner]:
                del self._held[owner]
            self._in_use -= 1
            self._dispatch()

    @contextmanager
    def hold(self, owner: Hashable) -> Iterator[None]:
        self.acquire(owner)
        try:
            yield
        finally:
            self.release(owner)

    # -- event loops -----------------------------------------------------------------------------

    async def acquire_async(self, owner: Hashable) -> None:
        """Take a slot for `owner`; cancelling the task (`asyncio.timeout`) stops the wait."""
        loop = asyncio.get_running_loop()
        granted: asyncio.Future[None] = loop.create_future()

        def wake() -> None:  # from whichever thread releases the slot
            loop.call_soon_threadsafe(_resolve, granted)

        waiter = _Waiter(owner, wake)
        if self._submit(waiter):
            return
        try:
            await granted
        except BaseException:
            if not self._withdraw(waiter):
                self.release(owner)  # granted as the wait was cancelled: hand it on
            raise

    @asynccontextmanager
    async def hold_async(self, owner: Hashable) -> AsyncIterator[None]:
        await self.acquire_async(owner)
        try:
            yield
        finally:
            self.release(owner)

    # -- the queue -------------------------------------------------------------------------------

    def _submit(self, waiter: _Waiter) -> bool:
        """Queue `waiter` and hand out what is free; whether it was granted at once."""
        with self._lock:
            queue = self._waiting.get(waiter.owner)
            if queue is None:
                queue = self._waiting[waiter.owner] = deque()
            queue.append(waiter)
            self._dispatch()
            return waiter.granted

    def _withdraw(self, waiter: _Waiter) -> bool:
        """Take a waiter that stopped waiting off its queue; False when it was granted first."""
        with self._lock:
            if waiter.granted:
                return False
            queue = self._waiting[waiter.owner]
            queue.remove(waiter)
            if not queue:
                del self._waiting[waiter.owner]
            return True

    def _dispatch(self) -> None:
        """Grant free slots to waiters (the lock is held)."""
        while self._in_use < self.capacity:
            owner = self._next_owner()
            if owner is _NOBODY:
                return
            queue = self._waiting.pop(owner)
            waiter = queue.popleft()
            if queue:
                self._waiting[owner] = queue  # served: to the back of the round-robin order
            self._in_use += 1
            self._held[owner] += 1
            waiter.granted = True
            waiter.wake()

    def _next_owner(self) -> Hashable:
        """The waiting owner holding the fewest slots (the first such in round-robin order)
        and below `per_owner`; `_NOBODY` when there is none."""
        best: Hashable = _NOBODY
        fewest = self.per_owner if self.per_owner is not None else self.capacity + 1
        for owner in self._waiting:
            held = self._held[owner]
            if held < fewest:
                best, fewest = owner, held
        return best


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
