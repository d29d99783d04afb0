"""Handlers that `zincir worker` processes load in the tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

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


async def wait_note_then_hang_once(run: zincir.Run) -> None:
    """Wait for signal "go" and note its payload; the first time, hang there (to be killed)."""
    payload = await run.wait_for_signal("w", "go")
    ledger = os.environ["LEDGER"]
    first = not os.path.exists(ledger)
    with open(ledger, "a") as out:  # noqa: ASYNC230 - a tiny append
        out.write(f"{os.getpid()} {payload}\n")
    if first:
        await trio.sleep_forever()
    await run.complete()


@asynccontextmanager
async def client_for_the_ledger() -> AsyncIterator[str]:
    """A worker's resource: a "client" (an id) noted in the ledger when opened and closed."""
    client = uuid.uuid4().hex
    with open(os.environ["LEDGER"], "a") as ledger:  # noqa: ASYNC230 - a tiny append
        ledger.write(f"open {client}\n")
    try:
        yield client
    finally:
        with open(os.environ["LEDGER"], "a") as ledger:  # noqa: ASYNC230 - a tiny append
            ledger.write(f"close {client}\n")


async def record_with_client(run: zincir.Run, client: str) -> None:
    with open(os.environ["LEDGER"], "a") as ledger:  # noqa: ASYNC230 - a tiny append
        ledger.write(f"{run.id} {client}\n")
    await run.complete()


async def note_version_then_complete(run: zincir.Run) -> None:
    """Note (run, its version, the version this worker serves, pid) in the ledger, then complete;
    a run whose config says "hang" hangs instead until an attempt of it was lost (its worker
    killed), so that a SIGKILL always finds it in flight."""
    with open(os.environ["LEDGER"], "a") as ledger:  # noqa: ASYNC230 - a tiny append
        ledger.write(f"{run.id} {run.version} {os.environ['SERVES']} {os.getpid()}\n")
    if run.config == {"hang": True}:
        events = (await run.state()).events
        if not any(event.type is zincir.EventType.ATTEMPT_LOST for event in events):
            await trio.sleep_forever()
    await run.complete()
