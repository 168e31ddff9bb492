"""`FairSlots`: a bounded number of things at once (upstream calls, embedding computations),
shared fairly between owners (tenants) instead of first come, first served."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Hashable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

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
