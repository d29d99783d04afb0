"""zincir's process for ``python -m bench.fanout``: one ResumeWorker that runs parents and children.

The process opens the database and starts ``zincir.ResumeWorker(db, handle,
max_concurrency=..., suspend_after=..., poll_interval=...)`` before anything is timed. There is
one handler for every run, which dispatches on the run's role, as an application would:

* ``fanout-child``: ``await run.complete(result=1)`` (a no-op body with a small result);
* ``fanout-parent``: spawns ``children`` child runs named ``child-0`` ... and fans them back in,
  in one of three styles (the run's config says which):

  - ``explicit``: ``run.spawn`` each child, then ``run.join`` each one in order, summing the
    results; the parent completes with ``{"children": n, "sum": total}``;
  - ``nursery``: ``nursery.spawn_soon`` each child inside ``async with run.children() as
    nursery:`` (the spawns are sent in batches, a transaction each; the exit joins the children,
    many per transaction), then the results read from ``nursery.records``; the same result;
  - ``concurrent``: ``run.spawn`` from many Trio tasks at once, then ``run.join`` likewise.

The command ``fanout(children, style)`` creates the parent (``open_run`` left without an end:
released, claimable at once) and answers when the handler has completed it. The clock runs in
the handler: from just before the first spawn of the parent's first start to the instant
``run.complete`` returned (after its COMMIT). A parent that suspended would start again from the
top (its spawns and joins replayed); ``starts`` counts its starts, and the clock keeps running.

Besides the times, the answer carries what zincir's database threads did meanwhile (counted by
wrapping each thread's batch method: measurement only, private attributes, absent if they move),
the CPU time of each kind of thread (:func:`thread_cpu`), and, with ``profile=True``, every SQL
statement sent, by kind and by the store operation that sent it (:class:`Profile`).
"""

from __future__ import annotations

import contextlib
import re
import resource
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

import trio

import zincir

from ..harness.child import Channel, serve
from ..harness.processes import cpu_seconds, proc_stat

PARENT_ROLE = "fanout-parent"
CHILD_ROLE = "fanout-child"
CONCURRENT_TASKS = 64  # the "concurrent" style: spawns (then joins) from this many Trio tasks at once


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def thread_cpu() -> dict[str, float]:
    """User + system CPU seconds so far of this process's threads, summed by role: the Trio
    thread, zincir's writers, its reader, its listener, and the rest (from /proc, Linux only;
    empty elsewhere). A thread that ended meanwhile takes its time with it."""
    out: dict[str, float] = {}
    main = threading.main_thread().native_id
    for thread in threading.enumerate():
        fields = proc_stat(f"/proc/self/task/{thread.native_id}/stat")
        if fields is not None:
            role = _thread_role(thread.name, thread.native_id == main)
            out[role] = out.get(role, 0.0) + cpu_seconds(fields)
    return out


def _thread_role(name: str, main: bool) -> str:
    if main:
        return "trio"
    for role in ("writer", "reader", "listener"):
        if name.startswith(f"zincir-{role}"):
            return role
    return "other"


# -- what the database threads do ------------------------------------------------------------------


class ThreadTally:
    """Transactions, operations and busy time of one zincir writer: the batches its database
    thread ran, and those it ran inline on the Trio thread (SQLite, while the thread was idle).

    The two never run at once; the Trio thread reads these between trials.
    """

    def __init__(self) -> None:
        self.transactions = 0
        self.operations = 0
        self.busy = 0.0

    def wrap(self, thread: Any) -> bool:
        run_batch = getattr(thread, "_run_batch", None)
        if run_batch is None:
            return False
        tally = self

        def counted(batch: list[Any]) -> Any:
            start = time.perf_counter()
            try:
                return run_batch(batch)
            finally:
                tally.busy += time.perf_counter() - start
                tally.transactions += 1
                tally.operations += len(batch)

        def counted_inline(batch: list[Any]) -> bool:
            start = time.perf_counter()
            ran: bool = run_inline_batch(batch)
            if ran:  # else the thread takes the batch, and counts it
                tally.busy += time.perf_counter() - start
                tally.transactions += 1
                tally.operations += len(batch)
            return ran

        thread._run_batch = counted
        run_inline_batch = getattr(thread, "_run_inline_batch", None)
        if run_inline_batch is not None:
            thread._run_inline_batch = counted_inline
        return True

    def snapshot(self) -> tuple[int, int, float]:
        return self.transactions, self.operations, self.busy


_TABLE = re.compile(r"\b(?:FROM|INTO|UPDATE|JOIN)\s+([a-z_]+)", re.IGNORECASE)


def statement_kind(sql: Any) -> str:
    """``INSERT agent_runs``, ``SELECT events``, ``COMMIT``, ...: the verb and the first table."""
    text = sql.decode() if isinstance(sql, bytes) else str(sql)
    words = text.split(None, 1)
    if not words:
        return "?"
    verb = words[0].upper()
    if verb in ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH"):
        table = _TABLE.search(text)
        return f"{verb} {table.group(1)}" if table else verb
    return verb


def operation_name(fn: Any) -> str:
    """The store function a database thread runs (``spawn_children``, ``claim_due``, ...)."""
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None)
    return str(name or type(fn).__name__)


class Profile:
    """Every statement zincir sends, by kind and by the store operation that sent it, and each
    operation's calls and time. Statements come from the connections' trace callbacks on SQLite
    and from wrapping zincir's ``Pipe.send`` on PostgreSQL (which also times each one);
    operations from wrapping each database thread's ``_call`` (measurement only: private names,
    so the profile is empty if they move). Statements outside any operation (BEGIN, COMMIT,
    SAVEPOINT, NOTIFY) count under ``(transaction)``."""

    OUTSIDE = "(transaction)"

    def __init__(self) -> None:
        self.statements: Counter[str] = Counter()  # kind
        self.statement_seconds: Counter[str] = Counter()
        self.by_operation: Counter[tuple[str, str]] = Counter()  # (operation, kind)
        self.calls: Counter[str] = Counter()  # operation
        self.seconds: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._current = threading.local()

    def note(self, sql: Any, seconds: float | None = None) -> None:
        kind = statement_kind(sql)
        operation = getattr(self._current, "name", None) or self.OUTSIDE
        with self._lock:
            self.statements[kind] += 1
            self.by_operation[operation, kind] += 1
            if seconds is not None:
                self.statement_seconds[kind] += seconds

    def _wrap_call(self, thread: Any) -> bool:
        original = getattr(thread, "_call", None)
        if original is None:
            return False
        profile = self

        def call(request: Any, **kwargs: Any) -> Any:
            name = operation_name(request.fn)
            profile._current.name = name
            start = time.perf_counter()
            try:
                return original(request, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                profile._current.name = None
                with profile._lock:
                    profile.calls[name] += 1
                    profile.seconds[name] += elapsed

        thread._call = call
        return True

    @contextlib.contextmanager
    def installed(self, db: zincir.Database) -> Iterator[None]:
        threads = [*db._writers, db._reader]
        wrapped = [t for t in threads if self._wrap_call(t)]
        try:
            if db.backend == "postgresql":
                from zincir._postgres._pipe import Pipe

                original = Pipe.send
                profile = self

                def send(pipe: Any, query: Any, params: Any = (), **kwargs: Any) -> Any:
                    start = time.perf_counter()
                    try:
                        return original(pipe, query, params, **kwargs)
                    finally:
                        profile.note(query, time.perf_counter() - start)

                Pipe.send = send  # type: ignore[method-assign]
                try:
                    yield
                finally:
                    Pipe.send = original  # type: ignore[method-assign]
            else:
                connections = [getattr(getattr(t, "_session", None), "_conn", None) for t in threads]
                traced = [c for c in connections if c is not None]
                for conn in traced:
                    conn.set_trace_callback(self.note)
                try:
                    yield
                finally:
                    for conn in traced:
                        conn.set_trace_callback(None)
        finally:
            for thread in wrapped:
                del thread._call  # the class's method again

    def as_json(self) -> dict[str, Any]:
        operations: dict[str, dict[str, Any]] = {}
        for (operation, kind), count in self.by_operation.items():
            entry = operations.setdefault(operation, {"calls": 0, "seconds": 0.0, "statements": {}})
            entry["statements"][kind] = count
        for operation, calls in self.calls.items():
            entry = operations.setdefault(operation, {"calls": 0, "seconds": 0.0, "statements": {}})
            entry["calls"], entry["seconds"] = calls, self.seconds[operation]
        return {
            "statements": dict(self.statements.most_common()),
            "statement_seconds": dict(self.statement_seconds),
            "operations": operations,
        }


# -- one trial --------------------------------------------------------------------------------------


@dataclass
class Trial:
    children: int
    style: str
    done: trio.Event = field(default_factory=trio.Event)
    starts: int = 0
    t_first: float | None = None
    cpu_first: float = 0.0
    ended_before: int = 0  # children that had ended when the first spawn began
    t_spawned: float = 0.0
    ended_at_spawned: int = 0  # ... and when the last spawn returned
    t_joined: float = 0.0
    t_end: float = 0.0
    cpu_end: float = 0.0
    thread_cpu_first: dict[str, float] = field(default_factory=dict)
    thread_cpu_end: dict[str, float] = field(default_factory=dict)
    result: Any = None
    threads_first: dict[str, tuple[int, int, float]] = field(default_factory=dict)
    threads_end: dict[str, tuple[int, int, float]] = field(default_factory=dict)


class ZincirSide:
    is_async = True

    def __init__(self, target: str, options: dict[str, Any]) -> None:
        self.target = target
        self.max_concurrency = int(options.get("max_concurrency", 64))
        self.suspend_after = options.get("suspend_after", 30.0)
        self.poll_interval = float(options.get("poll_interval", 1.0))
        self.writers = options.get("writers")
        self.trials: dict[str, Trial] = {}
        self.children_ended = 0
        self.tallies: dict[str, ThreadTally] = {}
        self.db: zincir.Database

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[None]:
        extra: dict[str, Any] = {}
        if self.writers and self.target.startswith(("postgresql://", "postgres://")):
            extra["writers"] = int(self.writers)
        async with zincir.open_database(self.target, **extra) as db, trio.open_nursery() as nursery:
            self.db = db
            self._tally_threads()
            worker = zincir.ResumeWorker(
                db,
                self.handle,
                max_concurrency=self.max_concurrency,
                suspend_after=self.suspend_after,
                poll_interval=self.poll_interval,
            )
            await nursery.start(worker.run)
            yield
            worker.stop()
            nursery.cancel_scope.cancel()

    def _tally_threads(self) -> None:
        threads = {f"writer {i + 1}": t for i, t in enumerate(self.db._writers)}
        threads["reader"] = self.db._reader
        for name, thread in threads.items():
            tally = ThreadTally()
            if tally.wrap(thread):
                self.tallies[name] = tally

    def _threads_now(self) -> dict[str, tuple[int, int, float]]:
        return {name: tally.snapshot() for name, tally in self.tallies.items()}

    async def open(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "version": f"zincir {version('zincir')}",
            "backend": self.db.backend,
            "worker": {
                "max_concurrency": self.max_concurrency,
                "suspend_after": self.suspend_after,
                "poll_interval": self.poll_interval,
            },
            "writer_threads": len(self.db._writers),
            "threads_counted": sorted(self.tallies),
        }
        if self.db.backend == "sqlite":
            facts["pragmas"] = await self.db._write(_writer_pragmas)
            facts["notes"] = "SQLite: WAL, synchronous=FULL (zincir's default), one writer thread"
        else:
            facts["notes"] = (
                f"PostgreSQL: psycopg 3, {len(self.db._writers)} writer connections (zincir's"
                " default unless --writers), LISTEN / NOTIFY wake-ups"
            )
        return facts

    # -- the handler ------------------------------------------------------------------------------

    async def handle(self, run: zincir.Run) -> None:
        record = (await run.state()).run
        if record.role == CHILD_ROLE:
            await run.complete(result=1)
            self.children_ended += 1
            return
        config: Any = record.config
        trial = self.trials[config["trial"]]
        trial.starts += 1
        if trial.t_first is None:
            trial.threads_first = self._threads_now()
            trial.ended_before = self.children_ended
            trial.cpu_first = process_cpu()
            trial.thread_cpu_first = thread_cpu()
            trial.t_first = time.monotonic()
        if trial.style == "nursery":
            async with run.children() as nursery:
                for i in range(trial.children):
                    nursery.spawn_soon(f"child-{i}", role=CHILD_ROLE)
                self._spawned(trial)
            records = list(nursery.records.values())
            ids = nursery.spawned
        elif trial.style == "concurrent":
            ids = await _at_once(trial.children, lambda i: run.spawn(f"child-{i}", role=CHILD_ROLE))
            self._spawned(trial)
        else:
            ids = [await run.spawn(f"child-{i}", role=CHILD_ROLE) for i in range(trial.children)]
            self._spawned(trial)
        if trial.style == "concurrent":
            records = await _at_once(len(ids), lambda i: run.join(ids[i]))
        elif trial.style == "explicit":
            records = [await run.join(child_id) for child_id in ids]
        total = sum(
            r.result for r in records if r.status is zincir.RunStatus.COMPLETED and isinstance(r.result, int)
        )
        trial.t_joined = time.monotonic()
        result = {"children": len(ids), "sum": total}
        await run.complete(result=result)
        trial.t_end = time.monotonic()
        trial.cpu_end = process_cpu()
        trial.thread_cpu_end = thread_cpu()
        trial.threads_end = self._threads_now()
        trial.result = result
        trial.done.set()

    def _spawned(self, trial: Trial) -> None:
        trial.t_spawned = time.monotonic()
        trial.ended_at_spawned = self.children_ended

    # -- commands ---------------------------------------------------------------------------------

    async def fanout(
        self, children: int, style: str, profile: bool = False, limit_s: float = 600.0
    ) -> dict[str, Any]:
        if style not in ("explicit", "nursery", "concurrent"):
            raise ValueError(f"unknown style {style!r}")
        key = uuid.uuid4().hex
        trial = self.trials[key] = Trial(children, style)
        profiler = Profile()
        with profiler.installed(self.db) if profile else contextlib.nullcontext():
            config = {"trial": key, "children": children, "style": style}
            async with zincir.open_run(self.db, role=PARENT_ROLE, config=config) as parent:
                parent_id = parent.id  # left without an end: released, and claimable at once
            with trio.fail_after(limit_s):
                await trial.done.wait()
        del self.trials[key]
        assert trial.t_first is not None
        stored = (await self.db.state(parent_id)).run
        answer: dict[str, Any] = {
            "parent": parent_id,
            "children": children,
            "style": style,
            "seconds": trial.t_end - trial.t_first,
            "spawn_seconds": trial.t_spawned - trial.t_first,
            "join_seconds": trial.t_joined - trial.t_spawned,
            "complete_seconds": trial.t_end - trial.t_joined,
            "ended_when_spawned": trial.ended_at_spawned - trial.ended_before,
            "starts": trial.starts,
            "status": stored.status.value,
            "result": stored.result,
            "cpu_seconds": trial.cpu_end - trial.cpu_first,
            "thread_cpu_seconds": {
                role: seconds - trial.thread_cpu_first.get(role, 0.0)
                for role, seconds in trial.thread_cpu_end.items()
            },
            "threads": _thread_deltas(trial.threads_first, trial.threads_end),
        }
        if profile:
            answer["profile"] = profiler.as_json()
        return answer


async def _at_once(n: int, call: Any, tasks: int = CONCURRENT_TASKS) -> list[Any]:
    """``call(i)`` for i in range(n) from ``tasks`` Trio tasks at once; the results in order of i."""
    results: list[Any] = [None] * n
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            results[i] = await call(i)

    async with trio.open_nursery() as nursery:
        for _ in range(min(tasks, n)):
            nursery.start_soon(worker)
    return results


def _thread_deltas(
    first: dict[str, tuple[int, int, float]], end: dict[str, tuple[int, int, float]]
) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, (tx1, ops1, busy1) in end.items():
        tx0, ops0, busy0 = first.get(name, (0, 0, 0.0))
        out[name] = {"transactions": tx1 - tx0, "operations": ops1 - ops0, "busy_seconds": busy1 - busy0}
    return out


def _writer_pragmas(tx: Any) -> dict[str, Any]:
    """Read on zincir's own writer connection (in one of its transactions)."""
    levels = {0: "off", 1: "normal", 2: "full", 3: "extra"}
    (mode,) = tx.one("PRAGMA journal_mode")
    (synchronous,) = tx.one("PRAGMA synchronous")
    (busy,) = tx.one("PRAGMA busy_timeout")
    return {"journal_mode": mode, "synchronous": levels.get(synchronous, synchronous), "busy_timeout": busy}


def child(channel: Channel, args: dict[str, Any]) -> None:
    """The child process hosting zincir's fan-outs (``bench/harness/child.py``)."""
    serve(ZincirSide(args["target"], args["options"]), channel)
