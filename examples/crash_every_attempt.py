"""A handler that crashes its worker on every attempt, to watch how zincir counts lost attempts.

Start a run:       .venv/bin/python examples/crash_every_attempt.py crash.db > run_id
Crash a worker:    .venv/bin/zincir worker examples.crash_every_attempt:handler \
                       --db crash.db --max-attempts 3

Each worker after the first takes the run at once (its predecessor's process is gone and left
nothing running), logs an ``attempt_lost`` event, and dies in its turn; once the attempts are
spent, the next worker fails the run, saying why. See docs/crashes.md.
"""

from __future__ import annotations

import os
import signal
import sys

import trio

import zincir


async def handler(run: zincir.Run) -> None:
    print(f"attempt on run {run.id}, epoch {run.epoch}: crashing", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would


async def start(path: str) -> None:
    async with zincir.open_run(path, role="crashy") as run:
        print(run.id)  # left unfinished: a worker claims it


if __name__ == "__main__":
    trio.run(start, sys.argv[1] if len(sys.argv) > 1 else "crash.db")
