"""A lease holder stops before its lease could have expired, whatever the database does.

Real processes and a real server: the owner's writer backend is stopped with SIGSTOP (a hung
server, or a network partition, as the owner sees it), or another process holds SQLite's write
lock for longer than the lease lasts. The owner's body ticks (wall-clock ms, the clock the
lease's expiry is kept in on this host) until it is stopped; no tick may come at or after the
expiry the database holds, and the block must end with LeaseLost while the database still does
not answer. See docs/leases.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

import zincir
from zincir._threads import submit

from .helpers import hearing_others, running_python, scalar, until
from .postgres_server import fresh_database

OWNER = """
    import json, sys, time, trio, zincir
    from zincir._threads import submit

    def say(**fields):
        print(json.dumps(fields), flush=True)

    def backend_pid(tx):
        return int(tx.one("SELECT pg_backend_pid()")[0])

    async def noop():
        return None

    async def main(target, ttl):
        async with zincir.open_database(target, **({"writers": 1} if "://" in target else {})) as db:
            try:
                async with zincir.open_run(db, lease_ttl=ttl) as run:
                    pid = None
                    if db.backend == "postgresql":
                        pid = await submit(db._writers[0], backend_pid, ())
                    say(run=run.id, writer_pid=pid)

                    async def tick():  # the body acting: it must stop before the lease could expire
                        while True:
                            say(tick=time.time_ns() // 1_000_000)
                            await trio.sleep(0.02)

                    async def write():  # the body writing: stuck once the database stops answering
                        step = 0
                        while True:
                            await run.step(f"s{step}", noop)
                            step += 1
                            await trio.sleep(0.05)

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(tick)
                        nursery.start_soon(write)
            except zincir.LeaseLost as exc:
                say(lost=time.time_ns() // 1_000_000, message=str(exc))
        say(closed=True)

    trio.run(main, sys.argv[1], float(sys.argv[2]))
"""


class Output:
    """The JSON lines a process prints, read by a thread as they come."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.records: list[dict[str, Any]] = []
        self.ended = False
        self._token = trio.lowlevel.current_trio_token()
        self._changed = trio.Event()
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self._tell(json.loads(line))
        self._tell(None)

    def _tell(self, record: dict[str, Any] | None) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._add, record)

    def _add(self, record: dict[str, Any] | None) -> None:
        if record is None:
            self.ended = True
        else:
            self.records.append(record)
        self._changed.set()
        self._changed = trio.Event()

    async def first(self, key: str, *, within: float) -> dict[str, Any]:
        """The first record with ``key``, waiting for it at most ``within`` seconds."""
        with trio.move_on_after(within):
            while True:
                for record in self.records:
                    if key in record:
                        return record
                if self.ended:
                    break
                await self._changed.wait()
        pytest.fail(f"no {key!r} line within {within} s; the process said {self.records[-3:]}")

    def values(self, key: str) -> list[Any]:
        return [record[key] for record in self.records if key in record]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def backend_pid(tx: Any) -> int:
    return int(tx.one("SELECT pg_backend_pid()")[0])


@contextlib.contextmanager
def stopped(url: str, pid: int) -> Iterator[None]:
    """SIGSTOP the backend ``pid`` while it is idle (outside any transaction, so that it holds
    no row lock: a stopped lock holder would stop the run's next owner as well, another fault
    than the one tested), and SIGCONT it on the way out, whatever happens. The test runs as
    root; the server runs as its own system user."""
    with psycopg.connect(url, autocommit=True) as admin:
        deadline = time.monotonic() + 10
        while True:
            os.kill(pid, signal.SIGSTOP)
            try:
                row = admin.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            except BaseException:
                os.kill(pid, signal.SIGCONT)
                raise
            if row == ("idle",):
                break
            os.kill(pid, signal.SIGCONT)
            if time.monotonic() > deadline:
                pytest.fail(f"backend {pid} was never idle: {row}")
            time.sleep(0.002)  # another process's state: there is no event to await
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def lease_expiry(url: str, run_id: str) -> tuple[int, int]:
    """(epoch, lease_expires_at) as committed in the database."""
    with psycopg.connect(url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT lease_epoch, lease_expires_at FROM agent_runs WHERE id = %s", (run_id,)
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.fixture
def pg_url(postgres_admin_url: str) -> Iterator[str]:
    with fresh_database(postgres_admin_url) as url:
        yield url


async def take_over(db: zincir.Database, run_id: str, *, within: float) -> zincir.Run:
    """Open the run as its next owner, as soon as its lease has expired (RunLeased until then)."""
    with trio.fail_after(within):
        while True:
            try:
                async with zincir.open_run(db, run_id, lease_ttl=30) as run:
                    await run.record_response("the next owner writes", [], "end")
                    return run
            except zincir.RunLeased:
                await trio.sleep(0.05)  # the lease's expiry on the server's clock: time is the thing


async def test_an_owner_whose_writer_backend_is_stopped_stops_before_its_lease_could_expire(
    pg_url: str,
) -> None:
    ttl = 3.0
    with running_python(OWNER, pg_url, str(ttl)) as owner:
        output = Output(owner)
        started = await output.first("run", within=30)
        run_id, pid = started["run"], started["writer_pid"]
        await output.first("tick", within=10)
        with stopped(pg_url, pid):
            stopped_at = now_ms()
            # Final while the backend is stopped: it is the only one that renews this lease.
            epoch, expires_at = lease_expiry(pg_url, run_id)
            lost = await output.first("lost", within=2 * ttl)  # before the fix: only after SIGCONT
            assert now_ms() < expires_at  # the block ended while the server still held the lease
            async with zincir.open_database(pg_url) as db:
                second = await take_over(db, run_id, within=3 * ttl)
            assert second.epoch == epoch + 1
        await trio.to_thread.run_sync(owner.wait, 30)  # closing its database waited for the backend
        output_done = await output.first("closed", within=30)
    assert output_done == {"closed": True}
    ticks = output.values("tick")
    assert ticks and max(ticks) < lost["lost"] < expires_at
    assert [t for t in ticks if t >= expires_at] == []
    assert any(t >= stopped_at for t in ticks)  # the body was still running when the backend stopped
    message = lost["message"]
    assert f"run {run_id}" in message and "no renewal was confirmed for" in message
    assert "unanswered" in message and "database or the network did not answer" in message
    with psycopg.connect(pg_url, autocommit=True) as admin:
        # Its writes in flight ran once the backend went on, and were fenced: no step of epoch 1
        # was stored at or after the expiry.
        late = admin.execute(
            "SELECT name, completed_at FROM steps WHERE run_id = %s AND epoch = %s AND completed_at >= %s",
            (run_id, epoch, expires_at),
        ).fetchall()
    assert late == []


async def test_an_owner_whose_writes_wait_for_another_processs_write_lock_stops_in_time(
    tmp_path: Path,
) -> None:
    # SQLite: another process holds the write lock for longer than the lease lasts, so no renewal
    # (and no write of the body) can be confirmed; the writer thread waits the lock out.
    path = str(tmp_path / "zincir.db")
    async with zincir.open_database(path):
        pass  # created and migrated, so the owner only waits for the lock below
    ttl = 2.0
    with running_python(OWNER, path, str(ttl)) as owner:
        output = Output(owner)
        started = await output.first("run", within=30)
        run_id = started["run"]
        await output.first("tick", within=10)
        locker = sqlite3.connect(path, isolation_level=None, timeout=10)
        try:
            locker.execute("BEGIN IMMEDIATE")
            locked_at = now_ms()
            # Final while the lock is held: nobody else can write the lease.
            epoch, expires_at = locker.execute(
                "SELECT lease_epoch, lease_expires_at FROM agent_runs WHERE id = ?", (run_id,)
            ).fetchone()
            lost = await output.first("lost", within=2 * ttl)  # before: when the 5 s lock wait gave up
            assert now_ms() < expires_at
            while now_ms() <= expires_at + 50:
                await trio.sleep(0.05)  # hold the lock past the expiry: time is the thing tested
        finally:
            locker.rollback()
            locker.close()
        async with zincir.open_database(path) as db:
            second = await take_over(db, run_id, within=3 * ttl)
        assert second.epoch == epoch + 1
        await trio.to_thread.run_sync(owner.wait, 30)
        assert await output.first("closed", within=30) == {"closed": True}
    ticks = output.values("tick")
    assert ticks and max(ticks) < lost["lost"] < expires_at
    assert any(t >= locked_at for t in ticks)
    assert "no renewal was confirmed for" in lost["message"]
    with sqlite3.connect(path) as conn:
        late = conn.execute(
            "SELECT name FROM steps WHERE run_id = ? AND epoch = ? AND completed_at >= ?",
            (run_id, epoch, expires_at),
        ).fetchall()
    assert late == []


async def test_a_workers_handler_stops_in_time_and_frees_its_slot_while_the_backend_is_stopped(
    pg_url: str,
) -> None:
    ttl = 2.0
    ticks: list[int] = []
    started: dict[str, trio.Event] = {}

    first_ended = trio.Event()

    async def handler(run: zincir.Run) -> None:
        started[run.id].set()
        if run.id == first:
            try:
                while True:  # acts until it is stopped
                    ticks.append(now_ms())
                    await trio.sleep(0.02)
            finally:
                first_ended.set()

    async with zincir.open_database(pg_url, writers=2) as db:
        ids = []
        for _ in range(2):
            async with zincir.open_run(db) as run:
                ids.append(run.id)  # released on leaving: claimable
            started[run.id] = trio.Event()
        first, second = ids
        # One slot: the second run is handled only once the first handler's slot is free.
        worker = zincir.ResumeWorker(db, handler, lease_ttl=ttl, max_concurrency=1, poll_interval=600)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(10):
                await started[first].wait()
            # The first run's writer (runs are routed to writers by id).
            writer = db._writers[hash(first) % len(db._writers)]
            with stopped(pg_url, await submit(writer, backend_pid, ())):
                _, expires_at = lease_expiry(pg_url, first)
                with trio.fail_after(2 * ttl):
                    await first_ended.wait()
                await until(lambda: no_handlers(worker), within=ttl)  # its slot is free
                assert now_ms() < expires_at
                # A writer does not answer: the worker claims nothing until it does (see below).
                assert not started[second].is_set()
            with trio.fail_after(30):  # the stopped writer answers: claiming goes on
                await started[second].wait()
            worker.stop()
    assert ticks and max(ticks) < expires_at


async def no_handlers(worker: zincir.ResumeWorker) -> bool:
    return worker.running_handlers == 0


async def test_a_worker_claims_nothing_while_a_writer_does_not_answer(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # One of two writers' backends is stopped while a worker holds three runs. Before, each run
    # lost to the stall freed a slot that the worker filled at once with another claim, through
    # the writer that still answered; a claimed run's operations are routed to either writer by
    # its id, so the next runs lost their leases (and attempts) the same way. Now the worker
    # claims nothing while a writer does not answer, and claims again once it does.
    caplog.set_level(logging.INFO, logger="zincir.worker")
    ttl = 2.0
    held = 3
    starts: list[str] = []
    changed = trio.Event()
    lost: set[str] = set()

    async def handler(run: zincir.Run) -> None:
        nonlocal changed
        starts.append(run.id)
        changed.set()
        changed = trio.Event()
        try:
            await trio.sleep_forever()  # holds the run until its lease is lost or the worker stops
        finally:
            lost.add(run.id)
            changed.set()
            changed = trio.Event()

    async def until_seen(what: Any) -> None:
        while not what():
            await changed.wait()

    async with zincir.open_database(pg_url, writers=2) as db:
        for _ in range(3 * held):
            async with zincir.open_run(db):
                pass  # released on leaving: claimable
        worker = zincir.ResumeWorker(
            db, handler, lease_ttl=ttl, max_concurrency=held, poll_interval=600, grace_period=0
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(10):
                await until_seen(lambda: len(starts) == held)
            victim = starts[0]  # one held run's writer (runs are routed to writers by id)
            writer = db._writers[hash(victim) % len(db._writers)]
            with stopped(pg_url, await submit(writer, backend_pid, ())):
                with trio.fail_after(2 * ttl):
                    await until_seen(lambda: victim in lost)  # its slot is free
                # Time is the thing tested: the writer stays silent for two more TTLs, in which
                # the worker had claimed (and lost) runs before.
                await trio.sleep(2 * ttl)
                assert starts[held:] == []
            with trio.fail_after(30):  # the writer answers again: the worker claims again
                await until_seen(lambda: len(starts) > held)
            worker.stop()
    said = [r.getMessage() for r in caplog.records if r.name == "zincir.worker"]
    assert any("has not answered for" in m and "claiming no run until it answers" in m for m in said)
    assert any("answers again" in m for m in said)


async def test_a_worker_waiting_for_a_silent_writer_stops_at_once(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The wait for the writer's answer is a write that does nothing, and a write is not given up
    # when its caller is cancelled: stop() must end the wait without it.
    ttl = 2.0
    lost = trio.Event()

    async def handler(run: zincir.Run) -> None:
        try:
            await trio.sleep_forever()
        finally:
            lost.set()

    async def pausing() -> bool:
        return any("claiming no run until it answers" in r.getMessage() for r in caplog.records)

    async with zincir.open_database(pg_url, writers=2) as db:
        async with zincir.open_run(db) as run:
            pass  # released on leaving: claimable
        # One slot, held: no claim is in flight when the writer stops (a claim waits for its answer).
        worker = zincir.ResumeWorker(
            db, handler, lease_ttl=ttl, max_concurrency=1, poll_interval=600, grace_period=0
        )
        stopped_worker = trio.Event()

        async def work(task_status: trio.TaskStatus[None]) -> None:
            await worker.run(task_status=task_status)
            stopped_worker.set()

        async with trio.open_nursery() as nursery:
            await nursery.start(work)
            await until(lambda: has_handlers(worker), within=10)
            writer = db._writers[hash(run.id) % len(db._writers)]
            with stopped(pg_url, await submit(writer, backend_pid, ())):
                with trio.fail_after(2 * ttl):
                    await lost.wait()
                await until(pausing, within=ttl)
                worker.stop()
                with trio.fail_after(ttl):  # while the writer is still stopped
                    await stopped_worker.wait()


async def test_a_claim_answered_too_late_gives_its_runs_back_with_their_attempts(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's only writer is stopped while its claim is in flight. Before, the claim's leases
    # reached a handler past their deadline: given up at once, each cost its run an attempt, and
    # the run waited for its lease to expire. Now they are released with the attempt given back,
    # and claimed again at once.
    ttl = 1.0
    seen: list[tuple[str, object]] = []  # (run id, attempts as stored) at each handler start
    handled = trio.Event()

    async def handler(run: zincir.Run) -> None:
        seen.append((run.id, scalar(db, "SELECT attempts FROM agent_runs WHERE id = ?", (run.id,))))
        await run.complete()
        handled.set()

    async with zincir.open_database(pg_url, writers=1) as db, zincir.open_database(pg_url) as other:
        worker = zincir.ResumeWorker(db, handler, lease_ttl=ttl, poll_interval=0.2)
        await hearing_others(db, monkeypatch)  # a run made elsewhere wakes the worker at once
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            writer = db._writers[0]
            with stopped(pg_url, await submit(writer, backend_pid, ())):
                async with zincir.open_run(other) as run:
                    pass  # released on leaving: claimable, and the worker is told at once
                # Time is the thing tested: the claim stays unanswered past its leases' deadline.
                await until(lambda: unanswered_longer_than(writer, ttl), within=30)
            with trio.fail_after(30):
                await handled.wait()
            worker.stop()
        events = [e.type for e in await db.events(run.id)]
    assert seen == [(run.id, 1)]  # claimed once more, and the late claim's attempt given back
    assert "attempt_lost" not in events


async def unanswered_longer_than(writer: Any, seconds: float) -> bool:
    return bool(writer.unanswered_for() > seconds)


async def has_handlers(worker: zincir.ResumeWorker) -> bool:
    return worker.running_handlers > 0


async def test_a_release_that_cannot_be_confirmed_is_given_up_by_the_deadline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The body is done, but another connection holds the write lock, so the release on leaving
    # waits (SQLite waits 5 s for a lock). The block ends by the deadline all the same, quietly:
    # the lease expires instead.
    path = tmp_path / "zincir.db"
    ttl = 2.0
    async with zincir.open_database(path) as db:
        locker = sqlite3.connect(path, isolation_level=None)
        try:
            async with zincir.open_run(db, lease_ttl=ttl) as run:
                locker.execute("BEGIN IMMEDIATE")
                (expires_at,) = locker.execute(
                    "SELECT lease_expires_at FROM agent_runs WHERE id = ?", (run.id,)
                ).fetchone()
            left_at = now_ms()
        finally:
            locker.rollback()
            locker.close()
    assert left_at < expires_at
    [failed] = [r.getMessage() for r in caplog.records if "releasing the lease failed" in r.getMessage()]
    # The heartbeat had stopped (the body was done): it was not late, and the loop not blocked.
    assert "did not answer" in failed and "event loop was blocked" not in failed


BLOCKING = """
    import sys, time, trio, zincir

    async def main(target):
        async with zincir.open_database(target) as db:
            async with zincir.open_run(db, lease_ttl=0.5) as run:
                time.sleep(1.5)  # blocks the event loop: the heartbeat cannot run
                await trio.sleep(5)  # the first checkpoint after it

    trio.run(main, sys.argv[1])
"""


async def test_a_blocked_event_loop_is_named_as_the_cause_once(db_target: str) -> None:
    # Time is the thing tested: the loop is blocked for three TTLs.
    async with zincir.open_database(db_target):
        pass  # created and migrated before the owner starts its clock
    with running_python(BLOCKING, db_target) as proc:
        _, stderr = await trio.to_thread.run_sync(proc.communicate, None, 60)
    assert proc.returncode == 1, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("zincir._errors.LeaseLost: run ") or last.startswith("zincir.LeaseLost: run "), (
        stderr
    )
    assert "the heartbeat could not run for" in last and "the Trio event loop was blocked" in last
    assert "trio.to_thread.run_sync" in last
    blocked_ms = int(last.split("could not run for ")[1].split(" ms")[0])
    assert 1000 <= blocked_ms <= 3000  # from when it was due (ttl/3 in) to the end of the block
    assert stderr.count("could not run for") == 1, stderr  # said once: no bare copy of the line
