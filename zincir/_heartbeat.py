"""The lease-keeping half of :class:`~zincir._run.Run`: the heartbeat that renews the lease,
the deadline that stops the owner before the lease could expire, what the heartbeat reads on the
way (a requested cancellation, the wall time), and the release on the way out.

A base class of :class:`~zincir._run.Run`, kept apart because it is its own concern (how long an
owner may trust its lease, docs/leases.md); it declares the attributes it uses, and the few
methods of the run it calls, for type checking.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import math
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from ._database import Database, Storage
from ._errors import (
    BudgetExceeded,
    DatabaseBusy,
    LeaseLost,
    RunTerminal,
    StorageError,
    TransientConflict,
    ZincirError,
)
from ._lease_watch import Ask
from ._lifecycle import Happened, Lifecycle, Phase
from ._requests import Flight
from ._store import Lease, Store
from ._types import RunStatus

__all__ = ["STOP_MARGIN"]

logger = logging.getLogger("zincir")

# A lease holder stops this fraction of its TTL before its lease could expire (docs/leases.md):
# the time its body may take to reach a checkpoint and unwind once told, on a loop that lags a
# little, and the drift between this machine's clock and the database's.
STOP_MARGIN: Final = 0.2


class _LeaseKeeping:
    """What keeps a run's lease: :class:`~zincir._run.Run` inherits it (see the module's
    docstring)."""

    id: str
    _db: Database
    _storage: Storage
    _store: Store
    _lease: Lease
    _flight: Flight
    _confirmed_at: float
    _watch_ask: Ask | None
    _context: contextvars.Context
    _heartbeat_done: trio.Event | None
    _news: bool
    _news_event: trio.Event | None
    _renewal_sent_at: float | None
    _renewal_refused: DatabaseBusy | None
    _heartbeat_due_at: float | None
    _lifecycle: Lifecycle
    _body_scope: trio.CancelScope
    _heartbeat_scope: trio.CancelScope
    _release_delay_ms: int
    _refund_attempt: bool
    _cancel_reason: str | None
    _budget_stop: BudgetExceeded | None

    if TYPE_CHECKING:  # the run's own, which these methods call

        @property
        def epoch(self) -> int:
            raise NotImplementedError

        async def _write(self, fn: Any, *args: Any) -> Any:
            raise NotImplementedError

        async def _finish(
            self, status: RunStatus, transition: dict[str, str], result_json: str | None = None
        ) -> None:
            raise NotImplementedError

    def _lose(self, message: str) -> None:
        """The lease is gone for good: stop the body now, and stop waiting for the database
        calls in flight (their outcome is unknown; the database fences the writes). Raised from
        the block as LeaseLost (or logged there, if the body raised something else)."""
        first = self._lifecycle.lose(message)
        if first:
            logger.debug("%s; stopping the body", message)
        self._stop_heartbeat()
        self._body_scope.cancel()
        if first:
            self._flight.abandon(functools.partial(LeaseLost, message))

    def _stop_heartbeat(self) -> None:
        self._heartbeat_scope.cancel()
        if self._heartbeat_done is None:
            self._heartbeat_due_at = None  # never to start: not due, so never late

    # -- the watch: one timer for every lease (zincir/_lease_watch.py) ------------------------

    def _start_watch(self) -> None:
        """Have the lease watched from now until :meth:`_stop_watch`: stopped at its deadline,
        renewed a third of a TTL after it was taken (the heartbeat's task starts then, or at the
        first news, or when the wall time runs out: most runs end before any of them)."""
        # The heartbeat's task runs in the block's context, as a task of the block would: its
        # calls belong to the block's flight, its log lines to the attempt's trace.
        self._context = contextvars.copy_context()
        self._watch_next()
        self._storage.wakes.add_owner(self.id, self._hear_news, since=self._confirmed_at)

    def _stop_watch(self) -> None:
        self._storage.wakes.remove_owner(self.id, self._hear_news)
        if self._watch_ask is not None:
            self._storage.lease_watch.forget(self._watch_ask)
            self._watch_ask = None

    def _watch_again(self) -> None:
        if self._watch_ask is not None:
            self._storage.lease_watch.forget(self._watch_ask)
            self._watch_next()

    def _heartbeat_wanted(self) -> bool:
        return self._heartbeat_done is None and not self._heartbeat_scope.cancel_called

    def _heartbeat_starts_at(self) -> float:
        """When (Trio time) the heartbeat's task must be running: the first renewal, or the end
        of the run's wall time, whichever comes first."""
        return min(self._confirmed_at + self._lease.ttl_ms / 3000, self._out_of_time_at())

    def _watch_next(self) -> None:
        when = self._stop_at()
        if self._heartbeat_wanted():
            when = min(when, self._heartbeat_starts_at())
        self._watch_ask = self._storage.lease_watch.at(when, self)

    def _due(self, now: float) -> None:
        """The watch's turn: stop the owner past its deadline, whatever its calls to the
        database wait for (on the way out, stop waiting for the release then); start the
        heartbeat when its first renewal or the wall time's end is due."""
        self._watch_ask = None
        if not self._lifecycle.holds():
            return
        if now >= self._stop_at():
            if self._lifecycle.phase is Phase.RELEASING:  # the body is done: let the lease expire
                self._flight.abandon(functools.partial(LeaseLost, self._deadline_message(now)))
            else:
                self._past_deadline()
            return
        if self._heartbeat_wanted() and now >= self._heartbeat_starts_at():
            self._start_heartbeat()
        self._watch_next()

    def _watch_failed(self, exc: Exception) -> None:
        self._lose(f"run {self.id}: watching the lease failed unexpectedly: {exc!r}")

    def _hear_news(self) -> None:
        """The run's inbox may hold news for its owner: the heartbeat reads it at once."""
        self._news = True
        if self._news_event is not None:
            self._news_event.set()
        elif self._heartbeat_wanted() and self._lifecycle.holds():
            self._start_heartbeat()

    def _start_heartbeat(self) -> None:
        self._heartbeat_done = trio.Event()
        trio.lowlevel.spawn_system_task(
            self._heartbeat, name=f"zincir heartbeat of run {self.id}", context=self._context
        )

    async def _heartbeat(self) -> None:
        assert self._heartbeat_done is not None
        try:
            await self._keep_lease()
        except Exception as exc:  # a system task's error would end the whole Trio run
            try:
                self._lose(f"run {self.id}: renewing the lease failed unexpectedly: {exc!r}")
            except Exception:
                logger.exception("run %s: stopping the body after a heartbeat's failure failed", self.id)
        finally:
            self._heartbeat_done.set()

    async def _heartbeat_stopped(self) -> None:
        """Wait until the heartbeat, stopped, has finished (a renewal it sent is answered or
        abandoned): the block does not end while a task of its own still runs."""
        if self._heartbeat_done is not None:
            with trio.CancelScope(shield=True):
                await self._heartbeat_done.wait()

    # -- the lease ------------------------------------------------------------------------

    async def _keep_lease(self) -> None:
        """Renew every ttl/3, counted from when the previous renewal (at first, the write that
        took the lease) was sent: a slow answer does not push every later renewal back.
        Transient database errors are retried, sooner as the deadline nears (see
        :meth:`_stop_at`); a definitive loss cancels the body at once. Each renewal also reads
        whether a cancellation was requested; news in the run's inbox (a request made in this
        process, or heard from another) has that read at once."""
        interval = self._lease.ttl_ms / 3000
        renew_at = self._confirmed_at + interval
        with self._heartbeat_scope:
            try:
                while not self._past_deadline():  # (a late start too: the loop was held)
                    self._heartbeat_due_at = renew_at
                    while trio.current_time() < renew_at:
                        if await self._news_until(min(renew_at, self._out_of_time_at())):
                            await self._look_at_news()
                        elif trio.current_time() >= self._out_of_time_at():
                            await self._look_at_news()  # the budget may have been raised meanwhile
                            if trio.current_time() >= self._out_of_time_at():
                                await self._stop_out_of_time()
                    if self._past_deadline():
                        return
                    self._heartbeat_due_at = None
                    next_at = await self._renew(interval)
                    if next_at is None:
                        return
                    renew_at = next_at
            except LeaseLost:
                return  # a read of the heartbeat's, abandoned with the lease: it is lost already
            finally:
                self._heartbeat_due_at = None  # stopped: not due, so never late (_deadline_message)

    async def _renew(self, interval: float) -> float | None:
        """Renew the lease once; the Trio time of the next renewal, None to stop renewing."""
        sent_at = self._renewal_sent_at = trio.current_time()
        try:
            self._lease, cancel_reason = await self._storage.write(
                self._store.renew, self._lease, route=self.id
            )  # the renewed lease says when the run's wall time ends, too
            self._confirmed_at = sent_at
            self._renewal_refused = None
            self._watch_again()  # the watch wakes only at a deadline that holds
            self._stop_if_cancelled(cancel_reason)
            return sent_at + interval
        except RunTerminal:
            return None  # this owner ended the run (another task of the body did)
        except LeaseLost as exc:
            if self._lifecycle.refusal_is_loss():  # not the release this owner is making right now
                self._lose(str(exc))
            return None
        except StorageError as exc:
            self._renewal_refused = exc if isinstance(exc, DatabaseBusy) else None
            # The database decides; this local view (its clock, as this process reads it) only
            # says how long retrying is worth it, and the deadline stops the owner before expiry.
            if self._lease.expires_at - self._db.clock() <= 0:
                self._lose(f"run {self.id}: the lease of epoch {self.epoch} expired ({exc})")
                return None
            delay = min(interval, max(0.005, (self._stop_at() - trio.current_time()) / 3))
            logger.warning("run %s: lease renewal failed, retrying in %.3f s: %s", self.id, delay, exc)
            return trio.current_time() + delay
        except Exception as exc:  # a bug must stop the body, not escape as a group
            self._lose(f"run {self.id}: renewing the lease failed unexpectedly: {exc!r}")
            return None
        finally:
            self._renewal_sent_at = None

    def _stop_at(self) -> float:
        """The Trio time by which this owner stops unless a newer renewal is confirmed: the
        database set the expiry to its own now + TTL at some moment after the confirmed write
        was submitted, so the lease cannot expire before that submission + TTL. The margin
        (:data:`STOP_MARGIN` of the TTL) is for the body to stop in."""
        return self._confirmed_at + self._lease.ttl_ms * (1 - STOP_MARGIN) / 1000

    def _past_deadline(self) -> bool:
        """Lose the lease if its deadline has passed while it is held; whether the owner is done
        with it (lost now or before, or given up: ended, suspended, released)."""
        if not self._lifecycle.holds():
            return True
        now = trio.current_time()
        if now < self._stop_at():
            return False
        self._lose(self._deadline_message(now))
        return True

    def _deadline_message(self, now: float) -> str:
        """Why no renewal was confirmed in time: the loop did not run the heartbeat, or the
        database (or the network) did not answer."""
        ttl_ms, margin_ms = self._lease.ttl_ms, math.ceil(self._lease.ttl_ms * STOP_MARGIN)
        silent_ms = math.floor((now - self._confirmed_at) * 1000)
        where = f"run {self.id}: the lease of epoch {self.epoch} was given up"
        left_ms = ttl_ms - silent_ms  # at least this long before the database may expire it
        expiry = (
            f"it may have expired {-left_ms} ms ago"
            if left_ms <= 0
            else f"it could expire within {left_ms} ms"
        )
        # How late the first of the heartbeat and this deadline ran (they wait on timers).
        due = min(self._stop_at(), math.inf if self._heartbeat_due_at is None else self._heartbeat_due_at)
        late_ms = math.floor((now - due) * 1000)
        if late_ms > margin_ms:
            return (
                f"{where}: the heartbeat could not run for {late_ms} ms because the Trio event loop"
                " was blocked (by CPU-bound or blocking code in this process, or by a machine too"
                f" busy to run it); with no renewal for"
                f" {silent_ms} ms of a {ttl_ms} ms lease, {expiry}. Run such work in a thread"
                " (await trio.to_thread.run_sync(fn)) so that the heartbeat can renew the lease"
                f" every {ttl_ms // 3} ms"
            )
        sent = self._renewal_sent_at
        unanswered = (
            "" if sent is None else f" (the one sent {math.floor((now - sent) * 1000)} ms ago is unanswered)"
        )
        return (
            f"{where}: no renewal was confirmed for {silent_ms} ms of a {ttl_ms} ms lease{unanswered}:"
            f" {self._why_unconfirmed()}, and {expiry}, so the body was stopped"
            " (the writes in flight have an unknown outcome)"
        )

    def _why_unconfirmed(self) -> str:
        """Why renewals were not confirmed: refused while another transaction held a lock the
        run needs (its row on PostgreSQL, the file's write lock on SQLite), or no answer."""
        refused = self._renewal_refused
        if isinstance(refused, TransientConflict):
            return (
                "another transaction held a lock on the run's row, so each renewal was refused"
                f" (the last one: {refused})"
            )
        if refused is not None:
            return (
                "another connection held the database's write lock, so the renewals failed"
                f" (the last one: {refused})"
            )
        return "the database or the network did not answer"

    def _out_of_time_at(self) -> float:
        """The Trio time at which the run's wall time runs out (infinity: no limit, or stopped)."""
        ends_at = self._lease.wall_time_ends_at
        if ends_at is None or self._budget_stop is not None:
            return math.inf
        return trio.current_time() + (ends_at - self._db.clock()) / 1000

    async def _stop_out_of_time(self) -> None:
        limit = "wall_time"
        message = "budget exceeded: its wall time has run out"
        try:
            await self._write(self._store.note_exceeded, limit, message)
        except ZincirError as exc:
            logger.warning("run %s: recording the wall time's end failed: %s", self.id, exc)
        self._budget_stop = BudgetExceeded(f"run {self.id}: {message}", limit)
        logger.info("%s; stopping", self._budget_stop)
        self._body_scope.cancel()

    async def _news_until(self, deadline: float) -> bool:
        """Whether news reached the run's inbox (see :meth:`_hear_news`) before ``deadline``
        (Trio time), or since the last look."""
        if not self._news:
            self._news_event = event = trio.Event()
            try:
                with trio.move_on_at(deadline):
                    await event.wait()
            finally:
                self._news_event = None
        news, self._news = self._news, False
        return news

    async def _look_at_news(self) -> None:
        """Read what an outsider may have changed: a cancellation request, the wall time."""
        try:
            reason, wall_end = await self._storage.read(self._store.owner_news, self.id)
        except StorageError:
            return  # the next renewal reads both again
        self._lease = attrs.evolve(self._lease, wall_time_ends_at=wall_end)
        self._stop_if_cancelled(reason)

    def _stop_if_cancelled(self, reason: str | None) -> None:
        if reason is not None and self._cancel_reason is None:
            self._cancel_reason = reason
            logger.info("run %s: cancellation requested (%s); stopping", self.id, reason)
            self._body_scope.cancel()

    async def _end_cancelled(self) -> None:
        """The body was stopped for a requested cancellation: end the run so, unless it ended
        (or was lost) first."""
        if self._lifecycle.given_up():
            return
        transition = {"from": "running", "reason": self._cancel_reason or "", "to": "cancelled"}
        with trio.CancelScope(shield=True):
            try:
                await self._finish(RunStatus.CANCELLED, transition)
            except ZincirError as exc:
                logger.warning("run %s: recording the cancellation failed: %s", self.id, exc)

    async def _release(self) -> bool:
        """Give the lease up on leaving the block; False if it was no longer this owner's. A
        lost lease is not released (its release would be refused, or wait for what lost it)."""
        if self._lifecycle.given_up():
            return True
        self._lifecycle.note(Happened.RELEASE_BEGAN)
        with trio.CancelScope(shield=True):
            try:
                released = await self._release_now()
            except (StorageError, LeaseLost) as exc:  # LeaseLost: not confirmed by the deadline
                self._lifecycle.note(Happened.RELEASE_FAILED)
                logger.warning("run %s: releasing the lease failed; it will expire instead: %s", self.id, exc)
                return True
            except BaseException:
                self._lifecycle.note(Happened.RELEASE_FAILED)
                raise
        self._lifecycle.note(Happened.RELEASED)
        return released

    async def _release_now(self) -> bool:
        """The release's write; while another transaction holds the run's row, tried again
        until the deadline (then the lease expires instead)."""
        delay = 0.001
        while True:
            try:
                released: bool = await self._storage.write(
                    self._store.release,
                    self._lease,
                    self._release_delay_ms,
                    self._refund_attempt,
                    route=self.id,
                )
                return released
            except TransientConflict:
                if trio.current_time() + delay >= self._stop_at():
                    raise
            await trio.sleep(delay)
            delay = min(2 * delay, 0.1)
