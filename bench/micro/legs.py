"""Per-leg timing of one sequential ``run.step`` on SQLite, for ``python -m bench.micro.profile_step``.

A step's write runs inline on the Trio thread while the writer thread is idle (as in a
sequential loop), or on the writer thread, crossing two threads and back. Each crossing is
stamped with ``time.perf_counter_ns()`` (one clock for every thread of a process) by thin
wrappers around the real objects, so the code measured is zincir's own, not a copy of it:

- the writer's ``run_inline`` (the request handed on, inline),
- the writer thread's request queue (``put`` on the Trio thread, ``get`` on the writer),
- its session (``BEGIN IMMEDIATE``, tried inline or waited for on the thread, and ``COMMIT``),
- the store (the operation's SQL),
- the Trio token (the writer's ``run_sync_soon`` reply, and when Trio runs it).

The legs of an inline step, in order (they add up to the whole step):

1. ``Run.step`` until its request is handed on (validation, the no-op, JSON, ``_as_owner``)
2. one pass of Trio's scheduler (every runnable task may add its write to the transaction)
3. ``BEGIN IMMEDIATE``
4. the operation's SQL (the lease check, the INSERT)
5. ``COMMIT`` (the fsync)
6. after the COMMIT until ``run.step`` has returned

And of a step through the writer thread (the database's writes sent there for the case):

1. ``Run.step`` until its request is queued
2. queued -> the writer has it (the first thread wake-up)
3. ``BEGIN IMMEDIATE``, 4. the SQL, 5. ``COMMIT``
6. after the COMMIT until the reply is handed to Trio (``run_sync_soon``)
7. reply -> Trio runs the wake callback (the second thread wake-up)
8. wake callback -> ``run.step`` has returned (rescheduling, the task's resumption, decoding)

Beside them, the same legs for the raw one-commit-per-step loop, and two bare ping-pongs
(no SQL at all): between two plain threads over ``SimpleQueue``, and between a Trio task and a
thread the way zincir's threads talk (``SimpleQueue`` there, ``run_sync_soon`` back).
"""

from __future__ import annotations

import queue
import sqlite3
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import outcome
import trio

import zincir
from zincir import _database, _sqlite
from zincir._payloads import Payloads
from zincir._store import Store
from zincir._threads import DatabaseThread

clock = time.perf_counter_ns

INLINE_LEGS = {
    "run_step_python": "1. run.step until its request is handed on",
    "gather": "2. one pass of Trio's scheduler (gathering a batch)",
    "begin": "3. BEGIN IMMEDIATE",
    "sql": "4. the step's SQL (lease check + INSERT)",
    "commit": "5. COMMIT (fsync)",
    "resume": "6. after COMMIT -> run.step returned",
}
STEP_LEGS = {
    "run_step_python": "1. run.step until its request is queued",
    "pickup": "2. queued -> the writer thread has it (wake-up 1)",
    "begin": "3. BEGIN IMMEDIATE",
    "sql": "4. the step's SQL (lease check + INSERT)",
    "commit": "5. COMMIT (fsync)",
    "to_reply": "6. after COMMIT -> reply handed to Trio (run_sync_soon)",
    "wake": "7. reply -> Trio runs the wake callback (wake-up 2)",
    "resume": "8. wake callback -> run.step returned",
}
RAW_LEGS = {
    "begin": "BEGIN IMMEDIATE",
    "sql": "INSERT",
    "commit": "COMMIT (fsync)",
    "python": "the loop's own Python",
}
THREADS_LEGS = {
    "there": "put -> the other thread has it",
    "back": "reply -> the first thread has it",
}
TRIO_LEGS = {
    "there": "put -> the thread has it (wake-up 1)",
    "wake": "run_sync_soon -> Trio runs the callback (wake-up 2)",
    "resume": "callback -> the task runs again",
}


class Stamps:
    """The instants of the step in flight (one at a time: the loop is sequential)."""

    def __init__(self) -> None:
        self.now: dict[str, int] = {}
        self.active = False

    def mark(self, what: str) -> None:
        if self.active:
            self.now[what] = clock()


class TimedQueue(queue.SimpleQueue[Any]):
    def __init__(self, stamps: Stamps) -> None:
        self.stamps = stamps

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        self.stamps.mark("queued")
        super().put(item, block, timeout)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        item = super().get(block, timeout)
        self.stamps.mark("picked")
        return item


class TimedSession:
    """Delegates to the real session, stamping BEGIN and COMMIT."""

    def __init__(self, session: Any, stamps: Stamps) -> None:
        self._session = session
        self._stamps = stamps

    def begin(self) -> None:
        self._session.begin()
        self._stamps.mark("begun")

    def try_begin(self) -> bool:
        self._stamps.mark("beginning")
        begun: bool = self._session.try_begin()
        self._stamps.mark("begun")
        return begun

    def commit(self, wakes: Any = None) -> None:
        self._stamps.mark("committing")
        self._session.commit(wakes)
        self._stamps.mark("committed")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class TimedStore:
    """The store, with every operation stamped where its SQL starts and ends."""

    def __init__(self, store: Store, stamps: Stamps) -> None:
        self._store = store
        self._stamps = stamps

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._store, name)
        if not callable(fn):
            return fn
        stamps = self._stamps

        def timed(*args: Any) -> Any:
            stamps.mark("sql_start")
            try:
                return fn(*args)
            finally:
                stamps.mark("sql_end")

        timed.__name__ = name
        return timed


class TimedToken:
    """A TrioToken whose ``run_sync_soon`` stamps the reply and the moment Trio runs it."""

    def __init__(self, token: trio.lowlevel.TrioToken, stamps: Stamps) -> None:
        self._token = token
        self._stamps = stamps

    def run_sync_soon(self, fn: Callable[..., object], *args: object, idempotent: bool = False) -> None:
        stamps = self._stamps

        def woken() -> None:
            stamps.mark("woken")
            fn(*args)

        stamps.mark("replied")
        self._token.run_sync_soon(woken, idempotent=idempotent)


@contextmanager
def _timed_queues(stamps: Stamps) -> Iterator[None]:
    """DatabaseThread makes its queue as ``queue.SimpleQueue()``: while its threads start, make
    that a TimedQueue (they keep it; nothing else in zincir is affected)."""
    import zincir._threads as threads

    real = threads.queue
    shim = ModuleType("queue")
    shim.SimpleQueue = lambda: TimedQueue(stamps)  # type: ignore[attr-defined]
    shim.Empty = queue.Empty  # type: ignore[attr-defined]
    threads.queue = shim  # type: ignore[assignment]
    try:
        yield
    finally:
        threads.queue = real


async def open_timed_database(path: str, stamps: Stamps) -> zincir.Database:
    """A Database on ``path`` (WAL, synchronous=FULL) with every crossing stamped."""
    token = TimedToken(trio.lowlevel.current_trio_token(), stamps)
    with _timed_queues(stamps):
        backend = await _sqlite.open_backend(
            path,
            token=token,  # type: ignore[arg-type]
            clock=None,
            synchronous="full",
            payloads=Payloads(),  # open_database's default: the content store at its threshold
        )
    writer: DatabaseThread = backend.writers[0]
    writer._session = TimedSession(writer._session, stamps)  # type: ignore[assignment]
    run_inline = writer.run_inline

    async def handed_on(request: Any) -> Any:
        stamps.mark("submitted")
        return await run_inline(request)

    writer.run_inline = handed_on  # type: ignore[method-assign]
    backend.store = TimedStore(backend.store, stamps)  # type: ignore[arg-type, assignment]
    return _database.Database._create(backend, _database.DEFAULT_MAX_PAYLOAD_BYTES)


async def noop(i: int) -> int:
    return i


def step_legs(s: dict[str, int], start: int, end: int) -> dict[str, float]:
    return {
        "run_step_python": s["queued"] - start,
        "pickup": s["picked"] - s["queued"],
        "begin": s["begun"] - s["picked"],
        "sql": s["sql_end"] - s["begun"],
        "commit": s["committed"] - s["sql_end"],
        "to_reply": s["replied"] - s["committed"],
        "wake": s["woken"] - s["replied"],
        "resume": end - s["woken"],
    }


def inline_step_legs(s: dict[str, int], start: int, end: int) -> dict[str, float]:
    return {
        "run_step_python": s["submitted"] - start,
        "gather": s["beginning"] - s["submitted"],
        "begin": s["begun"] - s["beginning"],
        "sql": s["sql_end"] - s["begun"],
        "commit": s["committed"] - s["sql_end"],
        "resume": end - s["committed"],
    }


async def zincir_steps(
    db: zincir.Database, stamps: Stamps, n: int, *, inline: bool
) -> list[dict[str, float]]:
    """``n`` sequential steps, their writes inline (as zincir runs a lone write) or all sent to
    the writer thread (as when it is busy). Inline, a step whose write went to the thread after
    all (slow commits on a busy machine tip the average that decides) is left out."""
    legs, first = (inline_step_legs, "submitted") if inline else (step_legs, "queued")
    writer = db._writers[0]
    writer._inline = inline
    out = []
    async with zincir.open_run(db, lease_ttl=3600) as run:
        await run.step("warm", noop, -1)  # the one read of completed step names
        for i in range(n):
            stamps.now = {}
            stamps.active = True
            start = clock()
            await run.step(f"step-{i}", noop, i)
            end = clock()
            stamps.active = False
            if first in stamps.now:
                out.append(legs(stamps.now, start, end))
        await run.complete()
    writer._inline = True
    if len(out) < n / 2:
        raise RuntimeError(f"only {len(out)} of {n} steps took the path measured: the disk is too slow")
    return out


def raw_steps(conn: sqlite3.Connection, n: int) -> list[dict[str, float]]:
    run = str(uuid.uuid4())
    out = []
    last = clock()
    for i in range(n):
        t0 = clock()
        conn.execute("BEGIN IMMEDIATE")
        t1 = clock()
        conn.execute("INSERT INTO steps (run_id, name, result) VALUES (?, ?, ?)", (run, f"step-{i}", str(i)))
        t2 = clock()
        conn.execute("COMMIT")
        t3 = clock()
        out.append({"begin": t1 - t0, "sql": t2 - t1, "commit": t3 - t2, "python": t0 - last})
        last = t3
    return out


def thread_ping_pong(n: int) -> list[dict[str, float]]:
    """Two plain threads, a SimpleQueue each way: the floor of two thread wake-ups."""
    there: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    back: queue.SimpleQueue[int] = queue.SimpleQueue()

    def echo() -> None:
        while (sent := there.get()) is not None:
            back.put(clock() - sent)  # how long the trip there took, and the start of the trip back

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    out = []
    for _ in range(n):
        start = clock()
        there.put(start)
        trip_there = back.get()
        out.append({"there": trip_there, "back": clock() - start - trip_there})
    there.put(None)
    thread.join()
    return out


async def trio_ping_pong(n: int) -> list[dict[str, float]]:
    """A Trio task and a thread, as zincir's threads talk: SimpleQueue there, run_sync_soon back."""
    token = trio.lowlevel.current_trio_token()
    inbox: queue.SimpleQueue[tuple[trio.lowlevel.Task, dict[str, int]] | None] = queue.SimpleQueue()

    def serve() -> None:
        while (item := inbox.get()) is not None:
            task, s = item
            s["picked"] = clock()

            def wake(task: trio.lowlevel.Task = task, s: dict[str, int] = s) -> None:
                s["woken"] = clock()
                trio.lowlevel.reschedule(task, outcome.Value(None))

            s["replied"] = clock()
            token.run_sync_soon(wake)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    out = []
    for _ in range(n):
        s: dict[str, int] = {"queued": clock()}
        inbox.put((trio.lowlevel.current_task(), s))
        await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
        end = clock()
        out.append(
            {
                "there": s["picked"] - s["queued"],
                "wake": s["woken"] - s["replied"],
                "resume": end - s["woken"],
            }
        )
    inbox.put(None)
    thread.join()
    return out


def summarize(samples: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per leg: the mean (the means add up to the whole) and the median, in µs."""
    legs = samples[0].keys()
    return {
        leg: {
            "mean": statistics.fmean(s[leg] for s in samples) / 1000,
            "median": statistics.median(s[leg] for s in samples) / 1000,
        }
        for leg in legs
    }
