"""Where a zincir step's time goes: ``python -m bench.micro.profile_step [--n 2000] [--reps 5]``.

Peels ``run.step`` into layers, each measured on its own file in WAL at synchronous=FULL, the
layers interleaved and repeated (medians of µs per step):

A. raw sqlite3: BEGIN IMMEDIATE; INSERT; COMMIT (the floor: one fsync'd commit)
B. zincir's own SQL for a step (``Store.complete_step``: lease check + INSERT + read-back),
   straight through sqlite3 on the caller's thread, one transaction per step
C. ``Database._write`` of an operation that does nothing: as a lone write runs, inline on the
   Trio thread (one pass of Trio's scheduler, then an empty BEGIN IMMEDIATE/COMMIT)
D. ``Database._write(Store.complete_step, ...)``: B through zincir's write path
E. ``run.step(name, noop)``: D plus ``Run.step``'s own Python (validation, JSON, bookkeeping)

E - D is Run.step's Python, D - B the hand-off, B - A the schema and its SQL.

Then the legs of E, stamped (``bench/micro/legs.py``): inline, until the request is handed on, the
scheduler pass, BEGIN, the SQL, COMMIT, until ``run.step`` returns; and the same steps with the
database's writes sent to the writer thread (as when it is busy), every crossing between the
threads stamped; side by side with the raw loop's BEGIN, INSERT and COMMIT and two bare
ping-pongs (two plain threads; a Trio task and a thread, as zincir's threads talk). Last, a
cProfile of E (the Trio thread only) sorted by own time.

Progress goes to stderr; the tables to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import platform
import pstats
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import trio

import zincir
from zincir._database import storage, wall_clock_ms
from zincir._sqlite._connection import Tx
from zincir._store import Store

from . import legs as _legs


def raw_conn(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def layer_a(conn: sqlite3.Connection, n: int) -> float:
    run = str(uuid.uuid4())
    start = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO steps (run_id, name, result) VALUES (?, ?, ?)", (run, f"step-{i}", str(i)))
        conn.execute("COMMIT")
    return time.perf_counter() - start


def layer_b(conn: sqlite3.Connection, n: int) -> float:
    conn.execute("BEGIN IMMEDIATE")
    lease = Store.create_run(
        Tx(conn, wall_clock_ms()), str(uuid.uuid4()), None, "bench", "", "{}", "profile", 3_600_000
    )
    conn.execute("COMMIT")
    start = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        now = wall_clock_ms()
        Store.complete_step(Tx(conn, now), lease, f"step-{i}", str(i), now)
        conn.execute("COMMIT")
    return time.perf_counter() - start


def _nothing(tx: Tx) -> None:
    return None


async def layer_c(db: zincir.Database, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await db._write(_nothing)
    return time.perf_counter() - start


async def layer_d(db: zincir.Database, n: int) -> float:
    async with zincir.open_run(db, lease_ttl=3600) as run:
        lease = run._lease
        start = time.perf_counter()
        for i in range(n):
            now = db.clock()
            await db._write(Store.complete_step, lease, f"step-{i}", str(i), now)
        seconds = time.perf_counter() - start
        await run.complete()
    return seconds


async def noop(i: int) -> int:
    return i


async def layer_e(db: zincir.Database, n: int) -> float:
    async with zincir.open_run(db, lease_ttl=3600) as run:
        start = time.perf_counter()
        for i in range(n):
            await run.step(f"step-{i}", noop, i)
        seconds = time.perf_counter() - start
        await run.complete()
    return seconds


LABELS = {
    "A": "raw sqlite3: BEGIN IMMEDIATE; INSERT; COMMIT",
    "B": "zincir's step SQL (Store.complete_step) via sqlite3",
    "C": "Database._write of a no-op operation (an empty transaction, inline)",
    "D": "Database._write(Store.complete_step)",
    "E": "run.step(name, noop)",
}


Legs = dict[str, dict[str, dict[str, float]]]  # case -> leg -> mean / median, µs


def progress(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:5.1f}s] {message}", file=sys.stderr, flush=True)


STARTED = time.perf_counter()


async def measure(workdir: str, n: int, reps: int) -> tuple[dict[str, list[float]], list[Legs]]:
    raw = raw_conn(os.path.join(workdir, "a.sqlite"))
    raw.execute("CREATE TABLE steps (run_id TEXT, name TEXT, result TEXT, PRIMARY KEY (run_id, name))")
    path_b = os.path.join(workdir, "b.db")
    async with zincir.open_database(path_b):  # create and migrate
        pass
    schema = raw_conn(path_b)
    schema.execute("PRAGMA foreign_keys = ON")
    out: dict[str, list[float]] = {k: [] for k in LABELS}
    legs: list[Legs] = []
    stamps = _legs.Stamps()
    timed = await _legs.open_timed_database(os.path.join(workdir, "legs.db"), stamps)
    try:
        async with zincir.open_database(os.path.join(workdir, "z.db"), synchronous="full") as db:
            layers: dict[str, Callable[[], Awaitable[float]]] = {
                "C": lambda: layer_c(db, n),
                "D": lambda: layer_d(db, n),
                "E": lambda: layer_e(db, n),
            }
            for rep in range(reps + 1):  # the first round warms up
                progress(f"layers A-E, {'warm-up' if not rep else f'rep {rep}/{reps}'}")
                times = {"A": layer_a(raw, n), "B": layer_b(schema, n)}
                for key, fn in layers.items():
                    times[key] = await fn()
                progress(f"legs, {'warm-up' if not rep else f'rep {rep}/{reps}'}")
                these = {
                    "raw": _legs.summarize(_legs.raw_steps(raw, n)),
                    "zincir": _legs.summarize(await _legs.zincir_steps(timed, stamps, n, inline=True)),
                    "zincir_thread": _legs.summarize(
                        await _legs.zincir_steps(timed, stamps, n, inline=False)
                    ),
                    "threads": _legs.summarize(_legs.thread_ping_pong(n)),
                    "trio": _legs.summarize(await _legs.trio_ping_pong(n)),
                }
                if rep:
                    for key, seconds in times.items():
                        out[key].append(seconds / n * 1e6)
                    legs.append(these)
            progress("cProfile of layer E")
            profiler = cProfile.Profile()
            profiler.enable()
            await layer_e(db, n)
            profiler.disable()
    finally:
        await storage(timed).close()
    raw.close()
    schema.close()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(18)
    print_profile(stream.getvalue())
    return out, legs


def median_legs(reps: list[Legs]) -> Legs:
    """Per case and leg, the median over the repetitions of each repetition's mean and median."""
    return {
        case: {
            leg: {stat: statistics.median(r[case][leg][stat] for r in reps) for stat in ("mean", "median")}
            for leg in reps[0][case]
        }
        for case in reps[0]
    }


def print_legs(legs: Legs, n: int, reps: int, unstamped: float) -> None:
    print(
        f"Legs of one sequential step, µs: median over {reps} reps of each rep's mean (median) of {n} steps"
    )
    cases = (
        ("zincir run.step (its write inline, as a lone write runs)", "zincir", _legs.INLINE_LEGS),
        ("zincir run.step, its write sent to the writer thread", "zincir_thread", _legs.STEP_LEGS),
        ("raw sqlite3, one commit per step", "raw", _legs.RAW_LEGS),
        ("bare ping-pong, two plain threads", "threads", _legs.THREADS_LEGS),
        ("bare ping-pong, Trio task <-> thread", "trio", _legs.TRIO_LEGS),
    )
    for title, case, labels in cases:
        total = sum(legs[case][leg]["mean"] for leg in labels)
        print(f"  {title}: {total:.1f} in all")
        for leg, label in labels.items():
            value = legs[case][leg]
            print(f"    {label:<60} {value['mean']:8.1f}  ({value['median']:.1f})")
    z, zt, r = legs["zincir"], legs["zincir_thread"], legs["raw"]
    stamped = sum(z[leg]["mean"] for leg in _legs.INLINE_LEGS)
    print(f"  (the stamps and their wrappers cost: {stamped:.1f} stamped vs {unstamped:.1f} for layer E)")
    hand_offs = zt["pickup"]["mean"] + zt["wake"]["mean"]
    print(
        f"  the writer thread's two wake-ups (legs 2 + 7): {hand_offs:.1f}; the Trio ping-pong's:"
        f" {legs['trio']['there']['mean'] + legs['trio']['wake']['mean']:.1f}; inline, the"
        f" scheduler pass instead: {z['gather']['mean']:.1f}"
    )
    print(
        f"  zincir's COMMIT / raw COMMIT: {z['commit']['mean'] / r['commit']['mean']:.2f};"
        f" zincir's SQL / raw INSERT: {z['sql']['mean'] / r['sql']['mean']:.2f}"
    )
    print()


def print_profile(text: str) -> None:
    lines = [line for line in text.splitlines() if line.strip()]
    print("cProfile of layer E on the Trio thread (own time; the writer thread is not seen):")
    for line in lines[2:24]:
        print("   ", line[:150])
    print()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.micro.profile_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--n", type=int, default=2000, help="steps per layer and repetition")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default=".", help="where to create the temporary files")
    parser.add_argument("--json", help="also write the medians (µs per step) to this file")
    parser.add_argument("--markdown", help="also write what is printed as a Markdown report to this file")
    args = parser.parse_args(argv)
    if args.markdown:
        printed = io.StringIO()
        with contextlib.redirect_stdout(Tee(sys.stdout, printed)):
            run(args)
        write_markdown(args.markdown, printed.getvalue(), argv)
    else:
        run(args)


class Tee(io.TextIOBase):
    def __init__(self, *streams: Any) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)


def write_markdown(path: str, printed: str, argv: list[str] | None) -> None:
    args = " ".join(sys.argv[1:] if argv is None else argv)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with open(path, "w") as f:
        f.write("# Where a sequential zincir step's time goes, leg by leg (SQLite)\n\n")
        f.write(f"Generated by `python -m bench.micro.profile_step {args}` on {when}")
        f.write(
            f" (Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs)."
        )
        f.write(
            " Do not edit by hand: rerun the command. How each leg is stamped: `bench/micro/legs.py`.\n\n"
        )
        f.write("```\n" + printed.strip() + "\n```\n")


def run(args: argparse.Namespace) -> None:
    workdir = tempfile.mkdtemp(prefix="zincir-profile-", dir=args.dir)
    try:
        res, reps = trio.run(measure, workdir, args.n, args.reps)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    legs = median_legs(reps)
    print_legs(legs, args.n, args.reps, med["E"])
    print(f"µs per step, median of {args.reps} x {args.n} steps (WAL, synchronous=FULL):")
    for key, label in LABELS.items():
        print(f"  {key}. {label:<58} {med[key]:8.1f}")
    print()
    print(f"  B - A  schema + SQL of a step          {med['B'] - med['A']:8.1f}")
    print(f"  D - B  hand-off (inline: a scheduler pass) {med['D'] - med['B']:8.1f}")
    print(f"  E - D  Run.step's Python                {med['E'] - med['D']:8.1f}")
    print(f"  E / A  a step over one raw commit       {med['E'] / med['A']:8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"n": args.n, "reps": args.reps, "labels": LABELS, "us_per_step": med, "legs": legs},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
