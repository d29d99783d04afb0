"""A run's inbox: what outsiders write without a lease (signals, decisions on approvals), the
owner's durable waits that consume it, and the audit trail of outsiders' writes.

An outsider locks the run's row as its owner's writes do (``tx.lock_run``), so that the two
are ordered: a run that is ending cannot take a signal nobody will ever receive, and an owner
suspending right now either sees the signal (and stays) or has committed 'waiting' before
the outsider's write looks for its waits. On PostgreSQL the lock is NOWAIT: an outsider never
waits for the row (the caller tries again), so its group commit, which may hold other runs'
rows, can never close a deadlock with an owner's.
"""

from __future__ import annotations

from typing import Any

import attrs

from .._errors import (
    ApprovalConflict,
    ApprovalHashMismatch,
    ApprovalNotRequested,
    InvalidArgument,
    NoDurableIntent,
)
from .._json import decode
from .._json import dump_trusted as _dump
from .._payloads import resolved, stored, texts
from .._types import EventType
from ._tx import Tx, lock_live_run
from ._types import (
    SUBMIT_CHECKPOINT,
    ApprovalOutcome,
    DecideOutcome,
    Lease,
    SendOutcome,
    WaitOutcome,
    approval_of,
    args_hash,
    check_wait_topic,
    signal_received_payload,
)

# -- signals and named waits ------------------------------------------------------------------


def send_signal(tx: Tx, run_id: str, topic: str, payload_json: str, key: str | None) -> SendOutcome:
    """Put a signal in a run's inbox, no lease needed; a run suspended on its topic becomes
    due. With ``key``, a repeat returns the first signal's id and stores nothing.
    RunNotFound, RunTerminal; TransientConflict while the owner writes the run (retried)."""
    if key is not None:  # a retry of a send that went through: its id, whatever happened since
        existing = tx.one("SELECT id FROM signals WHERE run_id = ? AND key = ?", (run_id, key))
        if existing is not None:
            return SendOutcome(int(existing[0]), stored=False)
    # Read before the insert: SQLite would refuse a signal of an unknown run with its own error.
    lock_live_run(tx, run_id, "status", "a terminal run takes no signals")
    # ON CONFLICT: a send with the same key committed after the look above (PostgreSQL).
    inserted = tx.send(
        "INSERT INTO signals (run_id, topic, payload, key, created_at) VALUES (?, ?, ?, ?, :now)"
        " ON CONFLICT (run_id, key) WHERE key IS NOT NULL DO NOTHING RETURNING id",
        (run_id, topic, stored(tx, run_id, payload_json, whole=True), key),
    )
    # Sent with the insert. If the insert lost a key race, the send that won made the run due.
    make_due(tx, run_id, "signal", topic)
    new = inserted.one()
    if new is None:
        (signal_id,) = tx.one("SELECT id FROM signals WHERE run_id = ? AND key = ?", (run_id, key))
        return SendOutcome(int(signal_id), stored=False)
    tx.wake(inbox=run_id)
    return SendOutcome(int(new[0]), stored=True)


def make_due(tx: Tx, run_id: str, kind: str, wake_key: str) -> None:
    """Make the run due now if this is one of the waits it is suspended on (the caller holds
    its row, so this statement sees the wait set of any suspension that committed first), and
    wake the workers if it is due."""
    made = tx.send(
        "UPDATE agent_runs SET next_attempt_at = :now WHERE id = ? AND status = 'waiting'"
        " AND (next_attempt_at IS NULL OR next_attempt_at > :now) AND EXISTS (SELECT 1 FROM run_waits"
        " WHERE run_id = ? AND kind = ? AND wake_key = ?)",
        (run_id, run_id, kind, wake_key),
    )
    if tx.dialect.row_locks:
        # A run that is due and free already is told of too: this outsider holds its row, so a
        # claim running meanwhile skipped it (SKIP LOCKED), and if this write made nothing due,
        # nothing else would tell a worker to look again before its poll.
        due = tx.one(
            "SELECT 1 FROM agent_runs WHERE id = ? AND status IN ('pending', 'running', 'waiting')"
            " AND next_attempt_at <= :now AND (lease_owner IS NULL OR lease_expires_at <= :now)",
            (run_id,),
        )
        woke = due is not None
    else:
        woke = made.count() > 0
    if woke:
        tx.wake(claimable=True)


def await_signal(tx: Tx, lease: Lease, name: str, topic: str, timeout_ms: int | None) -> WaitOutcome:
    """Record wait ``name`` (its deadline on the first call), then bind the oldest unconsumed
    signal of ``topic`` to it, or time it out past its stored deadline; both are logged.
    Fenced; InvalidArgument when the name was first used for another topic."""
    tx.fence(lease)
    tx.execute(
        "INSERT INTO waits (run_id, name, kind, topic, deadline, created_at)"
        " VALUES (?, ?, 'signal', ?, :now + ?, :now) ON CONFLICT (run_id, name) DO NOTHING",
        (lease.run_id, name, topic, timeout_ms),
    )
    stored_topic, deadline, completed_at, signal_id, timed_out = tx.one(
        "SELECT topic, deadline, completed_at, signal_id, timed_out FROM waits WHERE run_id = ? AND name = ?",
        (lease.run_id, name),
    )
    check_wait_topic(lease.run_id, name, stored_topic, topic)
    if completed_at is not None:
        if timed_out:
            return WaitOutcome.timed_out(deadline)
        (payload,) = texts(tx, tx.one("SELECT payload FROM signals WHERE id = ?", (signal_id,)))
        return WaitOutcome.received(payload)
    signal = tx.one(
        "SELECT id, payload FROM signals WHERE run_id = ? AND topic = ? AND consumed_by IS NULL"
        " AND (CAST(? AS BIGINT) IS NULL OR created_at <= ?) ORDER BY id LIMIT 1",
        (lease.run_id, topic, deadline, deadline),  # a signal sent after the deadline is too late
    )
    if signal is not None:
        signal_id, payload = resolved(tx, [signal], (1,))[0]
        tx.execute("UPDATE signals SET consumed_by = ?, consumed_at = :now WHERE id = ?", (name, signal_id))
        tx.execute(
            "UPDATE waits SET completed_at = :now, signal_id = ? WHERE run_id = ? AND name = ?",
            (signal_id, lease.run_id, name),
        )
        event = signal_received_payload(name, topic, signal_id, payload)
        tx.log(lease.run_id, EventType.SIGNAL_RECEIVED, event, f"wait:{name}")
        return WaitOutcome.received(payload)
    if deadline is not None and deadline <= tx.now:
        tx.execute(
            "UPDATE waits SET completed_at = :now, timed_out = 1 WHERE run_id = ? AND name = ?",
            (lease.run_id, name),
        )
        event = _dump({"deadline": deadline, "name": name, "signal": topic})
        tx.log(lease.run_id, EventType.WAIT_TIMED_OUT, event, f"wait:{name}")
        return WaitOutcome.timed_out(deadline)
    return WaitOutcome.pending(None if deadline is None else deadline - tx.now)


def signal_ready(tx: Tx, run_id: str, topic: str, name: str) -> bool:
    """Whether await_signal would now decide the wait (a cheap read, for polling)."""
    row = tx.one(
        "SELECT 1 FROM signals WHERE run_id = ? AND topic = ? AND consumed_by IS NULL"
        " UNION ALL SELECT 1 FROM waits WHERE run_id = ? AND name = ? AND deadline <= :now LIMIT 1",
        (run_id, topic, run_id, name),
    )
    return row is not None


# -- approvals --------------------------------------------------------------------------------

_APPROVAL_COLUMNS = "call_id, approved, decided_by, reason, args_hash, requested_at, decided_at"


def await_approval(tx: Tx, lease: Lease, call_id: str, timeout_ms: int | None) -> ApprovalOutcome:
    """Request approval of a pending intent on the first call (``approval_requested``, with
    its args hash and deadline); log a decision once it is there (``approval_decided``), or
    time the request out. Fenced; NoDurableIntent, InvalidArgument (no longer pending)."""
    tx.fence(lease)
    row = _approval_row(tx, lease.run_id, call_id, lock=True)
    if row is None:
        _request_approval(tx, lease.run_id, call_id, timeout_ms)
        row = _approval_row(tx, lease.run_id, call_id, lock=False)
        assert row is not None
    *fields, deadline, timed_out, logged_at = row
    approval = approval_of(fields)
    if approval.approved is not None:
        if logged_at is None:
            decision = {
                "approved": approval.approved, "args_hash": approval.args_hash, "by": approval.by,
                "call_id": call_id, "reason": approval.reason,
            }  # fmt: skip
            key = f"approval:{call_id}:decided"
            tx.log(lease.run_id, EventType.APPROVAL_DECIDED, _dump(decision), key)
            tx.execute(
                "UPDATE approvals SET logged_at = :now WHERE run_id = ? AND call_id = ?",
                (lease.run_id, call_id),
            )
        return ApprovalOutcome("decided", approval)
    if timed_out:
        return ApprovalOutcome("timed_out", approval)
    if deadline is not None and deadline <= tx.now:
        tx.execute(
            "UPDATE approvals SET timed_out = 1 WHERE run_id = ? AND call_id = ?", (lease.run_id, call_id)
        )
        event = _dump({"deadline": deadline, "name": f"approval:{call_id}", "call_id": call_id})
        tx.log(lease.run_id, EventType.WAIT_TIMED_OUT, event, f"approval:{call_id}:timed_out")
        return ApprovalOutcome("timed_out", approval)
    return ApprovalOutcome("pending", approval, None if deadline is None else deadline - tx.now)


def _approval_row(tx: Tx, run_id: str, call_id: str, *, lock: bool) -> Any:
    # ``lock``: held against the other side's write until the transaction ends; NOWAIT, as every
    # row lock of a writer (see _tx.py), so a row held elsewhere is a conflict retried, not a wait.
    return tx.one(
        f"SELECT {_APPROVAL_COLUMNS}, deadline, timed_out, logged_at FROM approvals"
        f" WHERE run_id = ? AND call_id = ?{tx.dialect.for_update_nowait if lock else ''}",
        (run_id, call_id),
    )


def _request_approval(tx: Tx, run_id: str, call_id: str, timeout_ms: int | None) -> None:
    intent = tx.one(
        "SELECT t.name, t.result_seq, e.payload FROM tool_intents AS t"
        " JOIN events AS e ON e.run_id = t.run_id AND e.seq = t.intent_seq"
        " WHERE t.run_id = ? AND t.call_id = ?",
        (run_id, call_id),
    )
    if intent is None:
        raise NoDurableIntent(f"run {run_id}: tool call {call_id!r} has no durable intent to approve")
    name, result_seq, payload_json = resolved(tx, [intent], (2,))[0]
    if result_seq is not None:
        raise InvalidArgument(
            f"run {run_id}: tool call {call_id!r} already has a result; approval is for pending calls"
        )
    if name == SUBMIT_CHECKPOINT:
        raise InvalidArgument(
            f"run {run_id}: {call_id!r} is a {SUBMIT_CHECKPOINT} call; its verifier decides it"
        )
    args = decode(payload_json)["args"]
    hash_ = args_hash(name, args)
    tx.execute(
        "INSERT INTO approvals (run_id, call_id, tool_name, args_hash, requested_at, deadline)"
        " VALUES (?, ?, ?, ?, :now, :now + ?)",
        (run_id, call_id, name, hash_, timeout_ms),
    )
    request = _dump({"args": args, "args_hash": hash_, "call_id": call_id, "name": name})
    tx.log(run_id, EventType.APPROVAL_REQUESTED, request, f"approval:{call_id}:requested")


def decide_approval(
    tx: Tx, run_id: str, call_id: str, approved: bool, by: str, reason: str, expected_hash: str | None
) -> DecideOutcome:
    """An outsider's decision, no lease needed; deciding the same way again is a no-op. A
    run suspended on the approval becomes due. RunNotFound, RunTerminal, NoDurableIntent,
    ApprovalNotRequested, ApprovalConflict, ApprovalHashMismatch."""
    lock_live_run(tx, run_id, "status", "its approvals can no longer be decided")
    row = _approval_row(tx, run_id, call_id, lock=True)
    where = f"run {run_id}: tool call {call_id!r}"
    if row is None:
        if tx.one("SELECT 1 FROM tool_intents WHERE run_id = ? AND call_id = ?", (run_id, call_id)) is None:
            raise NoDurableIntent(f"{where} has no durable intent")
        raise ApprovalNotRequested(f"{where} has no approval request")
    *fields, deadline, timed_out, _ = row
    current = approval_of(fields)
    if expected_hash is not None and expected_hash != current.args_hash:
        raise ApprovalHashMismatch(
            f"{where}: the arguments approved (hash {expected_hash}) are not the intent's"
            f" ({current.args_hash})"
        )
    if timed_out or (deadline is not None and deadline <= tx.now):
        raise ApprovalConflict(f"{where}: the approval request timed out before a decision")
    answered = tx.one(
        "SELECT result_seq FROM tool_intents WHERE run_id = ? AND call_id = ?", (run_id, call_id)
    )
    if current.approved is None and answered is not None and answered[0] is not None:
        raise ApprovalConflict(f"{where} already has a result: there is nothing left to approve")
    if current.approved is not None:
        if current.approved != approved:
            verdict = "approved" if current.approved else "denied"
            raise ApprovalConflict(f"{where} was already {verdict} by {current.by}")
        return DecideOutcome(current, recorded=False)  # nothing changed: nobody to wake
    tx.execute(
        "UPDATE approvals SET approved = ?, decided_by = ?, reason = ?, decided_at = :now"
        " WHERE run_id = ? AND call_id = ?",
        (int(approved), by, reason, run_id, call_id),
    )
    tx.wake(inbox=run_id)
    make_due(tx, run_id, "approval", call_id)
    return DecideOutcome(attrs.evolve(current, approved=approved, by=by, reason=reason, decided_at=tx.now))


def approval_ready(tx: Tx, run_id: str, call_id: str) -> bool:
    """Whether await_approval would now decide (a cheap read, for polling)."""
    row = tx.one(
        "SELECT 1 FROM approvals WHERE run_id = ? AND call_id = ?"
        " AND (decided_at IS NOT NULL OR timed_out = 1 OR deadline <= :now)",
        (run_id, call_id),
    )
    return row is not None


# -- what an owner reads of its inbox, and the audit trail ------------------------------------


def record_action(tx: Tx, run_id: str, action: str, by: str | None, detail_json: str) -> None:
    """Append a row to the outsiders' audit trail (``outsider_actions``), in the transaction
    of the write it describes."""
    tx.execute(
        "INSERT INTO outsider_actions (run_id, action, done_by, detail, created_at)"
        " VALUES (?, ?, ?, ?, :now)",
        (run_id, action, by, detail_json),
    )
