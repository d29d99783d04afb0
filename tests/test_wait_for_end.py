"""zincir.wait_for_end: a script waits for a run that workers (here or in other processes) end."""

from __future__ import annotations

import subprocess

import pytest
import trio

import zincir
from zincir import _ends

from .helpers import hearing_others, rows, start_python, trace_operations
from .test_suspension import until, working

# Takes the run, says so, then ends it as told on stdin ("complete" or "fail").
ENDS_WHEN_TOLD = """
    import sys, trio, zincir
    async def main():
        async with zincir.open_database(sys.argv[1]) as db, zincir.open_run(db, sys.argv[2]) as run:
            print("holding", flush=True)
            how = await trio.to_thread.run_sync(sys.stdin.readline)
            if how.strip() == "complete":
                await run.complete(result={"answer": 42})
            else:
                await run.fail("told to")
    trio.run(main)
"""


@pytest.fixture
def only_wake_ups(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fallback read a minute apart: a wait that ends in seconds was woken, not polled."""
    monkeypatch.setattr(_ends, "_POLL_S", 60.0)


async def released_run(db: zincir.Database, **options: object) -> str:
    async with zincir.open_run(db, **options) as run:  # type: ignore[arg-type]
        return run.id


@pytest.mark.parametrize("how", ["complete", "fail"])
async def test_an_end_in_another_process_wakes_the_wait_at_once(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch, only_wake_ups: None, how: str
) -> None:
    run_id = await released_run(db)
    await hearing_others(db, monkeypatch)  # its first word ("look at everything") is behind us
    noted = trace_operations(monkeypatch, db._store, "watch_end")
    ended: list[zincir.RunRecord] = []

    async def wait() -> None:
        ended.append(await zincir.wait_for_end(db, run_id))

    other = start_python(ENDS_WHEN_TOLD, db.path, run_id, stdin=subprocess.PIPE)
    try:
        assert other.stdout is not None and other.stdin is not None
        assert await trio.to_thread.run_sync(other.stdout.readline) == "holding\n"
        with trio.fail_after(30):  # far less than the fallback read's minute
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait)
                await until(lambda: _true(bool(noted)))  # waiting: the end comes after this
                assert not ended
                other.stdin.write(f"{how}\n")
                other.stdin.flush()
        await trio.to_thread.run_sync(other.wait)
    finally:
        other.kill()
        other.communicate()
    [record] = ended
    if how == "complete":
        assert (record.status, record.result) == (zincir.RunStatus.COMPLETED, {"answer": 42})
    else:
        assert record.status is zincir.RunStatus.FAILED
    if db.backend == "postgresql":
        assert rows(db, "SELECT * FROM run_waiters") == []  # the end took the note with it


async def test_an_end_by_this_processes_worker_wakes_it_and_waiting_is_no_end(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch, only_wake_ups: None
) -> None:
    run_id = await released_run(db)
    await hearing_others(db, monkeypatch)  # its first word ("look at everything") is behind us

    async def handler(run: zincir.Run) -> None:
        go = await run.wait_for_signal("w", "go")  # suspends at once (suspend_after=0)
        await run.complete(result=go)

    async with working(db, handler, suspend_after=0):
        await until(lambda: _status_is(db, run_id, zincir.RunStatus.WAITING))
        # Suspended is not ended: the wait runs into its timeout (time is what is tested).
        with pytest.raises(zincir.WaitTimeout, match=f"run {run_id} did not end within 0.3 s: it is waiting"):
            await zincir.wait_for_end(db, run_id, timeout=0.3)
        noted = trace_operations(monkeypatch, db._store, "watch_end")
        ended: list[zincir.RunRecord] = []

        async def wait() -> None:
            ended.append(await zincir.wait_for_end(db, run_id))

        with trio.fail_after(30):  # far less than the fallback read's minute
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait)
                await until(lambda: _true(bool(noted)))
                await zincir.send_signal(db, run_id, "go", "now")
        assert [(r.status, r.result) for r in ended] == [(zincir.RunStatus.COMPLETED, "now")]
    if db.backend == "postgresql":
        assert rows(db, "SELECT * FROM run_waiters") == []  # the timed-out wait took its note back


async def test_an_ended_run_returns_at_once_and_an_unknown_one_is_not_found(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await run.complete(result=[1, 2])
    with trio.fail_after(5):
        record = await zincir.wait_for_end(db, run.id.upper())  # any spelling of the id
    assert (record.id, record.status, record.result) == (run.id, zincir.RunStatus.COMPLETED, [1, 2])
    cancelled = await released_run(db)
    await zincir.cancel_run(db, cancelled, reason="not needed")
    assert (await zincir.wait_for_end(db, cancelled)).status is zincir.RunStatus.CANCELLED
    with pytest.raises(zincir.RunNotFound):
        await zincir.wait_for_end(db, "00000000-0000-4000-8000-000000000000")
    with pytest.raises(zincir.InvalidArgument, match="timeout"):
        await zincir.wait_for_end(db, run.id, timeout=-1)
    with pytest.raises(zincir.InvalidArgument, match="needs a Database"):
        await zincir.wait_for_end(db.path, run.id)  # type: ignore[arg-type]


async def _true(value: bool) -> bool:
    return value


async def _status_is(db: zincir.Database, run_id: str, status: zincir.RunStatus) -> bool:
    return (await db.state(run_id)).run.status is status
