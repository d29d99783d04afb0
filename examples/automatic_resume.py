"""Automatic recovery: a process dies mid-run, and a ResumeWorker finishes the run for it.

    .venv/bin/python examples/automatic_resume.py

1. A child process starts a run, records a model response that asks for a tool, and is
   killed with SIGKILL before the tool result is recorded: a real crash, lease and all.
2. This process runs a ResumeWorker. Once the dead owner's lease expires (2 s here), the
   worker claims the run (epoch + 1), re-runs the pending tool intent and completes it.

The same handler works with the command line worker:
    .venv/bin/zincir worker examples.automatic_resume:handler
"""

from __future__ import annotations

import logging
import os
import signal
import sys

import trio

import zincir

LEASE_TTL = 2.0
log = logging.getLogger("example")


async def handler(run: zincir.Run) -> None:
    """Continue a run from its log: run every pending tool intent again, then finish."""
    for pending in await run.pending_tools():
        log.info("re-running %s (idempotency key %s)", pending.call.name, pending.idempotency_key)
        await run.record_tool_result(pending.call.id, {"greeting": f"hello from epoch {run.epoch}"})
    await run.complete()


async def die_mid_run(db_path: str) -> None:
    async with zincir.open_run(db_path, role="doomed", lease_ttl=LEASE_TTL) as run:
        await run.record_response("Let me greet.", [zincir.ToolCall("greet-1", "greet", {})], "tool_use")
        print(run.id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no release: like a power cut


async def recover(db_path: str) -> None:
    child = await trio.run_process(
        [sys.executable, __file__, "--die", db_path], capture_stdout=True, check=False
    )
    run_id = child.stdout.decode().strip()
    log.info("child process died with signal %d, leaving run %s", -child.returncode, run_id)
    async with zincir.open_database(db_path) as db:
        finished = trio.Event()

        async def handle_then_report(run: zincir.Run) -> None:
            await handler(run)
            finished.set()

        worker = zincir.ResumeWorker(db, handle_then_report, lease_ttl=LEASE_TTL, poll_interval=0.2)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            log.info("worker started; it takes the run once it sees the owner is gone (at once on this host)")
            await finished.wait()
            worker.stop()
        for event in await db.events(run_id):
            log.info("#%d %s %s", event.seq, event.type.value, event.payload)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if sys.argv[1:2] == ["--die"]:
        trio.run(die_mid_run, sys.argv[2])
    else:
        trio.run(recover, os.environ.get("ZINCIR_DATABASE_PATH", "zincir.db"))
