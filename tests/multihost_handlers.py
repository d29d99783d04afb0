"""The handler that scripts/multihost.py runs in a `zincir worker` on each simulated host.

Per run: record a model response asking for one `append` tool call (once: a resumed run finds
the intent pending), apply the call's effect to the keyed ledger (INSERT ... ON CONFLICT (key)
DO NOTHING, keyed by the run id and the call's idempotency key), work a little, record the
tool's result and complete the run. Every execution also appends a row to the attempts table,
with the server's clock (`zincir_now_ms()`) and the lease expiry it saw, for the checks.

Environment: MULTIHOST_URL (the database, as this host reaches it), MULTIHOST_HOST (this
host's name), MULTIHOST_CONFIRM_MS (how long the tool waits between its effect and its result,
default 30). MULTIHOST_BROKEN=1 keys the effect by the attempt instead of the idempotency
key, a deliberate bug the duplicate-effect check must catch.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import psycopg
import trio

import zincir

_CALL_ID = "append-1"
_pool: list[psycopg.Connection[Any]] = []
_pool_lock = threading.Lock()


def _execute(query: str, params: tuple[Any, ...]) -> Any:
    """Run one autocommit statement on a pooled connection (called in a worker thread)."""
    with _pool_lock:
        conn = _pool.pop() if _pool else None
    if conn is None:
        conn = psycopg.connect(os.environ["MULTIHOST_URL"], autocommit=True, connect_timeout=10)
    try:
        row = conn.execute(query, params).fetchone() if "RETURNING" in query else None
    except BaseException:
        conn.close()
        raise
    with _pool_lock:
        _pool.append(conn)
    return row


async def _sql(query: str, *params: Any) -> Any:
    return await trio.to_thread.run_sync(_execute, query, params)


async def ledger_handler(run: zincir.Run) -> None:
    host = os.environ["MULTIHOST_HOST"]
    broken = os.environ.get("MULTIHOST_BROKEN") == "1"
    (attempt_id,) = await _sql(
        "INSERT INTO multihost_attempts (run_id, host, pid, epoch, fencing_token, started_ms, seen_expiry)"
        " SELECT %s, %s, %s, %s, %s, zincir_now_ms(), lease_expires_at FROM agent_runs"
        " WHERE id = %s AND lease_epoch = %s RETURNING id",
        run.id,
        host,
        os.getpid(),
        run.epoch,
        run.fencing_token,
        run.id,
        run.epoch,
    )
    outcome = "error"
    try:
        state = await run.state()
        if not any(event.type == zincir.EventType.LLM_CALL for event in state.events):
            await run.record_response(
                "appending", [zincir.ToolCall(_CALL_ID, "append", {"run": run.id})], "tool_use"
            )
        for pending in await run.pending_tools():
            await trio.sleep(0.01)  # the tool prepares its effect
            key = f"{run.id}/{pending.idempotency_key}"
            if broken:
                key = f"{key}/{pending.fencing_token}"
            inserted = await _sql(
                "INSERT INTO multihost_ledger (key, run_id, host, epoch, applied_ms)"
                " VALUES (%s, %s, %s, %s, zincir_now_ms()) ON CONFLICT (key) DO NOTHING"
                " RETURNING key",
                key,
                run.id,
                host,
                run.epoch,
            )
            await _note_expiry(attempt_id, run, "inserted" if inserted else "duplicate")
            # ... and waits for it to be confirmed: the kill lands here.
            await trio.sleep(int(os.environ.get("MULTIHOST_CONFIRM_MS", "30")) / 1000)
            await run.record_tool_result(pending.call.id, {"appended": key})
        await _note_expiry(attempt_id, run)
        await run.complete()
        outcome = "completed"
    except zincir.LeaseLost:
        outcome = "lost"
        raise
    except BaseException as exc:
        outcome = f"error: {exc!r}"[:500]
        raise
    finally:
        with trio.CancelScope(shield=True):
            await _sql(
                "UPDATE multihost_attempts SET finished_ms = zincir_now_ms(), outcome = %s"
                " WHERE id = %s RETURNING id",
                outcome,
                attempt_id,
            )


async def _note_expiry(attempt_id: int, run: zincir.Run, effect: str | None = None) -> None:
    """Remember the latest expiry of this owner's lease that the database shows (and what the
    ledger insert did: 'inserted', or 'duplicate' when an earlier owner had applied it)."""
    await _sql(
        "UPDATE multihost_attempts SET seen_expiry = greatest(seen_expiry, r.lease_expires_at),"
        " effect = coalesce(%s::text, effect)"
        " FROM agent_runs r WHERE multihost_attempts.id = %s AND r.id = %s AND r.lease_epoch = %s"
        " RETURNING multihost_attempts.id",
        effect,
        attempt_id,
        run.id,
        run.epoch,
    )


async def complete_handler(run: zincir.Run) -> None:
    """scripts/multihost.py --throughput: a run that only completes (a claim + a completion)."""
    await run.complete()
