"""``python -m bench.micro.profile_pg``: where a zincir step's time goes on PostgreSQL.

On a throwaway server (``bench/harness/server.py``, fsync=on, data in ``--dir``) or ``--url``:

* floors with plain psycopg on one connection: a ``SELECT 1`` round trip; an autocommit
  ``INSERT`` (one round trip + one WAL flush); ``BEGIN`` + ``INSERT`` + ``COMMIT`` (what a step
  needs at least with explicit transactions); each's wall time and the server's CPU;
* zincir's sequential steps, 50 concurrent runs and one ResumeWorker completing due runs,
  with every statement zincir sends (``Pipe.send``, its connections' pipeline) counted and timed by
  statement kind (patched in this process only): statements per step, time inside them (waiting for the
  server) against the wall time, the batch sizes of the group commit (steps per COMMIT), and the
  server's CPU per step (its processes' in ``/proc``, as ``bench.postgres`` reads it; a server on
  another machine has none to read).

Prints a table per workload, and writes the figures as JSON with ``--json PATH``.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import trio

import zincir
from zincir._postgres._pipe import Pipe

from ..harness.server import postgres_server, postmaster_pid, scratch_database, server_cpu
from ..harness.study import scratch


class Counter:
    """Counts and times psycopg executes by the statement's first words, per thread, and reads
    the server's CPU from one :meth:`reset` to :meth:`stop`."""

    def __init__(self, postmaster: int | None = None) -> None:
        self.lock = threading.Lock()
        self.calls: collections.Counter[str] = collections.Counter()
        self.seconds: collections.Counter[str] = collections.Counter()
        self.original = Pipe.send
        self.postmaster = postmaster
        self.server_cpu_at_reset: float | None = None
        self.server_cpu_s: float | None = None  # from reset to stop

    def stop(self) -> None:
        """The end of the timed part: read while its connections are open (a backend that
        exits takes its CPU out of the sum)."""
        if self.postmaster is not None and self.server_cpu_at_reset is not None:
            self.server_cpu_s = server_cpu(self.postmaster) - self.server_cpu_at_reset

    def kind(self, sql: Any) -> str:
        text = sql.decode() if isinstance(sql, bytes) else str(sql)
        words = text.split()
        if not words:
            return "?"
        head = words[0].upper()
        if head in ("SELECT", "UPDATE", "INSERT", "DELETE"):
            table = next((w for w in words[1:] if w.lower() in _TABLES), "")
            return f"{head} {table}".strip() + (" FOR UPDATE" if "FOR UPDATE" in text.upper() else "")
        return head

    @contextmanager
    def installed(self) -> Iterator[None]:
        counter = self

        def execute(pipe: Any, query: Any, params: Any = (), **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return counter.original(pipe, query, params, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                key = counter.kind(query)
                with counter.lock:
                    counter.calls[key] += 1
                    counter.seconds[key] += elapsed

        Pipe.send = execute  # type: ignore[method-assign]
        try:
            yield
        finally:
            Pipe.send = self.original  # type: ignore[method-assign]

    def reset(self) -> None:
        with self.lock:
            self.calls.clear()
            self.seconds.clear()
        self.server_cpu_at_reset = None if self.postmaster is None else server_cpu(self.postmaster)
        self.server_cpu_s = None


_TABLES = {"agent_runs", "events", "steps", "tool_intents", "checkpoints", "timers", "bench"}


def floors(url: str, n: int, postmaster: int | None) -> dict[str, float]:
    """Each floor's wall time per operation (``<name>_us``) and, with the server's processes to
    read, the server's CPU per operation (``<name>_server_cpu_us``): what one statement, and one
    commit of one row, cost the server before zincir adds anything."""
    out: dict[str, float] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench (id BIGINT PRIMARY KEY, payload TEXT)")
        ids = itertools.count()

        def select_1() -> None:
            conn.execute("SELECT 1")

        def autocommit_insert() -> None:
            conn.execute("INSERT INTO bench VALUES (%s, 'x')", (next(ids),))

        def begin_insert_commit() -> None:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO bench VALUES (%s, 'x')", (next(ids),))
            conn.execute("COMMIT")

        for name, operation in [
            ("select_1_round_trip", select_1),
            ("autocommit_insert", autocommit_insert),
            ("begin_insert_commit", begin_insert_commit),
        ]:
            cpu_before = None if postmaster is None else server_cpu(postmaster)
            start = time.perf_counter()
            for _ in range(n):
                operation()
            out[f"{name}_us"] = (time.perf_counter() - start) / n * 1e6
            if postmaster is not None and cpu_before is not None:
                out[f"{name}_server_cpu_us"] = (server_cpu(postmaster) - cpu_before) / n * 1e6
        conn.execute("DROP TABLE bench")
    return out


async def noop(i: int) -> int:
    return i


async def sequential(url: str, n: int, counter: Counter) -> dict[str, Any]:
    async with zincir.open_database(url) as db:
        async with zincir.open_run(db, role="warm") as run:
            for i in range(50):
                await run.step(f"s{i}", noop, i)
            await run.complete()
        counter.reset()
        start = time.perf_counter()
        async with zincir.open_run(db, role="profile-seq") as run:
            for i in range(n):
                await run.step(f"s{i}", noop, i)
            await run.complete()
        wall = time.perf_counter() - start
        counter.stop()
    return summary(counter, wall, n)


async def concurrent(url: str, runs: int, steps: int, counter: Counter) -> dict[str, Any]:
    async with zincir.open_database(url) as db:

        async def one() -> None:
            async with zincir.open_run(db, role="profile-conc") as run:
                for i in range(steps):
                    await run.step(f"s{i}", noop, i)
                await run.complete()

        async with trio.open_nursery() as nursery:  # a warm-up: every connection opened
            for _ in range(runs):
                nursery.start_soon(one)
        counter.reset()
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(runs):
                nursery.start_soon(one)
        wall = time.perf_counter() - start
        counter.stop()
    return summary(counter, wall, runs * steps)


async def worker(url: str, runs: int, concurrency: int, counter: Counter) -> dict[str, Any]:
    """One ResumeWorker claiming and completing ``runs`` due runs (as in comparison 4)."""
    async with zincir.open_database(url) as db:
        limiter = trio.CapacityLimiter(100)

        async def seed_one() -> None:
            async with limiter, zincir.open_run(db, role="profile-due"):
                pass

        async with trio.open_nursery() as nursery:
            for _ in range(runs):
                nursery.start_soon(seed_one)
        done = trio.Event()
        handled = 0

        async def handler(run: zincir.Run) -> None:
            nonlocal handled
            await run.complete()
            handled += 1
            if handled == runs:
                done.set()

        resume = zincir.ResumeWorker(db, handler, max_concurrency=concurrency, poll_interval=0.2)
        counter.reset()
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            await nursery.start(resume.run)
            await done.wait()
            wall = time.perf_counter() - start
            counter.stop()
            resume.stop()
    return summary(counter, wall, runs)


def summary(counter: Counter, wall: float, steps: int) -> dict[str, Any]:
    with counter.lock:
        calls, seconds = dict(counter.calls), dict(counter.seconds)
    commits = calls.get("COMMIT", 0)
    server = counter.server_cpu_s
    return {
        "server_cpu_us_per_step": None if server is None else server / steps * 1e6,
        "wall_s": wall,
        "steps": steps,
        "us_per_step": wall / steps * 1e6,
        "steps_per_s": steps / wall,
        "statements_per_step": sum(calls.values()) / steps,
        "commits": commits,
        "steps_per_commit": steps / commits if commits else float("nan"),
        "seconds_in_execute": sum(seconds.values()),
        "by_kind": {
            k: {"calls": calls[k], "seconds": seconds[k], "us_per_call": seconds[k] / calls[k] * 1e6}
            for k in sorted(calls, key=lambda k: -seconds[k])
        },
    }


def show(title: str, s: dict[str, Any]) -> None:
    print(
        f"\n{title}: {s['steps']:,} steps in {s['wall_s']:.2f} s: {s['us_per_step']:,.0f} us/step,"
        f" {s['steps_per_s']:,.0f} steps/s"
    )
    print(
        f"  statements per step {s['statements_per_step']:.2f}; {s['commits']:,} COMMITs,"
        f" {s['steps_per_commit']:.1f} steps per COMMIT; time inside execute (all threads)"
        f" {s['seconds_in_execute']:.2f} s = {s['seconds_in_execute'] / s['wall_s'] * 100:.0f}% of the wall"
    )
    if s["server_cpu_us_per_step"] is not None:
        print(f"  server CPU per step {s['server_cpu_us_per_step']:,.0f} us")
    print(f"  {'statement':<32} {'calls':>8} {'total s':>8} {'us/call':>8}")
    for kind, k in s["by_kind"].items():
        print(f"  {kind:<32} {k['calls']:>8,} {k['seconds']:>8.2f} {k['us_per_call']:>8.0f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.profile_pg", description=__doc__)
    parser.add_argument("--url", help="a PostgreSQL superuser URL (default: a throwaway server)")
    parser.add_argument("--dir", default=".", help="where the throwaway server's data goes")
    parser.add_argument("--n", type=int, default=1000, help="sequential steps")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--worker-runs", type=int, default=2000, help="due runs for the worker")
    parser.add_argument("--worker-concurrency", type=int, default=32)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    with (
        scratch(args.dir, "zincir-bench-pg-profile-", keep=False, log=lambda _: None) as workdir,
        postgres_server(args.url, workdir, lambda _: None) as admin,
        scratch_database(admin, f"zincir_profile_{uuid.uuid4().hex[:8]}") as url,
    ):
        out: dict[str, Any] = {"floors": floors(url, args.n, postmaster_pid(url))}
        print("floors (plain psycopg, one connection):")
        for k, v in out["floors"].items():
            print(f"  {k:<36} {v:8,.0f}")
        counter = Counter(postmaster_pid(url))
        with counter.installed():
            out["sequential"] = trio.run(sequential, url, args.n, counter)
            show("zincir, one run of sequential steps", out["sequential"])
            out["concurrent"] = trio.run(concurrent, url, args.runs, args.steps, counter)
            show(f"zincir, {args.runs} runs x {args.steps} steps at once", out["concurrent"])
            out["worker"] = trio.run(worker, url, args.worker_runs, args.worker_concurrency, counter)
            show(
                f"zincir, one ResumeWorker(max_concurrency={args.worker_concurrency}) claiming"
                f" and completing {args.worker_runs:,} due runs ('steps' = runs)",
                out["worker"],
            )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
