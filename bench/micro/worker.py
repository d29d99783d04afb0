"""Resume-worker throughput: claim + complete of many due runs.

    .venv/bin/python -m bench.micro.worker [--runs 10000] [--concurrency 64]

Creates the runs (released, so all are due), then starts a ResumeWorker whose handler
completes each run at once, and reports claims+completions per second at synchronous=FULL.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import trio

import zincir


async def create_released_runs(db: zincir.Database, count: int) -> None:
    async def create(n: int) -> None:
        for _ in range(n):
            async with zincir.open_run(db):
                pass

    async with trio.open_nursery() as nursery:
        for share in [count // 100 + (1 if i < count % 100 else 0) for i in range(100)]:
            nursery.start_soon(create, share)


async def bench(path: Path, runs: int, concurrency: int) -> float:
    async with zincir.open_database(path) as db:
        await create_released_runs(db, runs)
        done = 0
        all_done = trio.Event()

        async def handler(run: zincir.Run) -> None:
            nonlocal done
            await run.complete()
            done += 1
            if done == runs:
                all_done.set()

        worker = zincir.ResumeWorker(db, handler, poll_interval=0.05, max_concurrency=concurrency)
        async with trio.open_nursery() as nursery:
            start = time.perf_counter()
            await nursery.start(worker.run)
            await all_done.wait()
            elapsed = time.perf_counter() - start
            worker.stop()
    return runs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the database goes (default: a temp dir)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        rate = trio.run(bench, Path(scratch) / "bench.db", args.runs, args.concurrency)
    setting = f"{args.runs} due runs, max_concurrency {args.concurrency}"
    print(f"worker: {setting}: {rate:,.0f} runs/s (claim + complete)")


if __name__ == "__main__":
    main()
