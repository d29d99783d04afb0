"""SQLite operations behind runs: each function is one operation on the database thread.

Every function takes a :class:`Tx` first and runs inside a transaction (a SAVEPOINT of the
writer's group commit, or a read snapshot). A function that raises leaves nothing behind.
Writes on behalf of a run owner are *fenced*: they first check, inside the same transaction,
that the owner's (owner, epoch) still holds an unexpired lease on a running run.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._errors import (
    InvalidArgument,
)
from .._json import dump_trusted as _dump
from .._store._budgets import insert_budget as _insert_budget
from .._store._reads import get_run
from .._store._types import (
    JoinOutcome,
    Lease,
    NewChild,
)
from .._types import EventType, RunRecord, RunStatus
from ._connection import Tx

_LIVE = (RunStatus.PENDING.value, RunStatus.RUNNING.value, RunStatus.WAITING.value)


# -- acquiring and keeping leases ---------------------------------------------------------------


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


# -- outsiders: retry now, and the audit trail --------------------------------------------------
