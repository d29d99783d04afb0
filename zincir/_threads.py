"""Database threads: one long-lived thread per connection, fed by a queue, replying into Trio.

Trio tasks hand an *operation* (a plain function of a transaction) to a thread and sleep until
the thread reschedules them with the outcome (``TrioToken.run_sync_soon`` +
``trio.lowlevel.reschedule``: far cheaper than a ``to_thread.run_sync`` per call). A writer
thread drains its queue and runs everything it found in ONE transaction, so a whole batch pays
for one durable commit. If an operation fails, that transaction is rolled back and the batch
runs again in a new one, each operation inside its own SAVEPOINT, so the failing operation gets
its own error while its neighbours still commit (savepoints cost statements on every write;
failures are rare). A caller's ``await`` returns only after the COMMIT that holds its operation.
Where a batch holds several calls of one operation in a row and the store has a *batch form*
for it (both backends' steps: :attr:`zincir._store.Store.batch_forms`), they run as one call of
that form; if it refuses (one call is not the common case), the batch runs again the same way,
each call on its own.

A writer may also run *inline* (SQLite's does): while its thread holds nothing, the writes
submitted during one pass of Trio's scheduler run in one transaction on the Trio thread itself,
the same way. That spares a lone write the two thread wake-ups, which cost about as much as a
fast local commit. A write goes to the thread instead when the file is locked by another
process (the thread waits the lock out, the loop does not), when recent COMMITs took long (a
slow disk would hold up the loop), when it carries a large value or its batch grew past
MAX_BATCH (then the whole batch goes, in order), or when the session has maintenance due
(SQLite's WAL checkpoint, which the thread does between transactions).

A submitted operation is not abandoned when its caller is cancelled: the caller waits for its
outcome. The one exception is a flight (:class:`zincir._requests.Flight`), a lease holder's calls:
once the lease is known lost, :meth:`Flight.abandon` answers every call of it still waiting with
an error at once, whatever the database does (see docs/leases.md).

An operation notes what its writes may wake (``tx.wake``); once the COMMIT that holds it is
done, the thread hands what the committed operations woke to :attr:`DatabaseThread.deliver`,
on the Trio thread, before their callers resume. One that failed, or was rolled back to its
savepoint, wakes nobody (see :mod:`zincir._wakes`).

What differs between backends (how to begin, which errors mean what, reconnecting) is a
:class:`Session`; everything here is backend-free.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

import outcome
import trio

from ._errors import StorageError
from ._requests import Operation, Request, answer, current_flight, wait_for_answer
from ._wakes import Wakes

if TYPE_CHECKING:
    from ._crypto import Sealer

__all__ = ["DatabaseThread", "Session", "submit"]

logger = logging.getLogger("zincir")

T = TypeVar("T")

# Bounds one transaction, so a flood of writers cannot make a single commit arbitrarily large.
MAX_BATCH: Final = 512

# An inline transaction holds up the loop while it runs: only while COMMITs take at most this
# long on average (a slow disk), never for an operation with a text argument this large (a big
# payload's write and fsync), and never for a batch of more than MAX_BATCH (the thread splits
# it). The COMMIT, not the whole transaction: a batch of many small operations is mostly their
# Python, which holds the GIL on either thread, and the thread gains the loop little beyond the
# disk's wait (an operation whose SQL is heavy, a large fork, does hold the loop for its time:
# docs/backends.md). 5 ms: a local SSD's fsync takes well under
# one even beside other writers (its average rises to about 2 ms there, from single commits
# of 5); a spinning disk's or a network volume's takes longer (docs/performance.md).
INLINE_COMMIT_SECONDS: Final = 0.005
INLINE_ARGUMENT_CHARS: Final = 64 * 1024


class Session(Protocol):
    """One connection as a database thread drives it; only ever used on that thread."""

    def begin(self) -> None: ...
    def try_begin(self) -> bool:
        """Begin at once if nothing stands in the way (no other writer holds a lock), else
        return False without waiting; only called for sessions that run operations inline."""

    def commit(self, wakes: Wakes | None) -> None:
        """Commit, and tell other processes what it wakes (PostgreSQL's NOTIFY, inside the
        transaction). Raises :class:`StorageError` only when the outcome is unknown; any other
        error means nothing was committed."""

    def rollback(self) -> None:
        """Roll back the open transaction, if there is one; never raises."""

    def share(self) -> None:
        """Make the open transaction one that several operations share, with or without
        savepoints (PostgreSQL's explicit block: a sync would commit an implicit one)."""

    def savepoint(self) -> None: ...
    def rollback_to_savepoint(self) -> None: ...
    def release_savepoint(self) -> None: ...

    def maintenance_due(self) -> bool:
        """Whether the session has work for its thread (then writes are not run inline)."""

    def maintain(self) -> None:
        """Do that work; only ever called on the thread, between transactions."""

    def end_operation(self) -> None:
        """Called after each operation of a shared transaction that returned: raises the error
        of any statement of it that failed, if the session sends statements ahead of their
        outcome (PostgreSQL's pipeline mode), so that its neighbours are not blamed for it."""

    def transaction_lost(self) -> bool:
        """Whether the database gave up the open transaction on its own (after an error)."""

    def may_run_again(self) -> bool:
        """After a transaction failed: whether it is known to have had no effect at all, for a
        reason that running it once more may not meet (a connection found dead)."""

    def tx(self) -> Any:
        """The object an operation receives (a :class:`zincir._store.Tx`)."""

    def translate(self, exc: Exception) -> Exception:
        """The zincir error for a driver error; any other exception unchanged."""

    def close(self) -> None: ...


_ONE_FAILED: Final = Wakes()
"""What an unguarded group commit returns when one of its operations failed (rolled back)."""


class DatabaseThread:
    """A thread that owns one session and runs submitted operations in transactions."""

    def __init__(
        self,
        *,
        name: str,
        session: Session,
        token: trio.lowlevel.TrioToken,
        group_commit: bool,
        inline: bool = False,
    ) -> None:
        self._session = session
        self._inline = inline
        # Inline writes: the requests handed to the thread and not answered yet (while there
        # are any, the connection is the thread's), the batch a task is gathering for one inline
        # transaction (both only touched on the Trio thread), and how long COMMITs took lately
        # (see _measure_commit).
        self._in_thread = 0
        # While it holds requests: since when (Trio time) the thread has answered none of them.
        self._unanswered_since: float | None = None
        self._gathering: list[Request] | None = None
        self._gathered_for_the_thread = False  # a request joined that the loop should not run
        self._last_batch = 0  # how many requests the last inline batch held
        self._commit_seconds = 0.0
        self._name = name
        self._token = token
        self._group_commit = group_commit
        self._queue: queue.SimpleQueue[Request] = queue.SimpleQueue()
        # Set once if the thread dies; from then on every request fails at once (under the lock,
        # so that none can slip into the queue after the thread emptied it for the last time).
        self._death: str | None = None
        self._lock = threading.Lock()
        self._batch: list[Request] = []  # taken from the queue and not answered yet
        self.deliver: Callable[[Wakes], None] | None = None
        """Where the wake-ups of committed operations go (set once, before any is submitted)."""
        self.sealer: Sealer | None = None
        """The database's encryption, handed to every operation's Tx (set once, before any is
        submitted; None: the database is not encrypted)."""
        self.batch_forms: Mapping[Operation, Callable[..., list[Any]]] = {}
        """The store's batch forms (:attr:`zincir._store.Store.batch_forms`; set once, before
        any operation is submitted)."""
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, requests: list[Request]) -> None:
        """Queue ``requests`` for the thread, in order (on the Trio thread)."""
        with self._lock:
            if self._death is not None:
                raise StorageError(self._death)
            if self._in_thread == 0:
                self._unanswered_since = trio.current_time()
            self._in_thread += len(requests)
            for request in requests:
                if request.fn is None:
                    self._inline = False  # closing: nothing may run on the connection beside it
                self._queue.put(request)

    # -- inline, on the Trio thread ---------------------------------------------------------

    def takes_inline(self, request: Request) -> bool:
        """Whether ``request`` goes the inline way: into the batch being gathered, if there is
        one (to keep the order of requests; :meth:`_joins` may send that whole batch to the
        thread), or into a new one if the session allows it, the thread holds nothing (so the
        connection is free), no maintenance is due, recent transactions were short, and the
        request is light (see :meth:`_for_the_loop`)."""
        if self._gathering is not None:
            return True
        return (
            self._inline
            and self._in_thread == 0
            and self._death is None
            and self._commit_seconds <= INLINE_COMMIT_SECONDS
            and not self._session.maintenance_due()
            and self._for_the_loop(request)
        )

    @staticmethod
    def _for_the_loop(request: Request) -> bool:
        """Not a close request, and no large value to write (its write and fsync would hold up
        the loop, and whether it may is not worth judging): a long string, or strings inside a
        list or tuple (a batch) that add up to one."""
        if request.fn is None:
            return False
        for arg in request.args:  # a loop, not all() over a generator: this is every write's path
            if type(arg) is str:
                if len(arg) > INLINE_ARGUMENT_CHARS:
                    return False
            elif isinstance(arg, str | list | tuple) and _chars(arg) > INLINE_ARGUMENT_CHARS:
                return False
        return True

    def _joins(self, batch: list[Request], request: Request) -> None:
        batch.append(request)
        if len(batch) >= MAX_BATCH or not self._for_the_loop(request):
            self._gathered_for_the_thread = True

    # A KeyboardInterrupt waits for the next checkpoint: no batch is left half run or half told.
    @trio.lowlevel.enable_ki_protection
    async def run_inline(self, request: Request) -> Any:
        """Run ``request`` on the Trio thread, in one transaction with every request submitted
        while the other runnable tasks take their turn. The thread takes the whole batch
        instead if the database is locked by another process (it waits the lock out), or if a
        request that joined should not hold up the loop."""
        if self._gathering is not None:
            self._joins(self._gathering, request)
            return await wait_for_answer(request)
        batch = self._gathering = [request]
        self._gathered_for_the_thread = False
        try:
            await trio.lowlevel.cancel_shielded_checkpoint()
            if len(batch) < self._last_batch:
                # Fewer than last time: the tasks the last batch answered were woken in the same
                # pass as this one, and Trio ran this one before some of them (it reverses a
                # pass's order at random: before all of them, half of the time). If they write
                # again, they do it in this pass: one more, so that they join this commit
                # instead of paying for one of their own a pass later.
                await trio.lowlevel.cancel_shielded_checkpoint()
        finally:
            self._gathering = None
        self._last_batch = len(batch)
        try:
            woken = None if self._gathered_for_the_thread else self._run_inline_batch(batch)
        except BaseException as exc:  # not an operation's error: those are outcomes
            interrupted = StorageError(
                f"{self._name}: the transaction was interrupted ({exc!r}) before its outcome was"
                " known; it was rolled back unless it had committed"
            )
            for other in batch[1:]:
                answer(other, outcome.Error(interrupted))
            raise
        if woken is not None:
            self._tell(woken)
            for other in batch[1:]:
                assert other.result is not None
                answer(other, other.result)
            assert request.result is not None
            return request.result.unwrap()
        try:
            self.submit(batch)
        except StorageError as exc:  # the thread died: nobody else will answer these
            for other in batch[1:]:
                answer(other, outcome.Error(StorageError(str(exc))))
            raise
        return await wait_for_answer(request)

    def _run_inline_batch(self, batch: list[Request]) -> Wakes | None:
        """Run the batch in one transaction now, and what it woke; None (with nothing written)
        if the thread must take it: the write lock is taken (also when a failed operation
        makes the batch run again), or the shared transaction failed and each operation needs
        its own (which could wait for the lock)."""
        if not self._try_begin():
            return None
        try:
            if len(batch) == 1:
                woken: Wakes | None = self._finish_alone(batch[0])
            else:
                woken = self._together(batch, self._try_begin)
                if woken is None or woken is _ONE_FAILED:
                    for request in batch:
                        request.result = None
                    return None
        except BaseException:
            self._roll_back()
            raise
        return woken

    def _roll_back(self) -> None:
        self._session.rollback()
        self._forget_run_keys()

    def _forget_run_keys(self) -> None:
        """An operation rolled back may have stored a new run's key, which the sealer
        remembers at once: a key that is not in the database must never seal a value. Rare,
        so every run key is read again when next needed."""
        if self.sealer is not None:
            self.sealer.forget_all()

    def _try_begin(self) -> bool:
        """Begin a transaction if that needs no wait (the write lock is free)."""
        try:
            return self._session.try_begin()
        except Exception:
            self._roll_back()
            return False

    def _commit(self, wakes: Wakes | None) -> None:
        """Commit the open transaction, and measure how long that took (see _measure_commit)."""
        if not self._inline:
            self._session.commit(wakes)
            return
        started = time.perf_counter()
        self._session.commit(wakes)
        self._measure_commit(time.perf_counter() - started, threading.get_ident() != self._thread.ident)

    def _measure_commit(self, seconds: float, inline: bool) -> None:
        """Keep a moving average of how long a COMMIT holds the loop (or would). An inline one
        is measured as it is. One on the thread is an upper bound: it includes the wait for the
        GIL after the fsync, which a busy loop holds for up to the interpreter's switch interval
        (5 ms), so it may only bring the average down (back to inline once the disk is fast
        again); fed as it is, a busy loop kept its writes on the thread, where every batch
        waits for the GIL again."""
        if inline or seconds < self._commit_seconds:
            self._commit_seconds += (seconds - self._commit_seconds) / 8

    def join(self) -> None:
        self._thread.join()

    def unanswered_for(self) -> float:
        """Seconds the thread has held requests without answering any of them (0 while it holds
        none): how long its connection has not answered, as far as the loop can tell. On the
        Trio thread; a write run inline is not counted (it holds the loop, not the thread)."""
        since = self._unanswered_since
        return 0.0 if since is None else trio.current_time() - since

    @property
    def backlog(self) -> int:
        """Requests taken or waiting and not answered yet: how busy the thread is, a moment ago."""
        return len(self._batch) + self._queue.qsize()

    # -- on the thread --------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            self._serve_until_closed()
        except BaseException as exc:
            self._die(exc)

    def _die(self, exc: BaseException) -> None:
        """Whatever killed the thread: fail every request it holds or will ever get."""
        logger.critical("database thread %s stopped unexpectedly", self._name, exc_info=exc)
        death = (
            f"{self._name}: the database thread stopped unexpectedly ({exc!r}); nothing in flight"
            " was committed, and the database must be reopened"
        )
        with self._lock:
            self._death = death
            stranded = self._batch
            while True:
                try:
                    stranded.append(self._queue.get_nowait())
                except queue.Empty:
                    break
        try:
            self._session.close()  # rolls back the transaction it died in, if any
        except Exception:
            logger.exception("database thread %s: closing its connection failed", self._name)
        for request in stranded:
            request.result = outcome.Value(None) if request.fn is None else outcome.Error(StorageError(death))
        if stranded:
            with contextlib.suppress(trio.RunFinishedError):  # nobody is left to tell
                self._reply(stranded, Wakes())

    def _serve_until_closed(self) -> None:
        closing = False
        while not closing:
            batch = self._batch = [self._queue.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            work = [r for r in batch if r.fn is not None]
            closing = len(work) < len(batch)
            woken = Wakes()
            if work:
                woken = self._run_batch(work)
                self._maintain()
            if closing:
                self._session.close()
                for request in batch:
                    if request.fn is None:
                        request.result = outcome.Value(None)
            self._batch = []
            self._reply(batch, woken)

    def _reply(self, batch: list[Request], woken: Wakes) -> None:
        def wake() -> None:
            self._in_thread -= len(batch)
            self._tell(woken)
            for request in batch:
                assert request.result is not None
                answer(request, request.result)
            # It answered just now: what it still holds has waited since then, at most.
            self._unanswered_since = trio.current_time() if self._in_thread else None

        # Closing waits for this thread's last reply and joins it: the Trio run is still there.
        self._token.run_sync_soon(wake)

    def _run_batch(self, batch: list[Request]) -> Wakes:
        if len(batch) > 1 and self._group_commit:
            woken = self._run_together(batch)
            if woken is not None:
                return woken
            # The shared transaction itself failed (commit error, or the database rolled it
            # back): give every operation its own transaction so each gets its own outcome.
        woken = Wakes()
        for request in batch:
            woken.add(self._run_alone(request))
        return woken

    def _call(self, request: Request, *, shared: bool = False) -> outcome.Outcome[Any]:
        assert request.fn is not None
        request.wakes = None
        try:
            tx = self._session.tx()
            if self.sealer is not None:
                tx.sealer = self.sealer
            value = request.fn(tx, *request.args)
            wakes = tx.close()  # a fence not read yet is judged here
            if shared:
                self._session.end_operation()
        except Exception as exc:
            return outcome.Error(self._session.translate(exc))
        request.wakes = wakes
        return outcome.Value(value)

    def _run_alone(self, request: Request) -> Wakes:
        woken = self._alone(request)
        if isinstance(request.result, outcome.Error) and self._session.may_run_again():
            woken = self._alone(request)
        return woken

    def _alone(self, request: Request) -> Wakes:
        try:
            self._session.begin()
        except Exception as exc:
            error = self._session.translate(exc)
            self._roll_back()
            request.result = outcome.Error(error)
            return Wakes()
        return self._finish_alone(request)

    def _finish_alone(self, request: Request) -> Wakes:
        """Run ``request`` in the transaction begun, commit it, and what it woke (nothing, if
        it failed). Its outcome goes to ``request.result``."""
        result = request.result = self._call(request)
        woken = Wakes()
        if type(result) is outcome.Value:  # what _call made (not isinstance: an ABC's check, slow)
            try:
                self._commit(request.wakes)
            except Exception as exc:
                request.result = outcome.Error(self._session.translate(exc))
            else:
                woken = request.wakes or woken
        # A commit ends the transaction. After a failure it is rolled back here, if the database
        # has not done it already; the operation's own error is the one to report either way.
        if type(request.result) is not outcome.Value:
            self._roll_back()
        return woken

    def _run_together(self, batch: list[Request]) -> Wakes | None:
        if not self._begin_for(batch):
            return Wakes()
        woken = self._together(batch, lambda: self._begin_for(batch))
        return Wakes() if woken is _ONE_FAILED else woken  # each answered with the error

    def _begin_for(self, batch: list[Request]) -> bool:
        """Begin a transaction for ``batch``; False, with each operation answered with the
        error, if that failed."""
        try:
            self._session.begin()
        except Exception as exc:
            self._roll_back()
            for request in batch:
                request.result = outcome.Error(self._session.translate(exc))
            return False
        return True

    def _together(self, batch: list[Request], begin_again: Callable[[], bool]) -> Wakes | None:
        """Run the batch in the transaction begun and commit it; what the operations woke.

        First unguarded: the operations run one after the other, and the first that fails rolls
        the whole transaction back. Then, in a transaction ``begin_again()`` begins, guarded:
        each runs in a savepoint of its own, so that a failing one gets its own error while its
        neighbours still commit. Operations rarely fail, and a savepoint costs two statements
        per operation on every write; an operation runs again only from a transaction rolled
        back, as after a lost one. :data:`_ONE_FAILED`: one failed and no transaction could
        begin again (nothing written). None: the transaction itself failed (nothing written;
        each operation needs a transaction of its own)."""
        woken = self._in_one_transaction(batch, guarded=False)
        if woken is _ONE_FAILED and begin_again():
            woken = self._in_one_transaction(batch, guarded=True)
        return woken

    def _in_one_transaction(self, batch: list[Request], *, guarded: bool) -> Wakes | None:
        """One pass of :meth:`_together`: unguarded, :data:`_ONE_FAILED` at the first failure."""
        woken = Wakes()
        try:
            self._session.share()
            units = batch if guarded or not self.batch_forms else self._units(batch)
            for unit in units:
                if isinstance(unit, list):  # calls of one batch form: one outcome, if it failed
                    self._call_many(unit)
                    request = unit[0]
                else:
                    request = unit
                    if guarded:
                        self._session.savepoint()
                    request.result = self._call(request, shared=True)
                if type(request.result) is outcome.Error:  # what _call made: no ABC's isinstance
                    if self._session.transaction_lost():
                        self._forget_run_keys()
                        return None
                    if not guarded:
                        self._roll_back()
                        return _ONE_FAILED
                    self._session.rollback_to_savepoint()
                    self._forget_run_keys()
                elif request.wakes is not None:
                    woken.add(request.wakes)
                if guarded:
                    self._session.release_savepoint()
            self._commit(woken)
        except StorageError as exc:
            # The session could not tell whether the COMMIT happened (a lost connection):
            # running the batch again could apply it twice, so every operation gets the error.
            for request in batch:
                request.result = outcome.Error(exc)
            return Wakes()
        except Exception:
            self._roll_back()
            return None
        return woken

    def _units(self, batch: list[Request]) -> list[Request | list[Request]]:
        """``batch`` in order, with each run of two or more requests of one operation that has
        a batch form gathered into a list."""
        units: list[Request | list[Request]] = []
        for request in batch:
            last = units[-1] if units else None
            if isinstance(last, list) and last[0].fn is request.fn:
                last.append(request)
            elif request.fn in self.batch_forms:
                units.append([request])
            else:
                units.append(request)
        return [unit[0] if isinstance(unit, list) and len(unit) == 1 else unit for unit in units]

    def _call_many(self, group: list[Request]) -> None:
        """Run ``group`` (requests of one operation) through its batch form; each request's
        outcome goes to its ``result``: the same error for all of them if it failed."""
        operation = group[0].fn
        assert operation is not None  # a close request has no batch form
        form = self.batch_forms[operation]
        together = Request(form, ([request.args for request in group],), group[0].task)
        result = self._call(together, shared=True)
        for request in group:
            request.wakes = None
        group[0].wakes = together.wakes
        if type(result) is outcome.Value:  # what _call made (not isinstance: an ABC's check)
            for request, value in zip(group, result.value, strict=True):
                request.result = outcome.Value(value)
        else:
            for request in group:
                request.result = result

    def _maintain(self) -> None:
        """Work the session saves for its thread (SQLite's WAL checkpoints), before the reply:
        while the batch is not answered, the connection is the thread's."""
        try:
            self._session.maintain()
        except Exception:  # the next maintenance tries again; nothing written is at stake
            logger.exception("database thread %s: maintenance failed", self._name)

    def _tell(self, woken: Wakes) -> None:
        """Hand what committed operations woke to :attr:`deliver` (on the Trio thread)."""
        if woken and self.deliver is not None:
            try:
                self.deliver(woken)
            except Exception:  # a lost hint, never a lost write: the commit has happened
                logger.exception("database thread %s: delivering wake-ups failed", self._name)


def _chars(arg: object) -> int:
    if isinstance(arg, str):
        return len(arg)
    if isinstance(arg, list | tuple):
        return sum(map(_chars, arg))
    return 0


# A KeyboardInterrupt waits for the next checkpoint: a queued request keeps the caller it answers.
@trio.lowlevel.enable_ki_protection
async def submit(thread: DatabaseThread, fn: Operation | None, args: tuple[Any, ...]) -> Any:
    """Hand ``fn(tx, *args)`` to ``thread`` and wait for its outcome.

    A caller cancelled before submitting writes nothing; once submitted, the operation is not
    abandoned: the caller waits for its outcome, and Trio delivers the cancellation at the
    caller's next checkpoint. Only the abandonment of the :class:`Flight` it was submitted in
    (see :func:`flying`) wakes the caller before, with the flight's error.
    """
    await trio.lowlevel.checkpoint_if_cancelled()
    flight = current_flight()
    request = Request(
        fn, args, trio.lowlevel.current_task(), flights=() if flight is None else flight._chain()
    )
    if thread.takes_inline(request):
        return await thread.run_inline(request)
    try:
        thread.submit([request])
    except StorageError:
        if fn is None:
            return None  # closing a thread that died: it closed its connection already
        raise
    return await wait_for_answer(request)
