"""How crashes are detected and counted (docs/crashes.md), on both backends, with real processes
killed with SIGKILL: a dead owner whose tool still runs is not taken over at once, and a lost
attempt leaves a record (``attempt_lost``) that ``max_attempts`` counts, visibly."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import zincir
from zincir import _owner

from .helpers import rows, start_python

# A tool run as a subprocess, as `git commit` or `pytest` would be: it waits for the test's go
# (a file, so that the test decides when the effect happens, not a timer), then applies its
# effect: a line in the effects file. (An orphan whose test runner died gives up in 10 minutes.)
TOOL = """
import os, sys, time
effects, key, go = sys.argv[1:]
give_up = time.monotonic() + 600
while not os.path.exists(go):
    if time.monotonic() > give_up:
        sys.exit(1)
    time.sleep(0.005)
with open(effects, "a") as out:
    out.write(key + "\\n")
"""

# An owner that runs the tool for its one tool call and prints the tool's PID. The test kills
# it with SIGKILL while the tool waits; the tool lives on, re-parented. ``how``: "keep" (as
# trio.run_process starts it), "scrub" (an environment of its own, as `env -i` gives, without
# the owner's mark), "scrub+group" (that, and a process group of its own).
OWNER = """
    import os, subprocess, sys, trio, zincir
    async def main():
        target, run_id, tool, effects, go, how = sys.argv[1:]
        env = {"PATH": os.environ["PATH"]} if how.startswith("scrub") else None
        group = {"process_group": 0} if how.endswith("+group") else {}
        async with zincir.open_database(target) as db, zincir.open_run(db, run_id, lease_ttl=30) as run:
            await run.record_response("", [zincir.ToolCall("commit", "git_commit", {})], "tool_use")
            [pending] = await run.pending_tools()
            async def commit(pending):
                command = [sys.executable, tool, effects, pending.idempotency_key, go]
                quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
                proc = await trio.lowlevel.open_process(command, env=env, **quiet, **group)
                print("tool", proc.pid, flush=True)
                await proc.wait()
                return "committed"
            await run.execute(pending, commit)
    trio.run(main)
"""


_orphans: list[tuple[int, int]] = []
"""The (pid, start) of each tool a test orphaned: killed when the test ends, whatever it found."""


@contextlib.contextmanager
def _tool_files(tmp_path: Path) -> Iterator[None]:
    (tmp_path / "tool.py").write_text(TOOL)
    try:
        yield
    finally:
        for pid, started in _orphans:
            if _owner.process_start(pid) == started:  # still that process: not a reused PID
                os.kill(pid, signal.SIGKILL)
        _orphans.clear()


async def _kill_the_owner_while_its_tool_runs(
    db: zincir.Database, tmp_path: Path, how: str = "keep", **popen: Any
) -> tuple[str, int]:
    """Create a run; an owner process records a tool call and starts its tool, and is killed
    with SIGKILL while the tool waits. (run id, the orphaned tool's PID)."""
    async with zincir.open_run(db) as run:
        run_id = run.id
    tool, effects, go = tmp_path / "tool.py", tmp_path / "effects", tmp_path / "go"
    args = (db.path, run_id, str(tool), str(effects), str(go), how)
    owner = start_python(OWNER, *args, **popen)
    try:
        assert owner.stdout is not None
        line = await trio.to_thread.run_sync(owner.stdout.readline)
        assert line.startswith("tool "), (line, owner.stderr.read() if owner.stderr else "")
    finally:
        owner.kill()
        await trio.to_thread.run_sync(owner.communicate)
    assert owner.returncode == -signal.SIGKILL
    tool_pid = int(line.split()[1])
    started = _owner.process_start(tool_pid)
    assert started is not None and started != _owner.GONE  # the orphan runs on
    _orphans.append((tool_pid, started))
    return run_id, tool_pid


async def _until(condition: Callable[[], bool]) -> None:
    """Wait for something another process does (no deadline of a timer: the test's fail_after)."""
    while not condition():
        await trio.sleep(0.01)


async def _let_the_tool_finish(tmp_path: Path, tool_pid: int) -> None:
    (tmp_path / "go").touch()
    with trio.fail_after(20):
        await _until(lambda: _owner.process_start(tool_pid) == _owner.GONE)


def _effects(tmp_path: Path) -> list[str]:
    path = tmp_path / "effects"
    return path.read_text().split() if path.exists() else []


async def _events(db: zincir.Database, run_id: str, type: zincir.EventType) -> list[Any]:
    return [e.payload for e in await db.events(run_id) if e.type is type]


async def _reconcile_and_complete(run: zincir.Run, tmp_path: Path, ran: list[str]) -> Any:
    """What a new owner does: the call started before, so it asks the probe first."""

    async def probe(pending: zincir.PendingToolCall) -> Any:
        return "committed" if pending.idempotency_key in _effects(tmp_path) else None

    async def commit(pending: zincir.PendingToolCall) -> Any:
        ran.append(pending.call.id)
        with (tmp_path / "effects").open("a") as out:
            out.write(pending.idempotency_key + "\n")
        return "committed"

    [pending] = await run.pending_tools()
    assert pending.started == 1
    result = await run.execute(pending, commit, reconcile=probe)
    await run.complete()
    return result


async def _claims(db: zincir.Database) -> list[str]:
    """The runs a worker's claim takes now (the store's claim, as ResumeWorker makes it)."""
    claims = await db._write(db._store.claim_due, "probe", 30_000, None, 8)
    return [lease.run_id for lease, _ in claims.leased]


@pytest.mark.parametrize("new_owner", ["open_run", "worker"])
async def test_a_dead_owners_tool_that_still_runs_keeps_its_lease_until_it_ends(
    db: zincir.Database, tmp_path: Path, new_owner: str
) -> None:
    with _tool_files(tmp_path):
        run_id, tool_pid = await _kill_the_owner_while_its_tool_runs(db, tmp_path)
        # The owner is gone, but the tool it started may still apply its effect: no takeover at
        # once, neither by open_run nor by a worker's claim (its lease has ~30 s left).
        with pytest.raises(zincir.RunLeased, match=f"process {tool_pid} .* still runs"):
            async with zincir.open_run(db, run_id):
                pass
        assert await _claims(db) == []
        assert _effects(tmp_path) == []
        await _let_the_tool_finish(tmp_path, tool_pid)  # the orphan's effect happens, once
        assert _effects(tmp_path) == ["tool_call:commit"]
        ran: list[str] = []
        with trio.fail_after(20):  # now nothing it started runs: at once, not in 30 s
            if new_owner == "open_run":
                async with zincir.open_run(db, run_id) as again:
                    result = await _reconcile_and_complete(again, tmp_path, ran)
            else:
                result = await _one_worker_pass(db, lambda run: _reconcile_and_complete(run, tmp_path, ran))
    assert (result, ran) == ("committed", [])  # the probe saw the orphan's effect: not run again
    assert _effects(tmp_path) == ["tool_call:commit"]
    [takeover] = await _events(db, run_id, zincir.EventType.LEASE_TAKEN_OVER)
    assert takeover["at_once"] is True
    assert "is gone, and no process it started is alive" in takeover["reason"]


async def _one_worker_pass(db: zincir.Database, handle: Callable[[zincir.Run], Awaitable[Any]]) -> Any:
    """Run a ResumeWorker until its handler has handled one run; what the handler returned."""
    results: list[Any] = []

    async def handler(run: zincir.Run) -> None:
        results.append(await handle(run))

    worker = zincir.ResumeWorker(db, handler, lease_ttl=30, poll_interval=60)  # claims at start only
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await _until(lambda: bool(results))
        worker.stop()
    [result] = results
    return result


@pytest.mark.parametrize(("how", "found"), [("scrub", "process group"), ("scrub+group", "session")])
async def test_a_dead_session_leaders_tool_keeps_its_lease_even_without_the_mark(
    db: zincir.Database, tmp_path: Path, how: str, found: str
) -> None:
    # The owner leads its own session and process group (as systemd or `setsid` starts it); its
    # tool scrubbed its environment, and stayed in the group, or made a group of its own.
    with _tool_files(tmp_path):
        run_id, tool_pid = await _kill_the_owner_while_its_tool_runs(
            db, tmp_path, how, start_new_session=True
        )
        with pytest.raises(
            zincir.RunLeased, match=rf"process {tool_pid} .*in the {found} \d+ it led\) still runs"
        ):
            async with zincir.open_run(db, run_id):
                pass
        assert await _claims(db) == []
        await _let_the_tool_finish(tmp_path, tool_pid)
        with trio.fail_after(20):
            async with zincir.open_run(db, run_id) as again:
                assert await _reconcile_and_complete(again, tmp_path, []) == "committed"
    assert _effects(tmp_path) == ["tool_call:commit"]


@contextlib.asynccontextmanager
async def _later(db: zincir.Database, minutes: float) -> AsyncIterator[zincir.Database]:
    """The same database, seen by a process whose clock is ``minutes`` ahead: every lease the
    others took has expired for it (on PostgreSQL the fake server clock of its operations)."""

    def clock() -> int:
        return int(time.time() * 1000 + minutes * 60_000)

    async with zincir.open_database(db.path, clock=clock) as later:
        yield later


async def test_an_expired_lease_of_a_dead_owner_is_taken_and_says_its_tool_still_runs(
    db: zincir.Database, tmp_path: Path
) -> None:
    with _tool_files(tmp_path):
        run_id, tool_pid = await _kill_the_owner_while_its_tool_runs(db, tmp_path)
        async with _later(db, minutes=5) as later, zincir.open_run(later, run_id) as again:
            epoch = again.epoch
    [takeover] = await _events(db, run_id, zincir.EventType.LEASE_TAKEN_OVER)
    assert takeover["at_once"] is False and takeover["from_epoch"] == epoch - 1
    assert takeover["reason"].startswith("its lease expired ")
    assert f"is gone, but process {tool_pid} (python" in takeover["reason"]
    assert "still runs" in takeover["reason"]
    [lost] = await _events(db, run_id, zincir.EventType.ATTEMPT_LOST)
    assert lost["known_by"] == "lease_expired" and lost["reason"] == takeover["reason"]


# -- lost attempts --------------------------------------------------------------------------------

# A worker process whose handler says which run it holds, then hangs until it is killed.
HANGING_WORKER = """
    import sys, trio, zincir
    async def hang(run):
        print("handling", run.id, flush=True)
        await trio.sleep_forever()
    async def main():
        async with zincir.open_database(sys.argv[1]) as db:
            worker = zincir.ResumeWorker(db, hang, lease_ttl=30, poll_interval=0.05, max_attempts=3)
            await worker.run()
    trio.run(main)
"""


async def _kill_a_worker_mid_handler(db: zincir.Database, run_id: str) -> tuple[int, str, int]:
    """Start a worker process, wait until its handler holds the run, SIGKILL it. The dead
    worker's (pid, lease owner, epoch)."""
    worker = start_python(HANGING_WORKER, db.path)
    try:
        assert worker.stdout is not None
        line = await trio.to_thread.run_sync(worker.stdout.readline)
        assert line.split() == ["handling", run_id], (line, worker.stderr.read() if worker.stderr else "")
    finally:
        worker.kill()
        await trio.to_thread.run_sync(worker.communicate)
    [(owner, epoch)] = rows(db, "SELECT lease_owner, lease_epoch FROM agent_runs WHERE id = ?", (run_id,))
    return worker.pid, owner, epoch


async def _handle_until_ended(db: zincir.Database, run_id: str, **options: Any) -> list[str]:
    """Run a ResumeWorker in this process until the run ends; the ids it handed to its handler."""
    handled: list[str] = []

    async def handler(run: zincir.Run) -> None:
        handled.append(run.id)
        await run.complete()

    worker = zincir.ResumeWorker(db, handler, lease_ttl=30, poll_interval=0.05, **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        with trio.fail_after(20):
            while not (await db.state(run_id)).run.status.is_terminal:
                await trio.sleep(0.01)
        worker.stop()
    return handled


@pytest.mark.parametrize("when", ["at_once", "after_expiry"])
async def test_a_claim_after_a_killed_attempt_logs_attempt_lost(
    db: zincir.Database, caplog: pytest.LogCaptureFixture, when: str
) -> None:
    async with zincir.open_run(db) as run:
        run_id = run.id
    pid, owner, epoch = await _kill_a_worker_mid_handler(db, run_id)
    caplog.set_level(logging.INFO, logger="zincir.worker")
    if when == "at_once":  # this host sees that the worker's process is gone
        handled = await _handle_until_ended(db, run_id, max_attempts=3)
    else:  # as another host would: after the lease expired
        async with _later(db, minutes=5) as later:
            handled = await _handle_until_ended(later, run_id, max_attempts=3)
    assert handled == [run_id]
    [lost] = await _events(db, run_id, zincir.EventType.ATTEMPT_LOST)
    gone = f"its owner, process {pid} of this host, is gone, and no process it started is alive"
    assert lost["owner"] == owner and lost["epoch"] == epoch
    assert (lost["attempts"], lost["max_attempts"]) == (1, 3)
    assert isinstance(lost["lease_expires_at"], int)
    if when == "at_once":
        assert (lost["known_by"], lost["reason"]) == ("process_gone", gone)
    else:
        assert lost["known_by"] == "lease_expired"
        assert lost["reason"].startswith("its lease expired ") and lost["reason"].endswith(f"; {gone}")
    [takeover] = await _events(db, run_id, zincir.EventType.LEASE_TAKEN_OVER)
    assert takeover == {"at_once": when == "at_once", "from_epoch": epoch, "reason": lost["reason"]}
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING and run_id in r.getMessage()]
    assert f"(attempt 2 of 3, epoch {epoch + 1}) after an attempt lost to" in record.getMessage()
    assert owner in record.getMessage()


async def test_attempts_spent_by_kills_fail_the_run_and_say_so(
    db: zincir.Database, caplog: pytest.LogCaptureFixture
) -> None:
    async with zincir.open_run(db) as run:
        run_id = run.id
    killed = [await _kill_a_worker_mid_handler(db, run_id) for _ in range(3)]  # attempts 1, 2, 3
    caplog.set_level(logging.INFO, logger="zincir.worker")
    assert await _handle_until_ended(db, run_id, max_attempts=3) == []  # failed, not handed out
    state = await db.state(run_id)
    assert state.run.status is zincir.RunStatus.FAILED
    lost = await _events(db, run_id, zincir.EventType.ATTEMPT_LOST)
    assert [(x["attempts"], x["owner"], x["known_by"]) for x in lost] == [
        (n, owner, "process_gone") for n, (_, owner, _) in enumerate(killed, start=1)
    ]
    pid, owner, epoch = killed[-1]
    reason = state.events[-1].payload["reason"]
    assert reason == (
        f"attempts exhausted: 3 of 3, the last lost to the death of its process (owner {owner},"
        f" epoch {epoch}): its owner, process {pid} of this host, is gone, and no process it"
        " started is alive"
    )
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage() == f"run {run_id} failed: {reason}"


def test_a_process_marks_what_it_starts_and_adds_its_mark_to_the_marks_it_inherited() -> None:
    me = _owner.this_process()
    _owner.mark_this_process()
    mine = f"{me.pid}.{me.process_start}"
    assert mine in os.environ[_owner.MARK].split()
    code = "import os; from zincir import _owner; _owner.mark_this_process(); print(os.environ[_owner.MARK])"
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    inherited, own = child.stdout.split()[-2:]
    assert inherited == mine and own != mine  # the parent's first: a grandchild carries both
