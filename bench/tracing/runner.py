"""``python -m bench.tracing``: what tracing costs per step, on against off, side by side (issue 38).

Per backend and rep, one database holds three runs, each opened under one series: tracing
off (``tracing=False``), on through the OpenTelemetry SDK with a no-op exporter (a
``TracerProvider`` whose ``BatchSpanProcessor`` hands each batch to an exporter that drops it:
every span is made, recorded, ended and queued as in production, only the network is left out),
and on through the API's no-op provider (zincir's own instrumentation alone: spans that record
nothing). The three runs take N steps each in turns, in rotating order, so that they share the
database, its writer thread, the disk and the same moments of a busy machine. A step is
``run.step(name, fn)`` with a trivial ``fn``: the cheapest durable work there is, so the ratio is
the largest a real step would see. Each step is timed; reported: µs per step (the median of all
steps, with the range of the reps' medians) and on ÷ off (target ≤ 1.10).

Each run's tracing is chosen as it is opened (a run's spans are settled then): the database's
tracing setting is swapped between the three ``open_run`` calls. Needs ``opentelemetry-sdk`` (in
the test extra). Writes ``bench/reports/tracing.md`` and its JSON.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio
from opentelemetry import context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import NoOpTracerProvider

import zincir
from zincir._tracing import Tracing

from ..harness import study
from ..harness.server import BACKEND_NAMES, backend_target
from .report import SERIES, render


class DropEverything(SpanExporter):
    """An exporter that drops what it is given (and counts it)."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Any) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


async def nothing(i: int) -> int:
    return i


def settings(provider: TracerProvider) -> dict[str, Tracing]:
    return {
        SERIES[0]: Tracing(False),
        SERIES[1]: Tracing(provider),
        SERIES[2]: Tracing(NoOpTracerProvider()),
    }


@contextlib.asynccontextmanager
async def three_runs(
    db: zincir.Database, provider: TracerProvider
) -> AsyncIterator[list[tuple[str, zincir.Run]]]:
    """A run per series, each opened while the database traces as the series says."""
    async with contextlib.AsyncExitStack() as stack:
        runs = []
        for name, tracing in settings(provider).items():
            db._tracing = tracing
            runs.append((name, await stack.enter_async_context(zincir.open_run(db))))
        db._tracing = Tracing(False)
        yield runs


async def one_rep(target: str, steps: int, provider: TracerProvider) -> dict[str, list[float]]:
    """``steps`` steps per series in turns; µs per step."""
    timed: dict[str, list[float]] = {name: [] for name in SERIES}
    async with zincir.open_database(target) as db, three_runs(db, provider) as runs:
        for i in range(steps):
            shift = i % len(runs)
            for name, run in runs[shift:] + runs[:shift]:
                started = time.perf_counter()
                await run.step(f"s{i}", nothing, i)
                timed[name].append((time.perf_counter() - started) * 1e6)
        for _, run in runs:
            await run.complete()
    return timed


def span_alone(provider: TracerProvider, spans: int) -> float:
    """µs of the SDK's own span as a step's is made (two attributes, made current, ended), alone
    in a loop: the median of ``spans``."""
    tracer = provider.get_tracer("bench")
    timed = []
    for i in range(spans):
        started = time.perf_counter_ns()
        span = tracer.start_span("step s", attributes={"zincir.run.id": "r", "zincir.step.name": f"s{i}"})
        token = context.attach(trace.set_span_in_context(span))
        context.detach(token)
        span.end()
        timed.append(time.perf_counter_ns() - started)
    return statistics.median(timed) / 1000


async def measure(target: str, steps: int, reps: int, log: study.Log) -> dict[str, Any]:
    """Per series: the median µs of every step, how many steps, and each rep's median."""
    exporter = DropEverything()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    try:
        await one_rep(target, max(20, steps // 10), provider)  # warm-up: caches, plans, the SDK
        every: dict[str, list[float]] = {name: [] for name in SERIES}
        medians: dict[str, list[float]] = {name: [] for name in SERIES}
        for rep in range(reps):
            for name, timed in (await one_rep(target, steps, provider)).items():
                every[name] += timed
                medians[name].append(statistics.median(timed))
            log(f"  rep {rep + 1}/{reps}: " + ", ".join(f"{k} {v[-1]:.0f} µs" for k, v in medians.items()))
        alone = span_alone(provider, 3 * steps)
    finally:
        provider.shutdown()  # exports what is queued
    series = {
        name: {"median": statistics.median(every[name]), "steps": len(every[name]), "reps": medians[name]}
        for name in SERIES
    }
    return {"series": series, "exported_spans": exporter.spans, "sdk_span_alone": alone}


def main(argv: list[str] | None = None) -> int:
    parser = study.parser("python -m bench.tracing", __doc__.splitlines()[0], "tracing.md")
    add = parser.add_argument
    add("--steps", type=int, default=1000, help="steps per series and rep (1000)")
    add("--reps", type=int, default=5, help="repetitions (5)")
    study.database_options(parser)
    args = parser.parse_args(argv)
    if study.redraw(args, render):
        return 0
    if args.quick:
        args.steps, args.reps = 20, 2
    backends = study.choices(args.backends, ("sqlite", "postgresql"), "backend")
    log = study.progress(args.quiet)
    started = time.perf_counter()
    with study.scratch(args.dir, "zincir-bench-tracing-", keep=args.keep, log=log) as workdir:
        results = study.begin(
            "python -m bench.tracing", argv, workdir,
            quick=args.quick, steps=args.steps, reps=args.reps, backends={},
        )  # fmt: skip
        for backend in backends:
            log(f"{backend}: {args.reps} reps of {args.steps} steps per series")
            with backend_target(backend, args.url, workdir, "tracing", log) as target:
                data = trio.run(measure, target, args.steps, args.reps, log)
                results["backends"][BACKEND_NAMES[backend]] = data
    study.finish(Path(args.out), results, render, None, started=started, log=log)
    return 0
