"""Paths of the durability contract (docs/durability.md) that nothing else in the suite runs.

Each test drives the real SQLite file and the real database threads into one failure or
edge path: a batch that SQLite aborts part-way, a real ``SQLITE_BUSY`` from another
connection, a worker handler whose own lease is taken, every method of a fenced ``Run``,
pending runs, the claim order, what leaves a run block, parents, the shortest lease, and
``zincir worker`` with a handler it cannot load.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from click.testing import CliRunner

import zincir
from zincir._cli import main
from zincir._heartbeat import STOP_MARGIN

from .conftest import ManualClock
from .helpers import dump, read_state, scalar
from .test_database import writes_on_the_thread

STATE_TRANSITION = zincir.EventType.STATE_TRANSITION


def lease_row(path: Path | str, run_id: str) -> tuple[Any, ...]:
    conn = sqlite3.connect(path)
    try:
        return tuple(
            conn.execute(
                "SELECT status, lease_owner, lease_epoch, lease_expires_at, last_seq FROM agent_runs"
                " WHERE id = ?",
                (run_id,),
            ).fetchone()
        )
    finally:
        conn.close()


class HeldWriter:
    """Holds the writer thread inside an operation (that writes nothing) until released, so
    that the operations submitted meanwhile queue up and run as one group-commit batch."""

    def __init__(self, then: Callable[[Any], None] | None = None) -> None:
        self._entered = threading.Event()
        self._opened = threading.Event()
        self._then = then

    def hold(self, tx: Any) -> None:
        self._entered.set()
        assert self._opened.wait(10), "the test never released the writer"
        if self._then is not None:
            self._then(tx)

    async def wait_entered(self) -> None:
        assert await trio.to_thread.run_sync(self._entered.wait, 10)

    def release(self) -> None:
        self._opened.set()


# -- group commit: SQLite aborts a shared batch ------------------------------------------------


async def test_a_disk_filling_part_way_through_a_batch_gives_each_neighbour_its_own_outcome(
    db: zincir.Database, db_path: Path
) -> None:
    traced: list[str] = []  # every statement the writer's connection runs, in order
    outcomes: dict[str, object] = {}
    big = "x" * 200_000  # about 50 pages more than the disk will have room for

    def cap_the_disk(tx: Any) -> None:
        # A few pages of room: the small appends fit, the big one cannot.
        (pages,) = tx.one("PRAGMA page_count")
        tx.execute(f"PRAGMA max_page_count = {pages + 4}")

    async def append(run: zincir.Run, name: str, content: str) -> None:
        try:
            outcomes[name] = await run.record_response(content, [], "end")
        except zincir.StorageError as exc:
            outcomes[name] = exc

    writes_on_the_thread(db)  # the held writer queues the three into one of the thread's batches
    async with contextlib.AsyncExitStack() as stack:
        runs = {name: await stack.enter_async_context(zincir.open_run(db)) for name in ("a", "big", "b")}
        before = {name: lease_row(db_path, run.id) for name, run in runs.items()}
        held = HeldWriter(then=cap_the_disk)
        await db._write(lambda tx: tx.conn.set_trace_callback(traced.append))
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(db._write, held.hold)
                await held.wait_entered()
                # Queued in this order behind the held writer: one batch, the big one between.
                for name, content in (("a", "small a"), ("big", big), ("b", "small b")):
                    nursery.start_soon(append, runs[name], name, content)
                    await trio.testing.wait_all_tasks_blocked()
                held.release()
            statements = traced[traced.index("COMMIT") + 1 :]  # after the commit that set the trace
        finally:
            await db._write(lambda tx: tx.conn.set_trace_callback(None))

        # Each operation got its own outcome: the small neighbours committed, the big one failed.
        assert outcomes["a"] == 1 and outcomes["b"] == 1
        assert isinstance(outcomes["big"], zincir.StorageError)
        assert "the database or disk is full" in str(outcomes["big"])
        # The shared transaction was aborted by SQLite, and every operation ran again alone.
        control = [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT")]
        assert control == [
            "BEGIN IMMEDIATE",  # the held operation, which caps the disk
            "COMMIT",
            "BEGIN IMMEDIATE",  # the shared batch: no COMMIT, SQLite rolled it back
            "BEGIN IMMEDIATE",  # a, alone
            "COMMIT",
            "BEGIN IMMEDIATE",  # big, alone: full again
            "BEGIN IMMEDIATE",  # b, alone
            "COMMIT",
        ]
        # No savepoint: the shared batch takes them only to run again after an operation failed,
        # and here SQLite had rolled the whole transaction back.
        assert statements.count("SAVEPOINT operation") == 0
        # Nothing of the big one was written, not even its seq: the run is exactly as before.
        assert lease_row(db_path, runs["big"].id) == before["big"]
        for name in ("a", "b"):  # committed: a separate connection sees them
            assert lease_row(db_path, runs[name].id)[4] == 1
            assert scalar(
                db_path, "SELECT payload FROM events WHERE run_id = ? AND seq = 1", (runs[name].id,)
            )
        assert scalar(db_path, "SELECT count(*) FROM events WHERE run_id = ?", (runs["big"].id,)) == 1

        # The failure was the operation's, not the run's: with room again it commits, gap-free.
        await db._write(lambda tx: tx.execute("PRAGMA max_page_count = 1073741823"))
        assert await runs["big"].record_response(big, [], "end") == 1
        for run in runs.values():
            await run.complete()
    assert [e.seq for e in (await read_state(db, runs["big"].id)).events] == [0, 1, 2]


# -- a real SQLITE_BUSY ---------------------------------------------------------------------------


@pytest.fixture
async def busy_db(db_path: Path, clock: ManualClock) -> AsyncIterator[zincir.Database]:
    """A database on an injected clock whose writer waits 200 ms for a lock, not 5 s."""
    async with zincir.open_database(db_path, clock=clock) as database:
        database._writers[0]._session.busy_timeout_ms = 200  # type: ignore[attr-defined]
        yield database


@contextlib.contextmanager
def write_locked(path: Path) -> Iterator[None]:
    """Another connection holds the file's write lock (``BEGIN IMMEDIATE``) for the block."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


class RenewalFailures(logging.Handler):
    """Counts the heartbeat's failed renewals (it logs each) and lets a test await a count."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self._waiters: list[tuple[int, trio.Event]] = []

    def emit(self, record: logging.LogRecord) -> None:  # on the Trio thread: the heartbeat task
        if "lease renewal failed" in record.getMessage():
            self.messages.append(record.getMessage())
            for count, event in self._waiters:
                if len(self.messages) >= count:
                    event.set()

    async def wait_for(self, count: int) -> None:
        event = trio.Event()
        self._waiters.append((count, event))
        if len(self.messages) >= count:
            event.set()
        with trio.fail_after(20):
            await event.wait()


@pytest.fixture
def renewal_failures() -> Iterator[RenewalFailures]:
    handler = RenewalFailures()
    logger = logging.getLogger("zincir")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


async def test_a_write_under_another_connections_write_lock_gets_database_busy(
    busy_db: zincir.Database, db_path: Path
) -> None:
    async with zincir.open_run(busy_db, lease_ttl=3600) as run:
        before = dump(db_path)
        with write_locked(db_path):
            started = trio.current_time()
            with pytest.raises(zincir.DatabaseBusy, match="locked") as info:
                await run.record_response("blocked", [], "end")
            waited = trio.current_time() - started
            # Reads go on under the lock (WAL), including the run's own.
            assert [e.seq for e in (await run.state()).events] == [0]
            assert await run.pending_tools() == []
        assert isinstance(info.value, zincir.StorageError)
        assert busy_db.path in str(info.value)
        assert 0.15 <= waited < 4  # the busy timeout was waited out: 200 ms, not 5 s
        assert dump(db_path) == before
        # Busy is transient: the run is still owned, and the same write now commits.
        assert await run.record_response("unblocked", [], "end") == 1
        await run.complete()


async def test_the_heartbeat_under_a_held_lock_retries_and_gives_up_at_its_deadline(
    busy_db: zincir.Database, db_path: Path, renewal_failures: RenewalFailures
) -> None:
    # The lock is held for good: each renewal waits out the 200 ms busy timeout and fails, and is
    # retried, until the owner's deadline (the TTL minus its margin, counted from when the write
    # that took the lease was submitted, on this process's clock: the injected database clock
    # stays still). Then the body is stopped, before the lease could have expired.
    ttl = 3.0
    before = trio.current_time()
    with pytest.raises(zincir.LeaseLost, match="no renewal was confirmed") as info:
        async with zincir.open_run(busy_db, lease_ttl=ttl) as run:  # renews every 1 s
            _, _, _, expires_at, _ = lease_row(db_path, run.id)
            with write_locked(db_path):
                try:
                    with trio.fail_after(10):
                        await trio.sleep_forever()  # cancelled at the deadline
                finally:
                    stopped = trio.current_time()
    assert len(renewal_failures.messages) >= 2  # retried, not a loss at the first failure
    assert (1 - STOP_MARGIN) * ttl <= stopped - before < ttl
    assert type(info.value) is zincir.LeaseLost
    assert f"run {run.id}: the lease of epoch 1 was given up" in str(info.value)
    assert lease_row(db_path, run.id)[3] == expires_at  # no renewal got through the lock
    with pytest.raises(zincir.LeaseLost):
        await run.record_response("after the loss", [], "end")


async def test_the_heartbeat_recovers_when_the_lock_is_released_before_its_deadline(
    busy_db: zincir.Database, clock: ManualClock, db_path: Path, renewal_failures: RenewalFailures
) -> None:
    # Real time: renews every 2 s and stops at 4.8 s, so after the first renewal (at 2 s) and its
    # first retry fail, a loaded machine has more than a second left for the retry that gets
    # through (with a 3 s lease it once had too little, at a load of 7 on 2 cores).
    async with zincir.open_run(busy_db, lease_ttl=6) as run:
        _, _, _, expires_at, _ = lease_row(db_path, run.id)
        with write_locked(db_path):
            await renewal_failures.wait_for(2)  # retried sooner and sooner
            clock.advance(0.2)
        # The next retry gets through (the writer thread commits it; the frozen clock cannot
        # expire the lease meanwhile).
        with trio.fail_after(10):
            while lease_row(db_path, run.id)[3] == expires_at:
                await trio.sleep(0.005)
        assert lease_row(db_path, run.id)[3] == clock() + 6000
        clock.advance(5.9)  # past the original expiry, within the renewed one
        assert await run.record_response("still the owner", [], "end") == 1
        await run.complete()
    assert (await read_state(busy_db, run.id)).run.status is zincir.RunStatus.COMPLETED
    assert not [m for m in renewal_failures.messages if "expired" in m]


# -- a worker handler whose own lease is taken -------------------------------------------------------


@pytest.mark.parametrize("noticed_by", ["heartbeat", "write"])
async def test_a_handler_whose_lease_is_taken_is_cancelled_and_the_worker_goes_on(
    clocked_db: zincir.Database, noticed_by: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    db = clocked_db
    entered = trio.Event()
    taken = trio.Event()
    cancelled = trio.Event()
    caught: list[BaseException] = []
    handled: list[str] = []
    later_done = trio.Event()

    async def handler(run: zincir.Run) -> None:
        handled.append(run.id)
        if (await run.state()).run.config.get("later"):
            await run.complete()
            later_done.set()
            return
        entered.set()
        try:
            if noticed_by == "write":
                await taken.wait()
                try:
                    await run.record_response("too late", [], "end")
                except zincir.LeaseLost as exc:
                    caught.append(exc)  # even a handler that swallows the loss is stopped
            await trio.sleep_forever()
        finally:
            cancelled.set()

    async with zincir.open_run(db) as created:
        run_id = created.id
    # Heartbeat: renews every 0.1 s and notices the fence. Write: never renews in the test.
    ttl = 0.3 if noticed_by == "heartbeat" else 3600
    worker = zincir.ResumeWorker(db, handler, lease_ttl=ttl, poll_interval=3600, max_concurrency=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        with trio.fail_after(10):
            await entered.wait()
        async with zincir.open_run(db, run_id, force=True) as thief:
            taken.set()
            with trio.fail_after(10):
                await cancelled.wait()
            assert thief.epoch == 3  # created (1), claimed (2), taken (3)
            await thief.record_response("the new owner writes", [], "end")
            await thief.complete()
        async with zincir.open_run(db, config={"later": True}):
            pass  # released: the same worker must still claim and handle it
        with trio.fail_after(10):
            await later_done.wait()  # with one slot: the fenced handler gave its slot back
        worker.stop()
    assert handled[0] == run_id and len(handled) == 2
    if noticed_by == "write":
        [error] = caught
        assert "fenced by a newer owner" in str(error)
    types = [e.type for e in (await read_state(db, run_id)).events]
    assert zincir.EventType.ATTEMPT_FAILED not in types
    # The forced takeover recorded the attempt it fenced: lost, not failed.
    taken_over = [zincir.EventType.ATTEMPT_LOST, zincir.EventType.LEASE_TAKEN_OVER]
    assert types == [STATE_TRANSITION, *taken_over, zincir.EventType.LLM_CALL, STATE_TRANSITION]
    assert (await read_state(db, run_id)).run.status is zincir.RunStatus.COMPLETED
    assert any("lease lost" in r.getMessage() and run_id in r.getMessage() for r in caplog.records)


# -- every method of a Run whose lease was lost ------------------------------------------------------


class VerifierStop(Exception):
    pass


async def _undecided(state: zincir.CheckpointState) -> zincir.Verification:
    raise VerifierStop  # leaves the candidate undecided


calls_after_the_loss: list[str] = []


async def _must_not_run(*args: object) -> zincir.Verification:
    calls_after_the_loss.append(repr(args))
    return zincir.Verification(True)


_SOME_RUN = "00000000-0000-4000-8000-000000000000"
_PENDING = zincir.PendingToolCall(zincir.ToolCall("t1", "t"), 1, "tool_call:t1", "x:1", started=1)


async def _spawn_in_a_nursery(run: zincir.Run) -> None:
    async with run.children() as nursery:
        await nursery.spawn("kid")


async def _send_on_a_stream(run: zincir.Run) -> None:
    async with run.stream("answer") as out:
        await out.send("after the loss")


METHODS: dict[str, Callable[[zincir.Run, zincir.Checkpoint], Awaitable[object]]] = {
    "record_response": lambda r, c: r.record_response("x", [{"id": "new", "name": "t"}], "tool_use"),
    "pending_tools": lambda r, c: r.pending_tools(),
    "record_tool_result": lambda r, c: r.record_tool_result("t1", "result"),
    "checkpoint": lambda r, c: r.checkpoint("cp-2", zincir.CheckpointState(), _must_not_run),
    "pending_checkpoint": lambda r, c: r.pending_checkpoint(),
    "verify_checkpoint": lambda r, c: r.verify_checkpoint(c, _must_not_run),
    "step": lambda r, c: r.step("step", _must_not_run),
    "sleep": lambda r, c: r.sleep("nap", 0),
    "wait_for_signal": lambda r, c: r.wait_for_signal("w", "go", timeout=0),
    "wait_for_approval": lambda r, c: r.wait_for_approval("t1", timeout=0),
    "start_tool": lambda r, c: r.start_tool("t1"),
    "start_model_call": lambda r, c: r.start_model_call(10, model="m"),
    "execute": lambda r, c: r.execute(_PENDING, _must_not_run),
    "spawn": lambda r, c: r.spawn("kid"),
    "join": lambda r, c: r.join(_SOME_RUN),
    "cancel_child": lambda r, c: r.cancel_child(_SOME_RUN, "after the loss"),
    "children": lambda r, c: _spawn_in_a_nursery(r),
    "stream": lambda r, c: _send_on_a_stream(r),
    "complete": lambda r, c: r.complete(),
    "fail": lambda r, c: r.fail("after the loss"),
}


def test_every_public_run_method_is_checked_after_a_loss() -> None:
    public = {name for name in dir(zincir.Run) if not name.startswith("_")}
    properties = {"epoch", "fencing_token", "database", "config", "version"}  # and the attribute id
    plain_reads = {"state", "usage", "check_budget"}  # they work after the lease is gone, too
    assert public == {*METHODS, *plain_reads, *properties}


@pytest.mark.parametrize("method", list(METHODS))
async def test_every_run_method_raises_lease_lost_after_the_lease_is_lost(
    clocked_db: zincir.Database, db_path: Path, method: str
) -> None:
    db = clocked_db
    calls_after_the_loss.clear()
    async with trio.open_nursery() as nursery:

        async def old_owner(task_status: trio.TaskStatus[tuple[zincir.Run, zincir.Checkpoint]]) -> None:
            with pytest.raises(zincir.LeaseLost, match="fenced"):
                # Renews every 0.4 s, and must confirm a renewal within 0.96 s of real time even on
                # a busy machine (the injected database clock stands still; the deadline does not).
                async with zincir.open_run(db, lease_ttl=1.2) as run:
                    calls = [{"id": "t1", "name": "t"}, {"id": "cp-1", "name": zincir.SUBMIT_CHECKPOINT}]
                    await run.record_response("", calls, "tool_use")
                    await run.record_tool_result("t1", 0)
                    with pytest.raises(VerifierStop):
                        await run.checkpoint("cp-1", zincir.CheckpointState(), _undecided)
                    await run.record_response("", [{"id": "cp-2", "name": zincir.SUBMIT_CHECKPOINT}], "x")
                    candidate = await run.pending_checkpoint()
                    assert candidate is not None
                    task_status.started((run, candidate))
                    await trio.sleep_forever()  # until the heartbeat sees the fence

        old, candidate = await nursery.start(old_owner)
        async with zincir.open_run(db, old.id, force=True, lease_ttl=3600):
            pass
    # The old block has ended in LeaseLost; the Run object is still there.
    before = dump(db_path)
    with pytest.raises(zincir.LeaseLost, match=f"run {old.id}: the lease of epoch 1") as info:
        await METHODS[method](old, candidate)
    assert type(info.value) is zincir.LeaseLost
    assert calls_after_the_loss == []  # no step function or verifier ran
    assert dump(db_path) == before
    # state() is a plain read and still works.
    state = await old.state()
    assert state.run.id == old.id
    assert [e.seq for e in state.events] == list(range(len(state.events)))


# -- pending runs ---------------------------------------------------------------------------------


def insert_pending_run(path: Path, now: int, events: int = 0) -> str:
    """A pending, never-leased run as a raw row: zincir creates its own runs running."""
    run_id = str(uuid.uuid4())
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute(
                "INSERT INTO agent_runs (id, role, provider, config, created_at, updated_at, last_seq)"
                " VALUES (?, 'agent', '', '{\"goal\":\"g\"}', ?, ?, ?)",
                (run_id, now, now, events - 1),
            )
            for seq in range(events):
                conn.execute(
                    "INSERT INTO events (run_id, seq, type, payload, created_at)"
                    " VALUES (?, ?, 'llm_call', '{\"content\":\"before\"}', ?)",
                    (run_id, seq, now),
                )
    finally:
        conn.close()
    return run_id


@pytest.mark.parametrize("events", [0, 2])
async def test_acquiring_a_pending_run_starts_it_with_the_next_seq(
    clocked_db: zincir.Database, clock: ManualClock, db_path: Path, events: int
) -> None:
    run_id = insert_pending_run(db_path, clock(), events)
    assert (await read_state(clocked_db, run_id)).run.status is zincir.RunStatus.PENDING
    async with zincir.open_run(clocked_db, run_id) as run:
        assert run.epoch == 1
        state = await run.state()
        assert state.run.status is zincir.RunStatus.RUNNING
        last = state.events[-1]
        assert (last.seq, last.type, last.payload) == (
            events,
            STATE_TRANSITION,
            {"from": "pending", "to": "running"},
        )
        assert [e.seq for e in state.events] == list(range(events + 1))
        assert await run.record_response("next", [], "end") == events + 1
    # Taking it again finds it running: no second transition.
    async with zincir.open_run(clocked_db, run_id) as again:
        assert again.epoch == 2
    state = await read_state(clocked_db, run_id)
    assert [e.type for e in state.events].count(STATE_TRANSITION) == 1


async def test_a_worker_claiming_a_pending_run_starts_it(
    clocked_db: zincir.Database, clock: ManualClock, db_path: Path
) -> None:
    run_id = insert_pending_run(db_path, clock(), events=1)
    seen: list[zincir.DurableState] = []
    handled = trio.Event()

    async def handler(run: zincir.Run) -> None:
        seen.append(await run.state())
        await run.complete()
        handled.set()

    worker = zincir.ResumeWorker(clocked_db, handler, poll_interval=0.01)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        with trio.fail_after(10):
            await handled.wait()
        worker.stop()
    [state] = seen
    assert state.run.status is zincir.RunStatus.RUNNING  # as the handler saw it
    transition = state.events[-1]
    assert (transition.seq, transition.type, transition.payload) == (
        1,
        STATE_TRANSITION,
        {"from": "pending", "to": "running"},
    )
    final = await read_state(clocked_db, run_id)
    assert [(e.seq, e.payload.get("to")) for e in final.events if e.type == STATE_TRANSITION] == [
        (1, "running"),
        (2, "completed"),
    ]


# -- the claim order ----------------------------------------------------------------------------------


async def test_the_worker_claims_the_most_overdue_run_first(
    clocked_db: zincir.Database, clock: ManualClock, db_path: Path
) -> None:
    ids = []
    for _ in range(5):
        async with zincir.open_run(clocked_db) as run:
            ids.append(run.id)
        clock.advance(1)  # created one second apart
    a, b, c, d, later = ids
    now = clock()
    due = {a: now - 10_000, b: now - 40_000, c: now - 20_000, d: now - 40_000, later: now + 60_000}
    conn = sqlite3.connect(db_path)
    with conn:
        conn.executemany(
            "UPDATE agent_runs SET next_attempt_at = ? WHERE id = ?", [(t, i) for i, t in due.items()]
        )
    conn.close()
    order: list[str] = []
    all_done = trio.Event()

    async def handler(run: zincir.Run) -> None:
        order.append(run.id)
        await run.complete()
        if len(order) == 4:
            all_done.set()

    worker = zincir.ResumeWorker(clocked_db, handler, poll_interval=0.01, max_concurrency=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        with trio.fail_after(10):
            await all_done.wait()
        worker.stop()
    # Most overdue first; equally overdue runs oldest first; a run not yet due not at all.
    assert order == [b, d, c, a]
    assert lease_row(db_path, later)[:2] == ("running", None)
    assert scalar(db_path, "SELECT attempts FROM agent_runs WHERE id = ?", (later,)) == 0


# -- what leaves a run block --------------------------------------------------------------------------


class BodyError(Exception):
    pass


class Interrupt(BaseException):
    """Like KeyboardInterrupt or SystemExit: not an Exception."""


async def _child_raises() -> None:
    raise BodyError("from the body's own nursery")


async def _raise_from_own_nursery() -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_child_raises)


def _group() -> BaseException:
    return ExceptionGroup("two", [BodyError("one"), ValueError("two")])


def _base_group() -> BaseException:
    return BaseExceptionGroup("mixed", [BodyError("one"), Interrupt("two")])


@pytest.mark.parametrize(
    "make",
    [_group, _base_group, lambda: Interrupt("stop"), lambda: SystemExit(3), lambda: GeneratorExit()],
    ids=["ExceptionGroup", "BaseExceptionGroup", "BaseException", "SystemExit", "GeneratorExit"],
)
async def test_groups_and_base_exceptions_leave_the_block_unchanged(
    db: zincir.Database, db_path: Path, make: Callable[[], BaseException]
) -> None:
    raised = make()
    with pytest.raises(BaseException) as info:  # the identity is checked below
        async with zincir.open_run(db) as run:
            raise raised
    assert info.value is raised
    if isinstance(raised, BaseExceptionGroup):
        assert info.value.exceptions == raised.exceptions
    # The lease was released on the way out; the run stays claimable.
    status, owner, epoch, expires_at, _ = lease_row(db_path, run.id)
    assert (status, owner, epoch, expires_at) == ("running", None, 1, None)


async def test_a_group_from_the_bodys_own_nursery_leaves_the_block_unchanged(db: zincir.Database) -> None:
    with pytest.raises(ExceptionGroup) as info:
        async with zincir.open_run(db):
            await _raise_from_own_nursery()
    # Exactly the body's group: one BodyError, not a group wrapped in the run's nursery's group.
    [error] = info.value.exceptions
    assert type(error) is BodyError


# -- parents ---------------------------------------------------------------------------------------


async def test_a_parent_run_id_is_stored_and_returned(db: zincir.Database, db_path: Path) -> None:
    async with zincir.open_run(db, role="planner") as parent:
        async with zincir.open_run(db, role="worker", parent_run_id=parent.id.upper()) as child:
            assert (await child.state()).run.parent_run_id == parent.id  # canonical form
        assert (await parent.state()).run.parent_run_id is None
    assert (await db.state(child.id)).run.parent_run_id == parent.id
    records = {r.id: r for r in await db.runs()}
    assert records[child.id].parent_run_id == parent.id
    assert records[parent.id].parent_run_id is None
    assert scalar(db_path, "SELECT parent_run_id FROM agent_runs WHERE id = ?", (child.id,)) == parent.id


async def test_an_unknown_parent_run_id_is_refused_and_nothing_is_written(
    db: zincir.Database, db_path: Path
) -> None:
    async with zincir.open_run(db):
        pass  # the database is not empty
    unknown = "0b8c7d0e-5f59-4c1e-9d6a-2f3b4c5d6e7f"
    before = dump(db_path)
    with pytest.raises(zincir.RunNotFound, match=f"parent run {unknown}"):
        async with zincir.open_run(db, parent_run_id=unknown):
            raise AssertionError("the block must not run")
    assert dump(db_path) == before


# -- the shortest lease ------------------------------------------------------------------------------


async def test_the_minimum_lease_ttl_is_accepted_and_anything_shorter_refused(
    clocked_db: zincir.Database, clock: ManualClock, db_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    # Both clocks stand still (the database's, and Trio's, which the owner's deadline is kept
    # on): a 30 ms lease is kept here however slow the machine is.
    assert zincir.MIN_LEASE_TTL == 0.030
    async with zincir.open_run(clocked_db, lease_ttl=0.030) as run:
        assert lease_row(db_path, run.id)[3] == clock() + 30
        assert await run.record_response("on a 30 ms lease", [], "end") == 1
    zincir.ResumeWorker(clocked_db, _must_not_run, lease_ttl=0.030)
    before = dump(db_path)
    for too_short in (0.029, 0.0299, 0.0, -1):
        # The message says why: an owner stops with a fifth of its TTL left.
        with pytest.raises(zincir.InvalidArgument) as info:
            async with zincir.open_run(clocked_db, lease_ttl=too_short):
                raise AssertionError("the block must not run")
        assert f"lease_ttl must be at least 0.03 s, not {too_short!r}" in str(info.value)
        assert "shorter than about 1 s are for tests only" in str(info.value)
        assert "docs/leases.md" in str(info.value)
        with pytest.raises(zincir.InvalidArgument, match="lease_ttl"):
            async with zincir.open_run(clocked_db, run.id, lease_ttl=too_short):
                raise AssertionError("the block must not run")
        with pytest.raises(zincir.InvalidArgument, match="lease_ttl"):
            zincir.ResumeWorker(clocked_db, _must_not_run, lease_ttl=too_short)
    assert dump(db_path) == before


# -- `zincir worker` with a handler it cannot load ----------------------------------------------


BAD_HANDLERS_MODULE = "zincir_test_bad_handlers"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon_here", "expected MODULE:HANDLER, got 'no_colon_here'"),
        (":handler", "expected MODULE:HANDLER"),
        (f"{BAD_HANDLERS_MODULE}:", "expected MODULE:HANDLER"),
        ("zincir_no_such_module:handle", "No module named 'zincir_no_such_module'"),
        (f"{BAD_HANDLERS_MODULE}:missing", "has no attribute 'missing'"),
        (f"{BAD_HANDLERS_MODULE}:NOT_CALLABLE", "is not callable"),
    ],
)
def test_the_worker_refuses_a_handler_it_cannot_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, message: str
) -> None:
    (tmp_path / f"{BAD_HANDLERS_MODULE}.py").write_text("NOT_CALLABLE = 42\n")
    monkeypatch.chdir(tmp_path)  # the worker imports handlers from the current directory
    monkeypatch.setattr(sys, "path", list(sys.path))  # ... by adding it to sys.path
    database = tmp_path / "worker.db"
    try:
        result = CliRunner().invoke(
            main, ["worker", spec, "--db", str(database)], env={"ZINCIR_DATABASE_PATH": None}
        )
    finally:
        sys.modules.pop(BAD_HANDLERS_MODULE, None)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert re.search(r"Invalid value for '?HANDLER'?:", result.stderr)
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not database.exists()  # refused before the database was opened


def test_the_installed_zincir_worker_exits_2_on_a_bad_handler(tmp_path: Path) -> None:
    database = tmp_path / "worker.db"
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("zincir")),
            "worker",
            "zincir_no_such_module:handle",
            "--db",
            str(database),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},  # this checkout
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert "Usage: zincir worker" in proc.stderr
    assert "cannot load 'zincir_no_such_module:handle'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not database.exists()
