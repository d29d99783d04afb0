"""The resume worker: recovery of abandoned runs, retries, limits, concurrency, shutdown."""

from __future__ import annotations

import functools
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

import zincir

from .conftest import ManualClock
from .helpers import (
    REPO,
    hearing_others,
    read_state,
    reap,
    rows,
    running_python,
    scalar,
    status_of,
    trace_operations,
    until,
)
from .helpers import has_status as _is
from .test_database import Gate, writes_on_the_thread


async def released_runs(db: zincir.Database, count: int, **kwargs: object) -> list[str]:
    ids = []
    for _ in range(count):
        async with zincir.open_run(db, **kwargs) as run:  # type: ignore[arg-type]
            ids.append(run.id)
    return ids


async def finish_pending_and_complete(run: zincir.Run) -> None:
    for pending in await run.pending_tools():
        await run.record_tool_result(pending.call.id, {"done_by_epoch": run.epoch})
    await run.complete()


ABANDON = """
    import sys, time, trio, zincir
    async def main():
        async with zincir.open_run(sys.argv[1], lease_ttl=0.5) as run:
            await run.record_response("", [{"id": "t1", "name": "tool"}], "tool_use")
            print(run.id, flush=True)
            await trio.sleep_forever()
    trio.run(main)
"""


async def test_a_run_abandoned_by_a_killed_process_is_completed_after_expiry(db: zincir.Database) -> None:
    with running_python(ABANDON, db.path) as proc:
        assert proc.stdout is not None
        run_id = (await trio.to_thread.run_sync(proc.stdout.readline)).strip()
        proc.send_signal(signal.SIGKILL)
        await trio.to_thread.run_sync(proc.wait)
    worker = zincir.ResumeWorker(db, finish_pending_and_complete, lease_ttl=1, poll_interval=0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await until(lambda: _is(db, run_id, zincir.RunStatus.COMPLETED))
        worker.stop()
    state = await read_state(db, run_id)
    [result] = [e for e in state.events if e.type is zincir.EventType.TOOL_RESULT]
    assert result.payload == {"call_id": "t1", "content": {"done_by_epoch": 2}}
    assert scalar(db, "SELECT attempts FROM agent_runs") == 1
    # The dead owner was a process of this host: its lease was taken at once, and why is logged.
    [takeover] = [e for e in state.events if e.type is zincir.EventType.LEASE_TAKEN_OVER]
    assert takeover.payload["from_epoch"] == 1 and "is gone" in takeover.payload["reason"]


async def test_terminal_and_actively_leased_runs_are_never_dispatched(db: zincir.Database) -> None:
    handled: list[str] = []

    async def handler(run: zincir.Run) -> None:
        handled.append(run.id)
        await run.complete()

    async with zincir.open_run(db) as done:
        await done.complete()
    async with zincir.open_run(db) as failed:
        await failed.fail("no")
    [free] = await released_runs(db, 1)
    async with zincir.open_run(db) as held:
        worker = zincir.ResumeWorker(db, handler, poll_interval=0.01)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await until(lambda: _is(db, free, zincir.RunStatus.COMPLETED))
            worker.stop()
        assert handled == [free]
        assert (await db._write(db._store.claim_due, "probe", 1000, None, 1)).leased == []
        await held.record_response("still mine", [], "end")


async def test_a_failing_handler_is_retried_after_the_backoff_then_failed(
    clocked_db: zincir.Database, clock: ManualClock
) -> None:
    attempts: list[int] = []

    async def handler(run: zincir.Run) -> None:
        attempts.append(run.epoch)
        raise ValueError(f"boom {len(attempts)}")

    async def failures() -> int:
        events = (await read_state(clocked_db, run_id)).events
        return sum(e.type == zincir.EventType.ATTEMPT_FAILED for e in events)

    [run_id] = await released_runs(clocked_db, 1)
    worker = zincir.ResumeWorker(
        clocked_db,
        handler,
        poll_interval=0.01,
        max_attempts=3,
        backoff=zincir.Backoff(initial=10, factor=2, jitter=0),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await until(lambda: _equals(failures, 1))
        # Not due again until the persisted retry time: nothing can claim it yet.
        assert (await clocked_db._write(clocked_db._store.claim_due, "probe", 1000, None, 1)).leased == []
        assert scalar(clocked_db, "SELECT next_attempt_at FROM agent_runs") == clock() + 10_000
        clock.advance(10)
        await until(lambda: _equals(failures, 2))
        clock.advance(20)
        await until(lambda: _is(clocked_db, run_id, zincir.RunStatus.FAILED))
        worker.stop()
    assert len(attempts) == 3
    events = (await read_state(clocked_db, run_id)).events
    failed = [e.payload for e in events if e.type == zincir.EventType.ATTEMPT_FAILED]
    assert [f["attempt"] for f in failed] == [1, 2, 3]
    assert failed[0]["error_type"] == "builtins.ValueError"
    assert failed[0]["message"] == "boom 1"
    assert failed[2]["next_attempt_at"] is None
    assert events[-1].payload == {
        "from": "running",
        "to": "failed",
        "reason": "attempts exhausted: 3 of 3, the last failed: builtins.ValueError: boom 3",
    }


async def _equals(count: Callable[[], Awaitable[int]], expected: int) -> bool:
    return await count() == expected


async def test_a_run_out_of_attempts_is_failed_without_running(db: zincir.Database) -> None:
    [run_id] = await released_runs(db, 1)
    rows(db, "UPDATE agent_runs SET attempts = 3")  # three owners died mid-attempt

    async def handler(run: zincir.Run) -> None:
        raise AssertionError("must not run")

    worker = zincir.ResumeWorker(db, handler, poll_interval=0.01, max_attempts=3)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await until(lambda: _is(db, run_id, zincir.RunStatus.FAILED))
        worker.stop()
    reason = (await read_state(db, run_id)).events[-1].payload["reason"]
    assert reason == "attempts exhausted: 3 of 3, the last ended without finishing the run"


async def test_the_concurrency_limit_is_never_exceeded(db: zincir.Database) -> None:
    ids = await released_runs(db, 30)
    running = 0
    most = 0

    let_go = trio.Event()

    async def handler(run: zincir.Run) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await let_go.wait()
        running -= 1
        await run.complete()

    async def waiting_for_a_free_slot() -> bool:
        return worker._limiter.statistics().tasks_waiting > 0

    worker = zincir.ResumeWorker(db, handler, poll_interval=0.01, max_concurrency=4)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        # With 30 runs due and no handler ending, the worker starts all it may, then waits ...
        await until(waiting_for_a_free_slot)
        let_go.set()  # ... and the rest run as slots come free
        for run_id in ids:
            await until(lambda run_id=run_id: _is(db, run_id, zincir.RunStatus.COMPLETED))
        worker.stop()
    assert most <= 4


async def test_stop_lets_a_short_handler_finish_and_cancels_a_long_one(db: zincir.Database) -> None:
    [short] = await released_runs(db, 1, config={"kind": "short"})
    [long] = await released_runs(db, 1, config={"kind": "long"})
    started = {"short": trio.Event(), "long": trio.Event()}
    cancelled = trio.Event()

    async def handler(run: zincir.Run) -> None:
        kind = (await run.state()).run.config["kind"]
        started[kind].set()
        if kind == "short":
            await trio.sleep(0.1)
            await run.complete()
        else:
            try:
                await trio.sleep_forever()
            finally:
                cancelled.set()

    worker = zincir.ResumeWorker(db, handler, poll_interval=0.01, grace_period=0.5)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await started["short"].wait()
        await started["long"].wait()
        worker.stop()
    assert cancelled.is_set()
    assert await status_of(db, short) == zincir.RunStatus.COMPLETED
    # The cancelled handler's run was released: claimable at once by anyone.
    [(lease, attempt)] = (await db._write(db._store.claim_due, "another-worker", 1000, None, 1)).leased
    assert lease.run_id == long
    assert attempt == 1  # the cancelled attempt was given back


async def test_a_run_released_in_this_process_is_claimed_without_waiting_a_poll(db: zincir.Database) -> None:
    handled = trio.Event()

    async def handler(run: zincir.Run) -> None:
        handled.set()
        await run.complete()

    worker = zincir.ResumeWorker(db, handler, poll_interval=3600)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await released_runs(db, 1)
        with trio.fail_after(5):
            await handled.wait()
        worker.stop()


def test_backoff_grows_exponentially_up_to_its_maximum() -> None:
    backoff = zincir.Backoff(initial=1, factor=2, maximum=5, jitter=0)
    assert [backoff.delay(n) for n in range(1, 6)] == [1, 2, 4, 5, 5]
    with pytest.raises(zincir.InvalidArgument, match="jitter"):
        zincir.Backoff(jitter=1.5)
    with pytest.raises(zincir.InvalidArgument, match="initial"):
        zincir.Backoff(initial=0)


async def test_a_renewal_racing_a_handlers_failure_record_is_not_a_lease_loss(
    db: zincir.Database,
    mock_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The race, forced: the heartbeat's renewal is queued right behind the write that records
    # the failure and releases the run, so it finds the lease released. That is this owner's
    # own release, not a loss: no "lease lost", and the failure is recorded once.
    caplog.set_level(logging.INFO)
    order = trace_operations(monkeypatch, db._store, "record_attempt_failure", "renew")
    await hearing_others(db, monkeypatch)  # its first word would poke the heartbeat mid-race
    [run_id] = await released_runs(db, 1)
    entered = trio.Event()
    proceed = trio.Event()

    async def handler(run: zincir.Run) -> None:
        entered.set()
        await proceed.wait()
        raise ValueError("boom")

    worker = zincir.ResumeWorker(
        db, handler, lease_ttl=30, poll_interval=3600, backoff=zincir.Backoff(initial=60, jitter=0)
    )
    writes_on_the_thread(db)
    gate = Gate()
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await entered.wait()
        nursery.start_soon(functools.partial(db._write, gate.pause, route=run_id))
        await gate.wait_entered()
        proceed.set()
        await trio.testing.wait_all_tasks_blocked()  # the failure record is queued behind the gate
        mock_clock.jump(10)  # the heartbeat (every 10 s) queues its renewal behind it
        await trio.testing.wait_all_tasks_blocked()
        gate.opened.set()
        worker.stop()  # returns once the handler is done
    # One batch: the renewal failed, so the batch ran again with a savepoint each.
    assert order == [("record_attempt_failure", None), ("renew", "LeaseLost")] * 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [m for m in warnings if "lease lost" in m or "was released" in m], warnings
    assert [m for m in warnings if "attempt 1 failed" in m]
    events = (await read_state(db, run_id)).events
    assert [e.type for e in events].count(zincir.EventType.ATTEMPT_FAILED) == 1
    [(owner, next_attempt_at)] = rows(db, "SELECT lease_owner, next_attempt_at FROM agent_runs")
    assert owner is None
    assert next_attempt_at == events[-1].payload["next_attempt_at"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"poll_interval": 0}, "poll_interval"),
        ({"lease_ttl": 0.001}, "lease_ttl"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"grace_period": -1}, "grace_period"),
    ],
)
async def test_bad_worker_settings(db: zincir.Database, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(zincir.InvalidArgument, match=match):
        zincir.ResumeWorker(db, finish_pending_and_complete, **kwargs)  # type: ignore[arg-type]


# -- two real worker processes --------------------------------------------------------------------


async def test_two_worker_processes_claim_each_run_exactly_once(db: zincir.Database, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    env = {**os.environ, "LEDGER": str(ledger), "PYTHONPATH": str(REPO)}
    command = [
        sys.executable, "-m", "zincir", "worker", "tests.worker_handlers:record_and_complete",
        "--db", db.path, "--poll-interval", "0.01", "--max-concurrency", "4",
    ]  # fmt: skip
    procs = [
        subprocess.Popen(
            command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    logs: list[list[str]] = [[], []]
    try:
        for proc, log in zip(procs, logs, strict=True):
            assert proc.stderr is not None
            while not log or "worker started" not in log[-1]:
                line = await trio.to_thread.run_sync(proc.stderr.readline)
                assert line, f"worker exited early: {log}"
                log.append(line)
        ids = await released_runs(db, 20)  # both workers now race for every run
        for run_id in ids:
            await until(lambda run_id=run_id: _is(db, run_id, zincir.RunStatus.COMPLETED), within=30)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        outputs = [await trio.to_thread.run_sync(lambda p=p: p.communicate(timeout=30)) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        assert "SIGTERM received: stopping" in err
    lines = ledger.read_text().splitlines()
    assert sorted(line.split()[0] for line in lines) == sorted(ids)
    assert scalar(db, "SELECT max(attempts) FROM agent_runs") == 1


def test_backoff_jitter_spreads_delays_across_its_whole_range() -> None:
    # 2000 draws from a seeded generator: deterministic, and a jitter that were ignored (every
    # delay exactly 10) or one-sided or narrower than asked would fail every bound below.
    saved = random.getstate()
    random.seed(20261129)
    try:
        delays = [zincir.Backoff(initial=10, jitter=0.5).delay(1) for _ in range(2000)]
        narrow = [zincir.Backoff(initial=10, jitter=0.1).delay(1) for _ in range(2000)]
    finally:
        random.setstate(saved)
    assert all(5 <= d <= 15 for d in delays)
    assert min(delays) < 5.5 and max(delays) > 14.5  # reaches both ends of +-50 %
    assert len(set(delays)) > 1900  # spread, not a few fixed values
    assert 9.5 < statistics.fmean(delays) < 10.5  # centred on the base delay
    # Uniform on [5, 15]: standard deviation 10 / sqrt(12) = 2.89.
    assert 2.6 < statistics.pstdev(delays) < 3.2
    assert sum(d < 10 for d in delays) > 800 and sum(d > 10 for d in delays) > 800
    assert all(9 <= d <= 11 for d in narrow)
    assert min(narrow) < 9.1 and max(narrow) > 10.9
    assert zincir.Backoff(initial=10, jitter=0).delay(1) == 10


def test_backoff_survives_thousands_of_attempts() -> None:
    assert zincir.Backoff(maximum=60, jitter=0).delay(5000) == 60


async def test_a_nan_grace_period_is_refused(db: zincir.Database) -> None:
    with pytest.raises(zincir.InvalidArgument, match="grace_period"):
        zincir.ResumeWorker(db, finish_pending_and_complete, grace_period=float("nan"))


async def test_a_handler_that_returns_without_ending_the_run_is_retried_after_the_backoff(
    clocked_db: zincir.Database, clock: ManualClock
) -> None:
    calls: list[int] = []
    second = trio.Event()

    async def lazy(run: zincir.Run) -> None:
        calls.append(run.epoch)
        if len(calls) == 2:
            await run.complete()
            second.set()

    [run_id] = await released_runs(clocked_db, 1)
    worker = zincir.ResumeWorker(
        clocked_db, lazy, poll_interval=0.01, backoff=zincir.Backoff(initial=30, jitter=0)
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await until(lambda: _released_until(clocked_db, clock() + 30_000))
        assert (await clocked_db._write(clocked_db._store.claim_due, "probe", 1000, None, 1)).leased == []
        clock.advance(30)
        with trio.fail_after(10):
            await second.wait()
        worker.stop()
    assert calls == [2, 3]
    assert await status_of(clocked_db, run_id) == zincir.RunStatus.COMPLETED


async def _released_until(db: zincir.Database, when: int) -> bool:
    row = await db._read(lambda tx: tx.one("SELECT lease_owner, next_attempt_at FROM agent_runs"))
    return row == (None, when)


async def test_claim_errors_are_retried_not_fatal(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    claim_due = db._store.claim_due
    failures = 0

    def flaky_claim(*args: object) -> object:
        nonlocal failures
        if failures < 3:
            failures += 1
            raise zincir.DatabaseBusy("simulated: another process holds the write lock")
        return claim_due(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(db._store, "claim_due", flaky_claim)
    handled = trio.Event()

    async def handler(run: zincir.Run) -> None:
        await run.complete()
        handled.set()

    [run_id] = await released_runs(db, 1)
    worker = zincir.ResumeWorker(db, handler, poll_interval=0.01, backoff=zincir.Backoff(initial=0.01))
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        with trio.fail_after(10):
            await handled.wait()
        worker.stop()
    assert failures == 3
    assert await status_of(db, run_id) == zincir.RunStatus.COMPLETED


HANG = """
import trio, zincir

async def hang(run: zincir.Run) -> None:
    print("handling", run.id, flush=True)
    await trio.sleep_forever()
"""


async def test_the_cli_stops_on_sigint_and_a_second_signal_cancels_handlers(
    db: zincir.Database, tmp_path: Path
) -> None:
    (tmp_path / "hang_handler.py").write_text(HANG)
    [run_id] = await released_runs(db, 1)
    command = [
        sys.executable, "-m", "zincir", "worker", "hang_handler:hang", "--db", db.path,
        "--poll-interval", "0.01", "--grace-period", "600",
    ]  # fmt: skip
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = await trio.to_thread.run_sync(proc.stdout.readline)
        assert line.split() == ["handling", run_id]
        proc.send_signal(signal.SIGINT)  # stop claiming; the handler has 600 s of grace ...
        assert proc.stderr is not None
        log = ""
        while "SIGINT received: stopping" not in log:
            line = await trio.to_thread.run_sync(proc.stderr.readline)
            assert line, f"the worker exited early: {log}"
            log += line
        proc.send_signal(signal.SIGINT)  # ... unless asked again
        _, err = await trio.to_thread.run_sync(lambda: proc.communicate(timeout=30))
    finally:
        reap(proc)
    assert proc.returncode == 0, err
    assert "received again: cancelling the handlers" in err
    # The cancelled handler released the run: claimable at once, its attempt given back.
    [(lease, attempt)] = (await db._write(db._store.claim_due, "next-worker", 1000, None, 1)).leased
    assert (lease.run_id, attempt) == (run_id, 1)


async def _no_database(*args: object, **kwargs: object) -> object:
    raise AssertionError("run.config must not query the database")


async def test_run_config_is_the_stored_config_on_every_way_to_a_lease(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .test_recovery import _held_by_a_child
    from .test_suspension import until, working

    config = {"goal": "fix the failing test", "limits": [1, {"deep": None}]}
    async with zincir.open_run(db, config=config) as run:
        with monkeypatch.context() as offline:  # read with the lease: no query of its own
            offline.setattr(db, "_read", _no_database)
            offline.setattr(db, "_write", _no_database)
            assert run.config == config
        kid = await run.spawn("kid", config={"topic": "leases"})
        lead = run.id
    async with zincir.open_run(db) as plain:
        assert plain.config == {}
    async with zincir.open_run(db, lead) as again:  # an existing run, taken by hand
        assert again.config == config
    async with zincir.open_run(db, config="just a string") as orphan:
        pass
    holder = await _held_by_a_child(db, orphan.id)  # held by a process that then dies
    holder.kill()
    holder.communicate()
    seen: dict[str, object] = {}

    async def handler(run: zincir.Run) -> None:
        seen[run.id] = run.config
        await run.complete()

    async with working(db, handler):
        await until(lambda: _all_completed(db, [lead, kid, plain.id, orphan.id]))
    assert seen == {lead: config, kid: {"topic": "leases"}, plain.id: {}, orphan.id: "just a string"}
    events = await db.events(orphan.id)
    assert [e for e in events if e.type is zincir.EventType.LEASE_TAKEN_OVER]  # the dead owner's path


async def _all_completed(db: zincir.Database, run_ids: list[str]) -> bool:
    return all([await _is(db, run_id, zincir.RunStatus.COMPLETED) for run_id in run_ids])


class ModelClient:
    """Stands for an expensive per-worker resource (an HTTP client, a connection pool)."""


async def test_worker_resources_are_built_once_for_every_handler_and_closed_after_the_last(
    db: zincir.Database,
) -> None:
    run_ids = await released_runs(db, 6)
    log: list[str] = []
    clients: list[ModelClient] = []
    last_started, release_last = trio.Event(), trio.Event()

    @asynccontextmanager
    async def model_client() -> AsyncIterator[ModelClient]:
        log.append("open")
        try:
            yield ModelClient()
        finally:
            log.append("close")

    async def handler(run: zincir.Run, client: ModelClient) -> None:
        clients.append(client)
        if run.id == run_ids[-1]:  # still at work when the worker is told to stop
            last_started.set()
            await release_last.wait()
        log.append("handled")
        await run.complete()

    worker = zincir.ResumeWorker(
        db, handler, resources=model_client, max_concurrency=3, poll_interval=60, grace_period=60
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        assert log[0] == "open"  # entered before the first claim
        await until(lambda: _all_completed(db, run_ids[:-1]))
        await last_started.wait()
        worker.stop()
        assert "close" not in log  # a handler still has it
        release_last.set()
    assert log == ["open", *["handled"] * 6, "close"]
    assert len(clients) == 6 and all(client is clients[0] for client in clients)
    assert await _all_completed(db, run_ids)


async def test_bad_worker_resources_are_refused(db: zincir.Database) -> None:
    async def handler(run: zincir.Run, resources: object) -> None:
        raise AssertionError("never called")

    with pytest.raises(zincir.InvalidArgument, match="resources must be"):
        zincir.ResumeWorker(db, handler, resources=42)  # type: ignore[call-overload]

    def not_a_context_manager() -> object:
        return object()

    worker = zincir.ResumeWorker(db, handler, resources=not_a_context_manager)  # type: ignore[arg-type]
    with pytest.raises(zincir.InvalidArgument, match="not an async context manager"):
        await worker.run()


async def test_until_idle_returns_once_nothing_is_left_and_not_while_a_run_will_come_due(
    db: zincir.Database,
) -> None:
    kinds = ["flaky", "sleepy", "waiter", "plain"]
    runs = {}
    for kind in kinds:
        async with zincir.open_run(db, config={"kind": kind}) as run:
            runs[kind] = run.id
    failed: list[str] = []

    async def handler(run: zincir.Run) -> None:
        kind = run.config["kind"]
        if kind == "flaky" and not failed:
            failed.append(run.id)
            raise RuntimeError("fails once: due again after the backoff")
        if kind == "sleepy":
            await run.sleep("nap", 0.3)  # suspends (suspend_after=0): due again at its wake time
        if kind == "waiter":
            await run.wait_for_signal("w", "go")  # suspends: only an outsider brings it back
        await run.complete()

    worker = zincir.ResumeWorker(
        db, handler, until_idle=True, suspend_after=0, poll_interval=60, backoff=zincir.Backoff(0.3, jitter=0)
    )
    with trio.fail_after(30):
        await worker.run()  # returns by itself
    statuses = {kind: await status_of(db, run_id) for kind, run_id in runs.items()}
    assert statuses == {
        "flaky": zincir.RunStatus.COMPLETED,  # it did not leave while a backoff was under way
        "sleepy": zincir.RunStatus.COMPLETED,  # nor while a durable sleep was
        "waiter": zincir.RunStatus.WAITING,
        "plain": zincir.RunStatus.COMPLETED,
    }


async def test_a_run_that_came_due_since_the_last_claim_is_not_left_for_a_poll(
    db: zincir.Database,
) -> None:
    # An idle worker sleeps for as long as next_due_in says. A run that became due between the
    # worker's claim and that read (a backoff ending just then) must make it look again at
    # once, not after a whole poll interval: it was missed when only future wake times counted.
    assert await db._read(db._store.next_due_in) is None
    async with zincir.open_run(db):  # left without an end: released, claimable now
        assert await db._read(db._store.next_due_in) is None  # leased: not claimable
    assert await db._read(db._store.next_due_in) == 0


async def test_until_idle_waits_for_a_run_another_owner_holds(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked = trace_operations(monkeypatch, db._store, "work_ahead")
    handled: list[str] = []

    async def handler(run: zincir.Run) -> None:
        handled.append(run.id)
        await run.complete()

    worker = zincir.ResumeWorker(db, handler, until_idle=True, poll_interval=60)
    # The nursery outlives the run's block: the worker goes on once the run is released.
    async with trio.open_nursery() as nursery:  # noqa: SIM117
        async with zincir.open_run(db) as held:
            nursery.start_soon(worker.run)
            await until(lambda: _true(bool(looked)))  # idle, and it looked ahead ...
            assert nursery.child_tasks  # ... and found this run, held here: it keeps working
        # Released, not completed: the worker takes it, then has nothing left and returns.
    assert handled == [held.id]
    assert await status_of(db, held.id) is zincir.RunStatus.COMPLETED


async def _true(value: bool) -> bool:
    return value


async def test_the_cli_worker_with_resources_until_idle_exits_when_done(
    db: zincir.Database, tmp_path: Path
) -> None:
    run_ids = await released_runs(db, 3)
    ledger = tmp_path / "ledger"
    command = [
        sys.executable, "-m", "zincir", "worker", "tests.worker_handlers:record_with_client", "--db", db.path,
        "--resources", "tests.worker_handlers:client_for_the_ledger", "--until-idle",
    ]  # fmt: skip
    env = {**os.environ, "LEDGER": str(ledger)}
    run_worker = functools.partial(subprocess.run, command, cwd=REPO, env=env, capture_output=True, text=True)
    done = await trio.to_thread.run_sync(functools.partial(run_worker, timeout=60))
    assert done.returncode == 0, done.stderr
    assert "worker idle" in done.stderr
    lines = ledger.read_text().splitlines()
    assert lines[0].startswith("open ") and lines[-1].startswith("close ")
    handled = [line.split() for line in lines[1:-1]]
    assert sorted(run_id for run_id, _ in handled) == sorted(run_ids)
    assert {client for _, client in handled} == {lines[0].split()[1]}  # one client for all
    assert await _all_completed(db, run_ids)
