"""``python -m bench.tracing``: what tracing costs per step, on against off, side by side (issue 38).

Per backend and rep, one database holds five runs, each opened under one series: tracing off
(``tracing=False``); on through the OpenTelemetry SDK with a no-op exporter (a
``TracerProvider`` whose ``BatchSpanProcessor`` hands each batch to an exporter that drops it:
every span is made, recorded, ended and queued as in production, only the network is left out);
on through the same SDK with every trace sampled out (``ALWAYS_OFF``: what a run costs that a
ratio sampler did not pick); on through the API's no-op provider (zincir's own instrumentation
alone: spans that record nothing); and off, each step wrapped by the bench in one bare SDK span
of its own (two attributes, made current, ended: what the SDK charges for one span per step,
in the same loop, so on ÷ this is what zincir adds beyond the SDK). The runs take N steps each in
turns, in rotating order, so that they share the database, its writer thread, the disk and the
same moments of a busy machine. A step is ``run.step(name, fn)`` with a trivial ``fn``: the
cheapest durable work there is, so the ratio is the largest a real step would see. Each step is
timed; reported: µs per step (the median of all steps, with the range of the reps' medians) and
each series ÷ off (target for the SDK ≤ 1.10).

Each run's tracing is chosen as it is opened (a run's spans are settled then): the database's
tracing setting is swapped between the ``open_run`` calls. Needs ``opentelemetry-sdk`` (in the
test extra). Writes ``bench/reports/tracing.md`` and its JSON.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import attrs
import trio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NoOpTracerProvider, Tracer

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


@attrs.frozen
class Providers:
    """The SDK's providers the series trace through, each with a no-op exporter."""

    sampled: TracerProvider
    sampled_out: TracerProvider

    @classmethod
    def make(cls, exporter: DropEverything) -> Providers:
        made = cls(TracerProvider(), TracerProvider(sampler=ALWAYS_OFF))
        for provider in (made.sampled, made.sampled_out):
            provider.add_span_processor(BatchSpanProcessor(exporter))
        return made

    def shutdown(self) -> None:
        self.sampled.shutdown()  # exports what is queued
        self.sampled_out.shutdown()


def settings(providers: Providers) -> dict[str, Tracing]:
    off, sdk, sampled_out, api, bare = SERIES
    return {
        off: Tracing(False),
        sdk: Tracing(providers.sampled),
        sampled_out: Tracing(providers.sampled_out),
        api: Tracing(NoOpTracerProvider()),
        bare: Tracing(False),  # the bench makes the span
    }


async def serve(
    db: zincir.Database,
    tracing: Tracing,
    bare: Tracer | None,
    orders: trio.MemoryReceiveChannel[tuple[int, trio.Event]],
    timed: list[float],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """One series' run, in a task of its own: its attempt's span is current in this task alone
    (runs opened in one task would nest, each step under the last run opened). It is opened
    while the database traces as the series says, then takes a step per order, timed."""
    db._tracing = tracing
    async with zincir.open_run(db) as run:
        db._tracing = Tracing(False)
        task_status.started()
        async for i, done in orders:
            started = time.perf_counter()
            if bare is None:
                await run.step(f"s{i}", nothing, i)
            else:
                attributes = {"zincir.run.id": run.id, "zincir.step.name": f"s{i}"}
                with bare.start_as_current_span(f"step s{i}", attributes=attributes):
                    await run.step(f"s{i}", nothing, i)
            timed.append((time.perf_counter() - started) * 1e6)
            done.set()
        await run.complete()


async def one_rep(target: str, steps: int, providers: Providers) -> dict[str, list[float]]:
    """``steps`` steps per series in turns (one step at a time); µs per step."""
    timed: dict[str, list[float]] = {name: [] for name in SERIES}
    bare = providers.sampled.get_tracer("bench")
    async with zincir.open_database(target) as db, trio.open_nursery() as nursery:
        senders = []
        for name, tracing in settings(providers).items():
            send, receive = trio.open_memory_channel[tuple[int, trio.Event]](0)
            await nursery.start(
                serve, db, tracing, bare if name == SERIES[-1] else None, receive, timed[name]
            )
            senders.append(send)
        for i in range(steps):
            shift = i % len(senders)
            for send in senders[shift:] + senders[:shift]:
                done = trio.Event()
                await send.send((i, done))
                await done.wait()
        for send in senders:
            await send.aclose()
    return timed


async def measure(target: str, steps: int, reps: int, log: study.Log) -> dict[str, Any]:
    """Per series: the median µs of every step, how many steps, and each rep's median."""
    exporter = DropEverything()
    providers = Providers.make(exporter)
    try:
        await one_rep(target, max(20, steps // 10), providers)  # warm-up: caches, plans, the SDK
        every: dict[str, list[float]] = {name: [] for name in SERIES}
        medians: dict[str, list[float]] = {name: [] for name in SERIES}
        for rep in range(reps):
            for name, timed in (await one_rep(target, steps, providers)).items():
                every[name] += timed
                medians[name].append(statistics.median(timed))
            log(f"  rep {rep + 1}/{reps}: " + ", ".join(f"{k} {v[-1]:.0f} µs" for k, v in medians.items()))
    finally:
        providers.shutdown()
    series = {
        name: {"median": statistics.median(every[name]), "steps": len(every[name]), "reps": medians[name]}
        for name in SERIES
    }
    return {"series": series, "exported_spans": exporter.spans}


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
    program, prefix = "python -m bench.tracing", "zincir-bench-tracing-"
    fields = {"steps": args.steps, "reps": args.reps, "backends": {}}
    with study.running(program, argv, args, prefix, render, **fields) as (workdir, results, log):
        for backend in backends:
            log(f"{backend}: {args.reps} reps of {args.steps} steps per series")
            with backend_target(backend, args.url, workdir, "tracing", log) as target:
                data = trio.run(measure, target, args.steps, args.reps, log)
                results["backends"][BACKEND_NAMES[backend]] = data
    return 0
