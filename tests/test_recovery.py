"""Knowing what happened before recovering (docs/recovery.md), on both backends, with real
SIGKILLs: tool start marks, reconciliation, and taking over a dead same-host owner at once."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

import zincir
from zincir import _owner

from .helpers import rows, running_python, start_python
from .test_waiting_views import cli

ONE_CALL = zincir.ToolCall("pay", "send_payment", {"to": "ada", "eur": 10})


async def test_start_marks_count_the_starts_of_a_tool_call(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await run.record_response("", [ONE_CALL], "tool_use")
        [pending] = await run.pending_tools()
        assert (pending.started, pending.last_started_at) == (0, None)
        assert await run.start_tool("pay") == 1
        assert await run.start_tool("pay") == 2
        [pending] = await run.pending_tools()
        assert pending.started == 2 and isinstance(pending.last_started_at, int)
        starts = [e.payload for e in await db.events(run.id) if e.type is zincir.EventType.TOOL_STARTED]
        assert starts == [{"attempt": 1, "call_id": "pay"}, {"attempt": 2, "call_id": "pay"}]
        await run.record_tool_result("pay", "done")
        with pytest.raises(zincir.InvalidArgument, match="already has a result"):
            await run.start_tool("pay")
        with pytest.raises(zincir.NoDurableIntent):
            await run.start_tool("nope")


async def test_execute_reconciles_only_a_call_that_started_before(db: zincir.Database) -> None:
    ran: list[str] = []
    looked: list[str] = []

    async def tool(pending: zincir.PendingToolCall) -> str:
        ran.append(pending.call.id)
        return "paid"

    async def found(pending: zincir.PendingToolCall) -> str | None:
        looked.append(pending.call.id)
        return "paid already" if pending.call.id == "effect-happened" else None

    async with zincir.open_run(db) as run:
        calls = [zincir.ToolCall(i, "pay", {"n": i}) for i in ("fresh", "effect-happened", "effect-missing")]
        await run.record_response("", calls, "tool_use")
        await run.start_tool("effect-happened")
        await run.start_tool("effect-missing")
        results = [await run.execute(p, tool, reconcile=found) for p in await run.pending_tools()]
        assert results == ["paid", "paid already", "paid"]
        assert looked == ["effect-happened", "effect-missing"]  # never for a call that never began
        assert ran == ["fresh", "effect-missing"]
        assert await run.pending_tools() == []
        await run.complete()


async def test_a_probe_says_done_with_none_and_a_found_result_is_marked_reconciled(
    db: zincir.Database,
) -> None:
    ran: list[str] = []

    async def tool(pending: zincir.PendingToolCall) -> Any:
        ran.append(pending.call.id)
        return None  # a tool whose result is None, as a delete or a notification may be

    async def probe(pending: zincir.PendingToolCall) -> Any:
        return {"deleted": zincir.Done(None), "found": {"id": 7}, "absent": None}[pending.call.id]

    async with zincir.open_run(db) as run:
        calls = [zincir.ToolCall(i, "act", {"on": i}) for i in ("deleted", "found", "absent", "fresh")]
        await run.record_response("", calls, "tool_use")
        for call in calls[:3]:
            await run.start_tool(call.id)
        results = [await run.execute(p, tool, reconcile=probe) for p in await run.pending_tools()]
        assert results == [None, {"id": 7}, None, None]
        assert ran == ["absent", "fresh"]  # Done(None) is a result found: the tool did not run again
        assert await run.pending_tools() == []
        await run.complete()
    recorded = {
        e.payload["call_id"]: e.payload
        for e in await db.events(run.id)
        if e.type is zincir.EventType.TOOL_RESULT
    }
    assert recorded == {
        "deleted": {"call_id": "deleted", "content": None, "reconciled": True},
        "found": {"call_id": "found", "content": {"id": 7}, "reconciled": True},
        "absent": {"call_id": "absent", "content": None},
        "fresh": {"call_id": "fresh", "content": None},
    }
    exported = [json.loads(line) for line in cli("export", run.id, "--db", db.path).stdout.splitlines()]
    marked = [
        line["payload"]["call_id"]
        for line in exported
        if line["kind"] == "event"
        and line["type"] == "tool_result"
        and line["payload"].get("reconciled") is True
    ]
    assert marked == ["deleted", "found"]


async def test_execute_again_after_the_tool_raised_reconciles_first(db: zincir.Database) -> None:
    effects: list[str] = []

    async def flaky(pending: zincir.PendingToolCall) -> str:
        effects.append(pending.idempotency_key)
        if len(effects) == 1:
            raise TimeoutError("the effect happened, the answer did not arrive")
        return "paid"

    async def found(pending: zincir.PendingToolCall) -> str | None:
        return "paid already" if pending.idempotency_key in effects else None

    async with zincir.open_run(db) as run:
        await run.record_response("", [ONE_CALL], "tool_use")
        [pending] = await run.pending_tools()
        with pytest.raises(TimeoutError):
            await run.execute(pending, flaky, reconcile=found)
        # The same snapshot again (pending.started is still 0): the start recorded since counts.
        assert await run.execute(pending, flaky, reconcile=found) == "paid already"
        assert effects == ["tool_call:pay"]
        await run.complete()


async def test_execute_refuses_a_call_read_by_another_run_or_owner(db: zincir.Database) -> None:
    async with zincir.open_run(db) as other:
        await other.record_response("", [ONE_CALL], "tool_use")
        [foreign] = await other.pending_tools()
        other_id = other.id

    async def tool(pending: zincir.PendingToolCall) -> str:
        raise AssertionError("must not run")

    async with zincir.open_run(db) as run:
        await run.record_response("", [ONE_CALL], "tool_use")  # the same call id, another run
        before = rows(db, "SELECT run_id, seq FROM events ORDER BY run_id, seq")
        with pytest.raises(zincir.InvalidArgument, match="take it from this run's pending_tools"):
            await run.execute(foreign, tool)
        assert rows(db, "SELECT run_id, seq FROM events ORDER BY run_id, seq") == before
    async with zincir.open_run(db, other_id) as again:  # a new owner, a new epoch
        with pytest.raises(zincir.InvalidArgument, match="was read by"):
            await again.execute(foreign, tool)
        [fresh] = await again.pending_tools()
        assert await again.execute(fresh, _paid) == "paid"


async def _paid(pending: zincir.PendingToolCall) -> str:
    return "paid"


# A process that records one payment intent and dies, before starting the tool or after its
# effect (written to the ledger) but before its result.
DIES = """
    import os, signal, sys, trio, zincir
    async def main():
        target, run_id, ledger, moment = sys.argv[1:]
        async with zincir.open_database(target) as db, zincir.open_run(db, run_id) as run:
            await run.record_response("", [zincir.ToolCall("pay", "send_payment", {"eur": 10})], "tool_use")
            [pending] = await run.pending_tools()
            if moment == "before-start":
                os.kill(os.getpid(), signal.SIGKILL)
            async def pay(pending):
                with open(ledger, "a") as out:
                    out.write(pending.idempotency_key + "\\n")
                os.kill(os.getpid(), signal.SIGKILL)  # the effect happened; its result never arrives
            await run.execute(pending, pay)
    trio.run(main)
"""


@pytest.mark.parametrize("moment", ["before-start", "after-the-effect"])
async def test_after_a_sigkill_the_marks_say_whether_the_tool_began(
    db: zincir.Database, tmp_path: Path, moment: str
) -> None:
    async with zincir.open_run(db) as run:
        run_id = run.id
    ledger = tmp_path / "ledger"
    with running_python(DIES, db.path, run_id, str(ledger), moment) as proc:
        await trio.to_thread.run_sync(proc.communicate)
        assert proc.returncode == -9
    looked: list[int] = []

    async def reconcile(pending: zincir.PendingToolCall) -> Any:
        looked.append(pending.started)
        paid = ledger.exists() and pending.idempotency_key in ledger.read_text().split()
        return {"paid": True, "reconciled": True} if paid else None

    async def pay(pending: zincir.PendingToolCall) -> Any:
        with ledger.open("a") as out:
            out.write(pending.idempotency_key + "\n")
        return {"paid": True}

    async with zincir.open_run(db, run_id) as again:  # the dead owner was on this host: at once
        [pending] = await again.pending_tools()
        result = await again.execute(pending, pay, reconcile=reconcile)
        await again.complete()
    payments = ledger.read_text().split()
    assert payments == ["tool_call:pay"]  # once, either way
    if moment == "before-start":
        assert pending.started == 0 and looked == [] and result == {"paid": True}
    else:
        assert pending.started == 1 and looked == [1] and result == {"paid": True, "reconciled": True}


LEASE_HOLDER = """
    import sys, trio, zincir
    async def main():
        async with zincir.open_database(sys.argv[1]) as db, zincir.open_run(db, sys.argv[2], lease_ttl=30):
            print("holding", flush=True)
            await trio.sleep_forever()
    trio.run(main)
"""


async def _held_by_a_child(db: zincir.Database, run_id: str) -> subprocess.Popen[str]:
    proc = start_python(LEASE_HOLDER, db.path, run_id)
    assert proc.stdout is not None
    assert await trio.to_thread.run_sync(proc.stdout.readline) == "holding\n"
    return proc


async def test_a_dead_owner_of_this_host_is_taken_over_at_once_a_live_one_never(
    db: zincir.Database,
) -> None:
    async with zincir.open_run(db) as run:
        run_id = run.id
    holder = await _held_by_a_child(db, run_id)
    try:
        with pytest.raises(zincir.RunLeased):  # alive: its lease holds, for 30 s
            async with zincir.open_run(db, run_id):
                pass
    finally:
        holder.kill()
        holder.communicate()
    with trio.fail_after(5):  # a 30 s lease, taken over because its process is gone
        async with zincir.open_run(db, run_id) as again:
            assert again.epoch == 3
    [takeover] = [e for e in await db.events(run_id) if e.type is zincir.EventType.LEASE_TAKEN_OVER]
    assert takeover.payload["from_epoch"] == 2
    assert f"process {holder.pid} of this host, is gone" in takeover.payload["reason"]


async def _lease_as(db: zincir.Database, run_id: str, host: str | None, pid: int, started: int) -> None:
    """Make the run look leased for a minute by a process described by (host, pid, started)."""
    now = db.clock()
    rows(
        db,
        "UPDATE agent_runs SET lease_owner = 'ghost', lease_epoch = lease_epoch + 1, lease_expires_at = ?,"
        " lease_host = ?, lease_pid = ?, lease_process_start = ? WHERE id = ?",
        (now + 60_000, host, pid, started, run_id),
    )


async def test_a_reused_pid_with_another_start_time_counts_as_dead(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        run_id = run.id
    with running_python("import time; time.sleep(60)") as alive:  # a live process with the PID
        real_start = _owner.process_start(alive.pid)
        assert isinstance(real_start, int) and real_start > 0
        me = _owner.this_process()
        await _lease_as(db, run_id, me.host, alive.pid, real_start - 1)  # the owner started earlier
        async with zincir.open_run(db, run_id):
            pass
        await _lease_as(db, run_id, me.host, alive.pid, real_start)  # the very process: alive
        with pytest.raises(zincir.RunLeased):
            async with zincir.open_run(db, run_id):
                pass


async def test_an_owner_in_another_pid_namespace_is_never_taken_over_early(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        run_id = run.id
    me = _owner.this_process()
    assert me.host is not None
    other_container = me.host.rsplit("/", 1)[0] + "/pid:[1]"  # same boot, another PID namespace
    await _lease_as(db, run_id, other_container, 999_999, 12345)  # no such PID here: means nothing
    with pytest.raises(zincir.RunLeased):
        async with zincir.open_run(db, run_id):
            pass
    await _lease_as(db, run_id, None, 999_999, 12345)  # an owner that could not say who it was
    with pytest.raises(zincir.RunLeased):
        async with zincir.open_run(db, run_id):
            pass


async def test_a_worker_resumes_a_sigkilled_owners_run_in_well_under_a_second(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        run_id = run.id
    holder = await _held_by_a_child(db, run_id)
    holder.kill()
    holder.communicate()
    killed_at = trio.current_time()
    resumed: list[float] = []

    async def handler(run: zincir.Run) -> None:
        resumed.append(trio.current_time() - killed_at)
        await run.complete()

    worker = zincir.ResumeWorker(db, handler, lease_ttl=30, poll_interval=0.1)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        with trio.fail_after(10):
            while not resumed:
                await trio.sleep(0.01)
        worker.stop()
    assert resumed[0] < 1.0, resumed  # not the 30 s its lease had left


def _a_dead_process() -> tuple[int, int]:
    """The pid and start time of a process of this host that has just ended."""
    with running_python("import time; time.sleep(60)") as proc:
        started = _owner.process_start(proc.pid)
        assert isinstance(started, int)
        proc.kill()
        proc.communicate()
    return proc.pid, started


async def _worker_pass(db: zincir.Database, handled: list[str], **options: Any) -> None:
    """Run a ResumeWorker until it has had a chance to claim what is due now (it polls once a
    minute: only a takeover at once can be seen here), then stop it."""

    async def handler(run: zincir.Run) -> None:
        handled.append(run.id)
        await run.complete()

    worker = zincir.ResumeWorker(db, handler, lease_ttl=30, poll_interval=60, **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        with trio.move_on_after(1.0):
            while not handled:
                await trio.sleep(0.01)
        worker.stop()


async def test_a_busy_live_owner_on_this_host_does_not_hide_a_dead_one(db: zincir.Database) -> None:
    me = _owner.this_process()
    live = []
    with running_python("import time; time.sleep(60)") as alive:
        alive_start = _owner.process_start(alive.pid)
        assert isinstance(alive_start, int)
        for _ in range(6):  # more leases than the worker has room for, first in every order
            async with zincir.open_run(db) as run:
                live.append(run.id)
            await _lease_as(db, run.id, me.host, alive.pid, alive_start)
        async with zincir.open_run(db) as run:
            orphan = run.id
        await _lease_as(db, orphan, me.host, *_a_dead_process())
        handled: list[str] = []
        await _worker_pass(db, handled, max_concurrency=1)
    assert handled == [orphan]


async def test_a_dead_owners_run_out_of_attempts_or_being_cancelled_is_ended_not_resumed(
    db: zincir.Database,
) -> None:
    me = _owner.this_process()
    async with zincir.open_run(db) as run:
        exhausted = run.id
    async with zincir.open_run(db) as run:
        cancelled = run.id
    for run_id in (exhausted, cancelled):
        await _lease_as(db, run_id, me.host, *_a_dead_process())
    rows(db, "UPDATE agent_runs SET attempts = 2 WHERE id = ?", (exhausted,))
    rows(
        db,
        "UPDATE agent_runs SET cancel_reason = 'stop it', cancel_requested_at = 1 WHERE id = ?",
        (cancelled,),
    )
    handled: list[str] = []
    await _worker_pass(db, handled, max_attempts=2)
    assert handled == []
    assert (await db.state(exhausted)).run.status is zincir.RunStatus.FAILED
    assert (await db.state(cancelled)).run.status is zincir.RunStatus.CANCELLED


async def test_show_and_the_inspector_mark_what_is_known_of_each_tool_call(db: zincir.Database) -> None:
    import json

    from .test_waiting_views import cli, page

    async with zincir.open_run(db) as run:
        calls = [zincir.ToolCall(i, "pay", {"n": i}) for i in ("a", "b", "c")]
        await run.record_response("", calls, "tool_use")
        await run.start_tool("b")
        await run.record_tool_result("c", "ok")
    data = json.loads(cli("show", "--db", db.path, run.id, "--json").stdout)
    assert [(t["call_id"], t["state"], t["started"]) for t in data["tool_calls"]] == [
        ("a", "never started", 0),
        ("b", "started, outcome unknown", 1),
        ("c", "done", 0),
    ]
    assert "tool calls (3)" in cli("show", "--db", db.path, run.id).stdout
    detail = await page(db, f"/runs/{run.id}")
    assert '<span class="intent-started">started, outcome unknown</span>' in detail
    assert '<span class="intent-never-started">never started</span>' in detail
