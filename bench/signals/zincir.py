"""zincir's processes for ``python -m bench.signals``.

Roles (``args["role"]`` of :func:`child`):

* ``inprocess``: ``arm(n)`` opens n runs with ``zincir.open_run``, each in its own Trio task
  blocked in ``await run.wait_for_signal("approval", "go")``; the answer comes once every wait is
  recorded in the ``waits`` table (read with a plain connection: there is no public "is it
  waiting yet"), so the sender cannot send before the wait began. When a wait returns, the task
  writes ``{"event": "resumed", "id": run_id, "t": time.monotonic()}`` and completes the run.
* ``worker``: a ``zincir.ResumeWorker(db, handler, suspend_after=0.0, poll_interval=1.0,
  max_concurrency=...)`` whose handler waits the same way, then completes. ``arm(n)`` creates n
  runs (created, then released: claimable at once) and answers once all n are suspended
  (``db.runs(status="waiting")``). ``fill(n)`` does the same for the throughput trial, and the
  worker writes one ``{"event": "all_done"}`` when its n-th handler has completed its run.
* ``sender``: ``send(targets)`` signals each run at its own moment (one Trio task, in order),
  recording ``time.monotonic()`` just before each ``zincir.send_signal``; ``blast(ids)`` signals
  every run as fast as it can with many concurrent tasks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import trio

import zincir

from ..harness.child import Channel, serve

if TYPE_CHECKING:
    from ..harness.child import Emit

WAIT_NAME, TOPIC = "approval", "go"


def make(role: str, target: str, options: dict[str, Any], emit: Emit) -> Any:
    if role == "inprocess":
        return InProcessWaiter(target, options, emit)
    if role == "worker":
        return SuspendingWorker(target, options, emit)
    if role == "sender":
        return Sender(target, options, emit)
    raise SystemExit(f"unknown zincir role {role!r}")


def describe(db: zincir.Database) -> dict[str, Any]:
    facts: dict[str, Any] = {"version": f"zincir {version('zincir')}", "backend": db.backend}
    # How often a wait re-reads the inbox when nothing woke it (a private constant: for the report).
    from zincir import _run_support

    facts["inbox_poll_s"] = getattr(_run_support, "_INBOX_POLL_S", None)
    if db.backend == "postgresql":
        facts["notes"] = "PostgreSQL: psycopg 3 in zincir's own threads; NOTIFY / LISTEN wake-ups"
    else:
        facts["notes"] = "SQLite: WAL, synchronous=FULL (zincir's default)"
    return facts


class Peek:
    """Plain reads of zincir's tables, on their own connection, for what no public API tells."""

    def __init__(self, target: str) -> None:
        self.postgres = target.startswith(("postgresql://", "postgres://"))
        self.target = target
        self._conn: Any = None

    def _connection(self) -> Any:
        if self._conn is None:
            if self.postgres:
                import psycopg

                self._conn = psycopg.connect(self.target, autocommit=True)
            else:
                import sqlite3

                self._conn = sqlite3.connect(self.target, isolation_level=None, check_same_thread=False)
                self._conn.execute("PRAGMA busy_timeout = 5000")
        return self._conn

    def _count(self, sql: str, params: list[Any]) -> int:
        if self.postgres:
            sql = sql.replace("?", "%s")
        row = self._connection().execute(sql, params).fetchone()
        return int(row[0])

    async def open_waits(self, run_ids: list[str]) -> int:
        """How many of these runs have a wait recorded and not yet completed."""
        if self.postgres:
            sql, params = (
                "SELECT count(*) FROM waits WHERE run_id = ANY(?) AND completed_at IS NULL",
                [run_ids],
            )
        else:
            marks = ",".join("?" * len(run_ids))
            sql = f"SELECT count(*) FROM waits WHERE run_id IN ({marks}) AND completed_at IS NULL"
            params = list(run_ids)
        return await trio.to_thread.run_sync(self._count, sql, params)

    async def runs_with_status(self, role: str, status: str) -> int:
        sql = "SELECT count(*) FROM agent_runs WHERE role = ? AND status = ?"
        return await trio.to_thread.run_sync(self._count, sql, [role, status])

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


async def _until(check: Callable[[], Any], what: str, seconds: float, every: float = 0.005) -> None:
    """Poll ``check`` (another process's commits have no event to await here)."""
    with trio.move_on_after(seconds) as scope:
        while not await check():  # noqa: ASYNC110
            await trio.sleep(every)
    if scope.cancelled_caught:
        raise TimeoutError(f"{what}: not within {seconds:.0f} s")


class _Side:
    is_async = True

    def __init__(self, target: str, options: dict[str, Any], emit: Emit) -> None:
        self.target = target
        self.options = options
        self.emit = emit
        self.peek = Peek(target)
        self.db: zincir.Database
        self.nursery: trio.Nursery

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[None]:
        try:
            writers = self.options.get("writers")
            extra = {"writers": int(writers)} if writers and self.peek.postgres else {}
            async with zincir.open_database(self.target, **extra) as db, trio.open_nursery() as nursery:
                self.db, self.nursery = db, nursery
                await self.started()
                yield
                nursery.cancel_scope.cancel()
        finally:
            self.peek.close()

    async def started(self) -> None:
        pass

    async def open(self) -> dict[str, Any]:
        return describe(self.db)


class InProcessWaiter(_Side):
    async def arm(self, n: int, tag: str) -> list[str]:
        ids = [await self.nursery.start(self._wait, tag) for _ in range(n)]
        await _until(lambda: self._all_waiting(ids), f"{n} waits recorded", 60)
        return ids

    async def _all_waiting(self, ids: list[str]) -> bool:
        return await self.peek.open_waits(ids) == len(ids)

    async def _wait(self, tag: str, task_status: trio.TaskStatus[str]) -> None:
        async with zincir.open_run(self.db, role=f"signals-inprocess-{tag}") as run:
            task_status.started(run.id)
            await run.wait_for_signal(WAIT_NAME, TOPIC)
            self.emit({"event": "resumed", "id": run.id, "t": time.monotonic()})
            await run.complete()


class SuspendingWorker(_Side):
    def __init__(self, target: str, options: dict[str, Any], emit: Emit) -> None:
        super().__init__(target, options, emit)
        self.concurrency = int(options.get("max_concurrency", 256))
        self.poll_interval = float(options.get("poll_interval", 1.0))
        self.suspend_after = float(options.get("suspend_after", 0.0))
        self.fill_role: str | None = None
        self.fill_n = 0
        self.completed = 0

    async def started(self) -> None:
        worker = zincir.ResumeWorker(
            self.db,
            self.handle,
            suspend_after=self.suspend_after,  # type: ignore[call-arg]
            poll_interval=self.poll_interval,
            max_concurrency=self.concurrency,
        )
        await self.nursery.start(worker.run)

    async def handle(self, run: zincir.Run) -> None:
        await run.wait_for_signal(WAIT_NAME, TOPIC)
        t = time.monotonic()
        if self.fill_role is None:
            self.emit({"event": "resumed", "id": run.id, "t": t})
        await run.complete()
        if self.fill_role is not None:
            self.completed += 1
            if self.completed == self.fill_n:
                self.emit({"event": "all_done", "t": time.monotonic()})

    async def _create(self, role: str) -> str:
        async with zincir.open_run(self.db, role=role) as run:
            return run.id  # leaving without complete() releases it: claimable at once

    async def arm(self, n: int, tag: str) -> list[str]:
        role = f"signals-suspended-{tag}"
        ids = [await self._create(role) for _ in range(n)]

        async def all_suspended() -> bool:
            waiting = await self.db.runs(status="waiting", role=role, limit=n + 1)
            return len(waiting) == n

        await _until(all_suspended, f"{n} runs suspended", 60)
        return ids

    async def fill(self, n: int, tag: str, concurrency: int = 64) -> dict[str, Any]:
        """Create n runs (``concurrency`` at a time) and wait until every one is suspended."""
        role = f"signals-throughput-{tag}"
        self.fill_role, self.fill_n, self.completed = role, n, 0
        ids: list[str] = []
        limiter = trio.CapacityLimiter(concurrency)
        start = time.monotonic()

        async def one() -> None:
            async with limiter:
                ids.append(await self._create(role))

        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)
        created = time.monotonic()

        async def all_suspended() -> bool:
            return await self.peek.runs_with_status(role, "waiting") == n

        await _until(all_suspended, f"{n} runs suspended", max(120.0, n / 20), every=0.1)
        return {
            "ids": ids,
            "create_seconds": created - start,
            "suspended_seconds": time.monotonic() - start,
        }

    async def count(self, status: str) -> int:
        assert self.fill_role is not None
        return await self.peek.runs_with_status(self.fill_role, status)


class Sender(_Side):
    async def send(self, targets: list[tuple[str, float]]) -> dict[str, float]:
        """Signal each run ``delay`` seconds after the call began, in order of the delays."""
        t0 = time.monotonic()
        sent: dict[str, float] = {}
        for i, (run_id, delay) in enumerate(sorted(targets, key=lambda t: t[1])):
            await trio.sleep(max(0.0, t0 + delay - time.monotonic()))
            sent[run_id] = time.monotonic()
            await zincir.send_signal(self.db, run_id, TOPIC, {"approved": True, "i": i})
        return sent

    async def blast(self, ids: list[str], concurrency: int) -> dict[str, Any]:
        """Signal every run at once: ``concurrency`` tasks, each sending one signal after another."""
        pending = list(reversed(ids))

        async def sender() -> None:
            while pending:
                run_id = pending.pop()
                await zincir.send_signal(self.db, run_id, TOPIC, {"approved": True})

        t_first = time.monotonic()
        async with trio.open_nursery() as nursery:
            for _ in range(min(concurrency, len(ids))):
                nursery.start_soon(sender)
        return {"t_first": t_first, "t_all_sent": time.monotonic(), "sent": len(ids)}


def child(channel: Channel, args: dict[str, Any]) -> None:
    """The child process of one of zincir's roles (``bench/harness/child.py``)."""
    serve(make(args["role"], args["target"], args["options"], channel.send), channel)
