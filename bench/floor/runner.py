"""``python -m bench.floor``: how close any Trio group commit can come to SQLite's batched ceiling.

Issue 14 asks for 50 runs x 100 durable steps at >= 0.7x the batched-insert ceiling (the same
rows, 100 per transaction, one plain ``execute`` loop). This measures, side by side in one
process and interleaved per repetition:

* **the ceiling**: comparison 2's own raw sqlite3 system (``bench/systems/raw.py``): the same 5,000
  rows, 100 per ``BEGIN IMMEDIATE`` ... ``COMMIT``;
* **bare group commit, execute**: 50 Trio tasks, each awaiting 100 writes. A write joins the batch
  gathered during one pass of Trio's scheduler; the first task of the batch runs it inline in one
  transaction (per write: a lease-row SELECT, the fence, and the INSERT) and reschedules the
  others. No validation, JSON, error handling or run bookkeeping: only what a fenced,
  group-committed durable step cannot do without;
* **bare group commit, executemany**: the same, with one lease SELECT for the whole batch and one
  ``executemany`` INSERT (cheaper per row than the ceiling's own loop);
* **zincir**: ``open_run`` + ``run.step`` x 100 in 50 tasks on one ``Database``, as comparison 2 of
  ``python -m bench`` does (its time includes opening and completing the runs).

All four on the same disk, WAL, ``synchronous=FULL``. Writes ``bench/reports/floor.md`` and a chart.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
import uuid
from pathlib import Path

import trio

from ..harness import study
from ..harness.machine import now
from ..harness.reports import write_outputs
from ..systems.raw import RawSystem
from ..systems.zincir import ZincirSystem
from .report import RUNS, SERIES, STEPS, chart, render

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


async def measure(workdir: Path, reps: int, log: study.Log) -> dict[str, list[float]]:
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
            for name in study.rotated(list(SERIES), rep):
                value = await legs[name]()
                if rep >= 0:
                    results[name].append(value)
            log("warm-up" if rep < 0 else f"repetition {rep + 1}/{reps}")
    finally:
        await system.close()
        bare.close()
        raw.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = study.parser("python -m bench.floor", __doc__.split("\n")[0], "floor.md", quick=False)
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions (7)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if study.redraw(args, render, chart):
        return 0
    log = study.progress(args.quiet)
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    with study.scratch(args.dir, "zincir-floor-", keep=args.keep, log=log) as workdir:
        results = trio.run(measure, workdir, args.reps, log)
    meta = {
        "command": " ".join(["python -m bench.floor", *(sys.argv[1:] if argv is None else argv)]),
        "when": now(),
        "minutes": (time.perf_counter() - started) / 60,
        "machine": f"{os.cpu_count()} CPUs, {os.uname().release}",
        "load": [load_before, os.getloadavg()[0]],  # the 1-minute load average, before and after
        "python": sys.version.split()[0],
        "dir": str(workdir),
    }
    write_outputs(out, {"results": results, "meta": meta}, render, chart)
    log(f"wrote {out}")
    return 0
