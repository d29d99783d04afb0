"""PostgreSQL operations behind runs: each function is one operation on a database thread.

The same operations as the SQLite store, in PostgreSQL's SQL. Every function takes a
:class:`Tx` first and runs inside a transaction (a SAVEPOINT of a writer's group commit, or a
read-only snapshot). "Now" is the server's clock, read inside the operation: a fenced write
locks the run's row and reads the clock in the same statement (``FOR NO KEY UPDATE``), so a stale
owner cannot slip through on another machine's idea of the time.

No operation waits for a row another transaction holds: every row lock is taken ``NOWAIT`` (or
``SKIP LOCKED``, for claims), and the writers' ``lock_timeout`` is short for whatever else might
wait. An operation that finds its row held fails alone (LockNotAvailable, a TransientConflict:
its batch's other operations still commit) and its caller tries again in a later batch, so a
row held elsewhere, for however long, never holds up a writer's group commit, and with it the
renewals of unrelated runs (see docs/leases.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._errors import (
    InvalidArgument,
    LeaseLost,
    RunNotFound,
    RunTerminal,
)
from .._json import dump_trusted as _dump
from .._rows import RUN_COLUMNS, to_run
from .._store._budgets import insert_budget as _insert_budget
from .._store._types import (
    JoinOutcome,
    Lease,
    NewChild,
)
from .._types import EventType, RunRecord, RunStatus
from ._tx import Sent, Tx

_LIVE = (RunStatus.PENDING.value, RunStatus.RUNNING.value, RunStatus.WAITING.value)


# -- acquiring and keeping leases ---------------------------------------------------------------


def _send_lock(tx: Tx, run_id: str, more: str = "", more_params: tuple[Any, ...] = ()) -> Sent:
    """Send the statement that locks the run's row, without waiting for it; read it with
    :func:`_locked`. Statements sent after it run with the lock held, so an operation may send
    its first statements with it and judge the lease when they come back (its writes are rolled
    back with it if the lease does not hold). ``more``: more columns to read once the lock is
    held (``, <expressions>``), with ``more_params``; :func:`_locked_row` returns them too.

    NO KEY UPDATE serializes the run's writers as FOR UPDATE would, but does not block the
    foreign-key checks of rows inserted elsewhere that point at this run (a child run's insert).
    NOWAIT: a row held by another transaction fails the operation at once (TransientConflict,
    retried by the caller) instead of holding up the batch it is in.
    """
    # The clock is read after the lock is held: in the lock statement's own target list it would
    # be computed before a wait on a holder that did not change the row.
    return tx.send(
        "WITH locked AS (SELECT status, lease_owner, lease_epoch, lease_expires_at FROM agent_runs"
        f" WHERE id = %s FOR NO KEY UPDATE NOWAIT) SELECT locked.*, zincir_now_ms(){more} FROM locked",
        (run_id, *more_params),
    )


def _locked(tx: Tx, run_id: str, lock: Sent) -> tuple[str, str | None, int, int | None]:
    status, owner, epoch, expires_at = _locked_row(tx, run_id, lock)
    return status, owner, epoch, expires_at


def _locked_row(tx: Tx, run_id: str, lock: Sent) -> list[Any]:
    """The lock's row without its clock (which becomes the operation's "now")."""
    row = lock.one()
    if row is None:
        raise RunNotFound(f"run {run_id} does not exist")
    status, owner, epoch, expires_at, now, *more = row
    tx.set_now(now)
    return [status, owner, epoch, expires_at, *more]


def check_lease(tx: Tx, lease: Lease, lock: Sent | None = None) -> None:
    """Raise unless the lease holds on a running run, now (see the SQLite store); ``lock``:
    the lock statement, if the operation sent it ahead."""
    _judge_lease(lease, *_locked(tx, lease.run_id, lock or _send_lock(tx, lease.run_id)), tx.now)


def _judge_lease(
    lease: Lease, status: str, owner: str | None, epoch: int, expires_at: int | None, now: int
) -> None:
    where = f"run {lease.run_id}: the lease of epoch {lease.epoch}"
    if epoch != lease.epoch:
        raise LeaseLost(f"{where} was fenced by a newer owner (epoch {epoch})")
    if status not in _LIVE:
        raise RunTerminal(f"run {lease.run_id} is already {status}")
    if owner != lease.owner or expires_at is None:
        raise LeaseLost(f"{where} was released")
    if expires_at <= now:
        raise LeaseLost(f"{where} expired {now - expires_at} ms ago")


# -- the event log ------------------------------------------------------------------------------


def _log_beside(
    tx: Tx, run_id: str, type: EventType, payload_json: str, key: str, beside: str, other: str
) -> None:
    """:func:`_log`, and in the same statement the write ``beside`` (a data-modifying
    statement whose parameters are now, the run's id and ``other``): one statement where two
    would be sent."""
    tx.execute(
        f"WITH beside AS ({beside}),"
        " allocated AS (UPDATE agent_runs SET last_seq = last_seq + 1, updated_at = %s"
        " WHERE id = %s RETURNING last_seq)"
        " INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
        " SELECT %s, last_seq, %s, %s, %s, %s FROM allocated",
        (tx.now, run_id, other, tx.now, run_id, run_id, type.value, payload_json, key, tx.now),
    )


# -- reading ------------------------------------------------------------------------------------


# -- checkpoints --------------------------------------------------------------------------------


# -- durable steps and sleeps -------------------------------------------------------------------


# -- signals and named waits --------------------------------------------------------------------


# -- approvals ----------------------------------------------------------------------------------


# -- child runs ---------------------------------------------------------------------------------


def spawn_children(tx: Tx, lease: Lease, children: Sequence[NewChild]) -> list[str]:
    """Create each child once, pending and unleased; a repeat returns its id. Every insert is
    sent with the lock and read after it (one round trip for the lot; if the lease does not
    hold, the raise rolls them back)."""
    lock = _send_lock(tx, lease.run_id)
    inserts = [_send_spawn(tx, lease.run_id, child) for child in children]
    check_lease(tx, lease, lock)
    ids = [_spawned(tx, child, insert) for child, insert in zip(children, inserts, strict=True)]
    if any(spawned == child.child_id for spawned, child in zip(ids, children, strict=True)):
        tx.notify_claimable()
    return ids


def _send_spawn(tx: Tx, parent_id: str, child: NewChild) -> Sent:
    """One statement inserts the child and, if it is new, logs child_spawned in the parent's log;
    it returns the new child's id, or the one spawned under that name before."""
    event = _dump({"child_id": child.child_id, "name": child.name, "role": child.role})
    return tx.send(
        "WITH now AS MATERIALIZED (SELECT zincir_now_ms() AS ms),"
        " spawned AS (INSERT INTO agent_runs (id, parent_run_id, role, provider, status, config,"
        " created_at, updated_at, next_attempt_at, spawn_name)"
        " SELECT %s, %s, %s, %s, 'pending', %s, now.ms, now.ms, now.ms, %s FROM now"
        " ON CONFLICT (parent_run_id, spawn_name) WHERE spawn_name IS NOT NULL DO NOTHING RETURNING id),"
        " allocated AS (UPDATE agent_runs SET last_seq = last_seq + 1, updated_at = (SELECT ms FROM now)"
        " WHERE id = %s AND EXISTS (SELECT 1 FROM spawned) RETURNING last_seq),"
        " logged AS (INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
        " SELECT %s, last_seq, %s, %s, %s, now.ms FROM allocated, now)"
        " SELECT (SELECT id FROM spawned),"
        " (SELECT id FROM agent_runs WHERE parent_run_id = %s AND spawn_name = %s)",
        (
            *(child.child_id, parent_id, child.role, child.provider, child.config_json, child.name),
            parent_id,
            *(parent_id, EventType.CHILD_SPAWNED.value, event, f"spawn:{child.name}"),
            *(parent_id, child.name),
        ),
    )


def _spawned(tx: Tx, child: NewChild, insert: Sent) -> str:
    """The id of the child ``insert`` created, or of the one spawned under its name before (a
    restart repeats the spawn)."""
    new, existing = insert.one()
    if new is None:
        return str(existing)
    if child.budget is not None:  # the child's own, whatever its parent spends
        _insert_budget(tx, child.child_id, child.budget)
    return child.child_id


def await_child(tx: Tx, lease: Lease, child_id: str, timeout_ms: int | None) -> JoinOutcome:
    """Record the join on its first call; log ``child_joined`` once the child has ended, or
    time the join out past its stored deadline. Fenced."""
    lock = _send_lock(tx, lease.run_id)
    looked = _send_join_look(tx, lease.run_id, child_id, timeout_ms)
    check_lease(tx, lease, lock)
    return _judge_join(tx, lease.run_id, child_id, looked)


def join_children(tx: Tx, lease: Lease, child_ids: Sequence[str]) -> list[RunRecord | None]:
    """await_child with no deadline for each (every look sent with the lock, one round trip):
    the ended children's records, None for the rest."""
    lock = _send_lock(tx, lease.run_id)
    looks = [_send_join_look(tx, lease.run_id, child_id, None) for child_id in child_ids]
    check_lease(tx, lease, lock)
    judged = [_judge_join(tx, lease.run_id, c, looked) for c, looked in zip(child_ids, looks, strict=True)]
    return [outcome.child for outcome in judged]


def _send_join_look(tx: Tx, parent_id: str, child_id: str, timeout_ms: int | None) -> Sent:
    """The child and the join's record (stored by the first call, read by later ones) in one
    statement: the join of a run that is not a child stores nothing."""
    return tx.send(
        f"WITH child AS (SELECT {RUN_COLUMNS} FROM agent_runs WHERE id = %s),"
        " recorded AS (INSERT INTO joins (run_id, child_id, deadline, created_at)"
        " SELECT %s, child.id, now.ms + %s, now.ms FROM child, (SELECT zincir_now_ms() AS ms) AS now"
        " WHERE child.parent_run_id = %s"
        " ON CONFLICT (run_id, child_id) DO UPDATE SET run_id = joins.run_id"
        " RETURNING deadline, completed_at, timed_out)"
        " SELECT child.*, recorded.* FROM child LEFT JOIN recorded ON true",
        (child_id, parent_id, timeout_ms, parent_id),
    )


def _judge_join(tx: Tx, parent_id: str, child_id: str, looked: Sent) -> JoinOutcome:
    """What the look found: log the end (or the timeout) the first time it is seen."""
    found = looked.one()
    child = None if found is None else to_run(found[:-3])
    if child is None or child.parent_run_id != parent_id:
        raise InvalidArgument(f"run {parent_id}: {child_id} is not a child of this run")
    deadline, completed_at, timed_out = found[-3:]
    if timed_out:
        return JoinOutcome("timed_out")
    if completed_at is not None:
        return JoinOutcome("ended", child)
    if child.status.is_terminal:
        event = _dump({"child_id": child_id, "result": child.result, "status": child.status.value})
        _log_beside(tx, parent_id, EventType.CHILD_JOINED, event, f"join:{child_id}", _JOINED, child_id)
        return JoinOutcome("ended", child)
    if deadline is not None and deadline <= tx.now:
        event = _dump({"child_id": child_id, "deadline": deadline, "name": f"join:{child_id}"})
        _log_beside(tx, parent_id, EventType.WAIT_TIMED_OUT, event, f"join:{child_id}", _TIMED_OUT, child_id)
        return JoinOutcome("timed_out")
    return JoinOutcome("pending", remaining_ms=None if deadline is None else deadline - tx.now)


# How a join ends, beside the event that says so (see _log_beside: now, the run, the child).
_JOINED = "UPDATE joins SET completed_at = %s WHERE run_id = %s AND child_id = %s"
_TIMED_OUT = "UPDATE joins SET completed_at = %s, timed_out = 1 WHERE run_id = %s AND child_id = %s"


def ended_children(tx: Tx, child_ids: Sequence[str]) -> set[str]:
    """Those of ``child_ids`` that have ended."""
    found = tx.all(
        "SELECT id FROM agent_runs WHERE id = ANY(%s) AND status IN ('completed', 'failed', 'cancelled')",
        (list(child_ids),),
    )
    return {str(row[0]) for row in found}


def child_ready(tx: Tx, run_id: str, child_id: str) -> bool:
    """A cheap read for a joining owner: has the child ended, or the join's deadline passed?"""
    row = tx.one(
        "SELECT 1 FROM agent_runs WHERE id = %s AND status IN ('completed', 'failed', 'cancelled')"
        " UNION ALL SELECT 1 FROM joins WHERE run_id = %s AND child_id = %s AND deadline <= zincir_now_ms()"
        " LIMIT 1",
        (child_id, run_id, child_id),
    )
    return row is not None


# -- budgets ------------------------------------------------------------------------------------


# -- dead owners and tool starts ----------------------------------------------------------------


# -- outsiders: retry now, and the audit trail --------------------------------------------------
