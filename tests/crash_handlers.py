"""Worker handlers for the crash-test kit's tests (zincir.testing.crash_test loads them by path)."""

from __future__ import annotations

import contextlib
import json

import trio

import zincir
from examples import approval_agent
from zincir.testing import effect_ledger


async def approve_when_asked(db: zincir.Database, run_id: str) -> None:
    """A scripted approver: approves each approval request of the run as soon as it is made (an
    outsider's write, as from `zincir approve`), until it is cancelled."""
    decided: set[str] = set()
    while True:
        for event in await db.events(run_id):
            call_id = str(event.payload.get("call_id"))
            if event.type is zincir.EventType.APPROVAL_REQUESTED and call_id not in decided:
                with contextlib.suppress(zincir.ApprovalConflict):  # decided before a crash
                    await zincir.decide_approval(db, run_id, call_id, approved=True, by="scripted approver")
                decided.add(call_id)
        await trio.sleep(0.02)  # polls: it stands for a person at another terminal


async def approved_refund(run: zincir.Run) -> None:
    """examples/approval_agent.py's handler, with a scripted approver beside it."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(approve_when_asked, run.database, run.id)
        await approval_agent.handler(run)
        nursery.cancel_scope.cancel()


async def _charge(pending: zincir.PendingToolCall) -> dict[str, object]:
    async with await trio.open_file("charges.jsonl", "a") as charges:  # no key, no probe
        await charges.write(json.dumps(pending.call.args) + "\n")
    await effect_ledger().record(pending.effect_key)
    return {"charged": pending.call.args["amount"]}


async def double_charger(run: zincir.Run) -> None:
    """A deliberately broken agent: its charge tool is not idempotent, and it has no probe."""
    if not any(e.type is zincir.EventType.LLM_CALL for e in await run.database.events(run.id)):
        await run.record_response(
            "Charging the card.", [zincir.ToolCall("charge-1", "charge", {"amount": 5})], "tool_use"
        )
    for pending in await run.pending_tools():
        await run.execute(pending, _charge)  # no reconcile=: a started charge runs again
    await run.complete()


async def always_fails(run: zincir.Run) -> None:
    """A handler whose run fails even uninterrupted: there is nothing to compare a crash with."""
    await run.fail("on purpose")


async def hangs(run: zincir.Run) -> None:
    """A handler that never ends its run: the crash test's time limit ends its process."""
    await trio.sleep_forever()
