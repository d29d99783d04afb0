"""Runs that, between them, write every type of event zincir has, in each of its shapes (for the
documented payload shapes of docs/events.md)."""

from __future__ import annotations

import contextlib
from typing import Any

import trio

import zincir

CLAIM = {"completed": ["x"], "remaining": [], "artifacts": [], "failed_attempts": [], "evidence": []}


async def passes(_: Any) -> zincir.Verification:
    return zincir.Verification(True, ["checked"])


async def fails(_: Any) -> zincir.Verification:
    return zincir.Verification(False, ["not yet"])


async def ok(pending: zincir.PendingToolCall) -> Any:
    return {"ok": pending.call.name}


async def already_done(pending: zincir.PendingToolCall) -> Any:
    return zincir.Done({"found": True})


async def _decide(db: zincir.Database, run_id: str, call_id: str) -> None:
    for _ in range(500):
        with contextlib.suppress(zincir.ApprovalNotRequested):
            await zincir.decide_approval(db, run_id, call_id, approved=True, by="alice", reason="fine")
            return
        await trio.sleep(0.01)
    raise AssertionError("the approval was never requested")


async def agent_run(db: zincir.Database) -> str:
    """Model calls marked (one failing), responses, tool calls started and answered (one found
    by a probe), checkpoints rejected and accepted, signals received and timed out, approvals
    decided and timed out, a child spawned, joined and timed out, a step and a sleep; completed."""
    async with zincir.open_run(db, config={"goal": "every event"}) as run:
        calls = [zincir.ToolCall("t1", "search", {"q": "a"}), zincir.ToolCall("t2", "search", {"q": "b"})]
        await run.start_model_call(40, model="m-1", cost=0.01)  # failed: the next mark finds it
        await run.start_model_call()
        await run.record_response("text", calls, "tool_use", usage={"input_tokens": 10, "output_tokens": 2})
        first, second = await run.pending_tools()
        await run.execute(first, ok)
        await run.start_tool("t2")  # as if a crash followed: the probe finds the effect
        [second] = await run.pending_tools()
        await run.execute(second, ok, reconcile=already_done)
        for call_id, verify in (("cp1", fails), ("cp2", passes)):
            await run.record_response(
                "", [zincir.ToolCall(call_id, zincir.SUBMIT_CHECKPOINT, CLAIM)], "tool_use"
            )
            await run.checkpoint(call_id, CLAIM, verify)
        await run.step("fetch", trio.sleep, 0)  # steps and sleeps have tables, not events
        await run.sleep("pause", 0.001)
        await zincir.send_signal(db, run.id, "review", {"ok": True}, by="bob")
        await run.wait_for_signal("w1", "review")
        with contextlib.suppress(zincir.WaitTimeout):
            await run.wait_for_signal("w2", "never", timeout=0)
        await run.record_response("", [zincir.ToolCall("a1", "refund", {"eur": 5})], "tool_use")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_decide, db, run.id, "a1")
            await run.wait_for_approval("a1")
        await run.record_tool_result("a1", {"refunded": 5})
        await run.record_response("", [zincir.ToolCall("a2", "deploy", {})], "tool_use")
        with contextlib.suppress(zincir.WaitTimeout):
            await run.wait_for_approval("a2", timeout=0)
        await run.record_tool_result("a2", {"denied": "no answer"})
        child = await run.spawn("helper", role="helper")
        slow = await run.spawn("slow", role="helper")
        async with zincir.open_run(db, child) as helper:
            await helper.complete({"done": True})
        await run.join(child)
        with contextlib.suppress(zincir.WaitTimeout):
            await run.join(slow, timeout=0)
        await zincir.cancel_run(db, slow, "not needed", by="bob")
        await run.complete({"answer": 42})
    return run.id


async def budget_runs(db: zincir.Database) -> list[str]:
    """A spend over its limit, a loop of identical calls, responses without progress; each run
    then fails."""
    cases = [
        (zincir.Budget(tokens=10), [("r1", "a", {"n": 1})], {"input_tokens": 8, "output_tokens": 8}),
        (zincir.Budget(max_identical_tool_calls=2), [("r1", "a", {"n": 1}), ("r2", "a", {"n": 1})], None),
        (zincir.Budget(max_responses_without_progress=2), [("r1", "a", {"n": 1}), ("r2", "b", {})], None),
    ]  # fmt: skip
    ids = []
    for budget, calls, usage in cases:
        async with zincir.open_run(db, budget=budget) as run:
            with contextlib.suppress(zincir.BudgetExceeded):
                for call_id, name, args in calls:
                    await run.record_response(
                        "", [zincir.ToolCall(call_id, name, args)], "tool_use", usage=usage
                    )
                    await run.record_tool_result(call_id, "done")
            await run.fail("over budget")
        ids.append(run.id)
    return ids


async def takeover_run(db: zincir.Database) -> str:
    """An owner fenced by a forced takeover with a model call in flight: its attempt is lost, its
    lease taken over, its call charged."""
    first_holds = trio.Event()

    async def first_owner(task_status: Any) -> None:
        with contextlib.suppress(zincir.LeaseLost):
            # A short lease: its heartbeat finds the loss soon (a renewal every lease_ttl / 3).
            async with zincir.open_run(db, lease_ttl=0.3) as run:
                await run.start_model_call(12)  # in flight when it is fenced: the next owner finds it
                task_status.started(run.id)
                first_holds.set()
                await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        run_id: str = await nursery.start(first_owner)
        await first_holds.wait()
        async with zincir.open_run(db, run_id, force=True) as again:
            await again.complete()
    return run_id


async def _wait_then_finish(run: zincir.Run) -> None:
    await run.wait_for_signal("go", "go")
    await run.complete()


async def _always_fails(run: zincir.Run) -> None:
    raise RuntimeError("the handler broke")


async def worker_runs(db: zincir.Database) -> list[str]:
    """Under a worker: a run suspended on a signal and woken by it (waiting and back), and a run
    whose only attempt failed."""
    async with zincir.open_run(db) as waiting:
        pass  # left running, with no owner: a worker claims it
    await zincir.ResumeWorker(db, _wait_then_finish, suspend_after=0, until_idle=True).run()  # suspends
    await zincir.send_signal(db, waiting.id, "go")
    await zincir.ResumeWorker(db, _wait_then_finish, suspend_after=0, until_idle=True).run()  # woken
    async with zincir.open_run(db) as failing:
        pass
    await zincir.ResumeWorker(db, _always_fails, max_attempts=1, until_idle=True).run()
    return [waiting.id, failing.id]


async def fork_run(db: zincir.Database, source_id: str) -> str:
    """A fork of the agent run taken after its first tool started, before any result: the
    results recorded after that seq are inherited."""
    events = await db.events(source_id)
    started = next(e.seq for e in events if e.type == zincir.EventType.TOOL_STARTED)
    return await zincir.fork_run(db, source_id, started, by="dev", reason="try again")


async def moved_run(db: zincir.Database) -> str:
    """A run of one version moved to another on purpose."""
    async with zincir.open_run(db, version="v1") as run:
        pass
    await zincir.set_version(db, run.id, "v2", by="ada")
    return run.id


async def every_event(db: zincir.Database) -> list[zincir.Event]:
    """The events of all the runs above, in order."""
    source = await agent_run(db)
    run_ids = [source, await fork_run(db, source), *await budget_runs(db), await takeover_run(db)]
    run_ids += [*await worker_runs(db), await moved_run(db)]
    runs = await db.runs(limit=1000)
    return [event for record in runs for event in await db.events(record.id)] if run_ids else []
