"""Leases: taking a run (a new one, an existing one, the due ones a worker claims), keeping
it, suspending it, and letting it go again after a backoff (or at once, when an outsider asks).
"""

from __future__ import annotations

from .._errors import RunLeased, RunNotFound, RunTerminal, RunWaiting
from .._types import RunStatus
from ._tx import LIVE, Tx


def retry_now(tx: Tx, run_id: str) -> int | None:
    """An outsider's cut of a backoff: a live run nobody holds, not waiting, whose next attempt
    is in the future becomes due now (workers are told). Returns the due time it had; None if it
    was due already (nothing written). RunNotFound, RunTerminal, RunLeased, RunWaiting."""
    row = tx.lock_run(run_id, "status, lease_owner, lease_expires_at, next_attempt_at")
    if row is None:
        raise RunNotFound(f"run {run_id} does not exist")
    status, owner, expires_at, due_at = row
    if status not in LIVE:
        raise RunTerminal(f"run {run_id} is {status}; there is nothing left to retry")
    if owner is not None and expires_at is not None and expires_at > tx.now:
        raise RunLeased(f"run {run_id} is leased by {owner} for {expires_at - tx.now} ms more: it is running")
    if status == RunStatus.WAITING.value:
        raise RunWaiting(f"run {run_id} is waiting, not backing off: what it awaits makes it due")
    if due_at is None or due_at <= tx.now:
        return None
    tx.execute("UPDATE agent_runs SET next_attempt_at = :now WHERE id = ?", (run_id,))
    tx.wake(claimable=True)
    return int(due_at)
