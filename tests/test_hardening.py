"""Regression tests for faults found by attacking the core (issue 12), one section per fault.

Each test failed on the code before its fix.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import zincir
from zincir._json import MAX_DEPTH

from .conftest import ManualClock
from .helpers import dump
from .test_database import writes_on_the_thread


def nested(depth: int) -> Any:
    """A list nested ``depth`` levels deep: [[[...]]]."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


async def noop() -> None:
    return None


# -- 1. every accepted JSON value decodes everywhere zincir reads it ---------------------------


def _recurse(frames: int, then: Callable[[], Any]) -> Any:
    return then() if frames == 0 else _recurse(frames - 1, then)


@pytest.mark.parametrize("depth", [MAX_DEPTH - 3, MAX_DEPTH + 1, 500, 900, 960, 985])
async def test_a_deep_value_is_refused_or_readable_everywhere(db: zincir.Database, depth: int) -> None:
    async with zincir.open_run(db) as run:
        before = dump(db)
        try:
            await run.record_response("", [zincir.ToolCall("c1", "tool", nested(depth))], "tool_use")
        except zincir.InvalidArgument:
            assert depth > MAX_DEPTH - 3
            assert dump(db) == before
        else:
            assert depth <= MAX_DEPTH - 3
            assert (await run.state()).events[-1].payload["args"] == nested(depth)
            await db.state(run.id)
            await db.events(run.id)
            assert [p.call.id for p in await run.pending_tools()] == ["c1"]


@pytest.mark.parametrize("depth", [MAX_DEPTH, MAX_DEPTH + 1, 980])
async def test_a_deep_config_never_makes_the_run_list_unreadable(db: zincir.Database, depth: int) -> None:
    if depth > MAX_DEPTH:
        with pytest.raises(zincir.InvalidArgument, match="deeper than"):
            async with zincir.open_run(db, config=nested(depth)):
                pass
        assert await db.runs() == []
    else:
        async with zincir.open_run(db, config=nested(depth)) as run:
            await run.complete()
        assert (await db.runs())[0].config == nested(depth)


async def test_acceptance_does_not_depend_on_the_callers_stack(db: zincir.Database) -> None:
    # Encoding happens in the caller; run it under a deep stack: the same value is accepted.
    async with zincir.open_run(db) as run:
        payload = _recurse(700, lambda: zincir._json.encode(nested(MAX_DEPTH), what="x", limit=10**6))
        assert payload.count("[") == MAX_DEPTH
        await run.step("deep", _deep_result)
        assert await run.step("deep", _deep_result) == nested(MAX_DEPTH)


async def _deep_result() -> Any:
    return nested(MAX_DEPTH)


# -- 2. an outer cancel scope never changes what the body raised -------------------------------


class BodyError(Exception):
    pass


async def test_a_bodys_own_error_survives_an_outer_cancellation(db: zincir.Database) -> None:
    with pytest.raises(BodyError, match="from finally"), trio.move_on_after(0.01):
        async with zincir.open_run(db):
            try:
                await trio.sleep_forever()
            finally:
                raise BodyError("from finally")


async def test_a_cancelled_body_leaves_as_a_bare_cancelled(db: zincir.Database) -> None:
    seen: list[BaseException] = []
    with trio.CancelScope() as scope:
        try:
            async with zincir.open_run(db):
                scope.cancel()
                await trio.sleep_forever()
        except BaseException as exc:
            seen.append(exc)
            raise
    assert scope.cancelled_caught
    assert [type(e) for e in seen] == [trio.Cancelled]
    (run,) = await db.runs()
    assert run.status is zincir.RunStatus.RUNNING  # released, not ended


# -- 3. another run's LeaseLost is an ordinary handler failure ---------------------------------


async def test_a_handler_failing_with_another_runs_lease_loss_backs_off(
    clocked_db: zincir.Database, clock: ManualClock
) -> None:
    db = clocked_db
    async with zincir.open_run(db) as handled:
        handled_id = handled.id
    clock.advance(1)  # the handled run is due first
    async with zincir.open_run(db) as other:
        other_id = other.id

    async def handler(run: zincir.Run) -> None:
        assert run.id == handled_id
        worker.stop()  # one claim is enough to see what happens to the failure
        async with zincir.open_run(db, other_id) as fenced:
            async with zincir.open_run(db, other_id, force=True):
                pass
            await fenced.step("x", noop)  # raises LeaseLost for *other*

    worker = zincir.ResumeWorker(
        db, handler, poll_interval=0.01, max_concurrency=1, backoff=zincir.Backoff(initial=60, jitter=0)
    )
    with trio.fail_after(10):
        await worker.run()
    failures = [e for e in await db.events(handled_id) if e.type is zincir.EventType.ATTEMPT_FAILED]
    assert len(failures) == 1
    assert failures[0].payload["error_type"] == "zincir.LeaseLost"
    assert failures[0].payload["next_attempt_at"] >= db.clock() + 50_000


# -- 4. unencodable text is refused before anything runs ---------------------------------------

SURROGATE = "bad\ud800name"


def _surrogate_calls() -> list[tuple[str, Callable[[zincir.Run], Awaitable[Any]]]]:
    async def verify(state: zincir.CheckpointState) -> zincir.Verification:
        return zincir.Verification(True)

    return [
        ("tool call id", lambda r: r.record_response("", [zincir.ToolCall(SURROGATE, "t")], "x")),
        ("tool name", lambda r: r.record_response("", [zincir.ToolCall("c", SURROGATE)], "x")),
        ("step name", lambda r: r.step(SURROGATE, _effect)),
        ("sleep name", lambda r: r.sleep(SURROGATE, 0)),
        ("result call id", lambda r: r.record_tool_result(SURROGATE, 1)),
        ("checkpoint call id", lambda r: r.checkpoint(SURROGATE, zincir.CheckpointState(), verify)),
    ]


EFFECTS: list[str] = []


async def _effect() -> str:
    EFFECTS.append("ran")
    return "done"


@pytest.mark.parametrize(("what", "call"), _surrogate_calls(), ids=[w for w, _ in _surrogate_calls()])
async def test_a_lone_surrogate_is_invalid_and_nothing_runs(
    db: zincir.Database, what: str, call: Callable[[zincir.Run], Awaitable[Any]]
) -> None:
    EFFECTS.clear()
    async with zincir.open_run(db) as run:
        before = dump(db)
        with pytest.raises(zincir.InvalidArgument, match="surrogate"):
            await call(run)
        assert dump(db) == before
    assert EFFECTS == []


@pytest.mark.parametrize("field", ["role", "provider"])
async def test_a_lone_surrogate_in_a_new_runs_description_is_invalid(db: zincir.Database, field: str) -> None:
    with pytest.raises(zincir.InvalidArgument, match="surrogate"):
        async with zincir.open_run(db, **{field: SURROGATE}):
            pass
    assert await db.runs() == []
    with pytest.raises(zincir.InvalidArgument, match="surrogate"):
        await db.runs(role=SURROGATE)


# -- 5. verifiers and step functions are checked before anything is written --------------------


def _sync_verifier(state: zincir.CheckpointState) -> zincir.Verification:
    EFFECTS.append("sync verifier ran")
    return zincir.Verification(True)


def _sync_step() -> str:
    EFFECTS.append("sync step ran")
    return "x"


@pytest.mark.parametrize("verify", [None, "verify", _sync_verifier])
async def test_a_verifier_that_is_not_async_is_refused_before_a_candidate_is_stored(
    db: zincir.Database, verify: Any
) -> None:
    EFFECTS.clear()
    async with zincir.open_run(db) as run:
        state = zincir.CheckpointState(completed=["a"])
        await run.record_response("", [zincir.ToolCall("cp", zincir.SUBMIT_CHECKPOINT, state.to_json())], "x")
        before = dump(db)
        with pytest.raises(zincir.InvalidArgument, match="verifier must be an async function"):
            await run.checkpoint("cp", state, verify)
        assert dump(db) == before
        assert await run.pending_checkpoint() is None
    assert EFFECTS == []


async def test_a_plain_step_function_is_refused_before_it_runs(db: zincir.Database) -> None:
    EFFECTS.clear()
    async with zincir.open_run(db) as run:
        with pytest.raises(zincir.InvalidArgument, match="async function"):
            await run.step("s", _sync_step)  # type: ignore[arg-type]
        # A partial of an async function, and an object with an async __call__, are fine.
        import functools

        class Probe:
            async def __call__(self, value: int) -> int:
                return value

        assert await run.step("partial", functools.partial(_echo, 3)) == 3
        assert await run.step("callable", Probe(), 4) == 4
    assert EFFECTS == []


async def _echo(value: int) -> int:
    return value


# -- 6. a valid file in a bad situation is a StorageError, not a SchemaError --------------------


async def test_a_locked_zincir_file_is_busy_not_foreign(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with zincir.open_database(db_path):
        pass
    monkeypatch.setattr(zincir._sqlite._connection, "BUSY_TIMEOUT_MS", 100)
    holder = sqlite3.connect(db_path, isolation_level=None)
    try:
        holder.execute("PRAGMA locking_mode = EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(zincir.DatabaseBusy, match="locked"):
            async with zincir.open_database(db_path):
                pass
    finally:
        holder.close()
    async with zincir.open_database(db_path) as db:  # and it opens once the lock is gone
        assert await db.runs() == []


@contextlib.contextmanager
def read_only_view(directory: Path, view: Path) -> Iterator[Path]:
    view.mkdir()
    try:
        subprocess.run(["mount", "--bind", str(directory), str(view)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"this test needs root to bind-mount a read-only view: {exc}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], check=True, capture_output=True)
        yield view
    finally:
        subprocess.run(["umount", str(view)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="bind-mounting a read-only view needs root")
async def test_a_zincir_file_on_a_read_only_mount_is_a_storage_error(tmp_path: Path) -> None:
    source = tmp_path / "data"
    source.mkdir()
    async with zincir.open_database(source / "z.db"):
        pass
    with read_only_view(source, tmp_path / "ro") as view:
        with pytest.raises(zincir.StorageError, match="read-only") as info:
            async with zincir.open_database(view / "z.db"):
                pass
        assert not isinstance(info.value, zincir.SchemaError)


# -- 7. out-of-range numbers and wrong types are InvalidArgument --------------------------------

HUGE = 2**64


@pytest.mark.parametrize(
    "call",
    [
        lambda db, run: db.events(run.id, after=HUGE),
        lambda db, run: db.events(run.id, limit=HUGE),
        lambda db, run: db.runs(limit=HUGE),
        lambda db, run: run.sleep("nap", 10**400),
        lambda db, run: run.record_response("", None, "x"),
        lambda db, run: run.record_response("", "c1", "x"),
    ],
    ids=["events-after", "events-limit", "runs-limit", "sleep", "tool-calls-none", "tool-calls-str"],
)
async def test_out_of_range_input_is_invalid(db: zincir.Database, call: Any) -> None:
    async with zincir.open_run(db) as run:
        before = dump(db)
        with pytest.raises(zincir.InvalidArgument):
            await call(db, run)
        assert dump(db) == before


async def test_huge_durations_and_counts_are_invalid(db: zincir.Database) -> None:
    with pytest.raises(zincir.InvalidArgument, match="lease_ttl"):
        async with zincir.open_run(db, lease_ttl=10**400):
            pass
    for kwargs in ({"initial": 10**400}, {"maximum": HUGE}, {"factor": 10**400}):
        with pytest.raises(zincir.InvalidArgument, match="Backoff"):
            zincir.Backoff(**kwargs)
    with pytest.raises(zincir.InvalidArgument, match="max_attempts"):
        zincir.ResumeWorker(db, noop, max_attempts=HUGE)
    with pytest.raises(zincir.InvalidArgument, match="poll_interval"):
        zincir.ResumeWorker(db, noop, poll_interval=10**400)
    assert await db.runs() == []


@pytest.mark.parametrize("path", [123, None, b"bytes.db"])
async def test_open_database_refuses_what_is_not_a_path(path: Any) -> None:
    with pytest.raises(zincir.InvalidArgument, match="path"):
        async with zincir.open_database(path):
            pass


# -- 8. a dead database thread fails its callers instead of hanging them -----------------------


class ThreadKiller(BaseException):
    """Not an Exception: what no operation's error handling expects."""


class DeadlyClock:
    def __init__(self) -> None:
        self.armed = False

    def __call__(self) -> int:
        if self.armed and threading.current_thread().name.startswith("zincir-writer"):
            raise ThreadKiller("the writer thread's clock exploded")
        return zincir.wall_clock_ms()


async def test_a_dead_writer_thread_fails_callers_promptly_and_close_finishes(db_path: Path) -> None:
    clock = DeadlyClock()
    with trio.fail_after(10):
        async with zincir.open_database(db_path, clock=clock) as db, zincir.open_run(db) as run:
            writes_on_the_thread(db)
            await run.step("before", noop)
            clock.armed = True
            with pytest.raises(zincir.StorageError, match="thread stopped unexpectedly"):
                await run.step("in flight", noop)
            with pytest.raises(zincir.StorageError, match="thread stopped unexpectedly"):
                await run.step("later", noop)
            # Reads go to the other thread, which still works.
            assert [s.type for s in (await db.events(run.id))][:1] == [zincir.EventType.STATE_TRANSITION]
            # Cancellation still works while the body waits on something else.
            with trio.move_on_after(0.01) as scope:
                await trio.sleep_forever()
            assert scope.cancelled_caught
    conn = sqlite3.connect(db_path)
    try:  # nothing of the failed steps was committed
        names = [r[0] for r in conn.execute("SELECT name FROM steps ORDER BY name")]
    finally:
        conn.close()
    assert names == ["before"]


# -- 9. a block whose lease was taken before it ended raises LeaseLost ------------------------


async def test_a_block_fenced_before_its_next_heartbeat_ends_in_lease_lost(db: zincir.Database) -> None:
    async def steal(run_id: str) -> int:
        async with zincir.open_run(db, run_id, force=True) as thief:
            await thief.step("stolen", noop)
            return thief.epoch

    with pytest.raises(zincir.LeaseLost, match="gone when the block ended"):
        async with zincir.open_run(db, lease_ttl=30.0) as run:
            thief_epoch = await steal(run.id)
    (record,) = await db.runs()
    assert record.status is zincir.RunStatus.RUNNING
    assert thief_epoch == run.epoch + 1
