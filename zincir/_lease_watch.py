"""One timer for every lease held through a database (docs/leases.md#one-timer-for-every-lease).

Each lease holder must stop before its lease could expire, whatever its calls to the database
wait for, and must start renewing a third of a TTL after it took the lease. A run that ends
sooner than that (most runs a worker claims) needs neither, so it gets no task of its own for
them: :class:`LeaseWatch` keeps every holder's next moment in one heap, sleeps until the
earliest in one system task, and calls the holder's ``_due`` then. ``_due`` is synchronous: it
stops a holder past its deadline, or starts that holder's heartbeat task, and never waits, so
one run's trouble never holds up another's turn.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from typing import Final, Protocol

import trio

__all__ = ["Ask", "LeaseWatch", "Watched"]

logger = logging.getLogger("zincir")

# Entries of holders gone before their moment stay in the heap until it comes; it is rebuilt
# without them once they outnumber the live ones by this much.
_SLACK: Final = 64


class Watched(Protocol):
    def _due(self, now: float) -> None:
        """The moment asked for has come (``now``, Trio time). Never waits."""

    def _watch_failed(self, exc: Exception) -> None:
        """``_due`` raised ``exc`` (a bug): stop the holder."""


class Ask:
    """One call asked of :class:`LeaseWatch`; ``holder`` is None once made or forgotten."""

    __slots__ = ("holder",)

    def __init__(self, holder: Watched) -> None:
        self.holder: Watched | None = holder


class LeaseWatch:
    """The heap and its task: :meth:`at` asks for a call, :meth:`forget` takes the ask back."""

    def __init__(self) -> None:
        # (when, a tie-breaker, the ask): the heap never compares asks.
        self._heap: list[tuple[float, int, Ask]] = []
        self._live = 0
        self._order = itertools.count()
        self._running = False
        self._sleep: trio.CancelScope | None = None

    def at(self, when: float, holder: Watched) -> Ask:
        """Call ``holder._due(now)`` once, at ``when`` (Trio time) or as soon after as the loop
        runs this task; the ask to :meth:`forget` it by."""
        ask = Ask(holder)
        heapq.heappush(self._heap, (when, next(self._order), ask))
        self._live += 1
        if not self._running:
            self._running = True
            trio.lowlevel.spawn_system_task(self._run, name="zincir lease watch")
        elif self._sleep is not None and when < self._sleep.deadline:
            self._sleep.deadline = when
        return ask

    def forget(self, ask: Ask) -> None:
        """Take back the call ``ask`` asked for, unless it was made."""
        if ask.holder is None:
            return
        ask.holder = None
        self._live -= 1
        if self._live == 0:
            self._heap.clear()
            if self._sleep is not None:
                self._sleep.cancel()  # nothing left to watch: the task ends
        elif len(self._heap) > 2 * self._live + _SLACK:
            self._heap[:] = [kept for kept in self._heap if kept[2].holder is not None]  # in place
            heapq.heapify(self._heap)

    async def _run(self) -> None:
        try:
            while self._live:
                with trio.CancelScope(deadline=self._heap[0][0]) as self._sleep:
                    await trio.sleep_forever()
                self._sleep = None
                self._call_due(trio.current_time())
        finally:
            self._running = False
            self._sleep = None

    def _call_due(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            ask = heapq.heappop(heap)[2]
            holder, ask.holder = ask.holder, None
            if holder is None:
                continue
            self._live -= 1
            try:
                holder._due(now)
            except Exception as exc:  # a system task's error would end the whole Trio run
                logger.exception("zincir lease watch: a holder's turn failed")
                try:
                    holder._watch_failed(exc)
                except Exception:
                    logger.exception("zincir lease watch: stopping that holder failed too")
