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
    judge,
)
from .._errors import (
    InvalidArgument,
    RunLeased,
    RunNotFound,
    RunTerminal,
)
from .._json import dump_trusted as _dump
from .._owner import Owner, Verdict, gone_holders, this_process
from .._owner import judge as judge_holder
from .._store._budgets import budget_usage
from .._store._budgets import insert_budget as _insert_budget
from .._store._budgets import wall_end as _wall_end
from .._store._ends import cancel_requested
from .._store._ends import cancel_unowned as _cancel_unowned
from .._store._ends import fail_exhausted as _fail_exhausted
from .._store._reads import get_run
from .._store._types import (
    Awaited,
    Claims,
    JoinOutcome,
    Lease,
    LostAttempt,
    NewChild,
    OpenWait,
    WaitKind,
    earliest,
    exhausted_reason,
    lost_attempt,
    suspension_payload,
)
from .._store._waits import signal_ready
from .._types import EventType, RunRecord, RunStatus
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


# -- approvals ----------------------------------------------------------------------------------


# -- child runs ---------------------------------------------------------------------------------


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


# -- budgets ------------------------------------------------------------------------------------


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
