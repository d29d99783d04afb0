"""Approvals bound to the exact tool intent (docs/approvals.md), on both backends."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import trio
import trio.testing
from click.testing import CliRunner, Result

import zincir
from zincir._cli import main as cli

from .conftest import ManualClock
from .helpers import REPO, dump, running_python

REFUND = {"amount": 120, "order": "A-17"}


def expected_hash(name: str, args: object) -> str:
    canonical = json.dumps({"args": args, "name": name}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


async def ask(run: zincir.Run, call_id: str = "c1") -> None:
    await run.record_response("I will refund.", [zincir.ToolCall(call_id, "send_refund", REFUND)], "tool_use")


def types(events: list[zincir.Event]) -> list[str]:
    return [e.type.value for e in events]


async def test_an_approval_is_requested_decided_and_logged(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await ask(run)
        got: list[zincir.Approval] = []

        async def waiter(task_status: trio.TaskStatus[None]) -> None:
            task_status.started()
            got.append(await run.wait_for_approval("c1"))

        async with trio.open_nursery() as nursery:
            await nursery.start(waiter)
            await trio.testing.wait_all_tasks_blocked()
            decided = await zincir.decide_approval(
                db, run.id, "c1", approved=True, by="ada", reason="within policy",
                args_hash=expected_hash("send_refund", REFUND),
            )  # fmt: skip
        [approval] = got
        assert approval.approved is True and approval.by == "ada" and approval.reason == "within policy"
        assert approval.args_hash == expected_hash("send_refund", REFUND) == decided.args_hash
        assert approval.requested_at <= (approval.decided_at or 0)
        events = (await run.state()).events
        assert types(events)[-2:] == ["approval_requested", "approval_decided"]
        assert events[-2].payload == {
            "args": REFUND, "args_hash": approval.args_hash, "call_id": "c1", "name": "send_refund",
        }  # fmt: skip
        assert events[-1].payload["approved"] is True and events[-1].payload["by"] == "ada"
        # Later calls return the recorded decision at once and log nothing new.
        assert await run.wait_for_approval("c1") == approval
        assert len((await run.state()).events) == len(events)
        await run.record_tool_result("c1", {"refunded": 120})
        await run.complete()


async def test_a_decision_with_a_stale_hash_is_refused_and_writes_nothing(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await ask(run)
        with trio.move_on_after(0.05):
            await run.wait_for_approval("c1")  # the request is recorded, then we stop waiting
        before = dump(db)
        stale = expected_hash("send_refund", {**REFUND, "amount": 12})
        with pytest.raises(zincir.ApprovalHashMismatch, match="not the intent's"):
            await zincir.decide_approval(db, run.id, "c1", approved=True, by="ada", args_hash=stale)
        assert dump(db) == before


async def test_deciding_twice_the_same_way_is_a_no_op_and_differently_is_refused(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await ask(run)
        with trio.move_on_after(0.05):
            await run.wait_for_approval("c1")
        first = await zincir.decide_approval(db, run.id, "c1", approved=False, by="bob", reason="too much")
        assert await zincir.decide_approval(db, run.id, "c1", approved=False, by="eve") == first
        before = dump(db)
        with pytest.raises(zincir.ApprovalConflict, match="already denied by bob"):
            await zincir.decide_approval(db, run.id, "c1", approved=True, by="eve")
        assert dump(db) == before
        denied = await run.wait_for_approval("c1")
        assert denied.approved is False and denied.by == "bob"


async def test_unknown_intents_and_missing_requests_are_specific_errors(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await ask(run)
        before = dump(db)
        with pytest.raises(zincir.NoDurableIntent):
            await zincir.decide_approval(db, run.id, "nope", approved=True, by="ada")
        with pytest.raises(zincir.ApprovalNotRequested):
            await zincir.decide_approval(db, run.id, "c1", approved=True, by="ada")
        with pytest.raises(zincir.NoDurableIntent):
            await run.wait_for_approval("nope")
        with pytest.raises(zincir.InvalidArgument, match="approved must be"):
            await zincir.decide_approval(db, run.id, "c1", approved="yes", by="ada")  # type: ignore[arg-type]
        assert dump(db) == before
        await run.record_tool_result("c1", "done without asking")
        with pytest.raises(zincir.InvalidArgument, match="already has a result"):
            await run.wait_for_approval("c1")


async def test_an_approval_request_survives_a_crash_before_the_decision(db: zincir.Database) -> None:
    async with zincir.open_run(db, lease_ttl=1) as run:
        await ask(run)
    child = """
        import os, signal, sys, trio, zincir
        async def main():
            async with zincir.open_database(sys.argv[1]) as db:
                async with zincir.open_run(db, sys.argv[2], lease_ttl=1) as run:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(run.wait_for_approval, "c1")
                        while not any(e.type.value == "approval_requested" for e in await db.events(run.id)):
                            await trio.sleep(0.01)
                        print("requested", flush=True)
                        os.kill(os.getpid(), signal.SIGKILL)
        trio.run(main)
    """
    with running_python(child, db.path, run.id) as proc:
        out, err = await trio.to_thread.run_sync(proc.communicate)
        assert proc.returncode == -9, err
    assert out.strip() == "requested"
    await zincir.decide_approval(db, run.id, "c1", approved=True, by="ada")
    with trio.fail_after(10):
        while True:  # the dead owner's lease expires first
            try:
                async with zincir.open_run(db, run.id) as again:
                    approval = await again.wait_for_approval("c1")
                break
            except zincir.RunLeased:
                await trio.sleep(0.1)
    assert approval.approved is True
    assert types(await db.events(run.id)).count("approval_requested") == 1


async def test_an_approval_times_out_at_its_stored_deadline(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await ask(run)
        with pytest.raises(zincir.WaitTimeout, match="approval"):
            await run.wait_for_approval("c1", timeout=0.2)
        with pytest.raises(zincir.ApprovalConflict, match="timed out"):
            await zincir.decide_approval(db, run.id, "c1", approved=True, by="late")
        with pytest.raises(zincir.WaitTimeout):
            await run.wait_for_approval("c1", timeout=3600)


async def test_the_approval_commands_show_decide_and_refuse(db: zincir.Database) -> None:
    zincir_bin = str(REPO / ".venv" / "bin" / "zincir")
    async with zincir.open_run(db) as run:
        await ask(run)
        with trio.move_on_after(0.05):
            await run.wait_for_approval("c1")
        listing = await trio.run_process([zincir_bin, "approvals", "--db", db.path], capture_stdout=True)
        text = listing.stdout.decode()
        assert run.id in text and "send_refund" in text and expected_hash("send_refund", REFUND) in text
        assert '"order": "A-17"' in text or '"order":"A-17"' in text
        wrong = await trio.run_process(
            [zincir_bin, "approve", run.id, "c1", "--by", "ada", "--hash", "0" * 64, "--db", db.path],
            capture_stderr=True,
            check=False,
        )
        assert wrong.returncode == 1 and b"not the intent's" in wrong.stderr
        await trio.run_process(
            [zincir_bin, "deny", run.id, "c1", "--by", "ada", "--reason", "no", "--db", db.path],
            capture_stdout=True,
        )
        assert (await run.wait_for_approval("c1")).approved is False
        empty = await trio.run_process([zincir_bin, "approvals", "--db", db.path], capture_stdout=True)
        assert run.id not in empty.stdout.decode()


async def test_a_decision_after_the_deadline_is_refused(
    clocked_db: zincir.Database, clock: ManualClock
) -> None:
    async with zincir.open_run(clocked_db) as run:
        await ask(run)
        with trio.move_on_after(0.05):
            await run.wait_for_approval("c1", timeout=5)
        clock.advance(10)
        with pytest.raises(zincir.ApprovalConflict, match="timed out"):
            await zincir.decide_approval(clocked_db, run.id, "c1", approved=True, by="late")
        with pytest.raises(zincir.WaitTimeout):
            await run.wait_for_approval("c1")


async def test_answered_calls_and_ended_runs_have_no_open_requests(db: zincir.Database) -> None:
    zincir_bin = str(REPO / ".venv" / "bin" / "zincir")
    async with zincir.open_run(db) as run:
        await ask(run)
        with trio.move_on_after(0.05):
            await run.wait_for_approval("c1")
        await run.record_tool_result("c1", "done without waiting")
        with pytest.raises(zincir.ApprovalConflict, match="already has a result"):
            await zincir.decide_approval(db, run.id, "c1", approved=True, by="ada")
        listing = await trio.run_process([zincir_bin, "approvals", "--db", db.path], capture_stdout=True)
        assert listing.stdout.decode().strip() == "no open approval requests"


async def test_the_approvals_command_never_creates_a_database(tmp_path: Path) -> None:
    zincir_bin = str(REPO / ".venv" / "bin" / "zincir")
    missing = tmp_path / "nothing-here.db"
    result = await trio.run_process(
        [zincir_bin, "approvals", "--db", str(missing)], capture_stderr=True, check=False
    )
    assert result.returncode == 1 and b"does not exist" in result.stderr
    assert not missing.exists()


OUTSIDER_COMMANDS = (
    ["signal", "RUN", "go"],
    ["approve", "RUN", "c1", "--by", "ada"],
    ["deny", "RUN", "c1", "--by", "ada"],
    ["cancel", "RUN", "--reason", "x"],
    ["retry", "RUN"],
    ["budget", "RUN", "--tokens", "5"],
)


def _zincir(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize("command", OUTSIDER_COMMANDS, ids=lambda c: c[0])
def test_a_write_to_a_run_never_creates_a_database(tmp_path: Path, command: list[str]) -> None:
    missing = tmp_path / "mistyped.db"
    run_id = "00000000-0000-4000-8000-000000000000"
    result = _zincir(*[run_id if a == "RUN" else a for a in command], "--db", str(missing))
    assert result.exit_code == 1 and "does not exist" in result.output, result.output
    assert not missing.exists()


@pytest.mark.parametrize("command", [*OUTSIDER_COMMANDS, ["approvals", "--run", "RUN"]], ids=lambda c: c[0])
async def test_a_malformed_run_id_is_one_error_line(db: zincir.Database, command: list[str]) -> None:
    before = dump(db)
    result = await trio.to_thread.run_sync(
        lambda: _zincir(*["not-a-run" if a == "RUN" else a for a in command], "--db", db.path)
    )
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert (
        result.output.startswith("Error: ")
        and "not-a-run" in result.output
        and result.output.count("\n") == 1
    )
    assert dump(db) == before


async def test_the_approvals_listing_escapes_what_the_model_named(db: zincir.Database) -> None:
    # A terminal must show what is being decided: a model-chosen call id or tool name must not
    # erase the line or hide the tool behind a control sequence.
    hidden_call, hidden_tool = "c1\x1b[2K\rrun x  call c1  tool read_file", "read_file\x1b[8m send_refund"
    async with zincir.open_run(db) as run:
        await run.record_response("", [zincir.ToolCall(hidden_call, hidden_tool, {})], "tool_use")
        with trio.move_on_after(0.05):
            await run.wait_for_approval(hidden_call)
    listing = await trio.to_thread.run_sync(lambda: _zincir("approvals", "--db", db.path))
    assert listing.exit_code == 0, listing.output
    assert "\x1b" not in listing.output and "\r" not in listing.output
    assert "\\x1b[8m send_refund" in listing.output and "\\x1b[2K\\rrun x" in listing.output


async def test_the_write_commands_take_a_run_id_prefix_as_the_read_commands_do(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await ask(run)
        with trio.move_on_after(0.05):
            await run.wait_for_approval("c1")
    prefix = run.id[:8]

    def shell(*args: str) -> Result:
        return _zincir(*args, "--db", db.path)

    approved = await trio.to_thread.run_sync(shell, "approve", prefix, "c1", "--by", "ada")
    assert approved.exit_code == 0 and "approved by ada: c1" in approved.output, approved.output
    sent = await trio.to_thread.run_sync(shell, "signal", prefix, "go")
    assert sent.exit_code == 0 and sent.output.strip().isdigit(), sent.output
    budget = await trio.to_thread.run_sync(shell, "budget", prefix, "--tokens", "100")
    assert budget.exit_code == 0 and f"run {run.id}:" in budget.output, budget.output
    cancelled = await trio.to_thread.run_sync(shell, "cancel", prefix, "--reason", "done")
    assert cancelled.exit_code == 0 and cancelled.output.strip() == f"cancelled {run.id}", cancelled.output
