"""``python -m bench.floor``: how close any Trio group commit can come to SQLite's batched ceiling.

Issue 14 asks for 50 runs x 100 durable steps at >= 0.7x the batched-insert ceiling (the same
rows, 100 per transaction, one plain ``execute`` loop). This measures, side by side in one
process and interleaved per repetition:

* **the ceiling**: comparison 2's own raw sqlite3 system (``bench/systems/raw.py``): the same 5,000
  rows, 100 per ``BEGIN IMMEDIATE`` ... ``COMMIT``;
* **bare group commit, execute**: 50 Trio tasks, each awaiting 100 writes. A write joins the batch
  gathered during one pass of Trio's scheduler; the first task of the batch runs it inline in one
  transaction (per write: a lease-row SELECT, the fence, and the INSERT) and reschedules the
  others. No validation, JSON, savepoints, error handling or run bookkeeping: only what a fenced,
  group-committed durable step cannot do without;
* **bare group commit, executemany**: the same, with one lease SELECT for the whole batch and one
  ``executemany`` INSERT (cheaper per row than the ceiling's own loop);
* **zincir**: ``open_run`` + ``run.step`` x 100 in 50 tasks on one ``Database``, as comparison 2 of
  ``python -m bench`` does (its time includes opening and completing the runs).

All four on the same disk, WAL, ``synchronous=FULL``. Writes ``bench/reports/floor.md`` and a chart.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import trio

from ..compare.comparisons import rotated
from ..harness.reports import REPORTS
from ..systems.raw import RawSystem
from ..systems.zincir import ZincirSystem

RUNS, STEPS = 50, 100
SERIES = ("ceiling", "bare_execute", "bare_executemany", "zincir")
LABELS = {
    "ceiling": "raw sqlite3, 100 rows per transaction (the ceiling)",
    "bare_execute": "bare Trio group commit, execute per write",
    "bare_executemany": "bare Trio group commit, executemany per batch",
    "zincir": "zincir, open_run + run.step",
}
_STEP_ROW = "INSERT INTO steps (run_id, name, result) VALUES (?, ?, ?)"


def _bare_file(path: Path) -> RawSystem:
    """The bare series' file: the ceiling's own step table, beside a table of lease rows."""
    bare = RawSystem("", str(path), {})
    bare.open()
    bare.conn.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, owner TEXT, epoch INT, expires INT)")
    return bare


def _write_batch(conn: sqlite3.Connection, batch: list[tuple[str, str, str]], many: bool) -> None:
    conn.execute("BEGIN IMMEDIATE")
    if many:
        ids = sorted({run_id for run_id, _, _ in batch})
        marks = ",".join("?" * len(ids))
        found = conn.execute(f"SELECT id, owner, epoch, expires FROM runs WHERE id IN ({marks})", ids)
        if len(found.fetchall()) != len(ids):
            raise AssertionError("a lease row is missing")
        conn.executemany(_STEP_ROW, batch)
    else:
        for run_id, name, result in batch:
            lease = conn.execute("SELECT owner, epoch, expires FROM runs WHERE id = ?", (run_id,))
            if lease.fetchone() is None:
                raise AssertionError("a lease row is missing")
            conn.execute(_STEP_ROW, (run_id, name, result))
    conn.execute("COMMIT")


async def _bare(conn: sqlite3.Connection, many: bool) -> float:
    batch: list[tuple[str, str, str]] = []
    waiting: list[trio.lowlevel.Task] = []
    gathering = False

    async def write(run_id: str, name: str, result: str) -> None:
        nonlocal gathering
        batch.append((run_id, name, result))
        if gathering:
            waiting.append(trio.lowlevel.current_task())
            await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
            return
        gathering = True
        await trio.lowlevel.cancel_shielded_checkpoint()  # the others add their writes meanwhile
        gathering = False
        mine, others = batch[:], waiting[:]
        batch.clear()
        waiting.clear()
        _write_batch(conn, mine, many)
        for task in others:
            trio.lowlevel.reschedule(task)

    async def one() -> None:
        run_id = str(uuid.uuid4())
        conn.execute("INSERT INTO runs VALUES (?, 'me', 1, 9999999999999)", (run_id,))
        for i in range(STEPS):
            await write(run_id, f"step-{i}", str(i))

    (before,) = conn.execute("SELECT count(*) FROM steps").fetchone()
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(RUNS):
            nursery.start_soon(one)
    elapsed = time.perf_counter() - start
    (after,) = conn.execute("SELECT count(*) FROM steps").fetchone()
    if after - before != RUNS * STEPS:  # every write committed, none twice
        raise AssertionError(f"the bare group commit stored {after - before} steps, not {RUNS * STEPS}")
    return RUNS * STEPS / elapsed


async def measure(workdir: Path, reps: int, progress: bool) -> dict[str, list[float]]:
    bare = _bare_file(workdir / "bare.db")
    raw = RawSystem("", str(workdir / "raw.db"), {})
    raw.open()
    system = ZincirSystem("", str(workdir / "zincir.db"), {})
    await system.open()
    results: dict[str, list[float]] = {name: [] for name in SERIES}

    async def zincir() -> float:
        return RUNS * STEPS / await system.concurrent(RUNS, STEPS)

    async def ceiling() -> float:
        return RUNS * STEPS / raw.concurrent(RUNS, STEPS)

    async def bare_execute() -> float:
        return await _bare(bare.conn, many=False)

    async def bare_executemany() -> float:
        return await _bare(bare.conn, many=True)

    legs = {
        "ceiling": ceiling,
        "bare_execute": bare_execute,
        "bare_executemany": bare_executemany,
        "zincir": zincir,
    }
    try:
        for rep in range(-1, reps):  # -1: the warm-up, not kept
            for name in rotated(list(SERIES), rep):
                value = await legs[name]()
                if rep >= 0:
                    results[name].append(value)
            if progress:
                done = "warm-up" if rep < 0 else f"repetition {rep + 1}/{reps}"
                print(f"bench.floor: {done}", file=sys.stderr, flush=True)
    finally:
        await system.close()
        bare.close()
        raw.close()
    return results


def render(results: dict[str, list[float]], meta: dict[str, Any]) -> str:
    ceiling = statistics.median(results["ceiling"])
    lines = [
        "# How close a Trio group commit can come to SQLite's batched ceiling (issue 14, target 2)",
        "",
        f"Generated by `{meta['command']}` on {meta['when']} in {meta['minutes']:.1f} min."
        " Do not edit by hand: rerun the command.",
        "",
        "![steps per second against the ceiling](floor.svg)",
        "",
        f"{RUNS} runs x {STEPS} steps (no-op), one process, WAL + synchronous=FULL, every series in one run,"
        f" interleaved (rotated order), median of {len(results['ceiling'])} after a warm-up."
        " The bare series are what any fenced, group-committed durable step must at least do under Trio:"
        " gather the writes of one scheduler pass, check each run's lease row, insert, commit, wake the"
        " waiters (see `bench/floor/`).",
        "",
        "| series | steps/s (median) | min - max | ÷ ceiling (median) |",
        "|---|---:|---:|---:|",
    ]
    for name in SERIES:
        values = results[name]
        lines.append(
            f"| {LABELS[name]} | {statistics.median(values):,.0f} | {min(values):,.0f} - {max(values):,.0f}"
            f" | {statistics.median(values) / ceiling:.2f}x |"
        )
    per_rep = {
        name: [v / c for v, c in zip(results[name], results["ceiling"], strict=True)] for name in SERIES
    }
    lines += [
        "",
        "Per repetition, ÷ that repetition's ceiling:",
        "",
        "| series | ratios |",
        "|---|---|",
        *(f"| {LABELS[n]} | {', '.join(f'{r:.2f}' for r in per_rep[n])} |" for n in SERIES[1:]),
        "",
        "**Reading it.** The target asks zincir for 0.7x the ceiling. The bare series have none of"
        " zincir's validation, JSON, savepoints, error handling or run bookkeeping, and still stay far"
        " below it: a run's next step cannot be written before its previous one committed, so one"
        " transaction holds at most one step per run (50, not the ceiling's 100), and every step costs a"
        " Trio task switch and its lease read on top of the ceiling's bare INSERT. (Handing the SQL to"
        " a writer thread instead overlaps only the part of it that runs without the GIL; zincir"
        " measured the same either way, see `bench/README.md`.)",
        "",
        f"Machine: {meta['machine']}; Python {meta['python']}; SQLite {sqlite3.sqlite_version};"
        f" databases in `{meta['dir']}`.",
    ]
    return "\n".join(lines) + "\n"


def chart(results: dict[str, list[float]]) -> str:
    ceiling = statistics.median(results["ceiling"])
    width, bar, gap, left = 720, 28, 14, 330
    height = len(SERIES) * (bar + gap) + 50
    scale = (width - left - 110) / max(statistics.median(v) for v in results.values())
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        ' font-family="sans-serif" font-size="13">',
        '<text x="10" y="20" font-weight="bold">50 runs x 100 steps: steps/s (median), ÷ ceiling</text>',
    ]
    for i, name in enumerate(SERIES):
        value = statistics.median(results[name])
        y = 36 + i * (bar + gap)
        color = {"ceiling": "#888", "zincir": "#3b7dd8"}.get(name, "#9bbbe8")
        label = LABELS[name].removesuffix(" (the ceiling)")
        parts += [
            f'<text x="{left - 8}" y="{y + 19}" text-anchor="end">{label}</text>',
            f'<rect x="{left}" y="{y}" width="{value * scale:.1f}" height="{bar}" fill="{color}"/>',
            f'<text x="{left + value * scale + 6:.1f}" y="{y + 19}">'
            f"{value:,.0f} ({value / ceiling:.2f}x)</text>",
        ]
    target = left + 0.7 * ceiling * scale
    parts += [
        f'<line x1="{target:.1f}" y1="30" x2="{target:.1f}" y2="{height - 10}"'
        ' stroke="#c33" stroke-dasharray="4 3"/>',
        f'<text x="{target + 4:.1f}" y="{height - 12}" fill="#c33">target 0.7x</text>',
        "</svg>",
    ]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions (7)")
    parser.add_argument("--dir", default=".", help="directory for the databases (default: .)")
    parser.add_argument("--out", default=str(REPORTS / "floor.md"), help="Markdown report path")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="zincir-floor-", dir=args.dir))
    started = time.perf_counter()
    try:
        results = trio.run(measure, workdir, args.reps, not args.quiet)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    meta = {
        "command": " ".join(["python -m bench.floor", *(sys.argv[1:] if argv is None else argv)]),
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "minutes": (time.perf_counter() - started) / 60,
        "machine": f"{os.cpu_count()} CPUs, {os.uname().release}",
        "python": sys.version.split()[0],
        "dir": str(workdir),
    }
    out = Path(args.out)
    out.write_text(render(results, meta), encoding="utf-8")
    out.with_suffix(".svg").write_text(chart(results), encoding="utf-8")
    out.with_suffix(".json").write_text(
        json.dumps({"results": results, "meta": meta}, indent=1), encoding="utf-8"
    )
    if not args.quiet:
        print(f"wrote {out}")
    return 0
