"""Handlers that `zincir worker` processes load in the tests."""

from __future__ import annotations

import os

import zincir


async def record_and_complete(run: zincir.Run) -> None:
    with open(os.environ["LEDGER"], "a") as ledger:  # noqa: ASYNC230 - a tiny append
        ledger.write(f"{run.id} {os.getpid()}\n")
    await run.complete()


async def wait_then_complete(run: zincir.Run) -> None:
    """Wait for signal "go", note its payload in the ledger, then complete."""
    payload = await run.wait_for_signal("w", "go")
    with open(os.environ["LEDGER"], "a") as ledger:  # noqa: ASYNC230 - a tiny append
        ledger.write(f"{run.id} {payload}\n")
    await run.complete()
