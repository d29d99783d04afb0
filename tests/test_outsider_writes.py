"""Outsiders' writes: retry now, and the audit trail that names who made each write (both backends)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
import trio
import trio.testing
from click.testing import CliRunner

import zincir
from zincir._cli import main

from .helpers import dump, rows


async def new_run(db: zincir.Database, **kwargs: Any) -> str:
    async with zincir.open_run(db, **kwargs) as run:  # released unfinished, due at once
        return run.id


def trail(db: zincir.Database, run_id: str) -> list[tuple[str, str | None, dict[str, Any]]]:
    found = rows(
        db, "SELECT action, done_by, detail FROM outsider_actions WHERE run_id = ? ORDER BY id", (run_id,)
    )
    return [(action, by, json.loads(detail)) for action, by, detail in found]


def backing_off(db: zincir.Database, run_id: str, seconds: float = 3600) -> None:
    """What a worker leaves after a failed attempt: the run released, due ``seconds`` from now."""
    rows(
        db,
        "UPDATE agent_runs SET status = 'running', attempts = 1,"
        " next_attempt_at = next_attempt_at + ? WHERE id = ?",
        (round(seconds * 1000), run_id),
    )


async def test_retry_now_cuts_a_failed_runs_backoff_short_and_wakes_the_worker(db: zincir.Database) -> None:
    run_id = await new_run(db)
    attempts: list[int] = []

    async def handler(run: zincir.Run) -> None:
        attempts.append(run.epoch)
        if len(attempts) == 1:
            raise RuntimeError("the model provider is down")
        await run.complete()

    # An hour's backoff and an hour between polls: only retry_now's wake-up explains a second try.
    worker = zincir.ResumeWorker(
        db, handler, poll_interval=3600, backoff=zincir.Backoff(initial=3600, jitter=0)
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        with trio.fail_after(10):
            while not rows(db, "SELECT 1 FROM agent_runs WHERE lease_owner IS NULL AND attempts = 1"):
                await trio.sleep(0.01)
        [(due_at,)] = rows(db, "SELECT next_attempt_at FROM agent_runs WHERE id = ?", (run_id,))
        assert await zincir.retry_now(db, run_id, by="ada") is True
        with trio.fail_after(10):
            while (await db.state(run_id)).run.status is not zincir.RunStatus.COMPLETED:
                await trio.sleep(0.01)
        worker.stop()
    assert len(attempts) == 2
    assert trail(db, run_id) == [("retry_now", "ada", {"was_due_at": due_at})]
    # The attempt count is kept: max_attempts still counts the failed attempt.
    assert rows(db, "SELECT attempts FROM agent_runs WHERE id = ?", (run_id,)) == [(2,)]


async def test_retry_now_refuses_a_run_that_is_not_backing_off_and_writes_nothing(
    db: zincir.Database,
) -> None:
    ended = await new_run(db)
    async with zincir.open_run(db, ended) as run:
        await run.complete()
    waiting = await new_run(db)
    rows(
        db,
        "UPDATE agent_runs SET status = 'waiting', wait_kind = 'signal', wait_target = 'go' WHERE id = ?",
        (waiting,),
    )
    rows(db, "UPDATE agent_runs SET next_attempt_at = next_attempt_at + 3600000 WHERE id = ?", (waiting,))
    due = await new_run(db)
    before = dump(db)
    with pytest.raises(zincir.RunNotFound):
        await zincir.retry_now(db, "00000000-0000-4000-8000-000000000000", by="ada")
    with pytest.raises(zincir.RunTerminal, match="completed"):
        await zincir.retry_now(db, ended, by="ada")
    with pytest.raises(zincir.RunWaiting, match="waiting, not backing off"):
        await zincir.retry_now(db, waiting, by="ada")
    with pytest.raises(zincir.InvalidArgument, match="not a UUID"):
        await zincir.retry_now(db, "nope")
    with pytest.raises(zincir.InvalidArgument, match="who acts"):
        await zincir.retry_now(db, due, by="")
    assert await zincir.retry_now(db, due, by="ada") is False  # due already: nothing to cut short
    assert dump(db) == before
    async with zincir.open_run(db, due):
        with pytest.raises(zincir.RunLeased, match="it is running"):
            await zincir.retry_now(db, due, by="ada")
        assert trail(db, due) == []


async def test_every_outsider_write_leaves_an_audit_row_naming_who(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await run.record_response("", [zincir.ToolCall("c1", "send_refund", {"amount": 5})], "tool_use")
        with trio.move_on_after(0.05):
            await run.wait_for_approval("c1")  # the request is recorded; the owner stops waiting
        run_id = run.id
    signal_id = await zincir.send_signal(db, run_id, "go", {"n": 1}, key="k1", by="bob")
    assert await zincir.send_signal(db, run_id, "go", {"n": 1}, key="k1", by="eve") == signal_id  # a repeat
    await zincir.send_signal(db, run_id, "go")  # nobody named
    approval = await zincir.decide_approval(db, run_id, "c1", approved=False, by="ada", reason="too much")
    await zincir.decide_approval(db, run_id, "c1", approved=False, by="ada")  # the same again: no row
    await zincir.raise_budget(db, run_id, tokens=1000, cost=2.5, by="carol")
    with pytest.raises(zincir.InvalidArgument):
        await zincir.raise_budget(db, run_id, tokens=-1, by="carol")
    await zincir.cancel_run(db, run_id, "wrong goal", by="dan")
    await zincir.cancel_run(db, run_id, "again", by="dan")  # cancelled already: nothing done
    assert trail(db, run_id) == [
        ("signal", "bob", {"key": "k1", "signal": "go", "signal_id": signal_id}),
        ("signal", None, {"key": None, "signal": "go", "signal_id": signal_id + 1}),
        ("deny", "ada", {"args_hash": approval.args_hash, "call_id": "c1", "reason": "too much"}),
        ("raise_budget", "carol", {"limits": {"cost": 2.5, "tokens": 1000}}),
        ("cancel", "dan", {"cancelled": 1, "reason": "wrong goal", "requested": 0}),
    ]
    [(times_ok,)] = rows(
        db, "SELECT count(*) FROM outsider_actions WHERE run_id = ? AND created_at > 0", (run_id,)
    )
    assert times_ok == 5
    shown = await trio.to_thread.run_sync(
        lambda: CliRunner().invoke(main, ["show", run_id, "--db", db.path], catch_exceptions=False).stdout
    )
    section = shown.partition("outsiders' actions, newest first (5)\n")[2].partition("\n\n")[0]
    assert [line.split()[1:3] for line in section.splitlines()[1:]] == [
        ["cancel", "dan"], ["raise_budget", "carol"], ["deny", "ada"], ["signal", "—"], ["signal", "bob"],
    ]  # fmt: skip
    as_json = await trio.to_thread.run_sync(
        lambda: CliRunner().invoke(main, ["show", run_id, "--json", "--db", db.path]).stdout
    )
    assert json.loads(as_json)["outsider_actions"][0]["detail"]["reason"] == "wrong goal"
    before = dump(db)
    with pytest.raises(zincir.RunTerminal):
        await zincir.send_signal(db, run_id, "go", by="bob")
    with pytest.raises(zincir.InvalidArgument, match="who acts"):
        await zincir.cancel_run(db, run_id, "x", by="\x00")
    assert dump(db) == before


async def test_a_version_6_database_gains_the_audit_trail_and_keeps_its_runs(
    db_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zincir import _schema

    every = _schema.load
    with monkeypatch.context() as patch:
        patch.setattr(_schema, "load", lambda backend: every(backend)[:6])
        async with zincir.open_database(db_target) as old:
            # A run released unfinished, as version 6 wrote it (by hand: today's code writes
            # columns a version-6 database lacks).
            run_id = str(uuid.uuid4())
            rows(
                old,
                "INSERT INTO agent_runs (id, role, provider, status, config, created_at, updated_at,"
                " last_seq, lease_epoch, next_attempt_at)"
                " VALUES (?, 'old', '', 'running', '{}', ?, ?, 0, 1, ?)",
                (run_id, *[time.time_ns() // 1_000_000] * 3),
            )
            rows(
                old,
                "INSERT INTO events (run_id, seq, type, payload, created_at)"
                ' VALUES (?, 0, \'state_transition\', \'{"from":"pending","to":"running"}\', 1)',
                (run_id,),
            )
            before = rows(old, "SELECT id, role, status, last_seq FROM agent_runs")
    async with zincir.open_database(db_target) as new:
        [(version,)] = rows(new, "SELECT max(version) FROM zincir_schema_migrations")
        assert version >= 7
        assert rows(new, "SELECT id, role, status, last_seq FROM agent_runs") == before
        assert trail(new, run_id) == []
        shown = await trio.to_thread.run_sync(
            lambda: CliRunner().invoke(main, ["show", run_id, "--db", db_target], catch_exceptions=False)
        )
        assert shown.exit_code == 0 and "outsiders' actions, newest first (0)" in shown.stdout
        backing_off(new, run_id)
        assert await zincir.retry_now(new, run_id, by="ada") is True
        assert trail(new, run_id)[0][:2] == ("retry_now", "ada")


async def test_zincir_retry_from_the_shell(db: zincir.Database) -> None:
    run_id = await new_run(db)
    backing_off(db, run_id)

    def cli(*args: str) -> Any:
        return CliRunner().invoke(main, [*args, "--db", db.path], catch_exceptions=False)

    retried = await trio.to_thread.run_sync(cli, "retry", run_id, "--by", "ada")
    assert retried.exit_code == 0, retried.output
    assert retried.stdout.strip() == f"{run_id} is due now; a worker will claim it"
    again = await trio.to_thread.run_sync(cli, "retry", run_id)
    assert again.stdout.strip() == f"{run_id} was due already; nothing changed"
    cancelled = await trio.to_thread.run_sync(cli, "cancel", run_id, "--reason", "done with it")
    assert cancelled.exit_code == 0, cancelled.output
    refused = await trio.to_thread.run_sync(cli, "retry", run_id)
    assert refused.exit_code == 1 and "cancelled; there is nothing left to retry" in refused.stderr
    [retry, cancel] = trail(db, run_id)
    assert retry[:2] == ("retry_now", "ada")
    assert cancel[0] == "cancel" and cancel[1]  # the OS user name by default


async def test_show_and_export_carry_the_whole_audit_trail(db: zincir.Database) -> None:
    run_id = await new_run(db)
    for i in range(120):  # more than any page of the inspector or list default
        await zincir.send_signal(db, run_id, "tick", i, by=f"sender-{i}")

    def cli(*args: str) -> str:
        return str(CliRunner().invoke(main, [*args, run_id, "--db", db.path], catch_exceptions=False).stdout)

    shown = json.loads(await trio.to_thread.run_sync(cli, "show", "--json"))
    assert [a["by"] for a in shown["outsider_actions"]] == [f"sender-{i}" for i in reversed(range(120))]
    assert "outsiders' actions, newest first (120)" in await trio.to_thread.run_sync(cli, "show")
    lines = [json.loads(line) for line in (await trio.to_thread.run_sync(cli, "export")).splitlines()]
    exported = [line for line in lines if line["kind"] == "outsider_action"]
    assert [(a["action"], a["by"]) for a in exported] == [("signal", f"sender-{i}") for i in range(120)]
    assert exported[-1]["detail"]["signal"] == "tick" and lines[-1] == exported[-1]


async def test_a_refused_outsider_write_on_a_new_connection_leaves_no_lock_behind(db_target: str) -> None:
    # The first transaction of a new PostgreSQL connection was never rolled back when it failed:
    # it sat idle in transaction, holding the run's row lock, until its Database closed.
    async with zincir.open_database(db_target) as db, zincir.open_run(db, lease_ttl=30) as run:
        calls = [zincir.ToolCall("c1", "refund", {"n": 1}), zincir.ToolCall("c2", "refund", {"n": 2})]
        await run.record_response("", calls, "tool_use")
        with trio.move_on_after(0.02):
            await run.wait_for_approval("c1")
        async with zincir.open_database(db_target) as outsider:
            with pytest.raises(zincir.ApprovalHashMismatch):
                await zincir.decide_approval(
                    outsider, run.id, "c1", approved=True, by="a", args_hash="0" * 64
                )
            with trio.fail_after(10):  # the owner's lock wait ended after 30 s, and its lease with it
                await run.record_tool_result("c2", "the owner writes on")
