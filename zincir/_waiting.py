"""The waiting half of :class:`~zincir._run.Run`: the loop every durable wait runs (sleeps,
signals, approvals, joins), the body's open waits and how busy it is, and the suspension that
gives the lease up while the body waits long under a worker (for its waits, or for a budget to be
raised).

A base class of :class:`~zincir._run.Run`, kept apart because it is its own concern (when a run
may suspend and how it wakes again, docs/waits.md); the public waits that call it stay on the run.
It declares the attributes it uses, and the few methods of the run it calls, for type checking.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import trio

from ._database import Storage
from ._errors import BudgetExceeded, DatabaseBusy, DatabaseUnavailable, StorageError, WaitTimeout
from ._lifecycle import Happened, Lifecycle
from ._run_support import _INBOX_POLL_S, _after_transient
from ._store import ApprovalOutcome, JoinOutcome, OpenWait, Store, WaitKind
from ._tracing import RunTrace, now_ns
from ._validation import check_seconds

logger = logging.getLogger("zincir")

T = TypeVar("T")


class _Waiting:
    """What a run's waits and suspensions need: :class:`~zincir._run.Run` inherits it (see the
    module's docstring)."""

    id: str
    _storage: Storage
    _store: Store
    _body_scope: trio.CancelScope
    _suspend_after: float | None
    _lifecycle: Lifecycle
    _suspending: tuple[trio.lowlevel.Task, trio.Event] | None
    _open_waits: dict[object, OpenWait]
    _waiting_tasks: dict[trio.lowlevel.Task, int]
    _busy: int
    _looking: int
    _quiet_since: float
    _trace: RunTrace | None

    if TYPE_CHECKING:  # the run's own, which these methods call

        async def _write(self, fn: Any, *args: Any) -> Any:
            raise NotImplementedError

        def _stop_heartbeat(self) -> None:
            raise NotImplementedError

        async def _look_at_news(self) -> None:
            raise NotImplementedError

    def _begin_activity(self) -> bool:
        """Under a worker, count the body busy with something other than its waits (a store
        operation, a step's function) until _end_activity: it does not suspend meanwhile, nor
        within suspend_after of the end (see _quiet_at). Whether it was counted."""
        if self._suspend_after is None or trio.lowlevel.current_task() in self._waiting_tasks:
            return False
        self._busy += 1
        return True

    async def _body_read(self, fn: Any, *args: Any) -> Any:
        """A plain read by the body (a step replayed, its state): while it is in flight, outside
        a wait, the run does not suspend; it is no work, so the quiet time goes on after it (a
        handler replaying its steps reaches a long sleep and suspends at once)."""
        if self._suspend_after is None or trio.lowlevel.current_task() in self._waiting_tasks:
            return await self._storage.read(fn, *args)
        self._looking += 1
        try:
            return await self._storage.read(fn, *args)
        finally:
            self._looking -= 1

    def _end_activity(self, counted: bool) -> None:
        if counted:
            self._busy -= 1
            self._quiet_since = trio.current_time()

    @contextmanager
    def _active(self) -> Iterator[None]:
        """_begin_activity and _end_activity around a block."""
        counted = self._begin_activity()
        try:
            yield
        finally:
            self._end_activity(counted)

    async def _sleep_or_suspend(self, name: str, wake_at: float) -> None:
        """Sleep until ``wake_at`` (Trio time). Under a worker, suspend the run while more than
        ``suspend_after`` is left, as soon as the body is quiet; after a suspension that did not
        happen (another wait can complete), try again later."""
        suspend_after = self._suspend_after
        suspend_at = math.inf if suspend_after is None else trio.current_time()
        while (now := trio.current_time()) < wake_at:
            if suspend_after is not None and now >= suspend_at:
                if wake_at - now <= suspend_after:
                    suspend_at = math.inf  # too little left to be worth a suspension
                elif (quiet_at := self._quiet_at()) > now:
                    suspend_at = quiet_at
                else:
                    await self._suspend("sleep", name)  # returns only if it did not suspend
                    suspend_at = self._suspend_time(retry=True)
                continue
            await trio.sleep_until(min(wake_at, suspend_at))

    async def _suspend_for_budget(self, exceeded: BudgetExceeded) -> bool:
        """Suspend the run until its budget is raised (a worker's answer to BudgetExceeded);
        False if it is within its limits again already."""
        self._lifecycle.note(Happened.ENDING_BEGAN)
        try:
            suspended = bool(await self._write(self._store.suspend, [("budget", exceeded.limit)]))
        except BaseException:
            self._lifecycle.note(Happened.ENDING_FAILED)
            raise
        self._lifecycle.note(Happened.ENDED_SUSPENDED if suspended else Happened.ENDING_FAILED)
        if suspended:
            self._stop_heartbeat()
            logger.info("run %s: suspended until its budget is raised (%s)", self.id, exceeded)
        return suspended

    def _timeout_ms(self, timeout: object, what: str) -> int | None:
        if timeout is None:
            return None
        return math.ceil(check_seconds(timeout, f"run {self.id}: {what}") * 1000)

    def _decision(
        self, outcome: ApprovalOutcome | JoinOutcome, done: str, value: T, waited: str
    ) -> tuple[bool, T, int | None]:
        """What a wait's ``decide`` returns from the outcome of its store operation: whether it
        is in state ``done``, ``value``, and the time left until its deadline; past the
        deadline, WaitTimeout (``waited``: the wait, as its message names it)."""
        if outcome.state == "timed_out":
            raise WaitTimeout(f"run {self.id}: {waited} passed its deadline")
        return outcome.state == done, value, outcome.remaining_ms

    async def _wait(
        self,
        decide: Callable[[], Awaitable[tuple[bool, Any, int | None]]],
        ready: Callable[[], Awaitable[bool]],
        kind: WaitKind,
        name: str,
    ) -> Any:
        """The loop of every durable wait. ``decide`` (a fenced write) returns (done, value, ms
        left until the deadline) or raises WaitTimeout; until it is done, sleep until the inbox
        may hold news, the deadline, or ``suspend_after`` (then, under a worker, suspend once
        the body is quiet)."""
        suspend_at = self._suspend_time()
        began_ns, traced = now_ns(), None
        with self._waiting_on(kind, name), contextlib.ExitStack() as spanned:
            while True:
                # Register before looking: news arriving between the look and the sleep still wakes us.
                woken = self._storage.wakes.inbox_event(self.id)
                try:
                    try:
                        done, value, remaining_ms = await decide()
                    except (DatabaseBusy, DatabaseUnavailable) as exc:
                        await _after_transient(self.id, "deciding a wait", exc)  # twice is safe: it replays
                        continue
                    if done:
                        if traced is not None:
                            traced.value = value
                        return value
                    if traced is None:  # it did not end at its first look: the run waits
                        traced = spanned.enter_context(self._traced_wait(kind, name, began_ns))
                    deadline = None if remaining_ms is None else trio.current_time() + remaining_ms / 1000
                    while not await _until_ready(woken, ready, deadline, suspend_at):
                        suspend_at = self._quiet_at()
                        if suspend_at <= trio.current_time():
                            await self._suspend(kind, name)
                            # It arrived meanwhile, another wait can complete, or suspending failed.
                            suspend_at = self._suspend_time(retry=True)
                            break
                finally:
                    self._storage.wakes.forget_inbox_event(self.id, woken)

    @contextmanager
    def _traced_wait(self, kind: WaitKind, name: str, began_ns: int) -> Iterator[_Waited]:
        """The span of a wait that did not end at its first look (none while tracing is off);
        set the block's value to what it returns."""
        waited = _Waited()
        trace = self._trace
        if trace is None:
            yield waited
            return
        span = trace.start_wait(kind, name, began_ns)
        try:
            yield waited
        except BaseException as exc:
            trace.end_wait(span, exc)
            raise
        trace.end_wait(span, None, waited.value)

    @contextmanager
    def _waiting_on(self, kind: WaitKind, name: str) -> Iterator[None]:
        """Count a wait among the body's open waits while the block lasts; the store operations
        of the task meanwhile are the wait's own, not activity that keeps the run from
        suspending."""
        token = object()
        task = trio.lowlevel.current_task()
        self._open_waits[token] = (kind, name)
        self._waiting_tasks[task] = self._waiting_tasks.get(task, 0) + 1
        try:
            yield
        finally:
            del self._open_waits[token]
            if self._waiting_tasks[task] == 1:
                del self._waiting_tasks[task]
            else:
                self._waiting_tasks[task] -= 1

    def _quiet_at(self) -> float:
        """The Trio time at which the body will have been quiet (no step running, no store
        operation but its waits') for ``suspend_after``, if nothing else happens; while it is
        busy, when to look again. Infinity without a worker."""
        if self._suspend_after is None:
            return math.inf
        if self._busy or self._looking:
            return trio.current_time() + max(self._suspend_after, _INBOX_POLL_S)
        return self._quiet_since + self._suspend_after

    def _suspend_time(self, *, retry: bool = False) -> float:
        """The Trio time at which a wait beginning now suspends the run (never: infinity). A
        ``retry`` after a suspension that did not happen comes no sooner than an inbox poll,
        so that a wait of the body that can complete has the time to do so."""
        if self._suspend_after is None:
            return math.inf
        return trio.current_time() + max(self._suspend_after, _INBOX_POLL_S if retry else 0)

    async def _unless_suspended_beside(self) -> None:
        """Raise Cancelled if another task of the body suspended the run (or is suspending it):
        a write refused for that lease is no loss, the body is being cancelled."""
        suspending = self._suspending
        if suspending is not None and suspending[0] is not trio.lowlevel.current_task():
            await suspending[1].wait()
        if self._lifecycle.suspended:
            await trio.lowlevel.checkpoint()  # the body is cancelled: this raises Cancelled

    async def _suspend(self, kind: WaitKind, name: str) -> None:
        """Suspend the run on every open wait of the body, ``name`` first, then cancel the
        body; the handler starts again from the top once the run is claimed again. Returns, and
        the owner goes on waiting, only if one of the waits can complete now (what it awaits
        arrived, or its deadline passed) or the write failed."""
        await self._unless_suspended_beside()  # two waits of one body may suspend together
        done = trio.Event()
        self._suspending = (trio.lowlevel.current_task(), done)
        try:
            await self._write_suspension([(kind, name), *self._open_waits.values()])
        finally:
            self._suspending = None
            done.set()

    async def _write_suspension(self, waits: list[OpenWait]) -> None:
        self._lifecycle.note(Happened.ENDING_BEGAN)  # a renewal racing it is not a loss of the lease
        try:
            suspended = await self._write(self._store.suspend, waits)
        except (DatabaseBusy, DatabaseUnavailable) as exc:
            self._lifecycle.note(Happened.ENDING_FAILED)
            logger.warning("run %s: suspending failed, waiting on in this process: %s", self.id, exc)
            return
        except BaseException:
            self._lifecycle.note(Happened.ENDING_FAILED)
            raise
        if not suspended:  # the store woke the body's waits: one of them can complete
            self._lifecycle.note(Happened.ENDING_FAILED)
            await self._look_at_news()  # a cancellation requested, perhaps: act on it now
            return
        self._lifecycle.note(Happened.ENDED_SUSPENDED)
        self._stop_heartbeat()
        described = ", ".join(f"{kind} {name!r}" for kind, name in dict.fromkeys(waits))
        logger.info("run %s: suspended, waiting for any of: %s", self.id, described)
        # Trio cancellation: user code's `except Exception` cannot swallow it, and the worker
        # does not count a cancelled handler as a failed attempt.
        self._body_scope.cancel()
        await trio.lowlevel.checkpoint()


@attrs.define
class _Waited:
    """What a traced wait returned (for its span, with content)."""

    value: Any = None


async def _until_ready(
    woken: trio.Event, ready: Callable[[], Awaitable[bool]], deadline: float | None, give_up_at: float
) -> bool:
    """True once the inbox may hold what a wait needs: woken at once by a write in this
    process (or a notification from another); otherwise a cheap read every poll interval
    finds what another process wrote; at the latest when the ``deadline`` (Trio time; None:
    none) is due. False at ``give_up_at`` (Trio time) if none of that happened first."""
    if deadline is None:
        deadline = math.inf
    while trio.current_time() < deadline:
        if trio.current_time() >= give_up_at:
            return False
        with trio.move_on_at(min(deadline, give_up_at, trio.current_time() + _INBOX_POLL_S)):
            await woken.wait()
            return True
        try:
            if await ready():
                return True
        except StorageError as exc:  # an outage: the heartbeat judges the lease, we keep waiting
            logger.warning("looking for a signal or decision failed, will look again: %s", exc)
    return True
