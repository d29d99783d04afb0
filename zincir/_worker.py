"""The resume worker: claims runs nobody is working on and hands each to a handler."""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Final, TypedDict, TypeVar, Unpack, final, overload

import attrs
import trio

from . import _requests, _threads
from ._database import Database, Storage, storage
from ._errors import (
    BudgetExceeded,
    InvalidArgument,
    LeaseLost,
    RunCancelled,
    StorageError,
    only_budget_exceeded,
)
from ._heartbeat import STOP_MARGIN
from ._ownership import owned_run
from ._run import Run
from ._store import Claims, Lease, exhausted_reason
from ._store._versions import SKIPPED_CAP, Versions, shown
from ._types import RunStatus
from ._validation import check_int, check_seconds, check_version, lease_ttl_ms

__all__ = ["Backoff", "Handler", "ResumeWorker"]

logger = logging.getLogger("zincir.worker")

Handler = Callable[[Run], Awaitable[Any]]
"""An async callable that continues a run; it should end with ``complete()`` or ``fail()``."""

R = TypeVar("R")


class WorkerOptions(TypedDict, total=False):
    """The options of a :class:`ResumeWorker` (keywords, each optional; left out, each is the
    default :class:`ResumeWorker` shows and its docstring explains)."""

    lease_ttl: float
    poll_interval: float
    max_concurrency: int
    max_attempts: int | None
    backoff: Backoff
    grace_period: float
    suspend_after: float | None
    until_idle: bool
    versions: Iterable[str | None] | None


_MAX_ERROR_MESSAGE: Final = 2000
_MAX_CONCURRENCY: Final = 10_000

# A writer that has held requests unanswered for this fraction of the lease TTL is taken as not
# answering: the worker claims nothing until it answers again (docs/worker.md). Well before a
# stalled renewal costs a run its lease (0.8 of the TTL); a pause it causes by mistake (a slow
# commit) ends with the writer's next answer.
_SILENT_WRITER_FRACTION: Final = 0.25


def _served(versions: object) -> Versions | None:
    """A worker's ``versions``, checked: None (any), or a tuple (None first, then by name)."""
    if versions is None:
        return None
    if isinstance(versions, str) or not isinstance(versions, Iterable):
        raise InvalidArgument(f"versions must be a set of versions (str, or None for none), not {versions!r}")
    served = {check_version(version, "a version in versions") for version in versions}
    if not served:
        raise InvalidArgument("versions is empty: the worker would claim nothing (None claims every version)")
    return tuple(sorted(served, key=lambda version: (version is not None, version or "")))


def _when(delay_ms: int) -> str:
    """A retry time for people: the delay and the local time, e.g. ``in 4.0 s (at 14:03:07)``."""
    at = datetime.datetime.now() + datetime.timedelta(milliseconds=delay_ms)
    return f"in {delay_ms / 1000:.1f} s (at {at.isoformat(sep=' ', timespec='seconds')})"


@attrs.frozen
class Backoff:
    """Exponential backoff with jitter: attempt n waits ``initial * factor**(n-1)`` seconds,
    capped at ``maximum``, then moved by up to ``jitter`` (a fraction) either way."""

    initial: float = 1.0
    factor: float = 2.0
    maximum: float = 300.0
    jitter: float = 0.1

    def __attrs_post_init__(self) -> None:
        for name in ("initial", "factor", "maximum"):
            check_seconds(getattr(self, name), f"Backoff.{name}", exclusive=True)
        if not 0 <= self.jitter < 1:
            raise InvalidArgument(f"Backoff.jitter must be in [0, 1), not {self.jitter!r}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after the ``attempt``-th attempt (1-based) failed."""
        try:
            base = min(self.maximum, self.initial * self.factor ** max(0, attempt - 1))
        except OverflowError:  # thousands of attempts: long past the maximum
            base = self.maximum
        return base * (1 + random.uniform(-self.jitter, self.jitter))


@final
class ResumeWorker:
    """Claims free or expired, non-terminal, due runs and runs ``handler(run)`` for each.

    At most ``max_concurrency`` handlers run at once. A handler that raises has its run
    released with a persisted retry time (``backoff``) and an ``attempt_failed`` event; after
    ``max_attempts`` claims the run is failed. An attempt whose process died (SIGKILL, a power
    cut) counts too: the next claim logs ``attempt_lost`` for it, and a run whose attempts are
    spent fails with the reason "attempts exhausted: ..." (docs/crashes.md). A handler that
    returns without ending the run releases it until the backoff has passed. :meth:`stop`
    stops claiming at once and gives running handlers ``grace_period`` seconds before
    cancelling them; cancelled handlers release their runs, so another worker can claim them
    straight away. While a database writer does not answer (for a quarter of ``lease_ttl``),
    the worker claims nothing: a run claimed then could not renew its lease (docs/worker.md).

    A handler whose wait (:meth:`Run.wait_for_signal`, :meth:`Run.wait_for_approval`,
    :meth:`Run.join`) is not satisfied within ``suspend_after`` seconds, or that sleeps longer
    than that, *suspends* its run once nothing else of its body is under way: the run becomes
    ``waiting`` on every wait the body is in, its lease is released and the handler is
    cancelled, without counting an attempt. Whichever comes first of the signals, decisions,
    children's ends and deadlines it waits for makes the run claimable again, and the handler
    starts over from the top (its steps, sleeps, waits and recorded responses return at once;
    see docs/waits.md). ``suspend_after=None``
    keeps every wait in the process. A handler that lets :class:`BudgetExceeded` escape
    suspends its run the same way, until its budget is raised.

    ``resources``: a function returning an async context manager (an ``@asynccontextmanager``,
    say) whose value every handler of this worker shares, such as one model client. It is
    entered once, when :meth:`run` starts (before the first claim), and exited once, when the
    worker has stopped and its handlers have finished; the handler then takes it as a second
    argument, ``handler(run, resources)``.

    ``until_idle``: :meth:`run` returns by itself once no handler runs, no run is due, and none
    will become due without an outsider's write. A run backing off, one in a durable sleep, and
    one another owner holds (its lease comes free when that owner lets go or dies) keep the
    worker going; runs suspended on a signal, an approval, a child or a budget do not, even with
    a deadline: a later worker resumes them.

    ``versions``: claim only runs of these versions of the agent (``None`` in it: runs without
    a version); None, the default, claims runs of any version. A due run of another version is
    left for a worker of its own, and an idle worker says once per poll how many it left
    (docs/versions.md). The handler reads :attr:`Run.version`.
    """

    # The two ways to call it (a handler with resources, or without), each with the options,
    # whose defaults are the implementation's below.
    @overload
    def __init__(self, db: Database, handler: Handler, **options: Unpack[WorkerOptions]) -> None: ...

    @overload
    def __init__(
        self,
        db: Database,
        handler: Callable[[Run, R], Awaitable[Any]],
        *,
        resources: Callable[[], AbstractAsyncContextManager[R]],
        **options: Unpack[WorkerOptions],
    ) -> None: ...

    def __init__(
        self,
        db: Database,
        handler: Callable[..., Awaitable[Any]],
        *,
        resources: Callable[[], AbstractAsyncContextManager[Any]] | None = None,
        lease_ttl: float = 30.0,
        poll_interval: float = 1.0,
        max_concurrency: int = 4,
        max_attempts: int | None = None,
        backoff: Backoff = Backoff(),
        grace_period: float = 10.0,
        suspend_after: float | None = 30.0,
        until_idle: bool = False,
        versions: Iterable[str | None] | None = None,
    ) -> None:
        if not isinstance(db, Database):
            raise InvalidArgument(f"ResumeWorker needs a Database, not {db!r}")
        if not callable(handler):
            raise InvalidArgument(f"handler must be an async callable, not {handler!r}")
        if resources is not None and not callable(resources):
            raise InvalidArgument(
                f"resources must be a function returning an async context manager, not {resources!r}"
            )
        if not isinstance(until_idle, bool):
            raise InvalidArgument(f"until_idle must be a bool, not {until_idle!r}")
        check_int(max_concurrency, "max_concurrency", minimum=1, maximum=_MAX_CONCURRENCY)
        if max_attempts is not None:
            check_int(max_attempts, "max_attempts (or None)", minimum=1)
        if not isinstance(backoff, Backoff):
            raise InvalidArgument(f"backoff must be a zincir.Backoff, not {backoff!r}")
        self._db = db
        self._storage: Storage = storage(db)
        self._handler = handler
        self._resource_factory = resources
        self._resources: Any = None  # the factory's value, while the worker runs
        self._until_idle = until_idle
        self._versions = _served(versions)
        self._turn = 0  # which of several versions claims first, turned at each claim
        self._skips_counted_at = -math.inf  # when (Trio time) the last idle poll counted skipped runs
        self._ttl_ms = lease_ttl_ms(lease_ttl)
        self._silent_writer_s = self._ttl_ms / 1000 * _SILENT_WRITER_FRACTION
        # A claim answered this long after it was sent leases nothing its owner could hold: an
        # owner stops at this deadline when no renewal was confirmed (docs/leases.md).
        self._claim_useless_after_s = self._ttl_ms / 1000 * (1 - STOP_MARGIN)
        self._poll_interval = check_seconds(poll_interval, "poll_interval", exclusive=True)
        self._limiter = trio.CapacityLimiter(max_concurrency)
        self._max_attempts = max_attempts
        self._backoff = backoff
        self._grace_period = check_seconds(grace_period, "grace_period")
        self._suspend_after = None if suspend_after is None else check_seconds(suspend_after, "suspend_after")
        self._owner = str(uuid.uuid4())
        self._claim_scope = trio.CancelScope()
        self._wakeup = trio.Event()
        self._running = False

    @property
    def running_handlers(self) -> int:
        """How many handlers are running now."""
        return int(self._limiter.borrowed_tokens)

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._claim_scope.cancel_called

    def stop(self) -> None:
        """Stop claiming now; running handlers get the grace period, then are cancelled.

        A plain method: call it from any task of the worker's Trio run.
        """
        self._claim_scope.cancel()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Claim and handle runs until :meth:`stop` or cancellation (or, with ``until_idle``,
        until nothing is left to do). The worker's ``resources`` are entered first and exited
        last, after every handler has finished."""
        if self._running:
            raise InvalidArgument("a ResumeWorker runs once; create another to run again")
        self._running = True
        async with self._resources_entered():
            self._storage.wakes.add_claim_listener(self._wake)
            try:
                async with trio.open_nursery() as handlers:
                    with self._claim_scope:
                        task_status.started()
                        await self._claim_forever(handlers)
                    logger.info(
                        "worker stopping: %d handler(s) get %.1f s", self.running_handlers, self._grace_period
                    )
                    handlers.cancel_scope.deadline = trio.current_time() + self._grace_period
            finally:
                self._storage.wakes.remove_claim_listener(self._wake)

    @asynccontextmanager
    async def _resources_entered(self) -> AsyncIterator[None]:
        factory = self._resource_factory
        if factory is None:
            yield
            return
        manager = factory()
        if not hasattr(manager, "__aenter__") or not hasattr(manager, "__aexit__"):
            raise InvalidArgument(
                f"resources {factory!r} returned {manager!r}, not an async context manager"
                " (decorate it with contextlib.asynccontextmanager)"
            )
        async with manager as value:
            self._resources = value
            try:
                yield
            finally:
                self._resources = None

    def _wake(self) -> None:
        self._wakeup.set()

    async def _claim_forever(self, handlers: trio.Nursery) -> None:
        failures = 0
        while True:
            slots = await self._free_slots()
            silent = [w for w in self._storage.writers if w.unanswered_for() > self._silent_writer_s]
            if silent:
                self._release_slots(slots)
                await self._until_answered(silent)
                continue
            # A fresh event before each claim: a run released while we claim wakes the wait below.
            self._wakeup = trio.Event()
            submitted_at = trio.current_time()  # each claimed lease expires after this + its TTL
            try:
                claimed = await self._storage.write(
                    self._storage.store.claim_due,
                    self._owner,
                    self._ttl_ms,
                    self._max_attempts,
                    len(slots),
                    self._claim_order(),
                    route=None,  # any writer: the least busy
                )
            except BaseException as exc:
                self._release_slots(slots)
                if not isinstance(exc, StorageError):
                    raise
                failures += 1
                delay = min(self._poll_interval, self._backoff.delay(failures))
                logger.warning("worker: claiming failed (%s); retrying in %.2f s", exc, delay)
                await trio.sleep(delay)
                continue
            failures = 0
            if claimed.leased and trio.current_time() >= submitted_at + self._claim_useless_after_s:
                self._give_back(claimed, handlers)  # the writer answered too late to hold them
                claimed = attrs.evolve(claimed, leased=[])
            self._log_claims(claimed)
            for (lease, attempt), slot in zip(claimed.leased, slots, strict=False):
                handlers.start_soon(self._handle, lease, attempt, slot, submitted_at)
            self._release_slots(slots[len(claimed.leased) :])
            if len(claimed.leased) < len(slots):  # nothing more is due: wait for a wake-up
                await self._note_skipped()
                if self._until_idle and self.running_handlers == 0 and not await self._work_ahead():
                    logger.info("worker idle: no run is due or will become due by itself; stopping")
                    return
                with trio.move_on_after(await self._idle_time()):
                    await self._wakeup.wait()

    async def _until_answered(self, writers: list[_threads.DatabaseThread]) -> None:
        """Claim nothing while a writer does not answer (a stopped server process, a network
        partition on its connection): a run claimed now would be routed to it as likely as to any
        other, its renewals would not be confirmed, and it would lose its lease and an attempt
        for nothing. Return once each has answered something sent behind what it holds."""
        silent_s = max(writer.unanswered_for() for writer in writers)
        logger.warning(
            "worker: a database writer has not answered for %.1f s; claiming no run until it answers",
            silent_s,
        )
        for writer in writers:
            await _answered(writer)
        logger.info("worker: the database writer answers again; claiming runs again")

    def _give_back(self, claims: Claims, handlers: trio.Nursery) -> None:
        """Release the runs of a claim answered past its leases' deadline, with the attempts
        it counted given back: handed to a handler, each would be given up at once."""
        logger.warning(
            "worker: a claim was answered too late to hold its leases (the database writer did not"
            " answer); giving %d run(s) back with their attempts",
            len(claims.leased),
        )
        for lease, _ in claims.leased:
            handlers.start_soon(self._release_unheld, lease)

    async def _release_unheld(self, lease: Lease) -> None:
        try:
            await self._storage.write(self._storage.store.release, lease, 0, True, route=lease.run_id)
        except (StorageError, LeaseLost) as exc:
            logger.warning("run %s: giving the run back failed; its lease will expire: %s", lease.run_id, exc)
        else:
            self._wake()  # claimable at once: claim it again, unless the writer is silent still

    def _log_claims(self, claims: Claims) -> None:
        """Say what a claim did: each run claimed, after which attempt was lost (a crash leaves
        no other trace), and each run ended instead: out of attempts, or cancelled."""
        limit = "" if self._max_attempts is None else f" of {self._max_attempts}"
        for lease, attempt in claims.leased:
            lost = claims.lost.get(lease.run_id)
            version = "" if lease.version is None else f", version {lease.version!r}"
            if lost is None:
                logger.info(
                    "claimed run %s (attempt %d%s, epoch %d%s)",
                    lease.run_id,
                    attempt,
                    limit,
                    lease.epoch,
                    version,
                )
            else:
                logger.warning(
                    "claimed run %s (attempt %d%s, epoch %d%s) after an attempt %s",
                    lease.run_id,
                    attempt,
                    limit,
                    lease.epoch,
                    version,
                    lost.summary(),
                )
        for run_id, status, reason in claims.ended:
            if status is RunStatus.FAILED:
                logger.error("run %s failed: %s", run_id, reason)
            else:
                logger.info("run %s %s: %s", run_id, status.value, reason)

    async def _work_ahead(self) -> bool:
        """Whether a run will become claimable by itself (with ``until_idle``, when idle)."""
        try:
            ahead: bool = await self._storage.read(self._storage.store.work_ahead, self._versions)
        except StorageError as exc:  # an outage is no reason to stop: look again after a poll
            logger.warning("worker: looking for work ahead failed (%s); looking again", exc)
            return True
        return ahead

    async def _idle_time(self) -> float:
        """Seconds until the next poll: the poll interval, or less if a run (a deadline, a wake
        time, a backoff) becomes due sooner, so that it is resumed then, not a poll late."""
        try:
            due_in = await self._storage.read(self._storage.store.next_due_in, self._versions)
        except StorageError:
            return self._poll_interval
        return self._poll_interval if due_in is None else min(self._poll_interval, due_in / 1000)

    def _claim_order(self) -> Versions | None:
        """The versions this claim reads, in order: with several, each claim starts with the
        next one, so that a version with many due runs never starves the others."""
        versions = self._versions
        if versions is None or len(versions) == 1:
            return versions
        self._turn = (self._turn + 1) % len(versions)
        return versions[self._turn :] + versions[: self._turn]

    async def _note_skipped(self) -> None:
        """When idle, at most once per poll: say how many due runs this worker leaves alone for
        their version (a version nobody serves shows here, and nowhere else)."""
        if self._versions is None or trio.current_time() < self._skips_counted_at + self._poll_interval:
            return
        self._skips_counted_at = trio.current_time()
        try:
            skipped: int = await self._storage.read(self._storage.store.skipped_for_version, self._versions)
        except StorageError as exc:
            logger.warning("worker: counting the runs due for other versions failed (%s)", exc)
            return
        if skipped:
            logger.info(
                "worker serving version(s) %s: skipped %s%d due run(s) of other versions",
                ", ".join(shown(version) for version in self._versions),
                "at least " if skipped >= SKIPPED_CAP else "",
                skipped,
            )

    async def _free_slots(self) -> list[object]:
        """Wait for one free handler slot, then take every other free one too, so that one
        transaction can claim as many runs as there is room for."""
        slots = [object()]
        await self._limiter.acquire_on_behalf_of(slots[0])
        while True:
            slot = object()
            try:
                self._limiter.acquire_on_behalf_of_nowait(slot)
            except trio.WouldBlock:
                return slots
            slots.append(slot)

    def _release_slots(self, slots: list[object]) -> None:
        for slot in slots:
            self._limiter.release_on_behalf_of(slot)

    async def _handle(self, lease: Lease, attempt: int, slot: object, submitted_at: float) -> None:
        try:
            async with owned_run(
                self._db,
                lease,
                submitted_at=submitted_at,
                suspend_after=self._suspend_after,
                in_worker=True,
                attempt=attempt,
            ) as run:
                try:
                    if self._resource_factory is None:
                        await self._handler(run)
                    else:
                        await self._handler(run, self._resources)
                except (BudgetExceeded, ExceptionGroup) as exc:
                    exceeded = only_budget_exceeded(exc)
                    if exceeded is None:  # a group that holds other errors too
                        await self._record_failure(run, attempt, exc)
                    # Not a failure: the run waits, with no process, until its budget is raised.
                    elif not await run._suspend_for_budget(exceeded):
                        logger.info("run %s: %s, but its budget was raised meanwhile", run.id, exceeded)
                    return
                except LeaseLost as exc:
                    if run._lifecycle.lost is not None:
                        raise  # this run's own lease is gone: nothing to record, nobody to back off
                    # Another run's lease, lost inside the handler: an ordinary failure here.
                    await self._record_failure(run, attempt, exc)
                    return
                except Exception as exc:
                    await self._record_failure(run, attempt, exc)
                    return
                except BaseException:
                    # Suspended, or cancelled by stop() or a shutdown: the run did not fail, so
                    # the attempt its claim counted is given back.
                    run._refund_attempt = True
                    raise
                if (finished := run._lifecycle.finished) is None:
                    run._release_delay_ms = self._backoff_ms(attempt)
                    logger.info(
                        "run %s: handler returned without ending the run; released, claimable again %s",
                        run.id,
                        _when(run._release_delay_ms),
                    )
                else:
                    logger.info("run %s: %s", run.id, finished.value)
        except RunCancelled as exc:
            logger.info("%s", exc)
        except LeaseLost as exc:
            logger.warning("run %s: lease lost: %s", lease.run_id, exc)
        except Exception:
            logger.exception("run %s: handler failed while recording its failure", lease.run_id)
        finally:
            self._limiter.release_on_behalf_of(slot)
            # The run may be due again at a new time (a suspension, a backoff): look again.
            self._wake()

    def _backoff_ms(self, attempt: int) -> int:
        return math.ceil(self._backoff.delay(attempt) * 1000)

    async def _record_failure(self, run: Run, attempt: int, exc: Exception) -> None:
        if (finished := run._lifecycle.finished) is not None:  # nothing to retry, nor to write
            logger.warning("run %s: the handler raised after the run %s: %r", run.id, finished.value, exc)
            return
        give_up = self._max_attempts is not None and attempt >= self._max_attempts
        delay_ms = None if give_up else self._backoff_ms(attempt)
        error = f"{type(exc).__module__}.{type(exc).__qualname__}"
        # If recording fails, the run is still released with this delay, not at once.
        run._release_delay_ms = delay_ms or 0
        failure = {"attempt": attempt, "error_type": error, "message": str(exc)[:_MAX_ERROR_MESSAGE]}
        reason = exhausted_reason(attempt, self._max_attempts or attempt, f"failed: {error}: {exc}")
        await run._end_ownership(
            self._storage.store.record_attempt_failure,
            failure,
            delay_ms,
            reason[:_MAX_ERROR_MESSAGE],
            ends_run=RunStatus.FAILED if delay_ms is None else None,
        )
        if delay_ms is None:
            logger.error("run %s failed: %s", run.id, reason)
        else:
            logger.warning("run %s: attempt %d failed (%r); retry %s", run.id, attempt, exc, _when(delay_ms))


async def _answered(writer: _threads.DatabaseThread) -> None:
    """Return once ``writer`` has answered a no-op queued behind what it holds (or failed it:
    an answer too). A cancellation ends the wait at once, without waiting for the writer."""
    flight = _requests.Flight()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_abandon_when_cancelled, flight)
        with _requests.flying(flight), contextlib.suppress(StorageError):
            await _threads.submit(writer, _no_op, ())
        nursery.cancel_scope.cancel()


async def _abandon_when_cancelled(flight: _requests.Flight) -> None:
    try:
        await trio.sleep_forever()
    finally:
        # A submitted call waits for its answer even when cancelled; abandoning it does not.
        flight.abandon(lambda: StorageError("the wait for a database writer was given up"))


def _no_op(tx: object) -> None:
    """An operation that writes nothing: its answer says the writer answers."""
