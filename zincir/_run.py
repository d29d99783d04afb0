"""Runs: :class:`Run`, what a run's body calls (the log, tools, checkpoints, steps, sleeps, waits,
children). Its base classes hold the model's responses and the tools' calls
(:mod:`zincir._tool_calls`), the checkpoints (:mod:`zincir._checkpointing`), the heartbeat that
keeps its lease (:mod:`zincir._heartbeat`) and the loop its waits run, with the suspension
(:mod:`zincir._waiting`); where the owner is with its lease is its :mod:`zincir._lifecycle`.
Taking the lease and the block around the body are in :mod:`zincir._ownership`; the durable
nursery, in :mod:`zincir._children`."""

from __future__ import annotations

import functools
import logging
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Final, TypeVar, Unpack, cast, final

import trio

from . import _faults
from ._budget import Budget, Usage, exceeded_error, judge
from ._checkpointing import _Checkpointing
from ._children import Children, _cancels_children
from ._database import Database, storage
from ._errors import (
    InvalidArgument,
    LeaseLost,
    RunTerminal,
    StepAlreadyRunning,
    TransientConflict,
    UnfinishedWork,
    WaitTimeout,
    ZincirError,
)
from ._heartbeat import _LeaseKeeping
from ._json import JSONValue, decode, encode
from ._lifecycle import Happened, Lifecycle, Phase
from ._requests import Flight, current_flight
from ._run_support import ChildOptions, _budget_row, _check_provider
from ._store import ApprovalOutcome, JoinOutcome, Lease, NewChild
from ._streams import DEFAULT_FLUSH_BYTES, DEFAULT_FLUSH_INTERVAL, Stream, open_stream
from ._tool_calls import _ToolCalls
from ._tracing import new_run_context, now_ns
from ._types import Approval, DurableState, RunRecord, RunStatus
from ._validation import (
    canonical_run_id,
    check_async_callable,
    check_call_id,
    check_fingerprints,
    check_name,
    check_seconds,
    check_text,
    check_version,
    is_async_function,
    is_name,
)
from ._waiting import _Waiting

__all__ = ["Run"]

logger = logging.getLogger("zincir")

T = TypeVar("T")

# Values that are their own JSON round trip: encoding and decoding one gives an equal value of
# the same type (floats are finite here: NaN and infinities are refused before they are stored).
_OWN_JSON: Final = frozenset({int, str, float, bool, type(None)})

# Run.config before its first read (a config may itself be JSON null).
_UNREAD: Final = object()


@final
class Run(_ToolCalls, _Checkpointing, _LeaseKeeping, _Waiting):
    """A run this process owns, inside ``async with open_run(...)``. No public constructor.

    Every method but :meth:`state` checks, inside its own transaction, that this owner's lease
    still holds; once the lease is lost each of them raises :class:`LeaseLost`.
    """

    id: str
    """The run's id (a canonical lowercase UUID string)."""
    _running_steps: set[str]
    _completed_steps: set[str] | None
    _in_worker: bool
    _started_calls: set[str]
    _nurseries: set[Children]
    _streams: dict[str, Stream]
    _config: JSONValue
    _submit_write: Callable[..., Awaitable[Any]]  # the storage's write, routed by this run's id
    _now: Callable[[], float]

    def __init__(self, *_: object, **__: object) -> None:
        raise TypeError("runs come from zincir.open_run() or a ResumeWorker")

    @classmethod
    def _create(cls, db: Database, lease: Lease, submitted_at: float) -> Run:
        self = object.__new__(cls)
        self.id = lease.run_id
        self._db = db
        self._storage = storage(db)
        self._store = self._storage.store
        self._submit_write = self._storage.writes_for(self.id)
        # Trio's clock, asked straight (trio.current_time() finds it through two more calls).
        self._now = trio.lowlevel.current_clock().current_time
        self._lease = lease
        # The database calls of the block: abandoned together once the lease is known lost.
        self._flight = Flight(current_flight())
        # When (Trio time) the last write that set the lease's expiry and was confirmed was
        # submitted: the acquisition, then each renewal. The expiry is later than that + TTL.
        self._confirmed_at = submitted_at
        self._watch_ask = None  # the lease watch's next call, while one is asked for
        self._heartbeat_done = None  # set once the heartbeat's task, if it started, has ended
        self._news = False  # news for the owner not looked at yet (see _hear_news)
        self._news_event = None  # while the heartbeat waits for news
        self._renewal_sent_at = None  # while a renewal is in flight, when it was submitted
        # The last renewal's failure, while it was refused for a lock another transaction held.
        self._renewal_refused = None
        # While the heartbeat sleeps, when it means to wake (from the start: it may not get to run).
        self._heartbeat_due_at = submitted_at + lease.ttl_ms / 3000
        self._lifecycle = Lifecycle()  # holding the lease, then how it was given up (or lost)
        self._body_scope = trio.CancelScope()
        self._heartbeat_scope = trio.CancelScope(shield=True)
        self._running_steps = set()
        self._started_calls = set()  # tools started through this Run (a PendingToolCall is a snapshot)
        self._nurseries = set()  # open durable nurseries (complete() refuses while one has spawns to send)
        self._streams = {}  # open streams by name (complete() and fail() store and close them first)
        self._completed_steps = None  # loaded by the first step()
        self._release_delay_ms = 0  # how long after release the run may be claimed again
        self._refund_attempt = False  # set by a worker whose handler was cancelled
        # Set by a worker: a wait longer than this many seconds suspends the run (see _suspend).
        self._suspend_after = None
        self._suspending = None  # the task writing a suspension, and when it is done
        # The waits the body's tasks are in right now, in the order they began: a suspension
        # records them all, and whichever completes first wakes the run (docs/waits.md).
        self._open_waits = {}
        # Under a worker: the tasks inside a wait, and how many of the body's other store
        # operations are in flight and since when none is. A run suspends only once its body has
        # been quiet for suspend_after, so that a task between two waits (a nursery sending its
        # children, then joining them) is in its next wait when the suspension records them.
        self._waiting_tasks = {}
        self._busy = 0
        self._looking = 0  # reads of the body in flight: no work done, but a task under way
        self._quiet_since = -math.inf
        self._cancel_reason = None  # a cancellation the heartbeat found requested
        self._budget_stop = None  # the wall time the heartbeat found spent
        self._in_worker = False  # a worker suspends a run over budget instead of raising
        self._config = _UNREAD  # decoded from the lease at the first read of run.config
        self._trace = None  # this attempt's spans, while tracing is on (docs/tracing.md)
        return self

    def __repr__(self) -> str:
        return f"<zincir.Run {self.id} epoch={self._lease.epoch}>"

    @property
    def epoch(self) -> int:
        """The lease epoch this owner holds; it grows by one at every acquisition."""
        return self._lease.epoch

    @property
    def fencing_token(self) -> str:
        """``<run id>:<epoch>``, for tools that must refuse a fenced (older) owner."""
        return self._lease.fencing_token

    @property
    def database(self) -> Database:
        """The database the run lives in."""
        return self._db

    @property
    def config(self) -> JSONValue:
        """The run's config as stored (``open_run(config=...)``, ``spawn(config=...)``; ``{}``
        when none was given). It was read with the lease and never changes, so this is no
        database read; the same object is returned each time: treat it as read-only."""
        if self._config is _UNREAD:
            self._config = decode(self._lease.config_json)
        return self._config

    @property
    def version(self) -> str | None:
        """The version of the agent the run belongs to (None: none), as it was when the lease
        was taken: nobody moves a run to another version while its lease holds
        (docs/versions.md)."""
        return self._lease.version

    # -- guards ---------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._lifecycle.phase is Phase.HOLDING and self._now() < self._stop_at():
            return  # the common case, on every write: what _past_deadline() finds first
        # After a stall of the loop, the body may get to run before the deadline's task does.
        self._past_deadline()
        if (lost := self._lifecycle.lost) is not None:
            raise LeaseLost(lost)
        if (finished := self._lifecycle.finished) is not None:
            raise RunTerminal(f"run {self.id} is already {finished.value}")

    async def _write(self, fn: Any, *args: Any) -> Any:
        counted = self._begin_activity()  # not a context manager: this is every write's path
        try:
            submit = self._submit_write
            if _faults.armed:  # a crash test's fault point (docs/crash-testing.md); off: this check
                return await _faults.around_commit(self, fn, args, lambda: self._as_owner(submit, fn, *args))
            return await self._as_owner(submit, fn, *args)
        finally:
            self._end_activity(counted)

    async def _write_unnumbered(self, fn: Any, *args: Any) -> Any:
        """A write that is no crash test's boundary: a stream's flush, whose number depends on
        timing, so that the boundaries of a run are the same in every copy of a crash test."""
        counted = self._begin_activity()
        try:
            return await self._as_owner(self._submit_write, fn, *args)
        finally:
            self._end_activity(counted)

    async def _read(self, fn: Any, *args: Any) -> Any:
        counted = self._begin_activity()
        try:
            return await self._as_owner(self._storage.read, fn, *args)
        finally:
            self._end_activity(counted)

    async def _as_owner(self, submit: Callable[..., Awaitable[Any]], fn: Any, *args: Any) -> Any:
        """Run a store operation with this owner's lease, which the operation checks. While
        another transaction holds a row it needs (nothing was written: PostgreSQL refuses to
        wait for a row, see zincir/_store/_tx.py), try again, for as long as this owner holds
        the lease: a row held past the deadline costs this run its lease (LeaseLost), and no
        other run."""
        delay = 0.001
        while True:
            self._check_usable()
            try:
                return await submit(fn, self._lease, *args)
            except LeaseLost as exc:
                await self._unless_suspended_beside()
                # Suspended beside a write shielded from the body's cancellation (a nursery's
                # batch): the refusal is no loss of the lease.
                if not self._lifecycle.suspended:
                    self._lose(str(exc))
                raise
            except TransientConflict:
                pass  # the loop's _check_usable() ends it once the lease is lost
            await trio.sleep(delay)
            delay = min(2 * delay, 0.1)

    def _encode(self, value: JSONValue, what: str) -> str:
        return encode(value, what=f"run {self.id}: {what}", limit=self._db.max_payload_bytes)

    # -- reading --------------------------------------------------------------------------

    async def state(self) -> DurableState:
        """The latest accepted checkpoint and the events after it, from one snapshot.

        "After it" means after its decision event and the ``tool_result`` that answered its
        ``submit_checkpoint`` call (seq > decision + 1): a fresh context starts from the
        checkpoint itself. Without an accepted checkpoint, the whole log. A plain read: it
        works after the lease is lost or the run has ended.
        """
        run, checkpoint, events = await self._body_read(self._store.durable_state, self.id)
        return DurableState(run, checkpoint, events)

    # -- budgets --------------------------------------------------------------------------

    async def usage(self) -> Usage | None:
        """The run's spend against its :class:`Budget` (None if it has none): tokens, cost,
        model and tool calls, wall time since it was created, and the loop and progress
        counters, as the database has them. A plain read."""
        usage: Usage | None = await self._body_read(self._store.budget_usage, self.id)
        return usage

    async def check_budget(self) -> None:
        """Raise :class:`BudgetExceeded` (:class:`LoopDetected`, :class:`NoProgress`) if a
        limit is reached: call it before the next model call."""
        usage = await self.usage()
        reached = None if usage is None else judge(usage)
        if reached is not None:
            raise exceeded_error(self.id, reached)

    # -- durable steps and sleeps ---------------------------------------------------------

    async def step(self, name: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` once for this run: if step ``name`` completed before (in
        this or any earlier owner), return its stored result without calling ``fn``.

        The result must be JSON; it is stored (fenced by the lease) before it is returned,
        and what is returned is the stored JSON value. If ``fn`` raises, nothing is stored
        and the next call runs it again.
        """
        if not is_name(name):  # what each check is about is spelled out only for its error
            check_name(name, f"run {self.id}: step name")
        if not is_async_function(fn):
            check_async_callable(fn, f"run {self.id}: the function of step {name!r}")
        self._check_usable()
        if self._completed_steps is None:
            # Only the lease holder completes steps, so one read per owner suffices: after it,
            # a new step costs one write, not a read and a write.
            completed = set(await self._body_read(self._store.completed_step_names, self.id))
            if self._completed_steps is None:
                self._completed_steps = completed
            else:  # another task of the body read them first, and may have completed more since
                self._completed_steps |= completed
        if name in self._completed_steps:
            stored = await self._body_read(self._store.step_result, self.id, name)
            assert stored is not None, "completed steps are never deleted"
            return cast(T, decode(stored))
        if name in self._running_steps:
            raise StepAlreadyRunning(f"run {self.id}: step {name!r} is already running")
        self._running_steps.add(name)
        counted = self._begin_activity()  # a run does not suspend while a step's function runs
        try:
            if self._trace is None:
                value, result, stored = await self._run_step(name, fn, args)
            else:
                with self._trace.step(name) as span:
                    value, result, stored = await self._run_step(name, fn, args)
                    if self._trace.content:
                        self._trace.set_result(span, "zincir.step.result", decode(stored))
        finally:
            self._end_activity(counted)
            self._running_steps.discard(name)
        self._completed_steps.add(name)
        if stored == result and type(value) in _OWN_JSON:
            return value  # what decoding the stored JSON would give back, without decoding it
        return cast(T, decode(stored))

    async def _run_step(self, name: str, fn: Callable[..., Awaitable[T]], args: Any) -> tuple[T, str, str]:
        """Run a step's function and store its result: (its value, its JSON, the stored JSON)."""
        started = self._now()
        value = await fn(*args)
        result = encode(
            value,
            what=lambda: f"run {self.id}: the result of step {name!r}",
            limit=self._db.max_payload_bytes,
        )
        elapsed_ms = math.floor((self._now() - started) * 1000)
        stored: str = await self._write(self._store.complete_step, name, result, elapsed_ms)
        return value, result, stored

    async def sleep(self, name: str, seconds: float) -> None:
        """Sleep durably: the wake time is stored first (the first call with ``name`` wins),
        so after a restart only the remainder is waited; a completed sleep returns at once.
        Under a :class:`ResumeWorker`, a sleep with more than ``suspend_after`` left suspends
        the run, together with the body's other waits, unless one of them can complete now
        (see docs/waits.md)."""
        check_name(name, f"run {self.id}: sleep name")
        duration = check_seconds(seconds, f"run {self.id}: the duration of sleep {name!r}")
        began_ns = now_ns()
        with self._waiting_on("sleep", name):
            remaining_ms, completed = await self._write(
                self._store.schedule_timer, name, math.ceil(duration * 1000)
            )
            if completed:
                return
            if remaining_ms > 0:
                with self._traced_wait("sleep", name, began_ns) as traced:
                    await self._sleep_or_suspend(name, trio.current_time() + remaining_ms / 1000)
                    await self._write(self._store.complete_timer, name)
                    traced.value = None
                return
            await self._write(self._store.complete_timer, name)

    # -- waiting for the world ------------------------------------------------------------

    async def wait_for_signal(
        self,
        name: str,
        signal: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a durable deadline, not a cancel scope
    ) -> JSONValue:
        """Wait for a signal of topic ``signal`` (see :func:`zincir.send_signal`) and return its
        payload. A *named* wait, like a step: the first time wait ``name`` completes, the oldest
        unconsumed signal of the topic is bound to it (a ``signal_received`` event), and every
        later call with ``name`` returns that payload at once, in this owner or any later one.

        ``timeout`` (seconds) is stored as an absolute deadline on the first call; past it the
        call raises :class:`WaitTimeout`, recorded, so later calls with ``name`` raise it too.
        A signal sent before the wait began is received. Under a :class:`ResumeWorker` the run
        suspends once the wait has lasted the worker's ``suspend_after``.
        """
        check_name(name, f"run {self.id}: wait name")
        topic = check_name(signal, f"run {self.id}: signal name")
        timeout_ms = self._timeout_ms(timeout, f"the timeout of wait {name!r}")

        async def decide() -> tuple[bool, JSONValue, int | None]:
            outcome = await self._write(self._store.await_signal, name, topic, timeout_ms)
            if outcome.state == "timed_out":
                raise WaitTimeout(
                    f"run {self.id}: wait {name!r} for signal {topic!r} passed its deadline"
                    f" ({outcome.deadline} ms)"
                )
            if outcome.state == "received":
                return True, decode(outcome.payload_json), None
            return False, None, outcome.deadline

        ready = functools.partial(self._storage.read, self._store.signal_ready, self.id, topic, name)
        return await self._wait(decide, ready, "signal", name)

    async def wait_for_approval(
        self,
        call_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a durable deadline, not a cancel scope
    ) -> Approval:
        """Ask for approval of the pending tool intent ``call_id`` and wait for the decision.

        The first call records the request (an ``approval_requested`` event with the intent's
        ``args_hash``, and the deadline if ``timeout`` is given); the decision, made by
        :func:`zincir.decide_approval` or ``zincir approve`` / ``zincir deny``, enters the log as
        ``approval_decided``. Later calls return the recorded decision at once. Past the
        deadline: :class:`WaitTimeout`. zincir runs no tools: a denied call gets whatever result
        you record for it. Under a :class:`ResumeWorker` the run suspends once the wait has
        lasted the worker's ``suspend_after``.
        """
        check_call_id(call_id, f"run {self.id}: call_id")
        timeout_ms = self._timeout_ms(timeout, f"the timeout of the approval of {call_id!r}")

        async def decide() -> tuple[bool, Approval | None, int | None]:
            outcome: ApprovalOutcome = await self._write(self._store.await_approval, call_id, timeout_ms)
            return self._decision(
                outcome, "decided", outcome.approval, f"the approval of tool call {call_id!r}"
            )

        ready = functools.partial(self._storage.read, self._store.approval_ready, self.id, call_id)
        approval: Approval = await self._wait(decide, ready, "approval", call_id)
        return approval

    # -- child runs -----------------------------------------------------------------------

    async def spawn(self, name: str, **options: Unpack[ChildOptions]) -> str:
        """Create the child run ``name`` of this run, once: a repeat (after a restart, say)
        returns the same child's id. The child is ``pending`` and unleased: any worker may claim
        it. A ``child_spawned`` event enters this run's log. ``budget`` is the child's own: what
        it spends is not its parent's. ``version`` and ``fingerprints``: this run's unless
        given (docs/versions.md). The options, and what each is when not given:
        :class:`ChildOptions`."""
        child = self._new_child(name, **options)
        ids: list[str] = await self._write(self._store.spawn_children, [child])
        return ids[0]

    def _new_child(
        self,
        name: str,
        *,
        role: str = "agent",
        provider: str = "",
        config: JSONValue = None,
        budget: Budget | None = None,
        version: object = None,
        fingerprints: object = None,
    ) -> NewChild:
        """The child ``name`` to create, its options checked (their defaults are these)."""
        check_name(name, f"run {self.id}: child name")
        limits = _budget_row(budget)
        marks = check_fingerprints(fingerprints, f"run {self.id}: the fingerprints of child {name!r}")
        return NewChild(
            name,
            str(uuid.uuid4()),
            check_name(role, f"run {self.id}: the role of child {name!r}"),
            _check_provider(provider),
            self._encode({} if config is None else config, f"the config of child {name!r}"),
            limits,
            check_version(version, f"run {self.id}: the version of child {name!r}"),
            None if marks is None else self._encode(marks, f"the fingerprints of child {name!r}"),
            None if self._trace is None else new_run_context(self._db._tracing),
        )

    async def join(
        self,
        child_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a durable deadline, not a cancel scope
    ) -> RunRecord:
        """Wait until child run ``child_id`` has ended (completed, failed or cancelled) and return
        it, with its :attr:`~RunRecord.result`. The first time it is seen ended, ``child_joined``
        enters this run's log; later calls return at once. ``timeout`` works as for
        :meth:`wait_for_signal` (a stored deadline, then :class:`WaitTimeout`). Under a
        :class:`ResumeWorker` the run suspends once the join has lasted ``suspend_after``, and the
        child's end wakes it."""
        child_id = canonical_run_id(child_id, f"run {self.id}: child_id")
        timeout_ms = self._timeout_ms(timeout, f"the timeout of the join of {child_id}")

        async def decide() -> tuple[bool, RunRecord | None, int | None]:
            outcome: JoinOutcome = await self._write(self._store.await_child, child_id, timeout_ms)
            return self._decision(outcome, "ended", outcome.child, f"the join of child {child_id}")

        ready = functools.partial(self._storage.read, self._store.child_ready, self.id, child_id)
        child: RunRecord = await self._wait(decide, ready, "child", child_id)
        return child

    async def cancel_child(self, child_id: str, reason: str) -> None:
        """Cancel child run ``child_id`` and its live descendants (see :func:`zincir.cancel_run`);
        join it to wait until it has stopped."""
        child_id = canonical_run_id(child_id, f"run {self.id}: child_id")
        reason = check_text(reason, f"run {self.id}: the reason", max_chars=4000, allow_empty=True)
        await self._write(self._store.cancel_child, child_id, reason)

    def stream(
        self,
        name: str,
        *,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        flush_bytes: int = DEFAULT_FLUSH_BYTES,
    ) -> AbstractAsyncContextManager[Stream]:
        """A named stream of this run's output: ``async with run.stream("answer") as out:``,
        then ``await out.send(chunk)`` for each JSON chunk, read live by
        :func:`zincir.read_stream` in any process. Chunks are stored in one fenced write per
        ``flush_interval`` (seconds) at most, at once when ``flush_bytes`` of JSON are waiting,
        and when the block ends, which closes the stream. A later owner of the run (after a
        crash, a lost lease, a suspension) that writes the same stream starts its next attempt,
        whose first chunk readers see flagged ``restarted`` (docs/streams.md)."""
        return open_stream(self, name, flush_interval, flush_bytes)

    @asynccontextmanager
    async def children(self) -> AsyncIterator[Children]:
        """A durable nursery: ``async with run.children() as nursery:`` joins every child
        spawned through it when the block ends cleanly, and cancels them when it raises. Spawns
        are named, so a handler restarted in the middle of the block finds the same children.
        A run ended inside the block (:meth:`complete`, :meth:`fail`) leaves it with nothing
        more to do; a Trio cancellation of the block cancels no child (docs/waits.md)."""
        body_error: BaseException | None = None
        async with trio.open_nursery() as background:  # where spawn_soon's batches are sent
            nursery = Children._create(self, background)
            try:
                yield nursery
            except BaseException as exc:  # raised below: never wrapped in an ExceptionGroup
                body_error = exc
            # Waited for here, so that the nursery's own exit has nothing left to wait for.
            body_error = await nursery._close(body_error)
        if self._lifecycle.finished is not None:
            # Completed (no child was live: complete() saw to it) or failed (the store cancelled
            # the live ones with the run): nothing is left to join or cancel, and no write could.
            if nursery._error is not None and not isinstance(nursery._error, RunTerminal):
                logger.warning("run %s: spawning children failed: %s", self.id, nursery._error)
            if body_error is not None:
                raise body_error
            return
        error = body_error or nursery._error
        if nursery._error is not None and error is not nursery._error and not self._lifecycle.suspended:
            logger.warning("run %s: spawning children failed too: %s", self.id, nursery._error)
        # A Trio cancellation (a suspension, a stop) is no Exception: the children go on, and the
        # restarted block finds them again.
        if isinstance(error, Exception) and _cancels_children(error):
            for child_id in nursery.spawned:
                try:
                    await self.cancel_child(child_id, f"the parent's nursery raised {type(error).__name__}")
                except ZincirError as failure:
                    logger.warning("run %s: cancelling child %s failed: %s", self.id, child_id, failure)
        if error is not None:
            raise error
        await nursery._join_all()

    # -- ending ---------------------------------------------------------------------------

    async def complete(self, result: JSONValue = None) -> None:
        """End the run as completed, with ``result`` (JSON, for its parent: see
        :attr:`RunRecord.result`). Refused (:class:`UnfinishedWork`) while tool intents, a
        candidate or a child run are open, or while a nursery has spawns not yet created."""
        for nursery in self._nurseries:
            if nursery._error is not None:  # children it was asked for do not exist
                raise nursery._error
            if nursery._unsent():
                raise UnfinishedWork(
                    f"run {self.id} cannot complete: children queued by spawn_soon are not created yet"
                )
        result_json = None if result is None else self._encode(result, "the result")
        await self._finish(RunStatus.COMPLETED, {"from": "running", "to": "completed"}, result_json)

    async def fail(self, reason: str) -> None:
        """End the run as failed, recording ``reason``; its live child runs are cancelled."""
        if not isinstance(reason, str):
            raise InvalidArgument(f"run {self.id}: the failure reason must be a string, not {reason!r}")
        await self._finish(RunStatus.FAILED, {"from": "running", "reason": reason, "to": "failed"})

    async def _finish(
        self, status: RunStatus, transition: dict[str, str], result_json: str | None = None
    ) -> None:
        payload = self._encode(transition, "the final transition")
        for stream in list(self._streams.values()):  # what they were sent is stored before the end
            await stream._flush(close=True)
        await self._end_ownership(self._store.finish, status, payload, result_json, ends_run=status)

    async def _end_ownership(self, fn: Any, *args: Any, ends_run: RunStatus | None = None) -> Any:
        """Run a write that gives up the lease (and ends the run in ``ends_run``, if given),
        then stop renewing it."""
        self._lifecycle.note(Happened.ENDING_BEGAN)
        try:
            result = await self._write(fn, *args)
        except BaseException:
            self._lifecycle.note(Happened.ENDING_FAILED)
            raise
        if ends_run is None:
            self._lifecycle.note(Happened.ENDED_RELEASED)
        else:
            self._lifecycle.finish(ends_run)
        self._stop_heartbeat()
        return result
