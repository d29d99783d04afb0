"""Suspension (docs/signals.md), on both backends: a worker's run whose wait or sleep outlasts
``suspend_after`` gives its lease up and becomes ``waiting``; the signal, the decision or the
deadline makes it claimable again, and the handler starts over from the top."""

from __future__ import annotations

import contextlib
import os
import signal as signals
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

import zincir

from .conftest import ManualClock
from .helpers import (
    REPO,
    dump,
    insert_started_run,
    rows,
    running_python,
    scalar,
    start_python,
    status_of,
    trace_operations,
    until,
)
from .helpers import has_status as _is


@asynccontextmanager
async def working(db: zincir.Database, handler: Any, **options: Any) -> AsyncIterator[zincir.ResumeWorker]:
    """A ResumeWorker running beside the block; stopped when the block ends."""
    options.setdefault("poll_interval", 60.0)  # only wake-ups, never a poll, can explain a resume
    options.setdefault("grace_period", 0.0)
    worker = zincir.ResumeWorker(db, handler, **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        yield worker
        worker.stop()


async def new_runs(db: zincir.Database, count: int) -> list[str]:
    """``count`` unowned runs, claimable at once."""
    ids: list[str] = []

    async def create() -> None:
        async with zincir.open_run(db) as run:
            ids.append(run.id)

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(create)
    return ids


def transitions(events: list[zincir.Event]) -> list[tuple[str, str]]:
    return [
        (e.payload["from"], e.payload["to"]) for e in events if e.type is zincir.EventType.STATE_TRANSITION
    ]


async def test_a_wait_outlasting_suspend_after_suspends_and_a_signal_resumes_from_the_top(
    db: zincir.Database,
) -> None:
    [run_id] = await new_runs(db, 1)
    effects: list[str] = []
    starts: list[int] = []

    async def handler(run: zincir.Run) -> None:
        starts.append(run.epoch)

        async def effect() -> str:
            effects.append("paid")
            return "receipt-1"

        assert await run.step("pay", effect) == "receipt-1"
        payload = await run.wait_for_signal("approval", "approved")
        await run.complete()
        effects.append(f"done {payload}")

    async with working(db, handler, suspend_after=0.05):
        await until(lambda: _is(db, run_id, zincir.RunStatus.WAITING))
        assert scalar(db, "SELECT lease_owner FROM agent_runs WHERE id = ?", (run_id,)) is None
        assert scalar(db, "SELECT attempts FROM agent_runs WHERE id = ?", (run_id,)) == 0
        assert scalar(db, "SELECT next_attempt_at FROM agent_runs WHERE id = ?", (run_id,)) is None
        with trio.fail_after(10):  # poll_interval is 60 s: only the send's wake-up is this fast
            await zincir.send_signal(db, run_id, "approved", {"by": "ada"})
            await until(lambda: _is(db, run_id, zincir.RunStatus.COMPLETED))

    assert effects == ["paid", "done {'by': 'ada'}"]  # the step ran once; the handler twice
    assert len(starts) == 2
    events = await db.events(run_id)
    assert transitions(events) == [
        ("pending", "running"),
        ("running", "waiting"),
        ("waiting", "running"),
        ("running", "completed"),
    ]
    [suspended] = [
        e for e in events if e.type is zincir.EventType.STATE_TRANSITION and e.payload["to"] == "waiting"
    ]
    assert suspended.payload["waiting_for"] == {"kind": "signal", "name": "approval", "signal": "approved"}
    assert suspended.payload["until"] is None
    assert not [e for e in events if e.type is zincir.EventType.ATTEMPT_FAILED]


async def test_a_signal_of_another_topic_does_not_wake_a_suspended_run(db: zincir.Database) -> None:
    [run_id] = await new_runs(db, 1)

    async def handler(run: zincir.Run) -> None:
        await run.wait_for_signal("w", "go")
        await run.complete()

    async with working(db, handler, suspend_after=0):
        await until(lambda: _is(db, run_id, zincir.RunStatus.WAITING))
        before = scalar(db, "SELECT next_attempt_at FROM agent_runs WHERE id = ?", (run_id,))
        await zincir.send_signal(db, run_id, "something-else", 1)
        assert scalar(db, "SELECT next_attempt_at FROM agent_runs WHERE id = ?", (run_id,)) == before is None
        assert await status_of(db, run_id) is zincir.RunStatus.WAITING


async def test_a_signal_from_another_process_resumes_a_suspended_run_at_once(db: zincir.Database) -> None:
    [run_id] = await new_runs(db, 1)
    got: list[object] = []

    async def handler(run: zincir.Run) -> None:
        got.append(await run.wait_for_signal("w", "go"))
        await run.complete()

    sender = """
        import sys, trio, zincir
        async def main():
            async with zincir.open_database(sys.argv[1]) as db:
                await zincir.send_signal(db, sys.argv[2], "go", {"from": "elsewhere"})
        trio.run(main)
    """
    async with working(db, handler, suspend_after=0):
        await until(lambda: _is(db, run_id, zincir.RunStatus.WAITING))
        with running_python(sender, db.path, run_id) as proc:
            # Another process's commit reaches this worker by NOTIFY (PostgreSQL) or by the
            # watcher of the file (SQLite); the 60 s poll never comes into it.
            await until(lambda: _is(db, run_id, zincir.RunStatus.COMPLETED), within=10)
            _, err = await trio.to_thread.run_sync(proc.communicate)
            assert proc.returncode == 0, err
    assert got == [{"from": "elsewhere"}]


async def test_a_suspended_wait_times_out_at_its_stored_deadline_not_before(
    clocked_db: zincir.Database, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = clocked_db
    [run_id] = await new_runs(db, 1)
    outcomes: list[str] = []

    async def handler(run: zincir.Run) -> None:
        try:
            await run.wait_for_signal("w", "go", timeout=60)
        except zincir.WaitTimeout:
            outcomes.append("timed out")
            await run.complete()

    async with working(db, handler, suspend_after=0, poll_interval=0.02):
        await until(lambda: _is(db, run_id, zincir.RunStatus.WAITING))
        deadline = scalar(db, "SELECT deadline FROM waits WHERE run_id = ?", (run_id,))
        assert scalar(db, "SELECT next_attempt_at FROM agent_runs WHERE id = ?", (run_id,)) == deadline
        claims = trace_operations(monkeypatch, db._store, "claim_due")
        clock.advance(59.999)
        await until(lambda: _at_least(claims, 3))  # the worker looked again and again, and left it
        assert await status_of(db, run_id) is zincir.RunStatus.WAITING
        clock.advance(0.001)
        await until(lambda: _is(db, run_id, zincir.RunStatus.COMPLETED))
    assert outcomes == ["timed out"]


async def _at_least(items: list[Any], n: int) -> bool:
    return len(items) >= n


async def test_a_sleep_longer_than_suspend_after_suspends_until_its_wake_time(
    clocked_db: zincir.Database, clock: ManualClock
) -> None:
    db = clocked_db
    [run_id] = await new_runs(db, 1)
    woke: list[int] = []

    async def handler(run: zincir.Run) -> None:
        await run.sleep("nap", 3600)
        woke.append(run.epoch)
        await run.complete()

    async with working(db, handler, suspend_after=1, poll_interval=0.02):
        await until(lambda: _is(db, run_id, zincir.RunStatus.WAITING))
        wake_at = scalar(db, "SELECT wake_at FROM timers WHERE run_id = ?", (run_id,))
        assert scalar(db, "SELECT next_attempt_at FROM agent_runs WHERE id = ?", (run_id,)) == wake_at
        clock.advance(3600)
        await until(lambda: _is(db, run_id, zincir.RunStatus.COMPLETED))
    assert len(woke) == 1  # it woke in the second owner, at once, without sleeping again
    [suspended] = [e for e in await db.events(run_id) if e.payload.get("to") == "waiting"]
    assert suspended.payload["waiting_for"] == {"kind": "sleep", "name": "nap"}
    assert suspended.payload["until"] == wake_at


async def test_an_approval_wait_suspends_and_the_decision_resumes_it(db: zincir.Database) -> None:
    [run_id] = await new_runs(db, 1)
    decisions: list[zincir.Approval] = []

    async def handler(run: zincir.Run) -> None:
        if not await run.pending_tools():
            await run.record_response(
                "refund?", [zincir.ToolCall("c1", "send_refund", {"eur": 40})], "tool_use"
            )
        approval = await run.wait_for_approval("c1")
        decisions.append(approval)
        await run.record_tool_result("c1", {"sent": approval.approved})
        await run.complete()

    async with working(db, handler, suspend_after=0):
        await until(lambda: _is(db, run_id, zincir.RunStatus.WAITING))
        [suspended] = [e for e in await db.events(run_id) if e.payload.get("to") == "waiting"]
        assert suspended.payload["waiting_for"] == {"call_id": "c1", "kind": "approval"}
        await zincir.decide_approval(db, run_id, "c1", approved=True, by="ada")
        with trio.fail_after(10):
            await until(lambda: _is(db, run_id, zincir.RunStatus.COMPLETED))
    assert [(d.approved, d.by) for d in decisions] == [(True, "ada")]


async def test_suspensions_never_count_as_attempts(db: zincir.Database) -> None:
    [run_id] = await new_runs(db, 1)

    async def handler(run: zincir.Run) -> None:
        for name in ("first", "second", "third"):
            await run.wait_for_signal(name, name)
        await run.complete()

    # With one attempt allowed, a suspension counted as a failure would fail the run.
    async with working(db, handler, suspend_after=0, max_attempts=1):
        for name in ("first", "second", "third"):
            await until(lambda: _waits_on(db, run_id, name))  # noqa: B023 - awaited at once
            await zincir.send_signal(db, run_id, name, None)
        await until(lambda: _is(db, run_id, zincir.RunStatus.COMPLETED))
    events = await db.events(run_id)
    assert transitions(events).count(("running", "waiting")) == 3
    assert not [e for e in events if e.type is zincir.EventType.ATTEMPT_FAILED]


async def test_user_code_catching_exception_cannot_swallow_the_suspension(db: zincir.Database) -> None:
    [run_id] = await new_runs(db, 1)
    reached: list[str] = []

    async def handler(run: zincir.Run) -> None:
        try:
            await run.wait_for_signal("w", "go")
        except Exception:
            reached.append("swallowed")
        reached.append("after the wait")
        await run.complete()

    async with working(db, handler, suspend_after=0):
        await until(lambda: _is(db, run_id, zincir.RunStatus.WAITING))
        assert reached == []
        await zincir.send_signal(db, run_id, "go", None)
        await until(lambda: _is(db, run_id, zincir.RunStatus.COMPLETED))
    assert reached == ["after the wait"]


async def test_five_times_more_suspended_runs_than_slots_hold_no_lease_and_cost_no_polling(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Five times max_concurrency: only runs that give their slot back when they suspend can all
    # be waiting at once (a thousand runs and 200 slots proved nothing more, at 3x the cost).
    ids = await new_runs(db, 300)

    async def handler(run: zincir.Run) -> None:
        await run.wait_for_signal("w", "go")
        await run.complete()

    async with working(db, handler, suspend_after=0, max_concurrency=60, poll_interval=0.05):
        await until(lambda: _waiting_at_least(db, 300), within=120, every=0.1)
        assert scalar(db, "SELECT count(*) FROM agent_runs WHERE lease_owner IS NOT NULL") == 0
        operations = trace_operations(
            monkeypatch, db._store, "claim_due", "signal_ready", "await_signal", "renew", "suspend"
        )
        await until(lambda: _at_least(operations, 5))
        # Idle: only the worker's claim looks at the database, one indexed query for every run.
        assert {name for name, _ in operations} == {"claim_due"}
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for run_id in ids:
                    nursery.start_soon(zincir.send_signal, db, run_id, "go", None)
            await until(lambda: _completed_at_least(db, 300), within=120, every=0.1)


async def _waits_on(db: zincir.Database, run_id: str, topic: str) -> bool:
    found = rows(db, "SELECT status, wait_target FROM agent_runs WHERE id = ?", (run_id,))
    return found == [("waiting", topic)]


async def _waiting_at_least(db: zincir.Database, n: int) -> bool:
    return _count(db, "waiting") >= n


async def _completed_at_least(db: zincir.Database, n: int) -> bool:
    return _count(db, "completed") >= n


def _count(db: zincir.Database, status: str) -> int:
    return int(scalar(db, "SELECT count(*) FROM agent_runs WHERE status = ?", (status,)))  # type: ignore[call-overload]


async def test_a_signal_that_arrives_while_the_owner_suspends_keeps_it_running(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        with trio.move_on_after(0.05):  # the wait is recorded and pending
            await run.wait_for_signal("w", "go")
        await zincir.send_signal(db, run.id, "go", 7)
        before = dump(db)
        suspended = await db._write(db._store.suspend, run._lease, [("signal", "w")], route=run.id)
        assert suspended is False
        assert dump(db) == before  # nothing written: the owner goes on and receives it
        assert await run.wait_for_signal("w", "go") == 7
        await run.complete()


async def test_signals_racing_the_suspensions_from_another_process_lose_no_wake_up(
    db: zincir.Database,
) -> None:
    ids = await new_runs(db, 100)

    async def handler(run: zincir.Run) -> None:
        await run.wait_for_signal("w", "go")
        await run.complete()

    sender = """
        import sys, trio, zincir
        async def main():
            async with zincir.open_database(sys.argv[1]) as db:
                print("ready", flush=True)
                sys.stdin.readline()
                async with trio.open_nursery() as nursery:
                    for run_id in sys.argv[2:]:
                        nursery.start_soon(zincir.send_signal, db, run_id, "go", None)
        trio.run(main)
    """
    proc = start_python(sender, db.path, *ids, stdin=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert await trio.to_thread.run_sync(proc.stdout.readline) == "ready\n"
        # The sends begin while the worker claims, waits and suspends the runs: each signal
        # lands before a wait looks, between its look and its suspension, or after it.
        async with working(db, handler, suspend_after=0, max_concurrency=50):
            proc.stdin.write("go\n")
            proc.stdin.flush()
            await until(lambda: _completed_at_least(db, 100), within=60)
    finally:
        proc.kill()
        proc.communicate()


async def test_open_run_takes_a_suspended_run_over_by_hand(db: zincir.Database) -> None:
    [run_id] = await new_runs(db, 1)

    async def handler(run: zincir.Run) -> None:
        await run.wait_for_signal("w", "go")

    async with working(db, handler, suspend_after=0):
        await until(lambda: _is(db, run_id, zincir.RunStatus.WAITING))
    async with zincir.open_run(db, run_id) as run:
        assert await status_of(db, run_id) is zincir.RunStatus.RUNNING
        await zincir.send_signal(db, run_id, "go", "by hand")
        assert await run.wait_for_signal("w", "go") == "by hand"
        await run.complete()
    assert transitions(await db.events(run_id))[-3:] == [
        ("running", "waiting"),
        ("waiting", "running"),
        ("running", "completed"),
    ]


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "10", True])
async def test_a_bad_suspend_after_is_invalid(db: zincir.Database, bad: object) -> None:
    with pytest.raises(zincir.InvalidArgument, match="suspend_after"):
        zincir.ResumeWorker(db, _never_called, suspend_after=bad)  # type: ignore[arg-type]


async def _never_called(run: zincir.Run) -> None:
    raise AssertionError("not reached")


@contextlib.contextmanager
def worker_process(db: zincir.Database, handler: str, ledger: Any, *options: str) -> Iterator[None]:
    """A `zincir worker` process running tests.worker_handlers:HANDLER; SIGKILLed at the end."""
    command = [str(REPO / ".venv" / "bin" / "zincir"), "worker", f"tests.worker_handlers:{handler}"]
    env = {**os.environ, "LEDGER": str(ledger)}
    proc = subprocess.Popen(
        [*command, "--db", db.path, *options], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        yield
    finally:
        proc.send_signal(signals.SIGKILL)
        proc.communicate()


async def test_a_suspended_runs_worker_killed_costs_nothing_and_a_new_one_resumes_it_at_once(
    db: zincir.Database, tmp_path: Any
) -> None:
    [run_id] = await new_runs(db, 1)
    ledger = tmp_path / "ledger"
    options = ("--poll-interval", "60", "--lease-ttl", "30", "--suspend-after", "0")
    with worker_process(db, "wait_then_complete", ledger, *options):
        await until(lambda: _is(db, run_id, zincir.RunStatus.WAITING), within=30)
    # A lease of 30 s would make a crashed owner's run wait; a suspended run has none.
    assert rows(db, "SELECT lease_owner FROM agent_runs WHERE id = ?", (run_id,)) == [(None,)]
    with worker_process(db, "wait_then_complete", ledger, *options):
        await zincir.send_signal(db, run_id, "go", {"n": 1})
        await until(lambda: _is(db, run_id, zincir.RunStatus.COMPLETED), within=20)
    assert ledger.read_text().split() == [f"{run_id}", "{'n':", "1}"]


_TABLES = ("events", "checkpoints", "steps", "timers", "signals", "waits", "approvals")
_RUN_COLUMNS = (
    "id, parent_run_id, role, provider, status, config, created_at, updated_at, last_seq,"
    " lease_owner, lease_epoch, lease_expires_at, attempts, next_attempt_at"
)


def _contents(db: zincir.Database) -> dict[str, list[tuple[Any, ...]]]:
    found = {t: sorted(map(repr, rows(db, f"SELECT * FROM {t}"))) for t in _TABLES}
    found["agent_runs"] = sorted(map(repr, rows(db, f"SELECT {_RUN_COLUMNS} FROM agent_runs")))
    intents = "run_id, call_id, name, intent_seq, response_seq, response_tool_count, result_seq"
    found["tool_intents"] = sorted(map(repr, rows(db, f"SELECT {intents} FROM tool_intents")))
    return found  # type: ignore[return-value]


_V2_ROWS = (
    "INSERT INTO agent_runs (id, role, provider, status, config, created_at, updated_at, last_seq,"
    " attempts, next_attempt_at) VALUES ('p', 'agent', '', 'running', '{}', 1, 2, 3, 1, 5)",
    "INSERT INTO agent_runs (id, parent_run_id, role, provider, status, config, created_at, updated_at)"
    " VALUES ('c', 'p', 'worker', '', 'completed', '{}', 1, 2)",
    "INSERT INTO events (run_id, seq, type, payload, created_at) VALUES"
    " ('p', 0, 'state_transition', '{}', 1), ('p', 1, 'llm_call', '{}', 1),"
    " ('p', 2, 'tool_call', '{}', 1), ('p', 3, 'signal_received', '{}', 1),"
    " ('c', 0, 'state_transition', '{}', 1)",
    "INSERT INTO tool_intents (run_id, call_id, name, intent_seq, response_seq, response_tool_count)"
    " VALUES ('p', 'c1', 't', 2, 1, 1)",
    "INSERT INTO steps (run_id, name, status, epoch, result, started_at, completed_at)"
    " VALUES ('c', 's', 'completed', 1, '1', 1, 1)",
    "INSERT INTO timers (run_id, name, wake_at, created_at) VALUES ('p', 'nap', 9, 1)",
    "INSERT INTO signals (run_id, topic, payload, created_at, consumed_by, consumed_at)"
    " VALUES ('p', 'go', '1', 1, 'w', 1)",
    "INSERT INTO waits (run_id, name, kind, topic, created_at, completed_at, signal_id)"
    " VALUES ('p', 'w', 'signal', 'go', 1, 1, (SELECT min(id) FROM signals))",
    "INSERT INTO approvals (run_id, call_id, tool_name, args_hash, requested_at)"
    " VALUES ('p', 'c1', 't', 'h', 1)",
)


async def test_a_version_2_database_keeps_every_row_through_the_migration(
    db_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zincir import _schema

    every = _schema.load
    with monkeypatch.context() as patch:
        patch.setattr(_schema, "load", lambda backend: every(backend)[:2])
        async with zincir.open_database(db_target) as old:
            for statement in _V2_ROWS:
                rows(old, statement)
            before = _contents(old)
    # Rebuilding agent_runs (SQLite) drops the old table: with foreign keys on, that would
    # have cascaded into every table above.
    async with zincir.open_database(db_target) as new:
        assert _contents(new) == before
        assert rows(new, "SELECT max(version) FROM zincir_schema_migrations") == [(len(every(new.backend)),)]
        assert rows(new, "SELECT wait_kind, wait_target FROM agent_runs WHERE id = 'p'") == [(None, None)]
        [child] = await new.runs(status="completed")
        assert child.parent_run_id == "p"


async def test_an_idle_worker_resumes_a_suspended_run_at_its_deadline_not_a_poll_later(
    db: zincir.Database,
) -> None:
    [run_id] = await new_runs(db, 1)
    outcomes: list[str] = []

    async def handler(run: zincir.Run) -> None:
        try:
            await run.wait_for_signal("w", "go", timeout=1.0)
        except zincir.WaitTimeout:
            outcomes.append("timed out")
            await run.complete()

    # Polling every 60 s, the worker would find the due run a minute late: it sleeps until the
    # earliest stored due time instead.
    async with working(db, handler, suspend_after=0, poll_interval=60):
        with trio.fail_after(10):
            await until(lambda: _is(db, run_id, zincir.RunStatus.COMPLETED))
    assert outcomes == ["timed out"]


async def test_a_worker_killed_after_its_wait_received_leaves_the_same_payload_to_the_next(
    db: zincir.Database, tmp_path: Any
) -> None:
    [run_id] = await new_runs(db, 1)
    ledger = tmp_path / "ledger"
    options = ("--poll-interval", "0.2", "--lease-ttl", "1", "--suspend-after", "0")
    with worker_process(db, "wait_note_then_hang_once", ledger, *options):
        await until(lambda: _is(db, run_id, zincir.RunStatus.WAITING), within=30)
        await zincir.send_signal(db, run_id, "go", {"n": 7})
        await until(lambda: _has_a_line(ledger), within=30)  # received, logged, noted: then it hangs
    with worker_process(db, "wait_note_then_hang_once", ledger, *options):
        await until(lambda: _is(db, run_id, zincir.RunStatus.COMPLETED), within=30)
    [(pid1, payload1), (pid2, payload2)] = [line.split(" ", 1) for line in ledger.read_text().splitlines()]
    assert pid1 != pid2 and payload1 == payload2 == "{'n': 7}"
    received = [e for e in await db.events(run_id) if e.type is zincir.EventType.SIGNAL_RECEIVED]
    assert len(received) == 1


async def _has_a_line(path: Any) -> bool:
    return bool(path.exists() and path.read_text().endswith("\n"))  # not just created


async def test_two_waits_of_one_handler_suspend_together_without_an_error(
    db: zincir.Database, caplog: pytest.LogCaptureFixture
) -> None:
    [run_id] = await new_runs(db, 1)
    got: dict[str, Any] = {}

    async def handler(run: zincir.Run) -> None:
        async def wait(name: str) -> None:
            got[name] = await run.wait_for_signal(name, "go")

        async with trio.open_nursery() as branches:
            branches.start_soon(wait, "w1")
            branches.start_soon(wait, "w2")
        await run.complete(result=sorted(got.values()))

    async with working(db, handler, suspend_after=0.05, max_attempts=1):
        await until(lambda: _status_is(db, run_id, "waiting"))
        await zincir.send_signal(db, run_id, "go", 1)
        await zincir.send_signal(db, run_id, "go", 2)
        await until(lambda: _status_is(db, run_id, "completed"), within=10)
    assert (await db.state(run_id)).run.result == [1, 2]
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


async def _status_is(db: zincir.Database, run_id: str, status: str) -> bool:
    return (await db.state(run_id)).run.status.value == status


# -- whichever comes first: a handler holding several waits at once (docs/waits.md) -----------


async def approve_or_abort(run: zincir.Run) -> None:
    """Ask approval of a deploy (call c1) and wait for the decision or an "abort" signal,
    whichever comes first; the run completes with what won."""
    if not await run.pending_tools():
        await run.record_response("deploy?", [zincir.ToolCall("c1", "deploy", {"env": "prod"})], "tool_use")
    won: list[dict[str, Any]] = []
    async with trio.open_nursery() as race:

        async def approval() -> None:
            won.append({"approved": (await run.wait_for_approval("c1")).approved})
            race.cancel_scope.cancel()

        async def abort() -> None:
            won.append({"aborted": await run.wait_for_signal("abort", "abort")})
            race.cancel_scope.cancel()

        race.start_soon(approval)
        race.start_soon(abort)
    await run.record_tool_result("c1", won[0])
    await run.complete(won[0])


def suspensions(events: list[zincir.Event]) -> list[dict[str, Any]]:
    return [
        e.payload
        for e in events
        if e.type is zincir.EventType.STATE_TRANSITION and e.payload["to"] == "waiting"
    ]


@pytest.mark.parametrize("first", ["abort", "approval"])
async def test_approve_or_abort_is_woken_by_whichever_comes_first(db: zincir.Database, first: str) -> None:
    # Several runs: which of a handler's two waits reaches suspend_after first is up to the
    # scheduler, and every run must wake whichever it was.
    ids = await new_runs(db, 4)
    async with working(db, approve_or_abort, suspend_after=0.05):
        await until(lambda: _all_are(db, ids, zincir.RunStatus.WAITING))
        with trio.fail_after(15):  # poll_interval is 60 s: only the wake-ups can be this fast
            for run_id in ids:
                if first == "abort":
                    await zincir.send_signal(db, run_id, "abort", "operator said stop")
                else:
                    await zincir.decide_approval(db, run_id, "c1", approved=True, by="ada")
            await until(lambda: _all_are(db, ids, zincir.RunStatus.COMPLETED))
    expected = {"aborted": "operator said stop"} if first == "abort" else {"approved": True}
    for run_id in ids:
        assert (await db.state(run_id)).run.result == expected
        events = await db.events(run_id)
        assert not [e for e in events if e.type is zincir.EventType.ATTEMPT_FAILED]
        [suspended, *_] = suspensions(events)
        # The suspension recorded both waits; waiting_for is the one that began it.
        assert sorted(suspended["waits"], key=lambda w: w["kind"]) == [
            {"call_id": "c1", "kind": "approval", "until": None},
            {"kind": "signal", "name": "abort", "signal": "abort", "until": None},
        ]
        assert suspended["waiting_for"] in [
            {k: v for k, v in w.items() if k != "until"} for w in suspended["waits"]
        ]


async def _all_are(db: zincir.Database, ids: list[str], status: zincir.RunStatus) -> bool:
    return all([await status_of(db, run_id) is status for run_id in ids])


async def nap_or_go(run: zincir.Run) -> None:
    """An hour's sleep or signal "go", whichever comes first; the run completes with what won."""
    won: list[Any] = []
    async with trio.open_nursery() as race:

        async def nap() -> None:
            await run.sleep("nap", 3600)
            won.append("slept")
            race.cancel_scope.cancel()

        async def go() -> None:
            won.append(await run.wait_for_signal("go", "go"))
            race.cancel_scope.cancel()

        race.start_soon(nap)
        race.start_soon(go)
    await run.complete(won[0])


async def test_a_signal_already_received_wins_over_a_sleeps_suspension(db: zincir.Database) -> None:
    ids = await new_runs(db, 6)
    for run_id in ids:
        await zincir.send_signal(db, run_id, "go", "went")
    # suspend_after=1: the hour's sleep would suspend the run at once, were the signal not there.
    async with working(db, nap_or_go, suspend_after=1):
        await until(lambda: _all_are(db, ids, zincir.RunStatus.COMPLETED))
    for run_id in ids:
        assert (await db.state(run_id)).run.result == "went"
        assert ("running", "waiting") not in transitions(await db.events(run_id))


async def test_a_signal_wakes_a_run_suspended_on_a_sleep_beside_its_wait(db: zincir.Database) -> None:
    ids = await new_runs(db, 4)
    async with working(db, nap_or_go, suspend_after=0.05):
        await until(lambda: _all_are(db, ids, zincir.RunStatus.WAITING))
        for run_id in ids:
            wake_at = scalar(db, "SELECT wake_at FROM timers WHERE run_id = ?", (run_id,))
            # Due by itself at the sleep's end (the earliest deadline of the two waits) ...
            assert scalar(db, "SELECT next_attempt_at FROM agent_runs WHERE id = ?", (run_id,)) == wake_at
        with trio.fail_after(15):  # ... or at once, when the signal comes first
            for run_id in ids:
                await zincir.send_signal(db, run_id, "go", "went")
            await until(lambda: _all_are(db, ids, zincir.RunStatus.COMPLETED))
    for run_id in ids:
        assert (await db.state(run_id)).run.result == "went"


async def test_the_earliest_deadline_of_a_runs_waits_wakes_it(
    clocked_db: zincir.Database, clock: ManualClock
) -> None:
    db = clocked_db
    ids = await new_runs(db, 4)

    async def approve_or_time_out(run: zincir.Run) -> None:
        if not await run.pending_tools():
            await run.record_response("deploy?", [zincir.ToolCall("c1", "deploy", {})], "tool_use")
        async with trio.open_nursery() as race:

            async def approval() -> None:
                await run.wait_for_approval("c1")
                race.cancel_scope.cancel()

            async def deadline() -> None:
                with contextlib.suppress(zincir.WaitTimeout):
                    await run.wait_for_signal("operator", "operator", timeout=60)
                race.cancel_scope.cancel()

            race.start_soon(approval)
            race.start_soon(deadline)
        await run.record_tool_result("c1", "not approved in time")
        await run.complete()

    async with working(db, approve_or_time_out, suspend_after=0.05, poll_interval=0.02):
        await until(lambda: _all_are(db, ids, zincir.RunStatus.WAITING))
        for run_id in ids:
            deadline = scalar(db, "SELECT deadline FROM waits WHERE run_id = ?", (run_id,))
            assert scalar(db, "SELECT next_attempt_at FROM agent_runs WHERE id = ?", (run_id,)) == deadline
        clock.advance(60)
        await until(lambda: _all_are(db, ids, zincir.RunStatus.COMPLETED))


async def test_a_run_suspended_before_wait_sets_existed_is_still_woken_after_the_migration(
    db_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zincir import _schema

    every = _schema.load
    with monkeypatch.context() as patch:
        patch.setattr(_schema, "load", lambda backend: every(backend)[:8])
        async with zincir.open_database(db_target) as old:
            run_id = str(uuid.uuid4())
            # Written with SQL (this code writes columns version 8 lacks): a run whose wait for
            # signal "go" is recorded and pending, suspended as version 8 recorded it: one wait,
            # in the run's row.
            insert_started_run(old, run_id)
            rows(
                old,
                "INSERT INTO waits (run_id, name, kind, topic, created_at)"
                " VALUES (?, 'w', 'signal', 'go', 1)",
                (run_id,),
            )
            rows(
                old,
                "UPDATE agent_runs SET status = 'waiting', wait_kind = 'signal', wait_target = 'go',"
                " next_attempt_at = NULL WHERE id = ?",
                (run_id,),
            )
    async with zincir.open_database(db_target) as new:
        assert rows(new, "SELECT kind, wake_key, name, deadline FROM run_waits") == [
            ("signal", "go", "w", None)
        ]
        outcome = await zincir.send_signal(new, run_id, "go", "after the upgrade")
        assert scalar(new, "SELECT next_attempt_at FROM agent_runs WHERE id = ?", (run_id,)) is not None
        got: list[object] = []

        async def handler(run: zincir.Run) -> None:
            got.append(await run.wait_for_signal("w", "go"))
            await run.complete()

        async with working(new, handler, suspend_after=0):
            await until(lambda: _is(new, run_id, zincir.RunStatus.COMPLETED))
    assert outcome > 0 and got == ["after the upgrade"]


@pytest.mark.parametrize("suspend_after", [0, 0.05])
async def test_a_run_does_not_suspend_while_another_task_is_in_a_step(
    db: zincir.Database, suspend_after: float
) -> None:
    [run_id] = await new_runs(db, 1)
    calls: list[int] = []

    async def handler(run: zincir.Run) -> None:
        async def slow_step() -> str:
            calls.append(run.epoch)
            # Time is the point here: long enough for the other task's wait to outlast
            # suspend_after many times over.
            await trio.sleep(0.5)
            return "drafted"

        async def draft_then_wait() -> None:
            await run.step("draft", slow_step)
            await run.wait_for_signal("review", "reviewed")

        async with trio.open_nursery() as tasks:
            tasks.start_soon(run.wait_for_signal, "abort", "abort")
            tasks.start_soon(draft_then_wait)
        await run.complete()

    async with working(db, handler, suspend_after=suspend_after):
        await until(lambda: _is(db, run_id, zincir.RunStatus.WAITING))
    assert len(calls) == 1  # the step's function was not cut short by a suspension, nor run again
    [suspended] = suspensions(await db.events(run_id))
    assert sorted(w["name"] for w in suspended["waits"]) == ["abort", "review"]
