"""Resume workers serving one version each against workers serving every version.

    .venv/bin/python -m bench.micro.versions [--runs 10000] [--versions 3] [--concurrency 16]
        [--reps 3] [--backends sqlite,postgresql] [--postgres-url URL] [--dir DIR]

The same database, side by side in one run: ``--runs`` due runs in ``--versions`` versions
(interleaved; each created, then released, so that all are due) are seeded once per backend and
copied for every repetition. Then, in one process, one ``ResumeWorker`` per version claims and
completes them all, either with ``versions={its version}`` (filtered: its claims read its
version's range of ``idx_agent_runs_version_claimable``) or with ``versions=None`` (unfiltered:
every worker claims any due run through ``idx_agent_runs_claimable``). The two modes alternate,
in rotated order, so that drift hits both alike. Reported: claims + completions per second, the
median of the repetitions, and filtered ÷ unfiltered (docs/versions.md), twice: while every
worker has runs of its own (over the first two thirds of the runs: the claims' own cost), and
to the last run (which adds the tail: a filtered worker whose version is done idles while the
others finish theirs, where an unfiltered one helps them). On a machine that other work shares,
wall-clock rates move with its load; the CPU seconds the whole drain took (this process's, and
the PostgreSQL server's when it runs here) move far less, so runs per CPU second are given too.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import trio

import zincir

from ..harness.server import (
    create_database,
    drop_database,
    postgres_server,
    postmaster_pid,
    server_cpu,
    with_database,
)

MODES = ("filtered", "unfiltered")


def version_name(i: int) -> str:
    return f"v{i + 1}"


async def seed(target: str, runs: int, versions: int) -> None:
    """``runs`` due runs, version ``v1``, ``v2``, ... in turn."""
    async with zincir.open_database(target) as db:
        limiter = trio.CapacityLimiter(100)

        async def one(i: int) -> None:
            async with limiter, zincir.open_run(db, role="bench-due", version=version_name(i % versions)):
                pass  # released unfinished: due at once

        async with trio.open_nursery() as nursery:
            for i in range(runs):
                nursery.start_soon(one, i)


Rates = tuple[float, float, float]
"""Runs per second over the first two thirds, runs per second to the last, runs per CPU second."""


async def drain(
    target: str, runs: int, versions: int, concurrency: int, filtered: bool, postmaster: int | None
) -> Rates:
    """Claims + completions per second of one worker per version, over the first two thirds of
    the runs and until every run is completed, and per CPU second (this process and the server)."""

    def cpu() -> float:
        return time.process_time() + (0.0 if postmaster is None else server_cpu(postmaster))

    async with zincir.open_database(target) as db:
        done = 0
        steady_at = 0.0
        all_done = trio.Event()

        async def handler(run: zincir.Run) -> None:
            nonlocal done, steady_at
            await run.complete()
            done += 1
            if done == runs * 2 // 3:
                steady_at = time.perf_counter()
            if done == runs:
                all_done.set()

        workers = [
            zincir.ResumeWorker(
                db,
                handler,
                max_concurrency=concurrency,  # and the default poll interval, as deployed
                versions={version_name(i)} if filtered else None,
            )
            for i in range(versions)
        ]
        async with trio.open_nursery() as nursery:
            cpu_at_start, start = cpu(), time.perf_counter()
            for worker in workers:
                await nursery.start(worker.run)
            await all_done.wait()
            elapsed, cpu_used = time.perf_counter() - start, cpu() - cpu_at_start
            for worker in workers:
                worker.stop()
    return (runs * 2 // 3) / (steady_at - start), runs / elapsed, runs / cpu_used


class Copies:
    """A seeded database and fresh copies of it, one per repetition."""

    def __init__(self, backend: str, scratch: Path, admin_url: str | None) -> None:
        self.backend, self.scratch, self.admin_url = backend, scratch, admin_url
        self.made = 0

    @property
    def template(self) -> str:
        if self.backend == "sqlite":
            return str(self.scratch / "template.db")
        assert self.admin_url is not None
        return with_database(self.admin_url, "bench_versions_template")

    def create_template(self) -> str:
        if self.backend == "postgresql":
            assert self.admin_url is not None
            create_database(self.admin_url, "bench_versions_template")
        return self.template

    @contextlib.contextmanager
    def copy(self) -> Iterator[str]:
        self.made += 1
        if self.backend == "sqlite":
            path = self.scratch / f"copy-{self.made}.db"
            shutil.copyfile(self.template, path)  # closed, so its WAL was checkpointed into it
            try:
                yield str(path)
            finally:
                for leftover in self.scratch.glob(f"copy-{self.made}.db*"):
                    leftover.unlink()
            return
        import psycopg
        from psycopg import sql

        assert self.admin_url is not None
        name = f"bench_versions_{self.made}"
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier("bench_versions_template")
                )
            )
        try:
            yield with_database(self.admin_url, name)
        finally:
            drop_database(self.admin_url, name)


def measure(copies: Copies, args: argparse.Namespace) -> dict[str, list[Rates]]:
    print(f"{copies.backend}: seeding {args.runs:,} due runs of {args.versions} versions", flush=True)
    template = copies.create_template()
    trio.run(seed, template, args.runs, args.versions)
    postmaster = None if copies.backend == "sqlite" else postmaster_pid(template)
    if copies.backend == "postgresql":  # statistics, as autovacuum keeps them (each copy has them)
        import psycopg

        with psycopg.connect(template, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
    rates: dict[str, list[Rates]] = {mode: [] for mode in MODES}
    for rep in range(args.reps):
        for mode in MODES if rep % 2 == 0 else reversed(MODES):
            with copies.copy() as target:
                rate = trio.run(
                    drain, target, args.runs, args.versions, args.concurrency, mode == "filtered", postmaster
                )
            rates[mode].append(rate)
            print(
                f"  rep {rep + 1} {mode:<10} {rate[0]:6,.0f} runs/s steady, {rate[1]:6,.0f} to the last,"
                f" {rate[2]:6,.0f} per CPU second",
                flush=True,
            )
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16, help="max_concurrency of each worker")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--postgres-url", default=None, help="a superuser URL (default: a throwaway server)")
    parser.add_argument("--dir", type=Path, default=None, help="where the databases go (default: a temp dir)")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        for backend in args.backends.split(","):
            if backend == "sqlite":
                results[backend] = measure(Copies(backend, Path(scratch), None), args)
                continue
            with postgres_server(args.postgres_url, Path(scratch), print) as admin_url:
                copies = Copies(backend, Path(scratch), admin_url)
                try:
                    results[backend] = measure(copies, args)
                finally:
                    drop_database(admin_url, "bench_versions_template")
    print(f"\n{args.runs:,} due runs of {args.versions} versions, one worker per version (max_concurrency"
          f" {args.concurrency} each), median of {args.reps}: claims + completions per second")  # fmt: skip
    for backend, rates in results.items():
        for which, phase in enumerate(("steady", "to the last run", "per CPU second")):
            filtered, unfiltered = (statistics.median(rate[which] for rate in rates[mode]) for mode in MODES)
            print(
                f"  {backend:<11} {phase:<16} filtered {filtered:8,.0f}   unfiltered {unfiltered:8,.0f}"
                f"   filtered / unfiltered {filtered / unfiltered:.2f}"
            )


if __name__ == "__main__":
    main()
