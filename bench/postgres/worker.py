"""Comparison 4 of ``python -m bench.postgres``: one worker process, or the seeder of due runs.

    python -m bench.postgres.worker seed URL N           # create N due runs (created, then released)
    python -m bench.postgres.worker work URL CONCURRENCY  # a ResumeWorker, gated by the parent

A worker opens the database (imports, connections and migrations happen before the timing),
prints ``{"ready": true}``, waits for ``go`` on stdin, then runs a ``zincir.ResumeWorker`` whose
handler only completes the run (one claim + one completion per run: the worker's own cost). On
``stop`` it stops claiming, lets its handlers finish, and prints how many runs it handled and
the CPU seconds it used since ``go`` (all its threads).
"""

from __future__ import annotations

import json
import sys
import time

import trio

import zincir


def say(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def seed(url: str, n: int, concurrency: int = 100) -> None:
    """N runs nobody owns and that are due now: each created (leased) and released at once."""
    async with zincir.open_database(url) as db:
        limiter = trio.CapacityLimiter(concurrency)

        async def one() -> None:
            async with limiter, zincir.open_run(db, role="bench-due"):
                pass  # leaving the block without complete() releases the run: it is claimable

        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)
    say({"seeded": n})


async def work(url: str, concurrency: int, poll_interval: float) -> None:
    handled = 0

    async def handler(run: zincir.Run) -> None:
        nonlocal handled
        await run.complete()
        handled += 1

    async with zincir.open_database(url) as db:
        worker = zincir.ResumeWorker(
            db, handler, max_concurrency=concurrency, poll_interval=poll_interval, grace_period=30
        )
        say({"ready": True})
        line = await trio.to_thread.run_sync(sys.stdin.readline)
        assert line.strip() == "go", line
        cpu_at_go = time.process_time()
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            worker.stop()
    say({"handled": handled, "cpu_s": time.process_time() - cpu_at_go})


def main() -> None:
    mode, url = sys.argv[1:3]
    if mode == "seed":
        trio.run(seed, url, int(sys.argv[3]))
    elif mode == "work":
        poll = float(sys.argv[4]) if len(sys.argv) > 4 else 0.2
        trio.run(work, url, int(sys.argv[3]), poll)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
