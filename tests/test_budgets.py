"""Budgets that survive restarts, and loop detection (docs/budgets.md), on both backends."""

from __future__ import annotations

import math

import pytest
import trio

import zincir

from .helpers import dump, running_python, scalar, until
from .helpers import has_status as _is
from .test_suspension import working


def kinds(events: list[zincir.Event], kind: zincir.EventType) -> list[zincir.Event]:
    return [e for e in events if e.type is kind]


async def test_responses_debit_tokens_cost_and_calls_in_either_key_style(db: zincir.Database) -> None:
    async with zincir.open_run(db, budget=zincir.Budget(tokens=10_000)) as run:
        anthropic = {"input_tokens": 100, "cache_read_input_tokens": 20, "output_tokens": 30, "cost": 0.25}
        await run.record_response(
            "a", [zincir.ToolCall("c1", "search", {"q": "x"})], "tool_use", usage=anthropic
        )
        openai = {"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45, "cost": 0.5}
        calls = [zincir.ToolCall("c2", "search", {}), zincir.ToolCall("c3", "read", {})]
        await run.record_response("b", calls, "tool_calls", usage=openai)
        await run.record_response("c", [], "end")  # no usage: a model call, nothing else
        usage = await run.usage()
        assert usage is not None
        spent = usage.spent
        assert (spent.input_tokens, spent.output_tokens, spent.tokens) == (160, 35, 195)
        assert (spent.cost, spent.model_calls, spent.tool_calls) == (0.75, 3, 3)
        assert usage.limits == zincir.Budget(tokens=10_000)
        assert usage.remaining.tokens == 10_000 - 195 and usage.remaining.cost is None
        await run.check_budget()  # within every limit


async def test_a_run_without_a_budget_has_no_usage(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await run.record_response("x", [], "end", usage={"input_tokens": 5})
        assert await run.usage() is None
        await run.check_budget()


async def test_reaching_a_limit_records_the_response_and_raises_after_the_commit(db: zincir.Database) -> None:
    async with zincir.open_run(db, budget=zincir.Budget(tokens=100, model_calls=10)) as run:
        await run.record_response("1", [], "end", usage={"input_tokens": 60})
        with pytest.raises(zincir.BudgetExceeded, match="tokens spent 120 of 100") as info:
            await run.record_response("2", [], "end", usage={"input_tokens": 60})
        assert info.value.limit == "tokens"
        with pytest.raises(zincir.BudgetExceeded):
            await run.record_response("3", [], "end", usage={"input_tokens": 1})  # still over
        with pytest.raises(zincir.BudgetExceeded):
            await run.check_budget()
        events = await db.events(run.id)
        assert len(kinds(events, zincir.EventType.LLM_CALL)) == 3  # every response was recorded
        [exceeded] = kinds(events, zincir.EventType.BUDGET_EXCEEDED)  # logged when first reached
        assert exceeded.payload["limit"] == "tokens"
        await zincir.raise_budget(db, run.id, tokens=1_000)
        await run.check_budget()
        usage = await run.usage()
        assert usage is not None and usage.limits.tokens == 1_000 and usage.limits.model_calls == 10


async def test_a_worker_suspends_a_run_over_budget_until_it_is_raised(db: zincir.Database) -> None:
    async with zincir.open_run(db, role="spender", budget=zincir.Budget(cost=1.0)) as run:
        run_id = run.id
    attempts: list[int] = []

    async def handler(run: zincir.Run) -> None:
        attempts.append(run.epoch)
        await run.check_budget()
        while len(kinds(await db.events(run.id), zincir.EventType.LLM_CALL)) < 3:
            await run.record_response("spend", [], "end", usage={"cost": 0.5})
        await run.complete()

    async with working(db, handler, max_attempts=1):  # a counted attempt would fail the run
        await until(lambda: _waits_for_budget(db, run_id))
        assert scalar(db, "SELECT lease_owner FROM agent_runs WHERE id = ?", (run_id,)) is None
        await zincir.raise_budget(db, run_id, cost=2.0)
        # poll_interval is 60 s: only the raise's wake-up resumes it this fast.
        await until(lambda: _is(db, run_id, zincir.RunStatus.COMPLETED), within=10)
    events = await db.events(run_id)
    assert len(kinds(events, zincir.EventType.LLM_CALL)) == 3
    assert not kinds(events, zincir.EventType.ATTEMPT_FAILED)
    [suspended] = [e for e in events if e.payload.get("to") == "waiting"]
    assert suspended.payload["waiting_for"] == {"kind": "budget", "limit": "cost"}


async def test_budget_exceeded_in_parallel_branches_suspends_too(db: zincir.Database) -> None:
    # Two model calls at once in a Trio nursery: what reaches the worker is an ExceptionGroup
    # holding the BudgetExceeded of one or both, which is still no failure.
    async with zincir.open_run(db, role="spender", budget=zincir.Budget(tokens=100)) as run:
        run_id = run.id

    async def handler(run: zincir.Run) -> None:
        if (await run.state()).run.role == "helper":
            await run.complete()
            return

        async def turn() -> None:
            await run.check_budget()
            await run.record_response("branch", [], "end", usage={"input_tokens": 60})

        async with run.children() as family, trio.open_nursery() as branches:
            await family.spawn("helper", role="helper")
            branches.start_soon(turn)
            branches.start_soon(turn)
        await run.complete()

    async with working(db, handler, max_attempts=1):
        await until(lambda: _waits_for_budget(db, run_id))
        assert not kinds(await db.events(run_id), zincir.EventType.ATTEMPT_FAILED)
        child = scalar(db, "SELECT status FROM agent_runs WHERE parent_run_id = ?", (run_id,))
        assert child != "cancelled"  # the nursery left its child alone, as for a plain BudgetExceeded
        await zincir.raise_budget(db, run_id, tokens=1_000)
        await until(lambda: _is(db, run_id, zincir.RunStatus.COMPLETED), within=10)


async def _waits_for_budget(db: zincir.Database, run_id: str) -> bool:
    return scalar(db, "SELECT wait_kind FROM agent_runs WHERE id = ?", (run_id,)) == "budget"


async def test_a_loop_is_the_same_tool_with_the_same_canonical_arguments(db: zincir.Database) -> None:
    async with zincir.open_run(db, budget=zincir.Budget(max_identical_tool_calls=3)) as run:
        args = [{"path": "a.py", "line": 3}, {"line": 3, "path": "a.py"}]  # one call, two key orders
        for i in range(2):
            await run.record_response("", [zincir.ToolCall(f"c{i}", "read", args[i])], "tool_use")
        await run.record_response("", [zincir.ToolCall("other", "read", {"path": "b.py"})], "tool_use")
        with pytest.raises(zincir.LoopDetected, match="3 times") as info:
            await run.record_response("", [zincir.ToolCall("c2", "read", args[0])], "tool_use")
        assert isinstance(info.value, zincir.BudgetExceeded)
        [event] = kinds(await db.events(run.id), zincir.EventType.LOOP_DETECTED)
        assert event.payload["limit"] == "max_identical_tool_calls"


def read(call_id: str, path: str) -> zincir.ToolCall:
    return zincir.ToolCall(call_id, "read_file", {"path": path})


async def test_a_loop_names_its_call_and_ends_when_the_model_moves_on(db: zincir.Database) -> None:
    async with zincir.open_run(db, budget=zincir.Budget(max_identical_tool_calls=3)) as run:
        for i in range(2):
            await run.record_response("", [read(f"a{i}", "a.py")], "tool_use")
        with pytest.raises(zincir.LoopDetected) as info:
            await run.record_response("", [read("a2", "a.py")], "tool_use")
        assert (info.value.call_id, info.value.tool) == ("a2", "read_file")
        assert """tool call 'a2', read_file({"path":"a.py"}), was made 3 times""" in str(info.value)
        with pytest.raises(zincir.LoopDetected, match="'a2'"):
            await run.check_budget()  # the latest response repeated it: the loop holds
        usage = await run.usage()
        assert usage is not None and usage.spent.repeated_call == read("a2", "a.py")
        # A call never made before is no loop, whatever came before it.
        await run.record_response("", [read("b0", "b.py")], "tool_use")
        await run.check_budget()
        usage = await run.usage()
        assert usage is not None and (usage.spent.identical_tool_calls, usage.spent.repeated_call) == (
            1,
            None,
        )
        # a.py is still three times in the window: asking for it again is a loop again.
        with pytest.raises(zincir.LoopDetected, match="'a3', .* 4 times"):
            await run.record_response("", [read("a3", "a.py")], "tool_use")
        await run.record_response("", [], "end")  # a response without tool calls repeats nothing
        await run.check_budget()
        loops = kinds(await db.events(run.id), zincir.EventType.LOOP_DETECTED)
        assert [(e.payload["call_id"], e.payload["tool"], e.payload["count"]) for e in loops] == [
            ("a2", "read_file", 3),
            ("a3", "read_file", 4),
        ]
        # A higher limit lifts it at once, for check_budget and for the next response.
        with pytest.raises(zincir.LoopDetected):
            await run.record_response("", [read("a4", "a.py")], "tool_use")
        await zincir.raise_budget(db, run.id, max_identical_tool_calls=10)
        await run.check_budget()
        await run.record_response("", [read("a5", "a.py")], "tool_use")  # the 6th of 10
        usage = await run.usage()
        assert usage is not None and usage.spent.identical_tool_calls == 6


async def test_an_accepted_checkpoint_starts_the_loop_window_again(db: zincir.Database) -> None:
    async def verdict(passed: bool) -> zincir.Verifier:
        async def verify(state: zincir.CheckpointState) -> zincir.Verification:
            return zincir.Verification(passed)

        return verify

    async with zincir.open_run(db, budget=zincir.Budget(max_identical_tool_calls=3)) as run:
        for i in range(2):
            await run.record_response("", [read(f"a{i}", "a.py")], "tool_use")
            await run.record_tool_result(f"a{i}", "print(1)")
        await run.record_response("", [zincir.ToolCall("cp1", zincir.SUBMIT_CHECKPOINT, {})], "tool_use")
        await run.checkpoint("cp1", zincir.CheckpointState(completed=["x"]), await verdict(False))
        with pytest.raises(zincir.LoopDetected):  # a rejected checkpoint is no progress
            await run.record_response("", [read("a2", "a.py")], "tool_use")
        await run.record_tool_result("a2", "print(1)")
        await run.record_response("", [zincir.ToolCall("cp2", zincir.SUBMIT_CHECKPOINT, {})], "tool_use")
        await run.checkpoint("cp2", zincir.CheckpointState(completed=["x"]), await verdict(True))
        usage = await run.usage()
        assert usage is not None and usage.spent.identical_tool_calls == 0
        await run.check_budget()
        for i in range(3, 5):  # twice more since the accepted checkpoint: within the limit
            await run.record_response("", [read(f"a{i}", "a.py")], "tool_use")
        with pytest.raises(zincir.LoopDetected, match="made 3 times .* since the latest accepted checkpoint"):
            await run.record_response("", [read("a5", "a.py")], "tool_use")


async def test_one_response_may_ask_for_the_same_call_twice(db: zincir.Database) -> None:
    async with zincir.open_run(db, budget=zincir.Budget(max_identical_tool_calls=3)) as run:
        await run.record_response(
            "", [read("a0", "a.py"), read("a1", "a.py"), read("b0", "b.py")], "tool_use"
        )
        usage = await run.usage()
        assert usage is not None and usage.spent.identical_tool_calls == 2
        assert usage.spent.repeated_call == read("a0", "a.py")
        with pytest.raises(zincir.LoopDetected, match="'a2'"):
            await run.record_response("", [read("b1", "b.py"), read("a2", "a.py")], "tool_use")


async def test_no_progress_counts_responses_since_the_latest_accepted_checkpoint(db: zincir.Database) -> None:
    async def accept(state: zincir.CheckpointState) -> zincir.Verification:
        return zincir.Verification(True)

    async with zincir.open_run(db, budget=zincir.Budget(max_responses_without_progress=3)) as run:
        await run.record_response("", [], "end")
        await run.record_response("", [zincir.ToolCall("cp", zincir.SUBMIT_CHECKPOINT, {})], "tool_use")
        await run.checkpoint("cp", zincir.CheckpointState(completed=["a"]), accept)  # progress
        await run.record_response("", [], "end")
        await run.record_response("", [], "end")
        with pytest.raises(zincir.NoProgress, match="3 responses"):
            await run.record_response("", [], "end")
        assert kinds(await db.events(run.id), zincir.EventType.NO_PROGRESS)


async def test_wall_time_counts_the_time_before_a_restart(db: zincir.Database) -> None:
    async with zincir.open_run(db, budget=zincir.Budget(wall_time=1.0)) as run:
        await trio.sleep(0.6)  # the first owner spends most of it, then stops
    started = trio.current_time()
    with pytest.raises(zincir.BudgetExceeded, match="wall time") as info:
        async with zincir.open_run(db, run.id, lease_ttl=60):  # a renewal is 20 s away
            await trio.sleep_forever()
    assert info.value.limit == "wall_time"
    assert trio.current_time() - started < 5  # stopped at the limit, not at a renewal
    [event] = kinds(await db.events(run.id), zincir.EventType.BUDGET_EXCEEDED)
    assert event.payload["limit"] == "wall_time"


async def test_concurrent_responses_of_one_run_debit_exactly_their_sum(db: zincir.Database) -> None:
    async with zincir.open_run(db, budget=zincir.Budget(tokens=10**9)) as run:
        async with trio.open_nursery() as nursery:
            for i in range(50):
                usage = {"input_tokens": i, "output_tokens": 2 * i, "cost": 0.125}
                nursery.start_soon(lambda u=usage: run.record_response("", [], "end", usage=u))  # type: ignore[misc]
        usage = await run.usage()
    assert usage is not None
    assert (usage.spent.input_tokens, usage.spent.output_tokens) == (sum(range(50)), 2 * sum(range(50)))
    assert (usage.spent.cost, usage.spent.model_calls) == (0.125 * 50, 50)


async def test_a_childs_budget_is_its_own(db: zincir.Database) -> None:
    async with zincir.open_run(db, budget=zincir.Budget(tokens=100)) as parent:
        child = await parent.spawn("kid", budget=zincir.Budget(tokens=1_000))
        async with zincir.open_run(db, child) as run:
            await run.record_response("", [], "end", usage={"input_tokens": 500})
            await run.complete()
        await parent.join(child)
        usage = await parent.usage()
        assert usage is not None and usage.spent.tokens == 0
        await parent.check_budget()
        await parent.complete()


@pytest.mark.parametrize(
    "limits",
    [{"tokens": -1}, {"cost": math.nan}, {"cost": -0.5}, {"tool_calls": True}, {"tokens": 2**64},
     {"cost": 1e300}, {"cost": 10**400}, {"wall_time": 0}, {"model_calls": 1.5}],
    ids=str,
)  # fmt: skip
async def test_bad_limits_are_invalid_and_change_nothing(
    db: zincir.Database, limits: dict[str, object]
) -> None:
    with pytest.raises(zincir.InvalidArgument):
        zincir.Budget(**limits)  # type: ignore[arg-type]
    async with zincir.open_run(db, budget=zincir.Budget(tokens=5)) as run:
        before = dump(db)
        with pytest.raises(zincir.InvalidArgument):
            await zincir.raise_budget(db, run.id, **limits)
        with pytest.raises(zincir.InvalidArgument):
            await zincir.raise_budget(db, run.id, tokenz=5)
        with pytest.raises(zincir.InvalidArgument):
            await run.record_response("", [], "end", usage={"input_tokens": -3})
        with pytest.raises(zincir.InvalidArgument):
            await run.record_response("", [], "end", usage={"cost": "free"})
        assert dump(db) == before


async def test_a_response_committed_before_a_sigkill_is_debited_once(db: zincir.Database) -> None:
    async with zincir.open_run(db, budget=zincir.Budget(tokens=1_000), lease_ttl=1) as run:
        run_id = run.id
    child = """
        import os, signal, sys, trio, zincir
        async def main():
            async with zincir.open_database(sys.argv[1]) as db:
                async with zincir.open_run(db, sys.argv[2], lease_ttl=1) as run:
                    await run.record_response("paid", [], "end", usage={"input_tokens": 7, "cost": 0.5})
                    os.kill(os.getpid(), signal.SIGKILL)  # right after the commit
        trio.run(main)
    """
    with running_python(child, db.path, run_id) as proc:
        await trio.to_thread.run_sync(proc.communicate)
        assert proc.returncode == -9
    usage = await _usage_of(db, run_id)
    assert (usage.spent.input_tokens, usage.spent.cost, usage.spent.model_calls) == (7, 0.5, 1)


async def _usage_of(db: zincir.Database, run_id: str) -> zincir.Usage:
    usage: zincir.Usage | None = await db._read(db._store.budget_usage, run_id)
    assert usage is not None
    return usage


async def test_the_budget_command_shows_and_raises_limits_and_runs_show_spend(db: zincir.Database) -> None:
    from .test_waiting_views import cli, page

    async with zincir.open_run(db, budget=zincir.Budget(tokens=1_000, cost=2.0)) as run:
        await run.record_response(
            "x", [], "end", usage={"input_tokens": 120, "output_tokens": 30, "cost": 0.4}
        )
    shown = cli("budget", run.id, "--db", db.path)
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines()[0] == f"run {run.id}: tokens 150/1,000 · cost 0.4/2"
    raised = await trio.to_thread.run_sync(cli, "budget", run.id, "--tokens", "5000", "--db", db.path)
    assert raised.exit_code == 0, raised.output
    assert "tokens 150/5,000" in raised.stdout
    refused = await trio.to_thread.run_sync(cli, "budget", run.id, "--tokens", "-4", "--db", db.path)
    assert refused.exit_code == 1 and "Budget.tokens" in refused.stderr
    listed = cli("runs", "--db", db.path)
    assert "tokens 150/5,000 · cost 0.4/2" in listed.stdout
    detail = await page(db, f"/runs/{run.id}")
    assert 'id="budget"' in detail and "tokens 150/5,000" in detail
    async with zincir.open_run(db) as plain:
        pass
    assert "has no budget" in cli("budget", plain.id, "--db", db.path).stdout


async def test_a_nursery_over_budget_keeps_its_children_for_when_the_budget_is_raised(
    db: zincir.Database,
) -> None:
    async with zincir.open_run(db, role="lead", budget=zincir.Budget(model_calls=1)) as lead:
        pass

    async def handler(run: zincir.Run) -> None:
        if (await run.state()).run.role != "lead":
            await run.complete(result="found")
            return
        async with run.children() as nursery:
            await nursery.spawn("kid", role="kid")
            if not kinds(await db.events(run.id), zincir.EventType.LLM_CALL):
                await run.record_response("plan", [], "end")  # spends the one model call
            await run.check_budget()
        await run.complete(result=[(await run.join(c)).result for c in nursery.spawned])

    async with working(db, handler, max_concurrency=2):
        await until(lambda: _waits_for_budget(db, lead.id))
        [kid] = [r for r in await db.runs(role="kid")]
        assert kid.status is not zincir.RunStatus.CANCELLED
        await zincir.raise_budget(db, lead.id, model_calls=5)
        await until(lambda: _is(db, lead.id, zincir.RunStatus.COMPLETED))
    assert (await db.state(lead.id)).run.result == ["found"]
