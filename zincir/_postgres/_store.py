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
from typing import Any, Final

import attrs
from psycopg import errors as pg_errors

from .._budget import (
    judge,
)
from .._errors import (
    InvalidArgument,
    LeaseLost,
    RunLeased,
    RunNotFound,
    RunTerminal,
)
from .._json import dump_trusted as _dump
from .._owner import Owner, Verdict, gone_holders, this_process
from .._owner import judge as judge_holder
from .._rows import RUN_COLUMNS, to_run
from .._store._budgets import WALL_END as _WALL_END
from .._store._budgets import budget_usage
from .._store._budgets import insert_budget as _insert_budget
from .._store._budgets import wall_end as _wall_end
from .._store._ends import cancel_requested
from .._store._ends import cancel_unowned as _cancel_unowned
from .._store._ends import fail_exhausted as _fail_exhausted
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
from ._tx import Sent, Tx

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
        and tx.one("SELECT 1 FROM agent_runs WHERE id = %s", (parent_run_id,)) is None
    ):
        raise RunNotFound(f"parent run {parent_run_id} does not exist")
    now = tx.now
    expires_at = now + ttl_ms
    tx.execute(
        "INSERT INTO agent_runs (id, parent_run_id, role, provider, status, config, created_at,"
        " updated_at, last_seq, lease_owner, lease_epoch, lease_expires_at, next_attempt_at, lease_host,"
        " lease_pid, lease_process_start)"
        " VALUES (%s, %s, %s, %s, 'running', %s, %s, %s, 0, %s, 1, %s, %s, %s, %s, %s)",
        (
            run_id,
            parent_run_id,
            role,
            provider,
            config_json,
            now,
            now,
            owner,
            expires_at,
            now,
            *this_process().as_row(),
        ),
    )
    _insert_event(tx, run_id, 0, EventType.STATE_TRANSITION, '{"from":"pending","to":"running"}')
    if budget is None:
        return Lease(run_id, owner, 1, ttl_ms, expires_at, config_json=config_json)
    _insert_budget(tx, run_id, budget)
    return Lease(run_id, owner, 1, ttl_ms, expires_at, _wall_end(tx, run_id), config_json=config_json)


def _lock_run(tx: Tx, run_id: str) -> tuple[str, str | None, int, int | None]:
    """Lock the run's row and read the server clock in the same statement."""
    return _locked(tx, run_id, _send_lock(tx, run_id))


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


_LEASE_ROW: Final = "lease_owner, lease_epoch, lease_expires_at, lease_host, lease_pid, lease_process_start"
"""The columns that say who held a lease, for :func:`lost_attempt`."""


def acquire_run(tx: Tx, run_id: str, owner: str, ttl_ms: int, force: bool) -> Lease | None:
    """Take a free or expired lease (any lease with ``force``), and start a pending run. None:
    the run had a cancellation request its dead owner never acted on, and was cancelled now."""
    status, lease_owner, epoch, expires_at = _lock_run(tx, run_id)
    if status not in _LIVE:
        raise RunTerminal(f"run {run_id} is {status}; a terminal run cannot be leased")
    cancel_reason, attempts, config_json, *lease_row = tx.one(
        f"SELECT cancel_reason, attempts, config, {_LEASE_ROW} FROM agent_runs WHERE id = %s", (run_id,)
    )
    if lease_owner is not None and expires_at is not None and expires_at > tx.now and not force:
        verdict = judge_holder(Owner(*lease_row[3:]))
        if not verdict.at_once:
            raise RunLeased(_still_leased(run_id, epoch, expires_at - tx.now, verdict))
    lost = lost_attempt(tx.now, lease_row, attempts, forced=force)
    if cancel_reason is not None:
        _cancel_unowned(tx, run_id, status, cancel_reason, lost)
        return None
    return _take(tx, run_id, status, owner, epoch + 1, ttl_ms, _wall_end(tx, run_id), lost, config_json)


def _still_leased(run_id: str, epoch: int, remaining_ms: int, verdict: Verdict) -> str:
    held = f"run {run_id} is leased by another owner (epoch {epoch}) for {remaining_ms} ms more"
    if verdict.gone:  # a process it started may still apply an effect: let the lease expire
        return f"{held}: {verdict.reason}; it is taken when the lease expires"
    return f"{held}; pass force=True only once that owner is known to be dead"


def claim_due(tx: Tx, owner: str, ttl_ms: int, max_attempts: int | None, limit: int) -> Claims:
    """Lease up to ``limit`` of the longest-due runs that are free or expired (first those of
    dead owners of this host), skipping rows another worker is claiming right now (``SKIP
    LOCKED``); a lease nobody released gets its ``attempt_lost``.

    A run that already used ``max_attempts`` claims is failed here instead of handed out again.
    """
    claims = Claims()
    _take_from_the_dead(tx, owner, ttl_ms, max_attempts, limit, claims)
    postponed: list[str] = []  # runs whose ending has to wait for a busy descendant
    while len(claims.leased) < limit:
        now, wanted = tx.now, limit - len(claims.leased)
        rows = tx.all(
            f"SELECT id, status, attempts, cancel_reason, {_WALL_END}, config, {_LEASE_ROW}"
            " FROM agent_runs AS r"
            " WHERE status IN ('pending', 'running', 'waiting') AND next_attempt_at <= %s"
            " AND (lease_owner IS NULL OR lease_expires_at <= %s) AND NOT (id = ANY(%s))"
            " ORDER BY next_attempt_at, created_at LIMIT %s FOR NO KEY UPDATE SKIP LOCKED",
            (now, now, postponed, wanted),
        )
        for run_id, status, attempts, cancel_reason, wall_end, config_json, *lease_row in rows:
            lost = lost_attempt(tx.now, lease_row, attempts, max_attempts)
            claim = _Claim(run_id, status, lease_row[1], attempts, cancel_reason, wall_end, config_json, lost)
            if not _claim_one(tx, claims, claim, owner, ttl_ms, max_attempts):
                postponed.append(run_id)
        if len(rows) < wanted:
            break  # no more are due (a run locked by another claim is skipped again)
    return claims


@attrs.frozen
class _Claim:
    """A claimable run, as a claim read it."""

    run_id: str
    status: str
    epoch: int
    attempts: int
    cancel_reason: str | None
    wall_end: int | None
    config_json: str
    lost: LostAttempt | None


def _claim_one(tx: Tx, claims: Claims, c: _Claim, owner: str, ttl_ms: int, max_attempts: int | None) -> bool:
    """Lease one run to a worker, or end it: cancelled (its owner died before it could stop),
    or failed (out of attempts). False: its ending has to wait for a busy descendant."""
    run_id, status, attempts, lost = c.run_id, c.status, c.attempts, c.lost
    if c.cancel_reason is not None:
        if not _unless_busy(tx, _cancel_unowned, run_id, status, c.cancel_reason, lost):
            return False
        claims.ended.append((run_id, RunStatus.CANCELLED, c.cancel_reason))
        return True
    if max_attempts is not None and attempts >= max_attempts:
        reason = exhausted_reason(attempts, max_attempts, _how_the_last_ended(lost))
        if not _unless_busy(tx, _fail_exhausted, run_id, status, reason, lost):
            return False
        claims.ended.append((run_id, RunStatus.FAILED, reason))
        return True
    lease = _take(
        tx, run_id, status, owner, c.epoch + 1, ttl_ms, c.wall_end, lost, c.config_json, count_attempt=True
    )
    claims.leased.append((lease, attempts + 1))
    if lost is not None:
        claims.lost[run_id] = lost
    return True


def _how_the_last_ended(lost: LostAttempt | None) -> str:
    return "ended without finishing the run" if lost is None else lost.summary()


def _unless_busy(tx: Tx, end: Any, run_id: str, *args: Any) -> bool:
    """End a run in a savepoint of its own; False (and nothing done) if a descendant it cancels
    is being written by its owner right now: the run stays due, and the other due runs are
    claimed meanwhile instead of all waiting behind it."""
    tx.savepoint("zincir_ending")
    try:
        end(tx, run_id, *args)
    except pg_errors.LockNotAvailable:
        tx.rollback_to("zincir_ending")
        tx.execute("RELEASE SAVEPOINT zincir_ending")
        return False
    tx.execute("RELEASE SAVEPOINT zincir_ending")
    return True


def next_due_in(tx: Tx) -> int | None:
    """Milliseconds until the next run becomes due by itself (a backoff, a deadline, a wake
    time), None if none will: an idle worker sleeps until then rather than a poll late."""
    (due,) = tx.one(
        "SELECT min(next_attempt_at) - zincir_now_ms() FROM agent_runs"
        " WHERE status IN ('pending', 'running', 'waiting') AND next_attempt_at > zincir_now_ms()",
        (),
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
        " OR (status = 'waiting' AND (next_attempt_at <= %s OR EXISTS (SELECT 1 FROM run_waits AS w"
        " WHERE w.run_id = agent_runs.id AND w.kind = 'sleep'))) LIMIT 1",
        (tx.now,),
    )
    return row is not None


def _take(
    tx: Tx,
    run_id: str,
    status: str,
    owner: str,
    epoch: int,
    ttl_ms: int,
    wall_end: int | None,
    lost: LostAttempt | None,
    config_json: str,
    *,
    count_attempt: bool = False,
) -> Lease:
    """Lease the run to ``owner`` (this process: its identity is stored with the lease); a
    pending or suspended run starts running; a lease its owner never released is taken over:
    ``attempt_lost``, then ``lease_taken_over`` (at once, or after it expired).
    ``wall_end``: when the run's wall time runs out (:data:`_WALL_END`), and ``config_json``
    (the run's config), read by the caller;
    ``count_attempt``: a worker's claim, which counts an attempt.

    The lease, the attempt and the last event go into the row in one UPDATE: one statement and
    one new version of the row per claimed run, where three UPDATEs made three."""
    expires_at = tx.now + ttl_ms
    me = this_process()
    lease_change = (
        "lease_owner = %s, lease_epoch = %s, lease_expires_at = %s, status = 'running', wait_kind = NULL,"
        " wait_target = NULL, lease_host = %s, lease_pid = %s, lease_process_start = %s,"
        " attempts = attempts + %s"
    )
    lease_params = (owner, epoch, expires_at, *me.as_row(), int(count_attempt))
    events = []
    if lost is not None:
        events.append((EventType.ATTEMPT_LOST, _dump(lost.payload())))
        events.append((EventType.LEASE_TAKEN_OVER, _dump(lost.takeover_payload())))
    if status != RunStatus.RUNNING:
        events.append((EventType.STATE_TRANSITION, _dump({"from": status, "to": "running"})))
    if not events:
        tx.execute(f"UPDATE agent_runs SET {lease_change} WHERE id = %s", (*lease_params, run_id))
    for number, (type, payload) in enumerate(events, start=1):
        if number < len(events):
            _log(tx, run_id, type, payload)
        else:
            _log_with(tx, run_id, type, payload, lease_change, lease_params)
    return Lease(run_id, owner, epoch, ttl_ms, expires_at, wall_end, config_json=config_json)


def renew(tx: Tx, lease: Lease) -> tuple[Lease, str | None]:
    """Extend an unexpired lease, and read a cancellation requested meanwhile; the expiry is
    compared with the server clock after the row lock is held, so a renewal that waited past
    its expiry cannot bring the lease back."""
    check_lease(tx, lease)
    expires_at = tx.now + lease.ttl_ms
    (cancel_reason,) = tx.one(
        "UPDATE agent_runs SET lease_expires_at = %s WHERE id = %s RETURNING cancel_reason",
        (expires_at, lease.run_id),
    )
    wall_end = _wall_end(tx, lease.run_id)
    return attrs.evolve(lease, expires_at=expires_at, wall_time_ends_at=wall_end), cancel_reason


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


def _allocate(tx: Tx, run_id: str, count: int) -> int:
    """Reserve ``count`` consecutive seqs for the run; returns the first."""
    (last,) = tx.one(
        "UPDATE agent_runs SET last_seq = last_seq + %s, updated_at = %s WHERE id = %s RETURNING last_seq",
        (count, tx.now, run_id),
    )
    return int(last) - count + 1


_APPEND = (
    "WITH allocated AS (UPDATE agent_runs SET last_seq = last_seq + 1, updated_at = %s WHERE id = %s"
    " RETURNING last_seq) INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
    " SELECT %s, last_seq, %s, %s, %s, %s FROM allocated"
)


def _append(tx: Tx, run_id: str, type: EventType, payload_json: str, key: str | None = None) -> int:
    """Allocate the run's next seq and append one event with it, in one statement (one round trip
    where _allocate and _insert_event take two); returns the seq."""
    params = (tx.now, run_id, run_id, type.value, payload_json, key, tx.now)
    (seq,) = tx.one(_APPEND + " RETURNING seq", params)
    return int(seq)


def _log(tx: Tx, run_id: str, type: EventType, payload_json: str, key: str | None = None) -> None:
    """:func:`_append` for a caller that has no use for the seq: sent, not waited for."""
    tx.execute(_APPEND, (tx.now, run_id, run_id, type.value, payload_json, key, tx.now))


def _log_with(
    tx: Tx, run_id: str, type: EventType, payload_json: str, changes: str, params: tuple[Any, ...]
) -> Sent:
    """:func:`_log`, with more of the run's row changed (``changes``: SET assignments, with
    ``params``) by the UPDATE that allocates the event's seq: one statement and one new version
    of the row where two UPDATEs make two. Its row is the run's ``parent_run_id``.

    "Now" is read by the statement itself, so that it may be sent right behind the lock,
    before the lock's answer (and its clock) has come back."""
    return tx.send(
        "WITH now AS MATERIALIZED (SELECT zincir_now_ms() AS ms),"
        " allocated AS (UPDATE agent_runs SET last_seq = last_seq + 1, updated_at = (SELECT ms FROM now),"
        f" {changes} WHERE id = %s RETURNING last_seq, parent_run_id),"
        " logged AS (INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
        " SELECT %s, last_seq, %s, %s, NULL, now.ms FROM allocated, now)"
        " SELECT parent_run_id FROM allocated",
        (*params, run_id, run_id, type.value, payload_json),
    )


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


def _insert_event(
    tx: Tx, run_id: str, seq: int, type: EventType, payload_json: str, key: str | None = None
) -> None:
    tx.execute(
        "INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
        " VALUES (%s, %s, %s, %s, %s, %s)",
        (run_id, seq, type.value, payload_json, key, tx.now),
    )


# -- reading ------------------------------------------------------------------------------------


# -- checkpoints --------------------------------------------------------------------------------


# -- durable steps and sleeps -------------------------------------------------------------------


# -- signals and named waits --------------------------------------------------------------------

# An outsider (a sender, an approver) locks the run's row as its owner's writes do, so that the
# two are ordered: a run that is ending cannot take a signal nobody will ever receive, and an owner
# suspending right now either sees the signal (and stays) or has committed 'waiting' before the
# wake-up looks. NOWAIT: an outsider never waits for the row (the caller retries at once), so its
# group commit, which may hold other runs' rows, can never close a deadlock with an owner's.
_OUTSIDER_LOCK = " FOR NO KEY UPDATE NOWAIT"


def suspend(tx: Tx, lease: Lease, waits: Sequence[OpenWait]) -> bool:
    """Unless one of ``waits`` can complete now, suspend the run on all of them (see the SQLite
    store). Fenced: the run's row stays locked until the commit, so a sender (its lock) either
    came first, and its signal is seen here, or wakes the committed 'waiting' run. Not while a
    cancellation is requested: the owner acts on that instead."""
    check_lease(tx, lease)
    if cancel_requested(tx, lease.run_id) is not None:
        return False
    awaited = [_awaited(tx, lease.run_id, kind, name) for kind, name in dict.fromkeys(waits)]
    pending = [found for found in awaited if found is not None and not found.due(tx.now)]
    if not pending or len(pending) < len(awaited):
        return False
    until = earliest(found.deadline for found in pending)
    _log(tx, lease.run_id, EventType.STATE_TRANSITION, suspension_payload(pending, until))
    first = pending[0]
    tx.execute(
        "UPDATE agent_runs SET status = 'waiting', wait_kind = %s, wait_target = %s, next_attempt_at = %s,"
        " lease_owner = NULL, lease_expires_at = NULL, attempts = greatest(0, attempts - 1) WHERE id = %s",
        (first.kind, first.wake_key, until, lease.run_id),
    )
    tx.execute("DELETE FROM run_waits WHERE run_id = %s", (lease.run_id,))
    tx.execute(
        "INSERT INTO run_waits (run_id, kind, wake_key, name, deadline, created_at)"
        " SELECT %s, kind, wake_key, name, deadline, %s FROM"
        " unnest(%s::text[], %s::text[], %s::text[], %s::bigint[]) AS w (kind, wake_key, name, deadline)",
        (
            lease.run_id,
            tx.now,
            [found.kind for found in pending],
            [found.wake_key for found in pending],
            [found.name for found in pending],
            [found.deadline for found in pending],
        ),
    )
    return True


def _awaited(tx: Tx, run_id: str, kind: WaitKind, name: str) -> Awaited | None:
    """What wait ``name`` still awaits; None if it is there (or the wait is no longer open)."""
    if kind == "signal":
        row = tx.one(
            "SELECT topic, deadline FROM waits WHERE run_id = %s AND name = %s AND completed_at IS NULL",
            (run_id, name),
        )
        if row is None or signal_ready(tx, run_id, row[0], name):
            return None
        return Awaited(kind, name, row[0], row[1])
    if kind == "approval":
        row = tx.one(
            "SELECT deadline FROM approvals WHERE run_id = %s AND call_id = %s AND decided_at IS NULL"
            " AND timed_out = 0",
            (run_id, name),
        )
        return None if row is None else Awaited(kind, name, name, row[0])
    if kind == "budget":
        usage = budget_usage(tx, run_id)
        reached = None if usage is None else judge(usage)
        return None if reached is None else Awaited(kind, reached.limit, "", None)
    if kind == "child":
        # FOR SHARE orders this with the child's own write: a child ending right now is seen
        # ended here (and the run does not suspend), or commits after this run is 'waiting'.
        # NOWAIT: while the child's write holds its row, this fails and is tried again.
        row = tx.one(
            "SELECT j.deadline FROM joins AS j JOIN agent_runs AS c ON c.id = j.child_id"
            " WHERE j.run_id = %s AND j.child_id = %s AND j.completed_at IS NULL"
            " AND c.status IN ('pending', 'running', 'waiting') FOR SHARE OF c NOWAIT",
            (run_id, name),
        )
        return None if row is None else Awaited(kind, name, name, row[0])
    row = tx.one(
        "SELECT wake_at FROM timers WHERE run_id = %s AND name = %s AND completed_at IS NULL", (run_id, name)
    )
    return None if row is None else Awaited(kind, name, name, row[0])


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


def _take_from_the_dead(
    tx: Tx, owner: str, ttl_ms: int, max_attempts: int | None, limit: int, claims: Claims
) -> None:
    """Lease the runs whose unexpired leases belong to processes of this host that are gone,
    with nothing they started alive, as claim_due leases due ones: a run with a cancellation
    requested ends cancelled, and one out of attempts ends failed, instead of being handed out.
    A dead owner whose tools still run keeps its leases until they expire."""
    for pid, started in _dead_owners_here(tx):
        rows = tx.all(
            f"SELECT id, status, attempts, cancel_reason, {_WALL_END}, config, {_LEASE_ROW}"
            " FROM agent_runs AS r"
            " WHERE lease_host = %s AND lease_owner IS NOT NULL AND lease_expires_at > %s"
            " AND status = 'running' AND lease_pid = %s AND lease_process_start = %s"
            " LIMIT %s FOR NO KEY UPDATE SKIP LOCKED",
            (this_process().host, tx.now, pid, started, limit - len(claims.leased)),
        )
        for run_id, status, attempts, cancel_reason, wall_end, config_json, *lease_row in rows:
            lost = lost_attempt(tx.now, lease_row, attempts, max_attempts)
            claim = _Claim(run_id, status, lease_row[1], attempts, cancel_reason, wall_end, config_json, lost)
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
        " WHERE lease_host = %s AND lease_owner IS NOT NULL AND lease_expires_at > %s AND status = 'running'",
        (me.host, tx.now),
    )
    return [(pid, started) for pid, started, verdict in gone_holders(holders) if verdict.at_once]


# -- outsiders: retry now, and the audit trail --------------------------------------------------
