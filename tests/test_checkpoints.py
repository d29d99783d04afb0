"""Verified checkpoints: propose, verify, decide; crashes in between; fresh-context state."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import attrs
import pytest
import trio

import zincir
from zincir import CheckpointState, Verification

from .helpers import dump, read_state, rows, running_python, scalar

DONE = CheckpointState(completed=["wrote the file"], remaining=[], artifacts=["out.txt"], evidence=["ok"])


async def accept(state: CheckpointState) -> Verification:
    return Verification(True, {"checked": state.completed})


async def reject(state: CheckpointState) -> Verification:
    return Verification(False, {"why": "not good enough"})


async def submit(run: zincir.Run, call_id: str, state: CheckpointState = DONE, *siblings: str) -> None:
    calls = [{"id": s, "name": "write_file", "args": {}} for s in siblings]
    calls.append({"id": call_id, "name": zincir.SUBMIT_CHECKPOINT, "args": state.to_json()})
    await run.record_response("checkpoint", calls, "tool_use")


def types(events: list[zincir.Event]) -> list[str]:
    return [e.type.value for e in events]


async def test_propose_verify_decide(db: zincir.Database) -> None:
    async with zincir.open_run(db, config={"goal": "g"}) as run:
        await submit(run, "cp-1")
        seen: list[CheckpointState] = []

        async def verify(state: CheckpointState) -> Verification:
            seen.append(state)
            # The candidate is durable before the verifier runs.
            assert (await run.pending_checkpoint()) is not None
            return Verification(True, {"looked_at": state.artifacts})

        checkpoint = await run.checkpoint("cp-1", DONE, verify)
        assert seen == [DONE]
        assert checkpoint.status == "accepted"
        assert (checkpoint.round, checkpoint.tool_call_id) == (1, "cp-1")
        assert checkpoint.verification == Verification(True, {"looked_at": ["out.txt"]})
        assert checkpoint.based_on_event_seq == 2
        assert checkpoint.decision_event_seq == 4
        assert checkpoint.decided_at is not None
        assert await run.pending_checkpoint() is None
        assert await run.pending_tools() == []

        state = await run.state()
        assert state.checkpoint == checkpoint
        assert state.events == []  # proposal, decision and its tool result are all behind it
        await run.record_response("next round", [], "end_turn")
        state = await run.state()
        assert types(state.events) == ["llm_call"]
        await run.complete()
    log = rows(db, "SELECT seq, type, payload, idempotency_key FROM events ORDER BY seq")
    assert [row[1] for row in log] == [
        "state_transition", "llm_call", "tool_call", "checkpoint_proposed",
        "checkpoint_accepted", "tool_result", "llm_call", "state_transition",
    ]  # fmt: skip
    assert log[4][3] == f"checkpoint:{checkpoint.id}:accepted"
    assert log[5][3] == f"checkpoint:{checkpoint.id}:tool_result"
    assert '"call_id":"cp-1"' in log[5][2] and '"accepted":true' in log[5][2]


async def test_a_rejection_keeps_the_baseline_and_a_new_round_can_succeed(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await submit(run, "cp-1")
        first = await run.checkpoint("cp-1", DONE, reject)
        assert first.status == "rejected"
        state = await run.state()
        assert state.checkpoint is None
        assert "checkpoint_rejected" in types(state.events)
        with pytest.raises(zincir.CheckpointNotPending, match="already decided"):
            await run.checkpoint("cp-1", DONE, accept)

        await submit(run, "cp-2")
        second = await run.checkpoint("cp-2", DONE, accept)
        assert (second.round, second.status) == (2, "accepted")
        assert (await run.state()).checkpoint == second


async def test_the_latest_accepted_checkpoint_is_the_baseline(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await submit(run, "cp-1", CheckpointState(completed=["a"], remaining=["b"]))
        await run.checkpoint("cp-1", CheckpointState(completed=["a"], remaining=["b"]), accept)
        await run.record_response("work", [], "end_turn")
        await submit(run, "cp-2")
        await run.checkpoint("cp-2", DONE, accept)
        state = await run.state()
        assert state.checkpoint is not None and state.checkpoint.round == 2
        assert state.events == []


async def test_siblings_must_have_results_first(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await submit(run, "cp", DONE, "w1", "w2")
        await run.record_tool_result("w1", "ok")
        with pytest.raises(zincir.CheckpointNotPending, match="'w2'"):
            await run.checkpoint("cp", DONE, accept)
        await run.record_tool_result("w2", "ok")
        checkpoint = await run.checkpoint("cp", DONE, accept)
        assert checkpoint.status == "accepted"
        await run.complete()


async def test_refusals(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await run.record_response("", [{"id": "tool", "name": "write_file"}], "tool_use")
        before = dump(db)
        with pytest.raises(zincir.CheckpointNotPending, match="no durable intent"):
            await run.checkpoint("missing", DONE, accept)
        with pytest.raises(zincir.CheckpointNotPending, match="not submit_checkpoint"):
            await run.checkpoint("tool", DONE, accept)
        with pytest.raises(zincir.InvalidArgument, match="exactly the lists"):
            await run.checkpoint("tool", {"completed": []}, accept)
        assert dump(db) == before


class VerifierError(Exception):
    pass


async def test_a_failing_verifier_leaves_the_candidate_undecided(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await submit(run, "cp-1")

        async def broken(state: CheckpointState) -> Verification:
            raise VerifierError("verifier crashed")

        with pytest.raises(VerifierError):
            await run.checkpoint("cp-1", DONE, broken)
        candidate = await run.pending_checkpoint()
        assert candidate is not None and candidate.status == "candidate"
        with pytest.raises(zincir.UnfinishedWork, match="undecided"):
            await run.complete()
        await submit(run, "cp-2")
        with pytest.raises(zincir.CheckpointNotPending, match="already has an undecided"):
            await run.checkpoint("cp-2", DONE, accept)
        decided = await run.verify_checkpoint(candidate, accept)
        assert decided.status == "accepted"


async def test_a_forged_candidate_copy_is_ignored(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await submit(run, "cp-1")
        with pytest.raises(VerifierError):
            await run.checkpoint("cp-1", DONE, _raise)
        candidate = await run.pending_checkpoint()
        assert candidate is not None
        forged = attrs.evolve(candidate, state=CheckpointState(completed=["everything, trust me"]))
        seen: list[CheckpointState] = []

        async def verify(state: CheckpointState) -> Verification:
            seen.append(state)
            return Verification(True, None)

        decided = await run.verify_checkpoint(forged, verify)
        assert seen == [DONE]
        assert decided.state == DONE
        with pytest.raises(zincir.CheckpointNotPending):
            await run.verify_checkpoint(candidate, verify)


async def _raise(state: CheckpointState) -> Verification:
    raise VerifierError


async def test_losing_the_lease_during_verification_decides_nothing(db: zincir.Database) -> None:
    verifying = trio.Event()

    async def slow(state: CheckpointState) -> Verification:
        verifying.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async with trio.open_nursery() as nursery:

        async def owner(task_status: trio.TaskStatus[str]) -> None:
            with pytest.raises(zincir.LeaseLost):
                async with zincir.open_run(db, lease_ttl=0.3) as run:
                    await submit(run, "cp-1")
                    task_status.started(run.id)
                    await run.checkpoint("cp-1", DONE, slow)

        run_id = await nursery.start(owner)
        await verifying.wait()
        async with zincir.open_run(db, run_id, force=True) as new:
            candidate = await new.pending_checkpoint()
            assert candidate is not None
    assert scalar(db, "SELECT status FROM checkpoints") == "candidate"


CRASH_IN_VERIFIER = """
    import sys, trio, zincir
    path = sys.argv[1]
    state = zincir.CheckpointState(completed=["done"], artifacts=["a"])
    async def stuck(state):
        print("verifying", flush=True)
        await trio.sleep_forever()
    async def main():
        async with zincir.open_run(path, lease_ttl=30) as run:
            print(run.id, flush=True)
            call = {"id": "cp", "name": "submit_checkpoint", "args": state.to_json()}
            await run.record_response("", [call], "x")
            await run.checkpoint("cp", state, stuck)
    trio.run(main)
"""


async def test_a_candidate_survives_a_crash_during_verification(db_path: Path) -> None:
    with running_python(CRASH_IN_VERIFIER, str(db_path)) as proc:
        assert proc.stdout is not None
        run_id = (await trio.to_thread.run_sync(proc.stdout.readline)).strip()
        assert (await trio.to_thread.run_sync(proc.stdout.readline)).strip() == "verifying"
        proc.send_signal(signal.SIGKILL)
        await trio.to_thread.run_sync(proc.wait)

    async with zincir.open_database(db_path) as db:
        # The dead owner's 30 s lease is still active, but its process (of this host) is gone:
        # the lease is taken over at once, no force needed.
        async with zincir.open_run(db, run_id) as run:
            candidate = await run.pending_checkpoint()
            assert candidate is not None
            assert candidate.state == CheckpointState(completed=["done"], artifacts=["a"])
            [pending] = await run.pending_tools()
            assert pending.call.name == zincir.SUBMIT_CHECKPOINT
            decided = await run.verify_checkpoint(candidate, accept)
            assert decided.status == "accepted"
            await run.complete()
        state = await read_state(db, run_id)
        assert state.run.status is zincir.RunStatus.COMPLETED


async def test_a_verifier_must_answer_with_a_bool(db: zincir.Database) -> None:
    async def sloppy(state: CheckpointState) -> Verification:
        return Verification("false", None)  # type: ignore[arg-type]

    async with zincir.open_run(db) as run:
        await submit(run, "cp-1")
        with pytest.raises(zincir.InvalidArgument, match="passed is a bool"):
            await run.checkpoint("cp-1", DONE, sloppy)
        candidate = await run.pending_checkpoint()
        assert candidate is not None
        assert candidate.status == "candidate"


async def test_a_verifier_that_outlives_the_lease_decides_nothing(db: zincir.Database) -> None:
    # The verifier ignores cancellation and answers after another owner took over: the
    # decision must be refused inside its transaction, not written.
    verifying = trio.Event()
    taken = trio.Event()
    finished = trio.Event()

    async def stubborn(state: CheckpointState) -> Verification:
        verifying.set()
        with trio.CancelScope(shield=True):
            await taken.wait()
        return Verification(True, {"too": "late"})

    async with trio.open_nursery() as nursery:

        async def owner(task_status: trio.TaskStatus[str]) -> None:
            try:
                with pytest.raises(zincir.LeaseLost, match="fenced"):
                    async with zincir.open_run(db, lease_ttl=30) as run:
                        await submit(run, "cp-1")
                        task_status.started(run.id)
                        await run.checkpoint("cp-1", DONE, stubborn)
            finally:
                finished.set()

        run_id = await nursery.start(owner)
        await verifying.wait()
        async with zincir.open_run(db, run_id, force=True):
            taken.set()
            await finished.wait()
    assert scalar(db, "SELECT status FROM checkpoints") == "candidate"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({1: "x"}, "keys are strings: data has the key 1 (int)"),
        ({"files": [{"a.py": 1, None: 2}]}, "data['files'][0] has the key None (NoneType)"),
        ({"score": float("nan")}, "CheckpointState.data is not a JSON value: Out of range float"),
        ({"seen": {"a.py"}}, "not a JSON value: Object of type set is not JSON serializable"),
    ],
)
def test_checkpoint_data_that_json_cannot_keep_is_refused_at_once(data: object, message: str) -> None:
    # Before, these were accepted here, and JSON turned 1 into "1" when the checkpoint was stored
    # (the state read back differed from the one proposed) or refused them only then.
    with pytest.raises(zincir.InvalidArgument) as info:
        CheckpointState(data=data)  # type: ignore[arg-type]
    assert message in str(info.value)


async def test_checkpoint_data_round_trips_and_an_old_checkpoint_reads_as_empty(db: zincir.Database) -> None:
    state = CheckpointState(
        completed=["committed"], data={"commit": "4f2a9c1", "files": ["a.py"], "tries": 3}
    )
    assert CheckpointState.from_json(state.to_json()) == state
    lists_only = {k: v for k, v in state.to_json().items() if k != "data"}
    assert CheckpointState.from_json(lists_only) == attrs.evolve(state, data={})
    with pytest.raises(zincir.InvalidArgument, match="'data' must be an object"):
        CheckpointState.from_json({**lists_only, "data": ["not", "an", "object"]})
    with pytest.raises(zincir.InvalidArgument, match="must be a dict"):
        CheckpointState(data=["x"])  # type: ignore[arg-type]
    async with zincir.open_run(db) as run:
        await submit(run, "cp-1", state)
        decided = await run.checkpoint("cp-1", state.to_json(), accept)  # as the model's args
        assert decided.state == state
    async with zincir.open_run(db, run.id) as later:  # a new owner continues from it
        checkpoint = (await later.state()).checkpoint
        assert checkpoint is not None and checkpoint.state.data == state.data
        # Stored before the field existed: the five lists only.
        rows(db, "UPDATE checkpoints SET state = ? WHERE run_id = ?", (json.dumps(lists_only), run.id))
        checkpoint = (await later.state()).checkpoint
        assert checkpoint is not None and checkpoint.state == attrs.evolve(state, data={})
        await later.complete()
