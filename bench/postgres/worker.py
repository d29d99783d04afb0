"""Comparison 4 of ``python -m bench.postgres``: one worker process, or the seeder of due runs
(:func:`child`, ``args["mode"]``):

* ``seed``: create ``n`` due runs (each created, then released) and say ``seeded``;
* ``work``: a worker. It opens the database (imports, connections and migrations happen before
  the timing), says ``ready``, waits for the parent's ``go``, then runs a ``zincir.ResumeWorker``
  whose handler only completes the run (one claim + one completion per run: the worker's own
  cost). On ``stop`` it stops claiming, lets its handlers finish, and says how many runs it
  handled and the CPU seconds it used since ``go`` (all its threads): ``stopped``.
"""

from __future__ import annotations

import time
from typing import Any

import trio

import zincir

from ..harness.child import Channel


async def seed(channel: Channel, url: str, n: int, concurrency: int = 100) -> None:
    """N runs nobody owns and that are due now: each created (leased) and released at once."""
    async with zincir.open_database(url) as db:
        limiter = trio.CapacityLimiter(concurrency)

        async def one() -> None:
            async with limiter, zincir.open_run(db, role="bench-due"):
                pass  # leaving the block without complete() releases the run: it is claimable

        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)
    channel.emit("seeded", n=n)


async def work(channel: Channel, url: str, concurrency: int, poll_interval: float) -> None:
    handled = 0

    async def handler(run: zincir.Run) -> None:
        nonlocal handled
        await run.complete()
        handled += 1

    async with zincir.open_database(url) as db:
        worker = zincir.ResumeWorker(
            db, handler, max_concurrency=concurrency, poll_interval=poll_interval, grace_period=30
        )
        channel.emit("ready")
        command = await trio.to_thread.run_sync(channel.next_command)
        assert command == {"cmd": "go"}, command
        cpu_at_go = time.process_time()
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await trio.to_thread.run_sync(channel.next_command)  # stop
            worker.stop()
    channel.emit("stopped", handled=handled, cpu_s=time.process_time() - cpu_at_go)


def child(channel: Channel, args: dict[str, Any]) -> None:
    """A seeder or a worker of comparison 4 (``bench/harness/child.py``)."""
    if args["mode"] == "seed":
        trio.run(seed, channel, args["url"], args["n"])
    else:
        trio.run(work, channel, args["url"], args["concurrency"], args["poll"])
