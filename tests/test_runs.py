"""Runs: creation, leases, heartbeat, fencing, the event log, tool intents and results."""

from __future__ import annotations

import functools
import math
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import zincir
from zincir._budget import Debit
from zincir._store import Lease, NewChild

from .conftest import ManualClock
from .helpers import (
    counting_renewals,
    dump,
    next_renewal,
    read_state,
    rows,
    scalar,
    start_python,
    trace_operations,
)
from .test_database import Gate, writes_on_the_thread


def event_types(state: zincir.DurableState) -> list[str]:
    return [e.type.value for e in state.events]


def lease_row(path: Path, run_id: str) -> tuple[Any, ...]:
    conn = sqlite3.connect(path)
    try:
        return tuple(
            conn.execute(
                "SELECT status, lease_owner, lease_epoch, lease_expires_at FROM agent_runs WHERE id = ?",
                (run_id,),
            ).fetchone()
        )
    finally:
        conn.close()


async def new_released_run(db: zincir.Database, **kwargs: Any) -> str:
    async with zincir.open_run(db, **kwargs) as run:
        return run.id


# -- creation and the log -----------------------------------------------------------------------


async def test_a_new_run_is_leased_and_running_with_one_transition(
    db: zincir.Database, db_path: Path
) -> None:
    async with zincir.open_run(db, role="coder", provider="acme", config={"goal": "g"}) as run:
        assert run.epoch == 1
        assert run.fencing_token == f"{run.id}:1"
        state = await run.state()
        assert state.run.status is zincir.RunStatus.RUNNING
        assert (state.run.role, state.run.provider, state.run.config) == ("coder", "acme", {"goal": "g"})
        assert state.checkpoint is None
        [event] = state.events
        assert (event.seq, event.type, event.payload) == (
            0,
            "state_transition",
            {"from": "pending", "to": "running"},
        )
        status, owner, epoch, _ = lease_row(db_path, run.id)
        assert (status, epoch) == ("running", 1)
        assert owner is not None


async def test_responses_intents_and_results(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await run.record_response(
            {"text": "two tools"},
            [zincir.ToolCall("a", "search", {"q": 1}), {"id": "b", "name": "fetch", "args": ["x"]}],
            "tool_use",
            usage={"input_tokens": 10, "output_tokens": 3},
        )
        pending = await run.pending_tools()
        assert [p.call for p in pending] == [
            zincir.ToolCall("a", "search", {"q": 1}),
            zincir.ToolCall("b", "fetch", ["x"]),
        ]
        assert [p.idempotency_key for p in pending] == ["tool_call:a", "tool_call:b"]
        assert {p.fencing_token for p in pending} == {run.fencing_token}
        assert {p.response_tool_count for p in pending} == {2}

        await run.record_tool_result("b", {"body": "B"})
        assert [p.call.id for p in await run.pending_tools()] == ["a"]
        await run.record_tool_result("a", [1, 2])
        await run.record_tool_result("a", [1, 2])  # the identical repeat writes nothing
        assert await run.pending_tools() == []

        state = await run.state()
        assert event_types(state) == [
            "state_transition",
            "llm_call",
            "tool_call",
            "tool_call",
            "tool_result",
            "tool_result",
        ]
        llm = state.events[1].payload
        assert llm["usage"] == {"input_tokens": 10, "output_tokens": 3}
        assert llm["tool_calls"][1] == {"id": "b", "name": "fetch", "args": ["x"]}
        assert state.events[2].payload == {
            "call_id": "a",
            "name": "search",
            "args": {"q": 1},
            "response_tool_count": 2,
        }
        assert state.events[2].idempotency_key == "tool_call:a"
        assert state.events[4].payload == {"call_id": "b", "content": {"body": "B"}}
        assert state.events[4].idempotency_key == "tool_result:b"
        await run.complete()
    assert [*event_types(state), "state_transition"] == event_types(await read_state(db, run.id))


async def test_result_errors(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await run.record_response(
            "", [{"id": "a", "name": "t"}, {"id": "k", "name": "submit_checkpoint"}], "x"
        )
        await run.record_tool_result("a", 1)
        with pytest.raises(zincir.ConflictingResult, match=f"run {run.id}: tool call 'a'"):
            await run.record_tool_result("a", 2)
        with pytest.raises(zincir.NoDurableIntent, match="'nope'"):
            await run.record_tool_result("nope", 1)
        with pytest.raises(zincir.InvalidArgument, match="run.checkpoint"):
            await run.record_tool_result("k", {"accepted": True})


async def test_concurrent_appends_get_unique_gap_free_seqs(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        async with trio.open_nursery() as nursery:
            for i in range(100):
                nursery.start_soon(run.record_response, i, [{"id": f"c{i}", "name": "t"}], "tool_use")
        seqs = [e.seq for e in (await run.state()).events]
        assert seqs == list(range(201))
        assert len(await run.pending_tools()) == 100


async def test_complete_and_fail_are_terminal(db: zincir.Database, db_path: Path) -> None:
    async with zincir.open_run(db) as run:
        await run.record_response("", [{"id": "a", "name": "t"}], "tool_use")
        with pytest.raises(zincir.UnfinishedWork, match="'a'"):
            await run.complete()
        await run.record_tool_result("a", None)
        await run.complete()
        with pytest.raises(zincir.RunTerminal, match="completed"):
            await run.record_response("", [], "end")
    assert lease_row(db_path, run.id)[:2] == ("completed", None)
    with pytest.raises(zincir.RunTerminal, match="completed"):
        async with zincir.open_run(db, run.id, force=True):
            pass

    async with zincir.open_run(db) as failing:
        await failing.fail("gave up")
    state = await read_state(db, failing.id)
    assert state.run.status is zincir.RunStatus.FAILED
    assert state.events[-1].payload == {"from": "running", "to": "failed", "reason": "gave up"}


# -- leaving the block ----------------------------------------------------------------------------


class BodyError(Exception):
    pass


async def test_body_exceptions_leave_unchanged_and_release_the_lease(
    db: zincir.Database, db_path: Path
) -> None:
    with pytest.raises(BodyError) as info:
        async with zincir.open_run(db) as run:
            raise BodyError("mine")
    assert type(info.value) is BodyError
    status, owner, epoch, expires = lease_row(db_path, run.id)
    assert (status, owner, expires, epoch) == ("running", None, None, 1)


async def _noop() -> None:
    return None


class Takeover:
    """Another owner forcing its way in once the first one holds the run (and its nursery runs)."""

    def __init__(self) -> None:
        self.owning = trio.Event()
        self.done = trio.Event()

    async def steal(self, db: zincir.Database, run_id: str) -> None:
        await self.owning.wait()
        async with zincir.open_run(db, run_id, force=True):
            pass
        self.done.set()


async def _own_with_a_nursery(
    db: zincir.Database, run_id: str, takeover: Takeover, where: str, *, on_cancel: Exception | None = None
) -> None:
    """Own ``run_id`` with a body that opens a nursery of sleeping tasks; once another owner
    took the run over, write (from the body, or from a task of the nursery): the write is
    fenced, the lease is lost, and the nursery ends in a group. ``on_cancel``: a sleeping task
    raises it when it is cancelled (a real error beside the loss)."""

    async def sleeper() -> None:
        try:
            await trio.sleep_forever()
        finally:
            if on_cancel is not None:
                raise on_cancel

    async def write(run: zincir.Run) -> None:
        await takeover.done.wait()
        await run.step("after the takeover", _noop)

    async with zincir.open_run(db, run_id) as run, trio.open_nursery() as nursery:
        nursery.start_soon(sleeper)
        nursery.start_soon(trio.sleep_forever)
        takeover.owning.set()
        if where == "task":
            nursery.start_soon(write, run)
            await trio.sleep_forever()
        else:
            await write(run)


@pytest.mark.parametrize("where", ["body", "task"])
async def test_a_body_with_its_own_nursery_ends_in_a_plain_lease_lost(
    db: zincir.Database, where: str
) -> None:
    # Before, the block raised ExceptionGroup([LeaseLost]): the nursery's group, with the
    # cancelled sleepers taken out of it.
    run_id = await new_released_run(db)
    takeover = Takeover()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(takeover.steal, db, run_id)
        with pytest.raises(zincir.LeaseLost) as info:
            await _own_with_a_nursery(db, run_id, takeover, where)
    assert type(info.value) is zincir.LeaseLost
    assert f"run {run_id}: the lease of epoch 2" in str(info.value)


async def test_a_real_error_beside_a_lost_lease_is_not_hidden(db: zincir.Database) -> None:
    run_id = await new_released_run(db)
    takeover = Takeover()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(takeover.steal, db, run_id)
        with pytest.raises(ExceptionGroup) as info:
            await _own_with_a_nursery(db, run_id, takeover, "body", on_cancel=BodyError("cleanup"))
    assert info.group_contains(BodyError, match="cleanup")
    assert info.group_contains(zincir.LeaseLost)


async def test_leaving_normally_or_by_cancellation_releases(db: zincir.Database, db_path: Path) -> None:
    run_id = await new_released_run(db)
    assert lease_row(db_path, run_id)[1] is None
    with trio.move_on_after(0.01):
        async with zincir.open_run(db, run_id) as run:
            await trio.sleep_forever()
    assert run.epoch == 2
    assert lease_row(db_path, run_id)[1:] == (None, 2, None)
    async with zincir.open_run(db, run_id) as again:
        assert again.epoch == 3


async def test_open_run_accepts_a_path(db_path: Path) -> None:
    async with zincir.open_run(db_path) as run:
        await run.record_response("x", [], "end")
        await run.complete()
    assert scalar(db_path, "SELECT status FROM agent_runs") == "completed"


# -- leases ----------------------------------------------------------------------------------------


async def test_an_active_lease_blocks_a_second_owner(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        with pytest.raises(zincir.RunLeased, match=run.id):
            async with zincir.open_run(db, run.id):
                pass
        await run.record_response("still mine", [], "end")


async def test_an_expired_lease_is_taken_without_force(
    clocked_db: zincir.Database, clock: ManualClock
) -> None:
    async with trio.open_nursery() as nursery:
        taken = trio.Event()

        async def stalled_owner(task_status: trio.TaskStatus[zincir.Run]) -> None:
            with pytest.raises(zincir.LeaseLost, match="fenced by a newer owner"):
                async with zincir.open_run(clocked_db, lease_ttl=10) as run:
                    task_status.started(run)
                    await taken.wait()
                    await run.record_response("too late", [], "end")

        old = await nursery.start(stalled_owner)
        clock.advance(10.001)  # the old owner's heartbeat (every 3.3 s of trio time) never ran
        async with zincir.open_run(clocked_db, old.id) as new:
            assert new.epoch == old.epoch + 1
            taken.set()
            await new.record_response("mine now", [], "end")


async def test_force_fences_an_active_owner_and_cancels_its_body(
    clocked_db: zincir.Database,
    clock: ManualClock,
    mock_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Both clocks stand still until the test moves them to the next heartbeat: when the old
    # owner notices the fence is what is checked, and no loaded machine can delay a renewal
    # of either owner past its expiry.
    db, ttl = clocked_db, 0.3
    renewals = counting_renewals(monkeypatch, db._store)
    body_exited = trio.Event()
    outcome: list[BaseException] = []
    async with trio.open_nursery() as nursery:

        async def owner(task_status: trio.TaskStatus[zincir.Run]) -> None:
            try:
                async with zincir.open_run(db, lease_ttl=ttl) as run:
                    task_status.started(run)
                    try:
                        await trio.sleep_forever()
                    finally:
                        body_exited.set()
            except zincir.LeaseLost as exc:
                outcome.append(exc)

        fenced = await nursery.start(owner)
        async with zincir.open_run(db, fenced.id, force=True, lease_ttl=ttl) as new:
            forced_at = trio.current_time()
            for _ in range(3):  # a heartbeat of either owner, each every ttl / 3
                await trio.testing.wait_all_tasks_blocked()
                if body_exited.is_set():
                    break
                await next_renewal(db, new.id, renewals, mock_clock, clock)
            # Detected by the old owner's next heartbeat: within one TTL.
            assert body_exited.is_set()
            assert trio.current_time() - forced_at < ttl
            assert new.epoch == 2
            await new.record_response("the new owner writes", [], "end")
    [lost] = outcome
    assert type(lost) is zincir.LeaseLost
    assert f"run {fenced.id}" in str(lost)
    assert "epoch 1" in str(lost) and "epoch 2" in str(lost)
    # Every method of the fenced Run raises LeaseLost now, except state().
    with pytest.raises(zincir.LeaseLost):
        await fenced.pending_tools()
    with pytest.raises(zincir.LeaseLost):
        await fenced.complete()
    # The fenced owner's attempt ended without a record of its own: the takeover logged it.
    assert [e.type for e in (await fenced.state()).events] == [
        zincir.EventType.STATE_TRANSITION,
        zincir.EventType.ATTEMPT_LOST,
        zincir.EventType.LEASE_TAKEN_OVER,
        zincir.EventType.LLM_CALL,
    ]


STATE_JSON = zincir.CheckpointState().to_json()

# Every store operation a run owner performs, with arguments it would otherwise accept.
GUARDED: list[tuple[str, tuple[Any, ...]]] = [
    ("record_response", ('{"content":"x"}', [], Debit(0, 0, 0.0, ()))),
    ("note_exceeded", ("wall_time", "probe")),
    ("record_tool_result", ("tool", '{"call_id":"tool","content":1}')),
    ("pending_tools", ()),
    (
        "propose_checkpoint",
        ("cp-2", '{"artifacts":[],"completed":[],"evidence":[],"failed_attempts":[],"remaining":[]}'),
    ),
    ("candidate", (None,)),
    ("decide_checkpoint", (1, '{"evidence":null,"passed":true}', True)),
    ("complete_step", ("step", '"x"', 0)),
    ("schedule_timer", ("nap", 10)),
    ("complete_timer", ("nap",)),
    ("finish", (zincir.RunStatus.FAILED, '{"from":"running","to":"failed"}', None)),
    ("suspend", ([("sleep", "nap")],)),
    ("spawn_children", ([NewChild("kid", "00000000-0000-4000-8000-00000000000c", "agent", "", "{}")],)),
    ("await_child", ("00000000-0000-4000-8000-00000000000c", None)),
    ("join_children", (["00000000-0000-4000-8000-00000000000c"],)),
    ("cancel_child", ("00000000-0000-4000-8000-00000000000c", "why")),
    ("record_attempt_failure", ('{"attempt":1}', None, "attempts exhausted")),
    ("renew", ()),
]


@pytest.mark.parametrize(("operation", "args"), GUARDED, ids=[name for name, _ in GUARDED])
async def test_a_stale_owner_is_fenced_inside_the_transaction(
    db: zincir.Database, db_path: Path, operation: str, args: tuple[Any, ...]
) -> None:
    # The Run object refuses a lost lease before the database; this goes to the store
    # directly, as a process that has not noticed its loss yet would.
    async with zincir.open_run(db) as first:
        calls = [{"id": "tool", "name": "t"}, {"id": "cp-1", "name": zincir.SUBMIT_CHECKPOINT}]
        await first.record_response("", calls, "tool_use")
        await first.record_tool_result("tool", 0)
        with pytest.raises(VerifierStop):
            await first.checkpoint("cp-1", zincir.CheckpointState(), _stop_verifier)
        await first.record_response("", [{"id": "cp-2", "name": zincir.SUBMIT_CHECKPOINT}], "x")
        stale = first._lease
    async with zincir.open_run(db, stale.run_id) as second:
        before = dump(db_path)
        submit = db._read if operation in ("pending_tools", "candidate") else db._write
        with pytest.raises(zincir.LeaseLost, match="fenced by a newer owner"):
            await submit(getattr(db._store, operation), stale, *args)
        assert not await db._write(db._store.release, stale, 0)
        assert dump(db_path) == before
        assert second.epoch == stale.epoch + 1


class VerifierStop(Exception):
    pass


async def _stop_verifier(state: zincir.CheckpointState) -> zincir.Verification:
    raise VerifierStop  # leaves the candidate undecided


async def test_a_renewal_delayed_past_expiry_cannot_resurrect_the_lease(
    clocked_db: zincir.Database, clock: ManualClock
) -> None:
    renewal_error: list[Exception] = []
    with pytest.raises(zincir.LeaseLost, match="expired") as block_error:
        async with zincir.open_run(clocked_db, lease_ttl=10) as run:
            writes_on_the_thread(clocked_db)
            gate = Gate()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(clocked_db._write, gate.pause, route=run.id))
                await gate.wait_entered()

                async def renew() -> None:
                    try:
                        await clocked_db._write(clocked_db._store.renew, run._lease, route=run.id)
                    except zincir.LeaseLost as exc:
                        renewal_error.append(exc)

                nursery.start_soon(renew)  # submitted while the lease is still valid
                await trio.testing.wait_all_tasks_blocked()
                clock.advance(10.5)  # ... but it only runs after the lease expired
                gate.opened.set()
            await run.record_response("x", [], "end")
    [error] = renewal_error
    assert "expired 500 ms ago" in str(error)
    assert "expired" in str(block_error.value)


async def test_the_heartbeat_keeps_a_short_lease_alive(
    clocked_db: zincir.Database,
    clock: ManualClock,
    mock_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    db_path: Path,
) -> None:
    # A 0.12 s lease, for four of its lifetimes. Both clocks stand still until the test moves
    # them to the heartbeat's next wake-up: a loaded machine cannot make a renewal late here.
    db, ttl = clocked_db, 0.12
    renewals = counting_renewals(monkeypatch, db._store)
    async with zincir.open_run(db, lease_ttl=ttl) as run:
        waits = []
        while sum(waits) < 4 * ttl:
            waits.append(await next_renewal(db, run.id, renewals, mock_clock, clock))
            with pytest.raises(zincir.RunLeased):
                async with zincir.open_run(db, run.id):
                    pass
        await run.record_response("alive", [], "end")
        assert lease_row(db_path, run.id)[2] == 1
    assert max(waits) < ttl  # renewed before each expiry


async def test_releasing_and_reacquiring_increments_the_epoch(db: zincir.Database) -> None:
    run_id = await new_released_run(db)
    epochs = []
    for _ in range(3):
        async with zincir.open_run(db, run_id) as run:
            epochs.append(run.epoch)
    assert epochs == [2, 3, 4]


HOLD_RUN = """
    import os, sys, time, trio, zincir
    path, run_id, go, done = sys.argv[1:5]
    async def main():
        async with zincir.open_database(path) as db:
            print("ready", flush=True)
            while not os.path.exists(go):
                time.sleep(0.0005)
            try:
                async with zincir.open_run(db, run_id, lease_ttl=30) as run:
                    print("won", flush=True)
                    while not os.path.exists(done):  # hold the lease until the test has seen both
                        await trio.sleep(0.01)
            except zincir.RunLeased:
                print("leased", flush=True)
    trio.run(main)
"""


async def test_two_processes_open_one_run_exactly_one_wins(
    db: zincir.Database, db_path: Path, tmp_path: Path
) -> None:
    run_id = await new_released_run(db)
    go = tmp_path / "go"
    done = tmp_path / "done"
    procs = [start_python(HOLD_RUN, str(db_path), run_id, str(go), str(done)) for _ in range(2)]
    try:
        for proc in procs:  # both are ready at the barrier: they race for real
            assert proc.stdout is not None
            assert (await trio.to_thread.run_sync(proc.stdout.readline)).strip() == "ready"
        go.touch()
        outcomes = [(await trio.to_thread.run_sync(p.stdout.readline)).strip() for p in procs]  # type: ignore[union-attr]
        assert sorted(outcomes) == ["leased", "won"]
    finally:
        done.touch()
        for proc in procs:
            try:
                await trio.to_thread.run_sync(lambda p=proc: p.communicate(timeout=30))
            finally:
                proc.kill()
    assert [p.returncode for p in procs] == [0, 0]


# -- bad input ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda r: r.record_response(object(), [], "x"), zincir.InvalidArgument, "not a JSON value"),
        (lambda r: r.record_response(math.nan, [], "x"), zincir.InvalidArgument, "not a JSON value"),
        (lambda r: r.record_response({"x": math.inf}, [], "x"), zincir.InvalidArgument, "not a JSON"),
        (lambda r: r.record_response("x" * 5000, [], "x"), zincir.InvalidArgument, "over the limit"),
        (
            lambda r: r.record_response("", [{"id": "", "name": "t"}], "x"),
            zincir.DuplicateToolCall,
            "non-empty",
        ),
        (
            lambda r: r.record_response("", [{"id": "a", "name": "t"}, {"id": "a", "name": "t"}], "x"),
            zincir.DuplicateToolCall,
            "twice",
        ),
        (
            lambda r: r.record_response("", [{"id": "used", "name": "t"}], "x"),
            zincir.DuplicateToolCall,
            "already used",
        ),
        (
            lambda r: r.record_response("", [{"id": "n", "name": "t" * 256}], "x"),
            zincir.InvalidArgument,
            "1 to 255",
        ),
        (lambda r: r.record_response("", [{"id": "n"}], "x"), zincir.InvalidArgument, "lacks"),
        (lambda r: r.record_response("", [], 7), zincir.InvalidArgument, "stop_reason"),
        (lambda r: r.record_tool_result("", 1), zincir.InvalidArgument, "call_id"),
        (lambda r: r.record_tool_result("used", {1, 2}), zincir.InvalidArgument, "not a JSON value"),
        (lambda r: r.fail(None), zincir.InvalidArgument, "reason"),
        (lambda r: r.sleep("nap", -1), zincir.InvalidArgument, "duration"),
        (lambda r: r.sleep("nap", math.inf), zincir.InvalidArgument, "duration"),
        (lambda r: r.sleep("", 1), zincir.InvalidArgument, "1 to 255"),
        (lambda r: r.step("x" * 256, trio.sleep, 0), zincir.InvalidArgument, "1 to 255"),
    ],
)
async def test_bad_input_gets_its_error_and_writes_nothing(
    db_path: Path, call: Any, error: type[Exception], match: str
) -> None:
    async with zincir.open_database(db_path, max_payload_bytes=4096) as db, zincir.open_run(db) as run:
        await run.record_response("", [{"id": "used", "name": "t"}], "x")
        before = dump(db_path)
        with pytest.raises(error, match=match) as info:
            await call(run)
        assert run.id in str(info.value)
        assert dump(db_path) == before


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"lease_ttl": 0.029}, zincir.InvalidArgument, "at least 0.03"),
        ({"lease_ttl": math.nan}, zincir.InvalidArgument, "finite"),
        ({"role": ""}, zincir.InvalidArgument, "role"),
        ({"config": {"x": object()}}, zincir.InvalidArgument, "config"),
        ({"parent_run_id": "not-a-uuid"}, zincir.InvalidArgument, "not a UUID"),
        ({"parent_run_id": "00000000-0000-0000-0000-000000000000"}, zincir.RunNotFound, "parent run"),
        ({"run_id": "00000000-0000-0000-0000-000000000000"}, zincir.RunNotFound, "00000000-0000"),
        ({"run_id": "nope"}, zincir.InvalidArgument, "not a UUID"),
    ],
)
async def test_bad_open_run_arguments_write_nothing(
    db: zincir.Database, db_path: Path, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    before = dump(db_path)
    with pytest.raises(error, match=match):
        async with zincir.open_run(db, **kwargs):
            pass
    assert dump(db_path) == before


def test_runs_have_no_public_constructor() -> None:
    with pytest.raises(TypeError, match="open_run"):
        zincir.Run()


async def test_transient_renewal_errors_are_retried_not_a_loss(
    clocked_db: zincir.Database,
    clock: ManualClock,
    mock_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # When the heartbeat retries is what this is about, so time is the subject here: both the
    # database's clock and Trio's stand still until the test moves them together, to the
    # heartbeat's next wake-up, and each renewal is awaited before time moves on.
    db = clocked_db
    renew = db._store.renew
    calls: list[str] = []

    def flaky_renew(tx: Any, lease: Lease) -> Lease:
        calls.append("renew")
        if 1 <= len(calls) <= 3:
            raise zincir.DatabaseBusy("simulated: another process holds the write lock")
        return renew(tx, lease)

    monkeypatch.setattr(db._store, "renew", flaky_renew)
    renewals = counting_renewals(monkeypatch, db._store)
    async with zincir.open_run(db, lease_ttl=30) as run:  # renews every 10 s
        waits = [await next_renewal(db, run.id, renewals, mock_clock, clock) for _ in range(5)]
        await run.record_response("still the owner", [], "end")
    assert len(calls) == 5  # three failed, then two succeeded
    interval, *retries, after = waits
    assert interval == pytest.approx(10) and after == pytest.approx(10)  # ttl / 3 (renewed)
    assert interval > retries[0] > retries[1] > retries[2]  # sooner as the expiry nears ...
    assert interval + sum(retries) < 30  # ... and the one that succeeded came before it


async def test_renewals_are_spaced_from_when_each_was_sent_not_when_it_was_answered(
    clocked_db: zincir.Database,
    clock: ManualClock,
    mock_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # When the heartbeat renews is what this is about: both clocks stand still but when the test
    # moves them. The first renewal (10 s in, on a 30 s lease) takes 4 s to be answered; the next
    # is sent 10 s after the first was sent, 6 s after its answer. Before, it was sent 10 s after
    # the answer: every slow answer pushed all later renewals back, towards the deadline.
    db = clocked_db
    renew = db._store.renew
    entered, answer = threading.Event(), threading.Event()

    def slow_first_renew(tx: Any, lease: Lease) -> Any:
        if not entered.is_set():
            entered.set()
            assert answer.wait(10), "the test never let the renewal answer"
        return renew(tx, lease)

    monkeypatch.setattr(db._store, "renew", slow_first_renew)
    renewals = counting_renewals(monkeypatch, db._store)
    writes_on_the_thread(db)  # SQLite would run the renewal on the loop, which the test holds
    async with zincir.open_run(db, lease_ttl=30) as run:
        await trio.testing.wait_all_tasks_blocked()  # the heartbeat sleeps until its first renewal
        first = trio.lowlevel.current_statistics().seconds_to_next_deadline
        mock_clock.jump(first)
        clock.advance(first)
        assert await trio.to_thread.run_sync(entered.wait, 10)  # sent, and not answered yet
        mock_clock.jump(4)
        clock.advance(4)
        answer.set()
        assert await trio.to_thread.run_sync(renewals.acquire, True, 10)
        await db._write(_noop_tx, route=run.id)  # behind the renewal, on its writer: answered
        after_the_answer = await next_renewal(db, run.id, renewals, mock_clock, clock)
        await run.record_response("still the owner", [], "end")
    assert first == pytest.approx(10)
    assert after_the_answer == pytest.approx(6)


def _noop_tx(tx: Any) -> None:
    pass


async def _jump_to_the_heartbeat(mock_clock: trio.testing.MockClock, clock: ManualClock) -> None:
    """Move both clocks to the next timer due (the heartbeat's or the owner's deadline)."""
    await trio.testing.wait_all_tasks_blocked()
    wait = trio.lowlevel.current_statistics().seconds_to_next_deadline
    mock_clock.jump(wait)
    clock.advance(wait)


async def test_renewals_refused_for_a_lock_held_elsewhere_say_so(
    db_path: Path, clock: ManualClock, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another connection holds SQLite's write lock: each renewal waits out the busy timeout (a
    # short one here, in real time, on the writer thread) and fails with DatabaseBusy. The
    # owner's deadline, on Trio's clock that only the test moves, then says the lock was held,
    # not that nothing answered.
    async with zincir.open_database(db_path, clock=clock) as db:
        session = db._writers[0]._session
        session.busy_timeout_ms = 100  # a short real wait for the lock, on the writer thread
        tried = threading.Semaphore(0)  # released after each BEGIN of the writer, taken or refused
        begin = session.begin

        def counted_begin() -> None:
            try:
                begin()
            finally:
                tried.release()

        monkeypatch.setattr(session, "begin", counted_begin)
        locker = sqlite3.connect(db_path, isolation_level=None)
        try:
            with pytest.raises(zincir.LeaseLost) as info:
                async with zincir.open_run(db, lease_ttl=30) as run:
                    locker.execute("BEGIN IMMEDIATE")
                    await _jump_to_the_heartbeat(mock_clock, clock)  # the first renewal, sent
                    assert await trio.to_thread.run_sync(tried.acquire, True, 10)  # refused
                    while run._renewal_sent_at is not None:  # its answer is on its way to the loop
                        await trio.lowlevel.checkpoint()
                    await _jump_to_the_heartbeat(mock_clock, clock)  # its retry, sent ...
                    while run._renewal_sent_at is None:
                        await trio.lowlevel.checkpoint()
                    await _jump_to_the_heartbeat(mock_clock, clock)  # the deadline: unanswered still
                    await trio.sleep_forever()
        finally:
            locker.rollback()
            locker.close()
    message = str(info.value)
    assert f"run {run.id}: the lease of epoch 1 was given up: no renewal was confirmed" in message
    assert "another connection held the database's write lock, so the renewals failed" in message
    assert "is unanswered" in message


@pytest.mark.parametrize("end", ["complete", "fail"])
async def test_a_renewal_racing_complete_is_not_a_lease_loss(
    db: zincir.Database, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch, end: str
) -> None:
    # The race, forced: the heartbeat's renewal is queued right behind the write that ends the
    # run, so it runs after that write committed and finds the run over. Before the fix this
    # cancelled the finished body and the block raised LeaseLost although the run had ended.
    order = trace_operations(monkeypatch, db._store, "finish", "renew")
    async with zincir.open_run(db, lease_ttl=30) as run:  # renews every 10 s of Trio time
        writes_on_the_thread(db)
        gate = Gate()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(db._write, gate.pause, route=run.id))
            await gate.wait_entered()
            nursery.start_soon(run.complete if end == "complete" else functools.partial(run.fail, "done"))
            await trio.testing.wait_all_tasks_blocked()  # the end is queued behind the gate
            mock_clock.jump(10)  # the heartbeat wakes and queues its renewal behind the end
            await trio.testing.wait_all_tasks_blocked()
            gate.opened.set()
    # One batch: the renewal failed, so the batch ran again with a savepoint each (its end kept).
    assert order == [("finish", None), ("renew", "RunTerminal")] * 2
    expected = zincir.RunStatus.COMPLETED if end == "complete" else zincir.RunStatus.FAILED
    state = await read_state(db, run.id)
    assert state.run.status is expected
    assert [e.seq for e in state.events] == [0, 1]


async def test_a_write_racing_the_runs_own_end_is_not_a_lease_loss(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def noop() -> None:
        return None

    order = trace_operations(monkeypatch, db._store, "finish", "complete_step")
    raced: list[BaseException] = []

    async def step_behind_the_end(run: zincir.Run) -> None:
        try:
            await run.step("late", noop)
        except zincir.RunTerminal as exc:
            raced.append(exc)

    async with zincir.open_run(db) as run:
        await run.step("early", noop)  # steps are loaded: the next step goes straight to its write
        writes_on_the_thread(db)
        gate = Gate()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(db._write, gate.pause, route=run.id))
            await gate.wait_entered()
            nursery.start_soon(run.fail, "giving up")
            await trio.testing.wait_all_tasks_blocked()  # fail()'s write is queued ...
            nursery.start_soon(step_behind_the_end, run)
            await trio.testing.wait_all_tasks_blocked()  # ... and the step's write right behind it
            gate.opened.set()
    # The step's write was in flight while the run ended: the store refused it as terminal.
    # (the end and the step were one batch, run again with savepoints after the step failed)
    assert order == [("complete_step", None), *[("finish", None), ("complete_step", "RunTerminal")] * 2]
    [error] = raced
    assert "already failed" in str(error)
    state = await read_state(db, run.id)
    assert state.run.status is zincir.RunStatus.FAILED
    assert rows(db, "SELECT name FROM steps") == [("early",)]


def nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda r: r.record_response("", [], "x", usage=5), "usage must be a mapping"),
        (lambda r: r.record_response(nested(100_000), [], "x"), "deeper than 100 levels"),
        (lambda r: r.checkpoint(["c1"], zincir.CheckpointState(), None), "call_id"),
        (lambda r: r.sleep("nap", 1e20), "at most"),
    ],
)
async def test_more_bad_input_gets_invalid_argument(db: zincir.Database, call: Any, match: str) -> None:
    async with zincir.open_run(db) as run:
        before = dump(db)
        with pytest.raises(zincir.InvalidArgument, match=match):
            await call(run)
        assert dump(db) == before


async def test_an_absurd_lease_ttl_is_refused(db: zincir.Database) -> None:
    with pytest.raises(zincir.InvalidArgument, match="at most"):
        async with zincir.open_run(db, lease_ttl=1e20):
            pass
