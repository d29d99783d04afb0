"""Forks (zincir.fork_run): a new run from any point of an old one, without repeating its effects
(both backends)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from typing import Any

import pytest
import trio

import zincir

from .helpers import dump, rows, running_python


async def verdict(state: zincir.CheckpointState) -> zincir.Verification:
    return zincir.Verification(True, ["checked"])


def without(dumped: str, run_id: str) -> list[str]:
    """The rows of a dump that are not the run's (every row of a run names its id)."""
    return [line for line in dumped.splitlines() if run_id not in line]


def triples(events: list[zincir.Event]) -> list[tuple[int, str, Any]]:
    return [(e.seq, e.type.value, e.payload) for e in events]


def trail(db: zincir.Database, run_id: str) -> list[tuple[str, str | None, dict[str, Any]]]:
    found = rows(
        db, "SELECT action, done_by, detail FROM outsider_actions WHERE run_id = ? ORDER BY id", (run_id,)
    )
    return [(action, by, json.loads(detail)) for action, by, detail in found]


async def research_run(db: zincir.Database) -> tuple[str, dict[str, int]]:
    """A run that searched, was checkpointed, then asked for two more tools: one answered, one
    started and never answered (its process died with the call in flight), and then a third
    response. Returns its id and the seqs of its landmarks."""
    seqs: dict[str, int] = {}
    async with zincir.open_run(db, config={"prompt": "v1"}) as run:
        seqs["first"] = await run.record_response(
            "searching", [{"id": "s1", "name": "search", "args": {"q": "a"}}], "tool_use"
        )
        await run.record_tool_result("s1", {"hits": 3})
        await run.record_response(
            "done", [{"id": "cp1", "name": zincir.SUBMIT_CHECKPOINT, "args": {}}], "tool_use"
        )
        checkpoint = await run.checkpoint("cp1", zincir.CheckpointState(completed=["search"]), verdict)
        assert checkpoint.decision_event_seq is not None
        seqs["checkpoint"] = checkpoint.decision_event_seq + 1
        calls = [
            {"id": "pay", "name": "charge", "args": {"cents": 500}},
            {"id": "mail", "name": "email", "args": {"to": "ada"}},
        ]
        seqs["second"] = await run.record_response("paying", calls, "tool_use")
        seqs["second_end"] = seqs["second"] + 2
        await run.record_tool_result("pay", {"charged": True})
        await run.start_tool("mail")
        seqs["third"] = await run.record_response(
            "more", [{"id": "x", "name": "search", "args": {}}], "tool_use"
        )
        return run.id, seqs


async def test_a_fork_copies_the_prefix_and_leaves_the_source_as_it_was(db: zincir.Database) -> None:
    source, seqs = await research_run(db)
    before = dump(db)
    at = seqs["second_end"]
    fork = await zincir.fork_run(db, source, at, config={"prompt": "v2"}, by="ada", reason="try v2")

    assert without(dump(db), fork) == before.splitlines()  # the source, row for row
    source_events = await db.events(source)
    events = await db.events(fork)
    assert triples(events[: at + 1]) == triples(source_events[: at + 1])
    forked = events[at + 1]
    assert forked.type is zincir.EventType.FORKED
    assert forked.payload == {
        "by": "ada", "config_changed": True, "fork_seq": at, "forked_from": source, "reason": "try v2",
    }  # fmt: skip
    record = (await db.state(fork)).run
    assert (record.forked_from, record.fork_seq) == (source, at)
    assert record.status is zincir.RunStatus.PENDING and record.config == {"prompt": "v2"}
    assert (record.role, record.provider, record.parent_run_id) == ("agent", "", None)
    assert (await db.state(source)).run.forked_from is None
    assert trail(db, fork) == [
        ("fork", "ada", {"config_changed": True, "fork_seq": at, "forked_from": source, "reason": "try v2"})
    ]
    # The log goes on gap-free after the copy.
    assert [e.seq for e in events] == list(range(len(events)))


async def test_no_effect_of_the_source_is_repeated_by_the_fork(db: zincir.Database) -> None:
    source, seqs = await research_run(db)
    at = seqs["second_end"]  # the charge and the e-mail were asked for, nothing more
    fork = await zincir.fork_run(db, source, at)

    events = await db.events(fork)
    # The charge's result came after the fork point: the fork inherits it, marked.
    [inherited] = [e for e in events[at + 2 :] if e.type is zincir.EventType.TOOL_RESULT]
    [source_result] = [e for e in await db.events(source) if e.idempotency_key == "tool_result:pay"]
    assert inherited.payload == {
        **source_result.payload, "inherited": {"run_id": source, "seq": source_result.seq},
    }  # fmt: skip
    probed: list[str] = []
    ran: list[str] = []

    async def probe(pending: zincir.PendingToolCall) -> Any:
        probed.append(pending.effect_key)
        return {"sent": True}  # the mail service knows this key: it was sent

    async def send(pending: zincir.PendingToolCall) -> Any:
        ran.append(pending.call.id)
        return {"sent": True}

    async with zincir.open_run(db, fork) as run:
        [mail] = await run.pending_tools()
        # Started by the source, never answered: pending, with its starts and the source's key.
        assert (mail.call.id, mail.started) == ("mail", 1)
        assert mail.effect_key == f"{source}:tool_call:mail"
        assert mail.fencing_token == f"{fork}:{run.epoch}"
        await run.execute(mail, send, reconcile=probe)
        # Recording the inherited result again is a no-op, as for any result.
        await run.record_tool_result("pay", {"charged": True})
        await run.complete()
    assert probed == [f"{source}:tool_call:mail"] and ran == []


async def test_a_fork_of_a_fork_keeps_the_chain_and_the_origin_of_each_effect(db: zincir.Database) -> None:
    source, seqs = await research_run(db)
    first = await zincir.fork_run(db, source, seqs["second_end"])
    async with zincir.open_run(db, first) as run:
        await run.record_response("again", [{"id": "y", "name": "search", "args": {}}], "tool_use")
    end = len(await db.events(first)) - 1
    second = await zincir.fork_run(db, first, end)

    record = (await db.state(second)).run
    assert (record.forked_from, record.fork_seq) == (first, end)
    assert triples((await db.events(second))[: end + 1]) == triples(await db.events(first))
    async with zincir.open_run(db, second) as run:
        keys = {p.call.id: p.effect_key for p in await run.pending_tools()}
    # The mail was asked for by the source: its effect is the source's. "y" is the first fork's.
    assert keys == {"mail": f"{source}:tool_call:mail", "y": f"{first}:tool_call:y"}


async def test_a_fork_at_a_checkpoint_starts_from_it(db: zincir.Database) -> None:
    source, seqs = await research_run(db)
    fork = await zincir.fork_run(db, source, at_checkpoint=1)

    state = await db.state(fork)
    assert state.run.fork_seq == seqs["checkpoint"]
    assert state.checkpoint is not None and state.checkpoint.status == "accepted"
    assert state.checkpoint.run_id == fork and state.checkpoint.state.completed == ["search"]
    assert [e.type for e in state.events] == [zincir.EventType.FORKED]


async def test_a_checkpoint_decided_after_the_fork_point_is_a_candidate_again(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await run.record_response(
            "", [{"id": "cp", "name": zincir.SUBMIT_CHECKPOINT, "args": {}}], "tool_use"
        )
        await run.checkpoint("cp", zincir.CheckpointState(completed=["a"]), verdict)
        source = run.id
    proposed = next(e.seq for e in await db.events(source) if e.type is zincir.EventType.CHECKPOINT_PROPOSED)
    fork = await zincir.fork_run(db, source, proposed)
    async with zincir.open_run(db, fork) as run:
        candidate = await run.pending_checkpoint()
        assert candidate is not None and candidate.state.completed == ["a"] and candidate.run_id == fork
        decided = await run.verify_checkpoint(candidate, verdict)  # the fork's verifier decides
        assert decided.status == "accepted"
        await run.complete()


@pytest.mark.parametrize("at", [-1, 10_000])
async def test_a_seq_outside_the_log_is_refused_and_writes_nothing(db: zincir.Database, at: int) -> None:
    source, _ = await research_run(db)
    before = dump(db)
    with pytest.raises(zincir.InvalidForkPoint, match=source):
        await zincir.fork_run(db, source, at)
    assert dump(db) == before


async def test_a_fork_point_that_is_not_there_is_refused_and_writes_nothing(db: zincir.Database) -> None:
    source, seqs = await research_run(db)
    before = dump(db)
    with pytest.raises(zincir.RunNotFound, match="00000000-0000-4000-8000-000000000000"):
        await zincir.fork_run(db, "00000000-0000-4000-8000-000000000000", 0)
    with pytest.raises(zincir.InvalidForkPoint, match="round 7"):
        await zincir.fork_run(db, source, at_checkpoint=7)
    # Inside a response and its tool calls (recorded together): the error names where to fork.
    with pytest.raises(
        zincir.InvalidForkPoint, match=f"fork at seq {seqs['second'] - 1} or {seqs['second_end']}"
    ):
        await zincir.fork_run(db, source, seqs["second"])
    with pytest.raises(zincir.InvalidForkPoint, match="recorded together"):
        await zincir.fork_run(db, source, seqs["checkpoint"] - 1)  # between a decision and its result
    with pytest.raises(zincir.InvalidArgument, match="exactly one"):
        await zincir.fork_run(db, source, 1, at_checkpoint=1)
    with pytest.raises(zincir.InvalidForkPoint):
        await zincir.fork_run(db, source, True)  # type: ignore[arg-type]
    assert dump(db) == before


async def test_a_fork_shares_the_children_its_prefix_spawned(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        child = await run.spawn("summarize", role="writer")
        source = run.id
    spawned_at = len(await db.events(source)) - 1
    fork = await zincir.fork_run(db, source, spawned_at)

    async with trio.open_nursery() as nursery, zincir.open_run(db, fork) as run:
        # The same name in the fork is the same child: not spawned twice.
        assert await run.spawn("summarize", role="writer") == child
        other = await run.spawn("translate")
        assert other != child

        async def finish_child() -> None:
            async with zincir.open_run(db, child) as child_run:
                await child_run.complete({"summary": "short"})

        nursery.start_soon(finish_child)
        with trio.fail_after(20):  # woken by the shared child's end, in this process
            joined = await run.join(child)
        assert joined.result == {"summary": "short"} and joined.parent_run_id == source
        with pytest.raises(zincir.InvalidArgument, match="shared with this fork"):  # the source's to cancel
            await run.cancel_child(child, "not the fork's")
        await run.cancel_child(other, "not needed")
        await run.complete()
    # The child is the source's still; the fork's own child is the fork's.
    assert (await db.state(child)).run.parent_run_id == source
    assert (await db.state(other)).run.parent_run_id == fork


async def test_a_suspended_fork_is_woken_by_the_end_of_a_shared_child(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        child = await run.spawn("slow")
        source = run.id
    fork = await zincir.fork_run(db, source, len(await db.events(source)) - 1)
    joined: list[zincir.RunRecord] = []
    release_child = trio.Event()

    async def handler(run: zincir.Run) -> None:
        if run.id == child:
            await release_child.wait()
            await run.complete("done")
            return
        if run.id != fork:
            return
        assert await run.spawn("slow") == child
        joined.append(await run.join(child))
        await run.complete()

    worker = zincir.ResumeWorker(db, handler, poll_interval=3600, suspend_after=0.05, max_concurrency=4)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        with trio.fail_after(20):
            while (await db.state(fork)).run.status is not zincir.RunStatus.WAITING:
                await trio.sleep(0.01)
            release_child.set()
            while (await db.state(fork)).run.status is not zincir.RunStatus.COMPLETED:
                await trio.sleep(0.01)
        worker.stop()
    assert [r.id for r in joined] == [child]


async def test_a_budgeted_fork_has_spent_what_its_prefix_spent(db: zincir.Database) -> None:
    budget = zincir.Budget(tokens=1_000, cost=5.0, max_identical_tool_calls=5)
    async with zincir.open_run(db, budget=budget) as run:
        usage = {"input_tokens": 100, "output_tokens": 20, "cost": 0.5}
        await run.record_response("", [{"id": "a", "name": "t", "args": {}}], "tool_use", usage=usage)
        await run.record_tool_result("a", 1)
        at = len(await db.events(run.id)) - 1
        await run.record_response("", [{"id": "b", "name": "t", "args": {}}], "tool_use", usage=usage)
        expected_source = await run.usage()
        source = run.id
    fork = await zincir.fork_run(db, source, at)
    async with zincir.open_run(db, fork) as run:
        spent = await run.usage()
    assert spent is not None and expected_source is not None
    assert spent.limits == expected_source.limits
    assert (spent.spent.input_tokens, spent.spent.output_tokens, spent.spent.cost) == (100, 20, 0.5)
    assert (spent.spent.model_calls, spent.spent.tool_calls) == (1, 1)
    assert expected_source.spent.model_calls == 2  # the source's spend is its own


async def test_steps_and_waits_done_in_the_prefix_are_not_done_again(db: zincir.Database) -> None:
    calls: list[str] = []

    async def side_effect(name: str) -> str:
        calls.append(name)
        return f"{name} done"

    async with zincir.open_run(db) as run:
        source = run.id
        await run.step("plan", side_effect, "plan")
        await zincir.send_signal(db, source, "go", {"n": 1})
        assert await run.wait_for_signal("start", "go") == {"n": 1}
        at = len(await db.events(source)) - 1
        await run.step("late", side_effect, "late")
    fork = await zincir.fork_run(db, source, at)
    async with zincir.open_run(db, fork) as run:
        assert await run.step("plan", side_effect, "plan") == "plan done"
        assert await run.wait_for_signal("start", "go") == {"n": 1}
        assert await run.step("late", side_effect, "late") == "late done"
        await run.complete()
    # "plan" ran once (the source's); "late" came after the fork point, so the fork ran it again.
    assert calls == ["plan", "late", "late"]


async def test_a_fork_taken_while_the_owner_writes_sees_a_consistent_prefix(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        source = run.id
        forks: list[tuple[str, int]] = []

        async def owner() -> None:
            for i in range(40):
                calls = [
                    {"id": f"c{i}", "name": "t", "args": {"i": i}},
                    {"id": f"d{i}", "name": "t", "args": {}},
                ]
                await run.record_response("", calls, "tool_use")
                await run.start_tool(f"c{i}")
                await run.record_tool_result(f"c{i}", i)
                await run.record_tool_result(f"d{i}", i)

        async def forker() -> None:
            while len(forks) < 15:
                events = await db.events(source)
                at = events[-1].seq
                if events[-1].type is not zincir.EventType.LLM_CALL:  # not inside a response
                    # InvalidForkPoint: a response's tool calls landed behind it meanwhile.
                    with contextlib.suppress(zincir.InvalidForkPoint):
                        forks.append((await zincir.fork_run(db, source, at), at))
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(owner)
            nursery.start_soon(forker)
    source_events = await db.events(source)
    answered = dict(rows(db, "SELECT call_id, result_seq FROM tool_intents WHERE run_id = ?", (source,)))
    assert len(forks) == 15
    for fork, at in forks:
        events = await db.events(fork)
        assert triples(events[: at + 1]) == triples(source_events[: at + 1])
        assert [e.seq for e in events] == list(range(len(events)))
        by_seq = {e.seq: e for e in events}
        inherited, pending = [], []
        for call_id, result_seq in rows(
            db, "SELECT call_id, result_seq FROM tool_intents WHERE run_id = ?", (fork,)
        ):
            source_seq = answered[call_id]
            if result_seq is None:
                pending.append(source_seq)
            elif result_seq <= at:
                assert result_seq == source_seq
            else:
                assert by_seq[result_seq].payload["inherited"] == {"run_id": source, "seq": source_seq}
                inherited.append(source_seq)
        # One snapshot of the source: every result it had by then is inherited, none after it.
        assert max(inherited, default=at) < min(pending, default=len(source_events)), (fork, at)


async def test_a_fork_of_a_finished_run_runs_under_a_worker(db: zincir.Database) -> None:
    source, seqs = await research_run(db)
    async with zincir.open_run(db, source) as run:
        await run.record_tool_result("mail", "sent")
        await run.record_tool_result("x", "found")
        await run.complete("v1 answer")
    fork = await zincir.fork_run(db, source, seqs["first"] + 2, config={"prompt": "v2"})

    async def handler(run: zincir.Run) -> None:
        assert run.config == {"prompt": "v2"}
        assert await run.pending_tools() == []  # the search's result is in the prefix
        await run.complete("v2 answer")

    worker = zincir.ResumeWorker(db, handler, until_idle=True)
    with trio.fail_after(20):
        await worker.run()
    assert (await db.state(fork)).run.result == "v2 answer"
    assert (await db.state(source)).run.result == "v1 answer"


# A process that forks a run; with "pause", it stops inside the fork's transaction (after the
# prefix was copied, before the commit) and says so, for the test to SIGKILL it there.
FORKER = """
import sys, time
import trio
import zincir
from zincir._store import _forks

target, source, at, how = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
copy_budget = _forks._copy_budget

def inside(*args):
    copy_budget(*args)
    print("inside", flush=True)
    time.sleep(600)

if how == "pause":
    _forks._copy_budget = inside

async def main():
    async with zincir.open_database(target) as db:
        print("forked", await zincir.fork_run(db, source, at), flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


@pytest.mark.parametrize("how", ["pause", "after"])
async def test_a_sigkill_during_fork_run_leaves_no_fork_or_a_whole_one(db: zincir.Database, how: str) -> None:
    source, seqs = await research_run(db)
    at = seqs["second_end"]
    before = dump(db)
    with running_python(FORKER, db.path, source, str(at), how) as forker:
        assert forker.stdout is not None
        line = await trio.to_thread.run_sync(forker.stdout.readline)
        os.kill(forker.pid, signal.SIGKILL)
        await trio.to_thread.run_sync(forker.wait)
    forks = rows(db, "SELECT id FROM agent_runs WHERE forked_from = ?", (source,))
    if how == "pause":  # killed inside the transaction: nothing of the fork is left
        assert line == "inside\n" and forks == []
        assert dump(db) == before
        return
    # Killed after fork_run returned: the fork is whole, and runs.
    assert line.startswith("forked ")
    [(fork,)] = forks
    assert line.split()[1] == fork
    assert without(dump(db), fork) == before.splitlines()
    events = await db.events(fork)
    assert [e.seq for e in events] == list(range(at + 3))  # the prefix, forked, the inherited result
    async with zincir.open_run(db, fork) as run:
        assert [p.call.id for p in await run.pending_tools()] == ["mail"]


async def test_approvals_come_as_the_prefix_logged_them(db: zincir.Database) -> None:
    calls = [{"id": "a", "name": "refund", "args": {"n": 1}}, {"id": "b", "name": "refund", "args": {"n": 2}}]
    async with zincir.open_run(db) as run:
        source = run.id
        await run.record_response("two refunds", calls, "tool_use")
        for call_id in ("a", "b"):
            with trio.move_on_after(0.05):
                await run.wait_for_approval(call_id)  # requested; stop waiting
        await zincir.decide_approval(db, source, "a", approved=True, by="ada")
        assert (await run.wait_for_approval("a")).approved is True  # logged: approval_decided
        at = len(await db.events(source)) - 1
        await zincir.decide_approval(db, source, "b", approved=False, by="bob")  # after the fork point
    fork = await zincir.fork_run(db, source, at)
    async with zincir.open_run(db, fork) as run:
        decided = await run.wait_for_approval("a")
        assert (decided.approved, decided.by) == (True, "ada")
        with trio.move_on_after(0.2) as waited:  # b's request is open again in the fork
            await run.wait_for_approval("b")
        assert waited.cancelled_caught
    decision = await zincir.decide_approval(db, fork, "b", approved=True, by="carol")
    assert (decision.approved, decision.by) == (True, "carol")
    assert rows(
        db, "SELECT approved, decided_by FROM approvals WHERE run_id = ? AND call_id = 'b'", (source,)
    ) == [(0, "bob")]
