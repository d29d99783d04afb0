"""An agent whose refund tool needs a person's approval, run by `zincir worker`.

    .venv/bin/python examples/approval_agent.py start              # a new run; prints its id
    .venv/bin/zincir worker examples.approval_agent:handler --lease-ttl 5
    .venv/bin/zincir approvals                                     # in another shell
    .venv/bin/zincir approve RUN_ID CALL_ID --by you --hash HASH   # or: deny ... --by you --reason TEXT

The handler records the (scripted) model's `send_refund` call, asks for approval of exactly
those arguments, and waits. Kill the worker while it waits and start it again: the request,
and a decision made in between, are in the database; the new worker's handler gets the decision
at once, and the refund is paid once (the ledger is keyed by the call's idempotency key).

Environment: ZINCIR_DATABASE_PATH (default zincir.db, or a postgresql:// URL) and
ZINCIR_LEDGER (default refunds.jsonl): the "bank", one JSON line per refund paid.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import trio

import zincir
from zincir.testing import effect_ledger

ROLE = "refund-agent"
REFUND = {"order": "A-17", "amount": 120}


def _ledger() -> Path:
    return Path(os.environ.get("ZINCIR_LEDGER", "refunds.jsonl"))


def pay_refund(
    idempotency_key: str, args: dict[str, object], effect_key: str | None = None
) -> dict[str, object]:
    """The tool with the side effect: pays once per idempotency key, however often it runs (a
    crash test's ledger counts each payment by ``effect_key``; a no-op outside a crash test)."""
    ledger = _ledger()
    paid = ledger.read_text().splitlines() if ledger.exists() else []
    if not any(json.loads(line)["key"] == idempotency_key for line in paid):
        with ledger.open("a") as out:
            out.write(json.dumps({"key": idempotency_key, **args}) + "\n")
        if effect_key is not None:
            effect_ledger().record_sync(effect_key)
    return {"refunded": args["amount"]}


async def handler(run: zincir.Run) -> None:
    """Continue the run from its log: ask (once), wait for the decision, act on it, finish."""
    if not [e for e in (await run.state()).events if e.type is zincir.EventType.LLM_CALL]:
        call = zincir.ToolCall(f"refund-{run.id[:8]}", "send_refund", REFUND)
        await run.record_response("The customer qualifies for a refund.", [call], "tool_use")
    for pending in await run.pending_tools():
        approval = await run.wait_for_approval(pending.call.id)
        if approval.approved:
            result = pay_refund(pending.idempotency_key, pending.call.args, pending.effect_key)
        else:
            result = {"denied": approval.reason, "by": approval.by}
        await run.record_tool_result(pending.call.id, result)
    await run.complete()


async def start(database: str) -> None:
    async with zincir.open_database(database) as db, zincir.open_run(db, role=ROLE) as run:
        print(run.id)  # left unfinished: a worker takes it from here


if __name__ == "__main__":
    if sys.argv[1:] != ["start"]:
        sys.exit(__doc__)
    trio.run(start, os.environ.get("ZINCIR_DATABASE_PATH", "zincir.db"))
