"""Durable named steps and durable sleep, fenced by the run's lease."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import zincir
from zincir._database import storage

from .conftest import ManualClock
from .helpers import running_python, scalar

STEP_IN_A_PROCESS = """
    import sys, trio, zincir
    path, ledger, run_id = sys.argv[1], sys.argv[2], (sys.argv[3] if len(sys.argv) > 3 else None)
    async def charge(amount):
        with open(ledger, "a") as f:
            f.write(f"charged {amount}\\n")
        return {"receipt": "r-1", "amount": amount}
    async def main():
        async with zincir.open_run(path, run_id) as run:
            print(run.id, flush=True)
            print(await run.step("charge", charge, 42), flush=True)
    trio.run(main)
"""


def run_process(*args: str) -> list[str]:
    with running_python(STEP_IN_A_PROCESS, *args) as proc:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out.splitlines()


async def test_a_completed_step_does_not_run_again_in_a_new_process(db_path: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    run_id, first = await trio.to_thread.run_sync(run_process, str(db_path), str(ledger))
    _, second = await trio.to_thread.run_sync(run_process, str(db_path), str(ledger), run_id)
    assert first == second == "{'amount': 42, 'receipt': 'r-1'}"
    assert ledger.read_text() == "charged 42\n"
    assert scalar(db_path, "SELECT epoch FROM steps WHERE name = 'charge'") == 1


class StepError(Exception):
    pass


async def test_a_failing_step_runs_again_on_the_next_call(db: zincir.Database) -> None:
    calls: list[int] = []

    async def flaky(n: int) -> int:
        calls.append(n)
        if len(calls) == 1:
            raise StepError("first try fails")
        return n * 2

    async with zincir.open_run(db) as run:
        with pytest.raises(StepError):
            await run.step("flaky", flaky, 21)
        assert await run.step("flaky", flaky, 21) == 42
        assert await run.step("flaky", flaky, 21) == 42
    assert calls == [21, 21]


async def test_a_result_that_is_not_json_leaves_the_step_unfinished(db: zincir.Database) -> None:
    results: list[object] = [object(), "fine"]

    async def produce() -> object:
        return results.pop(0)

    async with zincir.open_run(db) as run:
        with pytest.raises(zincir.InvalidArgument, match="step 'produce'"):
            await run.step("produce", produce)
        assert await run.step("produce", produce) == "fine"


async def test_a_step_names_what_it_refuses(db: zincir.Database) -> None:
    # run.step checks its common case first and spells out what it refuses only then.
    def plain() -> int:
        return 1

    async def number(value: int) -> int:
        return value

    async with zincir.open_run(db) as run:
        with pytest.raises(zincir.InvalidArgument, match=f"run {run.id}: step name"):
            await run.step("", number, 1)
        with pytest.raises(zincir.InvalidArgument, match="the function of step 'plain'"):
            await run.step("plain", plain)  # type: ignore[arg-type]
        with pytest.raises(zincir.InvalidArgument, match="the result of step 'huge' is not a JSON value"):
            await run.step("huge", number, 10**5000)  # more digits than int's text conversion takes
        deep: list[object] = []
        for _ in range(100):
            deep = [deep]
        # Too deep: said once, not wrapped in "is not a JSON value" (the depth check's error is a
        # ValueError too).
        with pytest.raises(zincir.InvalidArgument) as refused:
            await run.step("deep", number, deep)
        assert str(refused.value) == (
            f"run {run.id}: the result of step 'deep' nests lists and objects deeper than 100 levels"
        )
        assert await run.step("ints", number, -7) == -7
        assert await run.step("bools", number, True) is True  # a bool is no int here: JSON true
    async with zincir.open_run(db, run.id) as again:  # what was stored, decoded
        assert await again.step("ints", number, 0) == -7
        assert await again.step("bools", number, 0) is True


async def test_the_same_step_cannot_run_twice_at_once(db: zincir.Database) -> None:
    release = trio.Event()
    started = trio.Event()
    calls = 0

    async def slow() -> str:
        nonlocal calls
        calls += 1
        started.set()
        await release.wait()
        return "done"

    async with zincir.open_run(db) as run, trio.open_nursery() as nursery:
        nursery.start_soon(run.step, "slow", slow)
        await started.wait()
        with pytest.raises(zincir.StepAlreadyRunning, match=f"run {run.id}: step 'slow'"):
            await run.step("slow", slow)
        release.set()
    assert calls == 1


async def test_a_step_completed_while_another_task_loads_the_done_steps_is_not_run_again(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two tasks of one body take their first steps at once, so each reads which steps are done.
    # The second read is made before the first task stores its step, and answered after it.
    store = storage(db).store
    read_done_steps = store.completed_step_names
    reads: list[list[str]] = []
    first_read, second_queued = threading.Event(), threading.Event()
    second_read, stored_x = threading.Event(), threading.Event()

    def in_order(tx: Any, run_id: str) -> list[str]:
        names: list[str] = read_done_steps(tx, run_id)
        reads.append(names)
        if len(reads) == 1:
            first_read.set()
            assert second_queued.wait(10), "the second read never came"
        else:
            second_read.set()
            assert stored_x.wait(10), "the first task never stored its step"
        return names

    monkeypatch.setattr(store, "completed_step_names", in_order)
    calls: list[str] = []

    async def x() -> str:
        calls.append("x")
        await trio.to_thread.run_sync(second_read.wait, 10)  # not stored before the second read
        return "x"

    async def y() -> str:
        return "y"

    async with zincir.open_run(db) as run:

        async def first() -> None:
            await run.step("x", x)
            stored_x.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await trio.to_thread.run_sync(first_read.wait, 10)  # its read is on the reader thread
            nursery.start_soon(run.step, "y", y)
            await trio.testing.wait_all_tasks_blocked()  # the second read waits behind it
            second_queued.set()
        assert reads == [[], []]  # neither read saw x
        assert await run.step("x", x) == "x"
        await run.complete()
    assert calls == ["x"]


async def test_a_takeover_reruns_an_unfinished_step_and_refuses_the_old_owner(db: zincir.Database) -> None:
    old_may_finish = trio.Event()
    old_started = trio.Event()
    old_outcome: list[BaseException] = []

    async def old_work() -> str:
        old_started.set()
        with trio.CancelScope(shield=True):  # a step that ignores cancellation to the end
            await old_may_finish.wait()
        return "old"

    async def new_work() -> str:
        return "new"

    async with trio.open_nursery() as nursery:

        async def old_owner(task_status: trio.TaskStatus[str]) -> None:
            try:
                async with zincir.open_run(db) as run:
                    task_status.started(run.id)
                    await run.step("work", old_work)
            except zincir.LeaseLost as exc:
                old_outcome.append(exc)

        run_id = await nursery.start(old_owner)
        await old_started.wait()
        async with zincir.open_run(db, run_id, force=True) as new:
            assert await new.step("work", new_work) == "new"
            old_may_finish.set()
    assert len(old_outcome) == 1
    assert scalar(db, "SELECT result FROM steps") == '"new"'
    assert scalar(db, "SELECT epoch FROM steps") == 2


async def test_a_stale_owner_cannot_complete_a_step(db: zincir.Database) -> None:
    async with zincir.open_run(db) as first:
        stale = first._lease
    async with zincir.open_run(db, stale.run_id):
        with pytest.raises(zincir.LeaseLost, match="fenced"):
            await db._write(db._store.complete_step, stale, "s", '"x"', 0)


async def test_steps_work_in_a_plain_workflow(db_path: Path) -> None:
    calls: list[tuple[int, int]] = []

    async def add(a: int, b: int) -> tuple[int, int]:
        calls.append((a, b))
        return (a + b, len(calls))  # a tuple: what comes back is the stored JSON, a list

    async def must_not_run(*args: object) -> object:
        raise AssertionError(f"a completed step ran again with {args}")

    async with zincir.open_database(db_path) as db:
        async with zincir.open_run(db, role="workflow") as run:
            assert await run.step("add", add, 1, 2) == [3, 1]
            await run.sleep("pause", 0)
            # The second call of a completed step returns the stored value: not fn's value for
            # these arguments, and fn is not called at all.
            assert await run.step("add", add, 10, 20) == [3, 1]
            assert await run.step("add", must_not_run, 5) == [3, 1]
            assert await run.step("double", add, 3, 3) == [6, 2]
            assert calls == [(1, 2), (3, 3)]
        # A new owner of the same run, in the same process.
        async with zincir.open_run(db, run.id) as again:
            assert again.epoch == 2
            assert await again.step("add", must_not_run) == [3, 1]
            assert await again.step("double", must_not_run) == [6, 2]
    # The database closed and opened again, as a restarted process would.
    async with zincir.open_database(db_path) as reopened, zincir.open_run(reopened, run.id) as last:
        assert await last.step("double", must_not_run) == [6, 2]
        assert await last.step("add", must_not_run) == [3, 1]
        await last.complete()
    assert calls == [(1, 2), (3, 3)]
    assert scalar(
        db_path, "SELECT group_concat(result, ' ') FROM (SELECT result FROM steps ORDER BY name)"
    ) == ("[3,1] [6,2]")


# -- sleep --------------------------------------------------------------------------------------------


async def test_the_first_sleep_call_wins_and_only_the_remainder_is_waited(
    clocked_db: zincir.Database, clock: ManualClock
) -> None:
    async with zincir.open_run(clocked_db, lease_ttl=3600) as run:
        with trio.move_on_after(0.05):
            await run.sleep("nap", 1000)
        clock.advance(999.5)  # 500 ms of the stored 1000 s remain
        start = trio.current_time()
        await run.sleep("nap", 5000)  # another duration: the stored wake time still holds
        waited = trio.current_time() - start
        assert 0.49 <= waited < 3.0
        start = trio.current_time()
        await run.sleep("nap", 5000)  # completed: returns at once, not after 0.5 s again
        assert trio.current_time() - start < 0.25


async def test_lease_loss_cancels_a_sleep(db: zincir.Database) -> None:
    lost = trio.Event()
    async with trio.open_nursery() as nursery:

        async def sleeper(task_status: trio.TaskStatus[str]) -> None:
            try:
                async with zincir.open_run(db, lease_ttl=0.3) as run:
                    task_status.started(run.id)
                    await run.sleep("long", 3600)
            except zincir.LeaseLost:
                lost.set()

        run_id = await nursery.start(sleeper)
        async with zincir.open_run(db, run_id, force=True):
            with trio.fail_after(5):
                await lost.wait()
    assert scalar(db, "SELECT completed_at FROM timers") is None


SLEEP_IN_A_PROCESS = """
    import sys, trio, zincir
    path = sys.argv[1]
    async def main():
        async with zincir.open_run(path, lease_ttl=30) as run:
            print(run.id, flush=True)
            await run.sleep("nap", 3600.0)
            print("woke", flush=True)
    trio.run(main)
"""


async def test_a_sleep_interrupted_by_sigkill_waits_only_the_remainder(db_path: Path) -> None:
    with running_python(SLEEP_IN_A_PROCESS, str(db_path)) as proc:
        assert proc.stdout is not None
        run_id = (await trio.to_thread.run_sync(proc.stdout.readline)).strip()
        with trio.fail_after(10):
            while scalar(db_path, "SELECT count(*) FROM timers") == 0:  # another process's write
                await trio.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        await trio.to_thread.run_sync(proc.wait)
    wake_at = scalar(db_path, "SELECT wake_at FROM timers")
    assert isinstance(wake_at, int)
    # The hour's sleep was killed at once; resume it when, by the database's clock, all but
    # half a second of it has passed (the clock runs on from there at the wall clock's pace).
    shift = wake_at - 500 - zincir.wall_clock_ms()

    def an_hour_later() -> int:
        return zincir.wall_clock_ms() + shift

    async with (
        zincir.open_database(db_path, clock=an_hour_later) as db,
        zincir.open_run(db, run_id, force=True) as run,
    ):
        with trio.fail_after(10):  # the whole hour again would end here
            await run.sleep("nap", 3600.0)
    # ... and not sooner than the stored wake time, by the same clock.
    assert scalar(db_path, "SELECT completed_at >= wake_at FROM timers") == 1
