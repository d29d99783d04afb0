"""A payment tool that is not idempotent, made safe by a probe: reconcile before running again.

    ZINCIR_CRASH_AFTER_EFFECT=1 .venv/bin/python examples/reconcile_payment.py   # pays, then dies
    .venv/bin/python examples/reconcile_payment.py                               # resumes: no 2nd payment
    cat payments.jsonl
    .venv/bin/zincir crash-test examples.reconcile_payment:handler               # every crash point

The "bank" (payments.jsonl) takes no idempotency key: paying twice pays twice. But each payment
carries a reference, so it can be looked up. The agent runs the tool through run.execute(): the
start is recorded before the money moves, and after a crash a call that had started is first
reconciled (looked up by its reference); only a payment that is not there is made.

Environment: ZINCIR_DATABASE_PATH (default zincir.db, or a postgresql:// URL), ZINCIR_PAYMENTS
(default payments.jsonl), ZINCIR_CRASH_AFTER_EFFECT=1 (SIGKILL right after the payment).
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import trio

import zincir
from zincir.testing import effect_ledger

ROLE = "payer"


def _bank() -> trio.Path:
    return trio.Path(os.environ.get("ZINCIR_PAYMENTS", "payments.jsonl"))


async def pay(pending: zincir.PendingToolCall) -> Any:
    """The effect: appends a payment (no deduplication), then, if asked, dies before its result."""
    payment = {"reference": pending.idempotency_key, **pending.call.args}
    async with await _bank().open("a") as bank:
        await bank.write(json.dumps(payment) + "\n")
    await effect_ledger().record(pending.effect_key)  # counted by a crash test; a no-op otherwise
    if os.environ.get("ZINCIR_CRASH_AFTER_EFFECT"):
        os.kill(os.getpid(), signal.SIGKILL)
    return {"paid": payment["amount"]}


async def find_payment(pending: zincir.PendingToolCall) -> Any:
    """The probe: the payment with this call's reference, if the bank has it."""
    bank = _bank()
    if not await bank.exists():
        return None
    for line in (await bank.read_text()).splitlines():
        payment = json.loads(line)
        if payment["reference"] == pending.idempotency_key:
            return {"paid": payment["amount"], "found_by": "reconcile"}
    return None


async def pay_invoice(run: zincir.Run) -> None:
    """Continue the run from its log: the model's request (once), then the payment (once)."""
    events = await run.database.events(run.id)
    if not any(e.type is zincir.EventType.LLM_CALL for e in events):  # the model asks for a payment
        # The call id (so the payment's reference) is this run's: another run pays anew.
        call = zincir.ToolCall(f"pay-invoice-7-{run.id[:8]}", "pay", {"to": "ACME", "amount": 120})
        await run.record_response("Paying the invoice.", [call], "tool_use")
    for pending in await run.pending_tools():
        print(f"{pending.call.id}: started {pending.started} time(s) before", flush=True)
        result = await run.execute(pending, pay, reconcile=find_payment)
        print(f"{pending.call.id}: {result}", flush=True)
    await run.complete()


async def handler(run: zincir.Run) -> None:
    """The same agent as a worker handler (``zincir worker``, ``zincir crash-test``)."""
    await pay_invoice(run)


async def main(database: str) -> None:
    async with zincir.open_database(database) as db:
        unfinished = [r.id for r in await db.runs(status="running", role=ROLE)]
        async with zincir.open_run(db, unfinished[0] if unfinished else None, role=ROLE) as run:
            await pay_invoice(run)
        print(f"run {run.id} completed", flush=True)


if __name__ == "__main__":
    trio.run(main, os.environ.get("ZINCIR_DATABASE_PATH", "zincir.db"))
