"""SQLite operations behind runs: each function is one operation on the database thread.

Every function takes a :class:`Tx` first and runs inside a transaction (a SAVEPOINT of the
writer's group commit, or a read snapshot). A function that raises leaves nothing behind.
Writes on behalf of a run owner are *fenced*: they first check, inside the same transaction,
that the owner's (owner, epoch) still holds an unexpired lease on a running run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from .._budget import (
    BUDGET_COLUMNS,
    LIMIT_COLUMNS,
    Usage,
    judge,
    usage_of,
)
from .._errors import (
    ApprovalConflict,
    ApprovalHashMismatch,
    ApprovalNotRequested,
    InvalidArgument,
    NoDurableIntent,
    RunLeased,
    RunNotFound,
    RunTerminal,
    RunWaiting,
)
from .._json import decode
from .._json import dump_trusted as _dump
from .._owner import Owner, Verdict, gone_holders, this_process
from .._owner import judge as judge_holder
from .._store._ends import cancel_descendants as _cancel_descendants
from .._store._ends import cancel_unowned as _cancel_unowned
from .._store._ends import fail_exhausted as _fail_exhausted
from .._store._ends import request_cancel as _request_cancel
from .._store._log import get_run
from .._store._types import (
    SUBMIT_CHECKPOINT,
    ApprovalOutcome,
    Awaited,
    CancelOutcome,
    Claims,
    DecideOutcome,
    JoinOutcome,
    Lease,
    LostAttempt,
    NewChild,
    OpenWait,
    SendOutcome,
    WaitKind,
    WaitOutcome,
    approval_of,
    args_hash,
    check_wait_topic,
    earliest,
    exhausted_reason,
    lost_attempt,
    signal_received_payload,
    suspension_payload,
)
from .._types import EventType, RunRecord, RunStatus, ToolCall
from ._connection import Tx

_LIVE = (RunStatus.PENDING.value, RunStatus.RUNNING.value, RunStatus.WAITING.value)


# -- acquiring and keeping leases ---------------------------------------------------------------


def create_run(
    tx: Tx,
    run_id: str,
    parent_run_id: str | None,
    role: str,
    provider: str,
    config_json: str,
    owner: str,
    ttl_ms: int,
    budget: tuple[Any, ...] | None = None,
) -> Lease:
    """Insert a run that is already leased and running, with its first event (and its budget's
    limits, in LIMIT_COLUMNS order), at once."""
    if (
        parent_run_id is not None
        and tx.one("SELECT 1 FROM agent_runs WHERE id = ?", (parent_run_id,)) is None
    ):
        raise RunNotFound(f"parent run {parent_run_id} does not exist")
    expires_at = tx.now + ttl_ms
    row = (run_id, parent_run_id, role, provider, config_json, tx.now, tx.now, owner, expires_at, tx.now)
    tx.execute(
        "INSERT INTO agent_runs (id, parent_run_id, role, provider, status, config, created_at,"
        " updated_at, last_seq, lease_owner, lease_epoch, lease_expires_at, next_attempt_at, lease_host,"
        " lease_pid, lease_process_start)"
        " VALUES (?, ?, ?, ?, 'running', ?, ?, ?, 0, ?, 1, ?, ?, ?, ?, ?)",
        (*row, *this_process().as_row()),
    )
    _insert_event(tx, run_id, 0, EventType.STATE_TRANSITION, '{"from":"pending","to":"running"}')
    if budget is None:
        return Lease(run_id, owner, 1, ttl_ms, expires_at, config_json=config_json)
    _insert_budget(tx, run_id, budget)
    return Lease(run_id, owner, 1, ttl_ms, expires_at, _wall_end(tx, run_id), config_json=config_json)


_LEASE_ROW = "lease_owner, lease_epoch, lease_expires_at, lease_host, lease_pid, lease_process_start"
"""The columns that say who held a lease, for :func:`lost_attempt`."""


def acquire_run(tx: Tx, run_id: str, owner: str, ttl_ms: int, force: bool) -> Lease | None:
    """Take a free or expired lease (any lease with ``force``), and start a pending run. None:
    the run had a cancellation request its dead owner never acted on, and was cancelled now."""
    row = tx.one(
        f"SELECT status, cancel_reason, attempts, {_LEASE_ROW} FROM agent_runs WHERE id = ?", (run_id,)
    )
    if row is None:
        raise RunNotFound(f"run {run_id} does not exist")
    status, cancel_reason, attempts, *lease_row = row
    lease_owner, epoch, expires_at, *holder = lease_row
    if status not in _LIVE:
        raise RunTerminal(f"run {run_id} is {status}; a terminal run cannot be leased")
    if lease_owner is not None and expires_at > tx.now and not force:
        verdict = judge_holder(Owner(*holder))
        if not verdict.at_once:
            raise RunLeased(_still_leased(run_id, epoch, expires_at - tx.now, verdict))
    lost = lost_attempt(tx.now, lease_row, attempts, forced=force)
    if cancel_reason is not None:
        _cancel_unowned(tx, run_id, status, cancel_reason, lost)
        return None
    return _take(tx, run_id, status, owner, epoch + 1, ttl_ms, lost)


def _still_leased(run_id: str, epoch: int, remaining_ms: int, verdict: Verdict) -> str:
    held = f"run {run_id} is leased by another owner (epoch {epoch}) for {remaining_ms} ms more"
    if verdict.gone:  # a process it started may still apply an effect: let the lease expire
        return f"{held}: {verdict.reason}; it is taken when the lease expires"
    return f"{held}; pass force=True only once that owner is known to be dead"


def claim_due(tx: Tx, owner: str, ttl_ms: int, max_attempts: int | None, limit: int) -> Claims:
    """Lease up to ``limit`` of the longest-due runs that are free or expired (first those of
    dead owners of this host); each gets its epoch and attempt count incremented, and a lease
    nobody released its ``attempt_lost``.

    A run that already used ``max_attempts`` claims (its last owner died mid-attempt) is
    failed here instead of being handed out again.
    """
    claims = Claims()
    _take_from_the_dead(tx, owner, ttl_ms, max_attempts, limit, claims)
    while len(claims.leased) < limit:
        rows = tx.all(
            f"SELECT id, status, attempts, cancel_reason, {_LEASE_ROW} FROM agent_runs"
            " INDEXED BY idx_agent_runs_claimable"
            " WHERE status IN ('pending', 'running', 'waiting') AND next_attempt_at <= ?1"
            " AND (lease_owner IS NULL OR lease_expires_at <= ?1)"
            " ORDER BY next_attempt_at, created_at LIMIT ?2",
            (tx.now, limit - len(claims.leased)),
        )
        if not rows:
            break
        for run_id, status, attempts, cancel_reason, *lease_row in rows:
            lost = lost_attempt(tx.now, lease_row, attempts, max_attempts)
            claim = _Claim(run_id, status, lease_row[1], attempts, cancel_reason, lost)
            _claim_one(tx, claims, claim, owner, ttl_ms, max_attempts)
    return claims


@attrs.frozen
class _Claim:
    """A claimable run, as a claim read it."""

    run_id: str
    status: str
    epoch: int
    attempts: int
    cancel_reason: str | None
    lost: LostAttempt | None


def _claim_one(tx: Tx, claims: Claims, c: _Claim, owner: str, ttl_ms: int, max_attempts: int | None) -> None:
    """Lease one run to a worker, or end it: cancelled (its owner died before it could stop),
    or failed (out of attempts)."""
    run_id, status, attempts, lost = c.run_id, c.status, c.attempts, c.lost
    if c.cancel_reason is not None:
        _cancel_unowned(tx, run_id, status, c.cancel_reason, lost)
        claims.ended.append((run_id, RunStatus.CANCELLED, c.cancel_reason))
        return
    if max_attempts is not None and attempts >= max_attempts:
        reason = exhausted_reason(attempts, max_attempts, _how_the_last_ended(lost))
        _fail_exhausted(tx, run_id, status, reason, lost)
        claims.ended.append((run_id, RunStatus.FAILED, reason))
        return
    tx.execute("UPDATE agent_runs SET attempts = attempts + 1 WHERE id = ?", (run_id,))
    claims.leased.append((_take(tx, run_id, status, owner, c.epoch + 1, ttl_ms, lost), attempts + 1))
    if lost is not None:
        claims.lost[run_id] = lost


def next_due_in(tx: Tx) -> int | None:
    """Milliseconds until the next run becomes due by itself (a backoff, a deadline, a wake
    time), None if none will: an idle worker sleeps until then rather than a poll late."""
    (due,) = tx.one(
        "SELECT min(next_attempt_at) - ? FROM agent_runs INDEXED BY idx_agent_runs_claimable"
        " WHERE status IN ('pending', 'running', 'waiting') AND next_attempt_at > ?",
        (tx.now, tx.now),
    )
    return None if due is None else int(due)


def work_ahead(tx: Tx) -> bool:
    """Whether a live run is, or will become, claimable with no outsider's write: a pending or
    running one (due now, backing off, or leased: a lease comes free when its owner lets go or
    dies), or a suspended one in a durable sleep, or woken already. Runs suspended on a
    signal, an approval, a child or a budget are not work ahead, deadline or not. Read when a
    worker with ``until_idle`` is idle, so a scan past many suspended runs is rare."""
    row = tx.one(
        "SELECT 1 FROM agent_runs WHERE status IN ('pending', 'running')"
        " OR (status = 'waiting' AND (next_attempt_at <= ?1 OR EXISTS (SELECT 1 FROM run_waits AS w"
        " WHERE w.run_id = agent_runs.id AND w.kind = 'sleep'))) LIMIT 1",
        (tx.now,),
    )
    return row is not None


def _how_the_last_ended(lost: LostAttempt | None) -> str:
    return "ended without finishing the run" if lost is None else lost.summary()


def _take(
    tx: Tx, run_id: str, status: str, owner: str, epoch: int, ttl_ms: int, lost: LostAttempt | None = None
) -> Lease:
    """Lease the run to ``owner`` (this process: its identity is stored with the lease); a
    pending or suspended run starts running; a lease its owner never released is taken over:
    ``attempt_lost``, then ``lease_taken_over`` (at once, or after it expired)."""
    expires_at = tx.now + ttl_ms
    me = this_process()
    (config_json,) = tx.one(
        "UPDATE agent_runs SET lease_owner = ?, lease_epoch = ?, lease_expires_at = ?,"
        " status = 'running', wait_kind = NULL, wait_target = NULL, lease_host = ?, lease_pid = ?,"
        " lease_process_start = ? WHERE id = ? RETURNING config",
        (owner, epoch, expires_at, *me.as_row(), run_id),
    )
    if lost is not None:
        seq = _allocate(tx, run_id, 2)
        _insert_event(tx, run_id, seq, EventType.ATTEMPT_LOST, _dump(lost.payload()))
        _insert_event(tx, run_id, seq + 1, EventType.LEASE_TAKEN_OVER, _dump(lost.takeover_payload()))
    if status != RunStatus.RUNNING:
        seq = _allocate(tx, run_id, 1)
        transition = _dump({"from": status, "to": "running"})
        _insert_event(tx, run_id, seq, EventType.STATE_TRANSITION, transition)
    return Lease(run_id, owner, epoch, ttl_ms, expires_at, _wall_end(tx, run_id), config_json=config_json)


def renew(tx: Tx, lease: Lease) -> tuple[Lease, str | None]:
    """Extend an unexpired lease; and the reason of a cancellation requested meanwhile. "Now"
    is read after the write lock is held, so a renewal that waited behind other writers past its
    expiry cannot bring the lease back."""
    expires_at = tx.now + lease.ttl_ms
    updated = tx.one(
        "UPDATE agent_runs SET lease_expires_at = ? WHERE id = ? AND lease_owner = ?"
        " AND lease_epoch = ? AND status = 'running' AND lease_expires_at > ? RETURNING cancel_reason",
        (expires_at, lease.run_id, lease.owner, lease.epoch, tx.now),
    )
    if updated is None:
        tx.fence(lease)  # raises with the reason
    return attrs.evolve(lease, expires_at=expires_at, wall_time_ends_at=_wall_end(tx, lease.run_id)), updated[
        0
    ]


# -- the event log ------------------------------------------------------------------------------


def _allocate(tx: Tx, run_id: str, count: int) -> int:
    """Reserve ``count`` consecutive seqs for the run; returns the first."""
    (last,) = tx.one(
        "UPDATE agent_runs SET last_seq = last_seq + ?, updated_at = ? WHERE id = ? RETURNING last_seq",
        (count, tx.now, run_id),
    )
    return int(last) - count + 1


def _insert_event(
    tx: Tx, run_id: str, seq: int, type: EventType, payload_json: str, key: str | None = None
) -> None:
    tx.execute(
        "INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (run_id, seq, type.value, payload_json, key, tx.now),
    )


# -- reading ------------------------------------------------------------------------------------


# -- checkpoints --------------------------------------------------------------------------------


# -- durable steps and sleeps -------------------------------------------------------------------


# -- signals and named waits --------------------------------------------------------------------


def send_signal(tx: Tx, run_id: str, topic: str, payload_json: str, key: str | None) -> SendOutcome:
    """Put a signal in the run's inbox (no lease: outsiders send); a run suspended on the topic
    becomes due at once."""
    if key is not None:  # a retry of a send that went through: its id, whatever happened since
        existing = tx.one("SELECT id FROM signals WHERE run_id = ? AND key = ?", (run_id, key))
        if existing is not None:
            return SendOutcome(int(existing[0]), stored=False, woke=False)
    row = tx.one("SELECT status FROM agent_runs WHERE id = ?", (run_id,))
    if row is None:
        raise RunNotFound(f"run {run_id} does not exist")
    if row[0] not in _LIVE:
        raise RunTerminal(f"run {run_id} is {row[0]}; a terminal run takes no signals")
    (signal_id,) = tx.one(
        "INSERT INTO signals (run_id, topic, payload, key, created_at) VALUES (?, ?, ?, ?, ?) RETURNING id",
        (run_id, topic, payload_json, key, tx.now),
    )
    return SendOutcome(int(signal_id), stored=True, woke=_wake(tx, run_id, "signal", topic))


def _wake(tx: Tx, run_id: str, kind: str, wake_key: str) -> bool:
    """Make the run due now if this is one of the waits it is suspended on; whether it was."""
    return bool(
        tx.execute(
            "UPDATE agent_runs SET next_attempt_at = ?1 WHERE id = ?2 AND status = 'waiting'"
            " AND (next_attempt_at IS NULL OR next_attempt_at > ?1) AND EXISTS (SELECT 1 FROM run_waits"
            " WHERE run_id = ?2 AND kind = ?3 AND wake_key = ?4)",
            (tx.now, run_id, kind, wake_key),
        ).rowcount
    )


def suspend(tx: Tx, lease: Lease, waits: Sequence[OpenWait]) -> bool:
    """Unless one of ``waits`` can complete now (what it awaits is there, or its deadline has
    passed), suspend the run on all of them: log running -> waiting (what, until when), record
    each wait, give the lease and the claim's attempt back, and leave the run due at the
    earliest deadline (None: only when an outsider's write for one of them makes it due). Not
    while a cancellation is requested: the owner acts on that instead. Fenced."""
    tx.fence(lease)
    if cancel_requested(tx, lease.run_id) is not None:
        return False
    awaited = [_awaited(tx, lease.run_id, kind, name) for kind, name in dict.fromkeys(waits)]
    pending = [found for found in awaited if found is not None and not found.due(tx.now)]
    if not pending or len(pending) < len(awaited):
        return False
    until = earliest(found.deadline for found in pending)
    seq = _allocate(tx, lease.run_id, 1)
    _insert_event(tx, lease.run_id, seq, EventType.STATE_TRANSITION, suspension_payload(pending, until))
    first = pending[0]
    tx.execute(
        "UPDATE agent_runs SET status = 'waiting', wait_kind = ?, wait_target = ?, next_attempt_at = ?,"
        " lease_owner = NULL, lease_expires_at = NULL, attempts = max(0, attempts - 1) WHERE id = ?",
        (first.kind, first.wake_key, until, lease.run_id),
    )
    tx.execute("DELETE FROM run_waits WHERE run_id = ?", (lease.run_id,))
    for found in pending:
        tx.execute(
            "INSERT INTO run_waits (run_id, kind, wake_key, name, deadline, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (lease.run_id, found.kind, found.wake_key, found.name, found.deadline, tx.now),
        )
    return True


def _awaited(tx: Tx, run_id: str, kind: WaitKind, name: str) -> Awaited | None:
    """What wait ``name`` still awaits; None if it is there (or the wait is no longer open)."""
    if kind == "signal":
        row = tx.one(
            "SELECT topic, deadline FROM waits WHERE run_id = ? AND name = ? AND completed_at IS NULL",
            (run_id, name),
        )
        if row is None or signal_ready(tx, run_id, row[0], name):
            return None
        return Awaited(kind, name, row[0], row[1])
    if kind == "approval":
        row = tx.one(
            "SELECT deadline FROM approvals WHERE run_id = ? AND call_id = ? AND decided_at IS NULL"
            " AND timed_out = 0",
            (run_id, name),
        )
        return None if row is None else Awaited(kind, name, name, row[0])
    if kind == "budget":
        usage = budget_usage(tx, run_id)
        reached = None if usage is None else judge(usage)
        return None if reached is None else Awaited(kind, reached.limit, "", None)
    if kind == "child":
        row = tx.one(
            "SELECT j.deadline FROM joins AS j JOIN agent_runs AS c ON c.id = j.child_id"
            " WHERE j.run_id = ? AND j.child_id = ? AND j.completed_at IS NULL"
            " AND c.status IN ('pending', 'running', 'waiting')",
            (run_id, name),
        )
        return None if row is None else Awaited(kind, name, name, row[0])
    row = tx.one(
        "SELECT wake_at FROM timers WHERE run_id = ? AND name = ? AND completed_at IS NULL", (run_id, name)
    )
    return None if row is None else Awaited(kind, name, name, row[0])


def await_signal(tx: Tx, lease: Lease, name: str, topic: str, timeout_ms: int | None) -> WaitOutcome:
    """Record wait ``name`` on its first call; bind the oldest unconsumed signal of ``topic``
    to it, or time it out past its stored deadline. Fenced; what is decided is logged."""
    tx.fence(lease)
    tx.execute(
        "INSERT INTO waits (run_id, name, kind, topic, deadline, created_at)"
        " VALUES (?, ?, 'signal', ?, ?, ?) ON CONFLICT (run_id, name) DO NOTHING",
        (lease.run_id, name, topic, None if timeout_ms is None else tx.now + timeout_ms, tx.now),
    )
    stored_topic, deadline, completed_at, signal_id, timed_out = tx.one(
        "SELECT topic, deadline, completed_at, signal_id, timed_out FROM waits WHERE run_id = ? AND name = ?",
        (lease.run_id, name),
    )
    check_wait_topic(lease.run_id, name, stored_topic, topic)
    if completed_at is not None:
        if timed_out:
            return WaitOutcome.timed_out(deadline)
        (payload,) = tx.one("SELECT payload FROM signals WHERE id = ?", (signal_id,))
        return WaitOutcome.received(payload)
    signal = tx.one(
        "SELECT id, payload FROM signals WHERE run_id = ? AND topic = ? AND consumed_by IS NULL"
        " AND (CAST(? AS BIGINT) IS NULL OR created_at <= ?) ORDER BY id LIMIT 1",
        (lease.run_id, topic, deadline, deadline),  # a signal sent after the deadline is too late
    )
    if signal is not None:
        signal_id, payload = signal
        tx.execute(
            "UPDATE signals SET consumed_by = ?, consumed_at = ? WHERE id = ?", (name, tx.now, signal_id)
        )
        tx.execute(
            "UPDATE waits SET completed_at = ?, signal_id = ? WHERE run_id = ? AND name = ?",
            (tx.now, signal_id, lease.run_id, name),
        )
        seq = _allocate(tx, lease.run_id, 1)
        event = signal_received_payload(name, topic, signal_id, payload)
        _insert_event(tx, lease.run_id, seq, EventType.SIGNAL_RECEIVED, event, f"wait:{name}")
        return WaitOutcome.received(payload)
    if deadline is not None and deadline <= tx.now:
        tx.execute(
            "UPDATE waits SET completed_at = ?, timed_out = 1 WHERE run_id = ? AND name = ?",
            (tx.now, lease.run_id, name),
        )
        seq = _allocate(tx, lease.run_id, 1)
        event = _dump({"deadline": deadline, "name": name, "signal": topic})
        _insert_event(tx, lease.run_id, seq, EventType.WAIT_TIMED_OUT, event, f"wait:{name}")
        return WaitOutcome.timed_out(deadline)
    return WaitOutcome.pending(None if deadline is None else deadline - tx.now)


def signal_ready(tx: Tx, run_id: str, topic: str, name: str) -> bool:
    """A cheap read for a waiting owner: is there something for wait ``name`` to decide?"""
    row = tx.one(
        "SELECT 1 FROM signals WHERE run_id = ? AND topic = ? AND consumed_by IS NULL"
        " UNION ALL SELECT 1 FROM waits WHERE run_id = ? AND name = ? AND deadline <= ? LIMIT 1",
        (run_id, topic, run_id, name, tx.now),
    )
    return row is not None


# -- approvals ----------------------------------------------------------------------------------

_ROW_LOCK = ""
_OUTSIDER_LOCK = ""  # one writer: nothing to order against
_APPROVAL_COLUMNS = "call_id, approved, decided_by, reason, args_hash, requested_at, decided_at"


def await_approval(tx: Tx, lease: Lease, call_id: str, timeout_ms: int | None) -> ApprovalOutcome:
    """Request approval of a pending intent on the first call; log its decision once there,
    or time the request out past its stored deadline. Fenced."""
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
            seq = _allocate(tx, lease.run_id, 1)
            _insert_event(
                tx,
                lease.run_id,
                seq,
                EventType.APPROVAL_DECIDED,
                _dump(decision),
                f"approval:{call_id}:decided",
            )
            tx.execute(
                "UPDATE approvals SET logged_at = ? WHERE run_id = ? AND call_id = ?",
                (tx.now, lease.run_id, call_id),
            )
        return ApprovalOutcome("decided", approval)
    if timed_out:
        return ApprovalOutcome("timed_out", approval)
    if deadline is not None and deadline <= tx.now:
        tx.execute(
            "UPDATE approvals SET timed_out = 1 WHERE run_id = ? AND call_id = ?", (lease.run_id, call_id)
        )
        seq = _allocate(tx, lease.run_id, 1)
        event = _dump({"deadline": deadline, "name": f"approval:{call_id}", "call_id": call_id})
        _insert_event(tx, lease.run_id, seq, EventType.WAIT_TIMED_OUT, event, f"approval:{call_id}:timed_out")
        return ApprovalOutcome("timed_out", approval)
    return ApprovalOutcome("pending", approval, None if deadline is None else deadline - tx.now)


def _approval_row(tx: Tx, run_id: str, call_id: str, *, lock: bool) -> Any:
    return tx.one(
        f"SELECT {_APPROVAL_COLUMNS}, deadline, timed_out, logged_at FROM approvals"
        f" WHERE run_id = ? AND call_id = ?{_ROW_LOCK if lock else ''}",
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
    name, result_seq, payload_json = intent
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
        " VALUES (?, ?, ?, ?, ?, ?)",
        (run_id, call_id, name, hash_, tx.now, None if timeout_ms is None else tx.now + timeout_ms),
    )
    seq = _allocate(tx, run_id, 1)
    request = _dump({"args": args, "args_hash": hash_, "call_id": call_id, "name": name})
    _insert_event(tx, run_id, seq, EventType.APPROVAL_REQUESTED, request, f"approval:{call_id}:requested")


def decide_approval(
    tx: Tx, run_id: str, call_id: str, approved: bool, by: str, reason: str, expected_hash: str | None
) -> DecideOutcome:
    """An outsider's decision on a requested approval; the same decision again is a no-op."""
    status = tx.one("SELECT status FROM agent_runs WHERE id = ?", (run_id,))
    if status is None:
        raise RunNotFound(f"run {run_id} does not exist")
    if status[0] not in _LIVE:
        raise RunTerminal(f"run {run_id} is {status[0]}; its approvals can no longer be decided")
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
        return DecideOutcome(current, woke=False, recorded=False)
    tx.execute(
        "UPDATE approvals SET approved = ?, decided_by = ?, reason = ?, decided_at = ?"
        " WHERE run_id = ? AND call_id = ?",
        (int(approved), by, reason, tx.now, run_id, call_id),
    )
    _notify_inbox(tx, run_id)
    decided = attrs.evolve(current, approved=approved, by=by, reason=reason, decided_at=tx.now)
    return DecideOutcome(decided, woke=_wake(tx, run_id, "approval", call_id))


def approval_ready(tx: Tx, run_id: str, call_id: str) -> bool:
    """A cheap read for a waiting owner: is the approval decided, or past its deadline?"""
    row = tx.one(
        "SELECT 1 FROM approvals WHERE run_id = ? AND call_id = ?"
        " AND (decided_at IS NOT NULL OR timed_out = 1 OR deadline <= ?)",
        (run_id, call_id, tx.now),
    )
    return row is not None


def _notify_inbox(tx: Tx, run_id: str) -> None:
    pass  # one process writes SQLite: the in-process wake-up is enough


# -- child runs ---------------------------------------------------------------------------------


def owner_news(tx: Tx, run_id: str) -> tuple[str | None, int | None]:
    """A cancellation requested and not yet acted on, and when the run's wall time runs out."""
    return cancel_requested(tx, run_id), _wall_end(tx, run_id)


def cancel_requested(tx: Tx, run_id: str) -> str | None:
    """The reason of a cancellation requested and not yet acted on."""
    row = tx.one("SELECT cancel_reason, cancel_requested_at FROM agent_runs WHERE id = ?", (run_id,))
    return None if row is None or row[1] is None else str(row[0])


def _wall_end(tx: Tx, run_id: str) -> int | None:
    """When the run's budget of wall time runs out (its creation plus the limit), if it has one."""
    row = tx.one(
        "SELECT r.created_at + b.max_wall_time_ms FROM budgets AS b JOIN agent_runs AS r ON r.id = b.run_id"
        " WHERE b.run_id = ? AND b.max_wall_time_ms IS NOT NULL",
        (run_id,),
    )
    return None if row is None else int(row[0])


def spawn_children(tx: Tx, lease: Lease, children: Sequence[NewChild]) -> list[str]:
    """Create each child once, pending and unleased; a repeat returns its id."""
    tx.fence(lease)
    return [_spawn(tx, lease.run_id, child) for child in children]


def _spawn(tx: Tx, parent_id: str, child: NewChild) -> str:
    existing = tx.one(
        "SELECT id FROM agent_runs WHERE parent_run_id = ? AND spawn_name = ?", (parent_id, child.name)
    )
    if existing is not None:
        return str(existing[0])
    tx.execute(
        "INSERT INTO agent_runs (id, parent_run_id, role, provider, status, config, created_at,"
        " updated_at, next_attempt_at, spawn_name) VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?)",
        (
            child.child_id,
            parent_id,
            child.role,
            child.provider,
            child.config_json,
            tx.now,
            tx.now,
            tx.now,
            child.name,
        ),
    )
    seq = _allocate(tx, parent_id, 1)
    event = _dump({"child_id": child.child_id, "name": child.name, "role": child.role})
    _insert_event(tx, parent_id, seq, EventType.CHILD_SPAWNED, event, f"spawn:{child.name}")
    if child.budget is not None:  # the child's own, whatever its parent spends
        _insert_budget(tx, child.child_id, child.budget)
    return child.child_id


def await_child(tx: Tx, lease: Lease, child_id: str, timeout_ms: int | None) -> JoinOutcome:
    """Record the join on its first call; log ``child_joined`` once the child has ended, or
    time the join out past its stored deadline. Fenced."""
    tx.fence(lease)
    return _look_at_join(tx, lease.run_id, child_id, timeout_ms)


def join_children(tx: Tx, lease: Lease, child_ids: Sequence[str]) -> list[RunRecord | None]:
    """await_child with no deadline for each: the ended children's records, None for the rest."""
    tx.fence(lease)
    return [_look_at_join(tx, lease.run_id, child_id, None).child for child_id in child_ids]


def _look_at_join(tx: Tx, parent_id: str, child_id: str, timeout_ms: int | None) -> JoinOutcome:
    parent = tx.one("SELECT parent_run_id FROM agent_runs WHERE id = ?", (child_id,))
    if parent is None or parent[0] != parent_id:
        raise InvalidArgument(f"run {parent_id}: {child_id} is not a child of this run")
    tx.execute(
        "INSERT INTO joins (run_id, child_id, deadline, created_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (run_id, child_id) DO NOTHING",
        (parent_id, child_id, None if timeout_ms is None else tx.now + timeout_ms, tx.now),
    )
    deadline, completed_at, timed_out = tx.one(
        "SELECT deadline, completed_at, timed_out FROM joins WHERE run_id = ? AND child_id = ?",
        (parent_id, child_id),
    )
    if timed_out:
        return JoinOutcome("timed_out")
    child = get_run(tx, child_id)
    if completed_at is not None:
        return JoinOutcome("ended", child)
    if child.status.is_terminal:
        tx.execute(
            "UPDATE joins SET completed_at = ? WHERE run_id = ? AND child_id = ?",
            (tx.now, parent_id, child_id),
        )
        seq = _allocate(tx, parent_id, 1)
        event = _dump({"child_id": child_id, "result": child.result, "status": child.status.value})
        _insert_event(tx, parent_id, seq, EventType.CHILD_JOINED, event, f"join:{child_id}")
        return JoinOutcome("ended", child)
    if deadline is not None and deadline <= tx.now:
        tx.execute(
            "UPDATE joins SET completed_at = ?, timed_out = 1 WHERE run_id = ? AND child_id = ?",
            (tx.now, parent_id, child_id),
        )
        seq = _allocate(tx, parent_id, 1)
        event = _dump({"child_id": child_id, "deadline": deadline, "name": f"join:{child_id}"})
        _insert_event(tx, parent_id, seq, EventType.WAIT_TIMED_OUT, event, f"join:{child_id}")
        return JoinOutcome("timed_out")
    return JoinOutcome("pending", remaining_ms=None if deadline is None else deadline - tx.now)


def ended_children(tx: Tx, child_ids: Sequence[str]) -> set[str]:
    """Those of ``child_ids`` that have ended."""
    marks = ", ".join("?" * len(child_ids))
    found = tx.all(
        f"SELECT id FROM agent_runs WHERE id IN ({marks}) AND status IN ('completed', 'failed', 'cancelled')",
        tuple(child_ids),
    )
    return {str(row[0]) for row in found}


def child_ready(tx: Tx, run_id: str, child_id: str) -> bool:
    """A cheap read for a joining owner: has the child ended, or the join's deadline passed?"""
    row = tx.one(
        "SELECT 1 FROM agent_runs WHERE id = ? AND status IN ('completed', 'failed', 'cancelled')"
        " UNION ALL SELECT 1 FROM joins WHERE run_id = ? AND child_id = ? AND deadline <= ? LIMIT 1",
        (child_id, run_id, child_id, tx.now),
    )
    return row is not None


def cancel_run(tx: Tx, run_id: str, reason: str) -> CancelOutcome:
    """An outsider's cancellation: end an unowned run now, ask an owned one's owner to; the
    same for every live descendant."""
    row = tx.one("SELECT status, lease_owner, lease_expires_at FROM agent_runs WHERE id = ?", (run_id,))
    if row is None:
        raise RunNotFound(f"run {run_id} does not exist")
    status, owner, expires_at = row
    if status not in _LIVE:
        return CancelOutcome((), (), already_terminal=status)
    if owner is not None and expires_at > tx.now:
        _request_cancel(tx, run_id, reason)
        cancelled, requested = _cancel_descendants(tx, run_id, reason)
        return CancelOutcome(tuple(cancelled), (run_id, *requested))
    _cancel_unowned(tx, run_id, status, reason)
    return CancelOutcome((run_id,), ())


def cancel_child(tx: Tx, lease: Lease, child_id: str, reason: str) -> CancelOutcome:
    """The parent's cancellation of one of its children. Fenced; InvalidArgument (not a child)."""
    tx.fence(lease)
    parent = tx.one("SELECT parent_run_id FROM agent_runs WHERE id = ?", (child_id,))
    if parent is None or parent[0] != lease.run_id:
        raise InvalidArgument(f"run {lease.run_id}: {child_id} is not a child of this run")
    return cancel_run(tx, child_id, reason)


# -- budgets ------------------------------------------------------------------------------------


def _age(tx: Tx, run_id: str) -> int:
    """How long the run has lived, in ms: until now, or until it ended (its wall time stops)."""
    (age,) = tx.one(
        "SELECT CASE WHEN status IN ('completed', 'failed', 'cancelled') THEN updated_at ELSE ? END"
        " - created_at FROM agent_runs WHERE id = ?",
        (tx.now, run_id),
    )
    return int(age)


def budget_usage(tx: Tx, run_id: str) -> Usage | None:
    """The run's spend against its limits; None if it has no budget."""
    row = tx.one(f"SELECT {BUDGET_COLUMNS}, repeated_call_id FROM budgets WHERE run_id = ?", (run_id,))
    if row is None:
        get_run(tx, run_id)  # an unknown run is an error
        return None
    *spend, repeated_id = row
    return usage_of(
        spend, _age(tx, run_id), None if repeated_id is None else _intent(tx, run_id, repeated_id)
    )


def _intent(tx: Tx, run_id: str, call_id: str) -> ToolCall | None:
    """The tool call of an intent, as the model asked for it (found by its primary key)."""
    row = tx.one(
        "SELECT e.payload FROM tool_intents AS t"
        " JOIN events AS e ON e.run_id = t.run_id AND e.seq = t.intent_seq"
        " WHERE t.run_id = ? AND t.call_id = ?",
        (run_id, call_id),
    )
    if row is None:
        return None
    payload = decode(row[0])
    return ToolCall(payload["call_id"], payload["name"], payload["args"])


def _insert_budget(tx: Tx, run_id: str, limits: tuple[Any, ...]) -> None:
    columns = ", ".join(LIMIT_COLUMNS)
    marks = ", ".join(["?"] * (len(LIMIT_COLUMNS) + 2))
    tx.execute(
        f"INSERT INTO budgets (run_id, {columns}, updated_at) VALUES ({marks})", (run_id, *limits, tx.now)
    )


def set_budget(tx: Tx, run_id: str, changes: dict[str, Any]) -> bool:
    """An outsider's change of limits (a run without a budget gets one, spending from now);
    a run suspended for its budget becomes due if it is within every limit again. Whether it was."""
    row = tx.one(f"SELECT status FROM agent_runs WHERE id = ?{_OUTSIDER_LOCK}", (run_id,))
    if row is None:
        raise RunNotFound(f"run {run_id} does not exist")
    if row[0] not in _LIVE:
        raise RunTerminal(f"run {run_id} is {row[0]}; its budget can no longer change")
    if tx.one("SELECT 1 FROM budgets WHERE run_id = ?", (run_id,)) is None:
        _insert_budget(tx, run_id, (None,) * len(LIMIT_COLUMNS))
    assignments = ", ".join(f"{column} = ?" for column in changes)
    tx.execute(
        f"UPDATE budgets SET {assignments}, updated_at = ? WHERE run_id = ?",
        (*changes.values(), tx.now, run_id),
    )
    _notify_inbox(tx, run_id)  # an owner watching its wall time looks again
    usage = budget_usage(tx, run_id)
    return usage is not None and judge(usage) is None and _wake(tx, run_id, "budget", "")


# -- dead owners and tool starts ----------------------------------------------------------------


def _take_from_the_dead(
    tx: Tx, owner: str, ttl_ms: int, max_attempts: int | None, limit: int, claims: Claims
) -> None:
    """Lease the runs whose unexpired leases belong to processes of this host that are gone,
    with nothing they started alive, as claim_due leases due ones: a run with a cancellation
    requested ends cancelled, and one out of attempts ends failed, instead of being handed out.
    A dead owner whose tools still run keeps its leases until they expire."""
    for pid, started in _dead_owners_here(tx):
        rows = tx.all(
            f"SELECT id, status, attempts, cancel_reason, {_LEASE_ROW} FROM agent_runs"
            " WHERE lease_host = ? AND lease_owner IS NOT NULL AND lease_expires_at > ?"
            " AND status = 'running' AND lease_pid = ? AND lease_process_start = ? LIMIT ?",
            (this_process().host, tx.now, pid, started, limit - len(claims.leased)),
        )
        for run_id, status, attempts, cancel_reason, *lease_row in rows:
            lost = lost_attempt(tx.now, lease_row, attempts, max_attempts)
            claim = _Claim(run_id, status, lease_row[1], attempts, cancel_reason, lost)
            _claim_one(tx, claims, claim, owner, ttl_ms, max_attempts)
        if len(claims.leased) >= limit:
            break


def _dead_owners_here(tx: Tx) -> list[tuple[int, int]]:
    """(pid, process start) of each process of this host that holds unexpired leases, no
    longer runs, and left no process it started alive. Every holder is looked at, not the first
    few: a busy live worker must not hide a dead one."""
    me = this_process()
    if me.host is None:
        return []
    holders = tx.all(  # one row per lease held here (told apart in Python: DISTINCT would sort)
        "SELECT lease_pid, lease_process_start FROM agent_runs"
        " WHERE lease_host = ? AND lease_owner IS NOT NULL AND lease_expires_at > ? AND status = 'running'",
        (me.host, tx.now),
    )
    return [(pid, started) for pid, started, verdict in gone_holders(holders) if verdict.at_once]


# -- outsiders: retry now, and the audit trail --------------------------------------------------


def retry_now(tx: Tx, run_id: str) -> int | None:
    """An outsider's cut of a backoff: a run nobody holds, due later (released after a failure,
    or by a handler that returned), becomes due now. The due time it had; None: due already."""
    row = tx.one(
        "SELECT status, lease_owner, lease_expires_at, next_attempt_at FROM agent_runs WHERE id = ?",
        (run_id,),
    )
    if row is None:
        raise RunNotFound(f"run {run_id} does not exist")
    status, owner, expires_at, due_at = row
    if status not in _LIVE:
        raise RunTerminal(f"run {run_id} is {status}; there is nothing left to retry")
    if owner is not None and expires_at > tx.now:
        raise RunLeased(f"run {run_id} is leased by {owner} for {expires_at - tx.now} ms more: it is running")
    if status == RunStatus.WAITING.value:
        raise RunWaiting(f"run {run_id} is waiting, not backing off: what it awaits makes it due")
    if due_at is None or due_at <= tx.now:
        return None
    tx.execute("UPDATE agent_runs SET next_attempt_at = ? WHERE id = ?", (tx.now, run_id))
    return int(due_at)


def record_action(tx: Tx, run_id: str, action: str, by: str | None, detail_json: str) -> None:
    """One row of the outsiders' audit trail, in the transaction of the write it describes."""
    tx.execute(
        "INSERT INTO outsider_actions (run_id, action, done_by, detail, created_at) VALUES (?, ?, ?, ?, ?)",
        (run_id, action, by, detail_json, tx.now),
    )
