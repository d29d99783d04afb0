"""PostgreSQL's own way of the few operations where it is measurably faster than the shared one.

Every other operation is :mod:`zincir._store`'s. Here, a data-modifying CTE (which SQLite does
not have) does in one statement per child what the shared form needs two for: a batch of a
hundred children sent behind the lock is a hundred statements, not two hundred. A run's end is
two statements, not seven: the fence reads the open work in its own statement, and one CTE logs
the end and does what follows from it. Several runs' steps, or ends, in one group commit are
two statements in all (the batch forms). (Measured: ``docs/architecture.md``, "Where a backend
has its own way".)
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._json import dump_trusted as _dump
from .._payloads import refer, stored, stored_unreferenced
from .._rows import RUN_COLUMNS
from .._store import LIVE, BatchRefused, Reply, Store, Tx, _ends
from .._store._budgets import insert_budget
from .._store._children import (
    SHARED_CHILD,
    SHARES,
    await_child,
    insert_child_params,
    insert_child_sql,
    join_children,
)
from .._store._types import Lease, NewChild
from .._types import EventType, RunStatus
from ._tx import POSTGRES
from ._tx import Tx as PostgresTx

__all__ = ["PostgresStore"]

_STATE_TRANSITION = EventType.STATE_TRANSITION.value


def spawn_children(tx: Tx, lease: Lease, children: Sequence[NewChild]) -> list[str]:
    """:func:`zincir._store._children.spawn_children`, one statement per child: it inserts the
    child and, if the child is new, logs ``child_spawned`` in the parent's log; it returns the
    new child's id, or the one spawned under that name before."""
    tx.fence(lease)
    parent_id = lease.run_id
    # The configs' parts are referenced by the children that are new (a repeated spawn writes no row).
    configs = [stored_unreferenced(tx, child.config_json, child.child_id) for child in children]
    inserts = [
        tx.send(
            "WITH now AS MATERIALIZED (SELECT CAST(:now AS BIGINT) AS ms),"
            f" spawned AS ({insert_child_sql('now.ms', ' FROM now')} RETURNING id),"
            " allocated AS (UPDATE agent_runs SET last_seq = last_seq + 1, updated_at = (SELECT ms FROM now)"
            " WHERE id = ? AND EXISTS (SELECT 1 FROM spawned) RETURNING last_seq),"
            " logged AS (INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
            " SELECT ?, last_seq, ?, ?, ?, now.ms FROM allocated, now)"
            " SELECT (SELECT id FROM spawned),"
            " coalesce((SELECT id FROM agent_runs WHERE parent_run_id = ? AND spawn_name = ?),"
            f" ({SHARED_CHILD}))",
            (
                *insert_child_params(child, parent_id, config),
                parent_id,
                *(parent_id, EventType.CHILD_SPAWNED.value, _spawned_event(child), f"spawn:{child.name}"),
                *(parent_id, child.name, parent_id, child.name),
            ),
        )
        for child, (config, _) in zip(children, configs, strict=True)
    ]
    ids = []
    for child, insert, (_, parts) in zip(children, inserts, configs, strict=True):
        new, existing = insert.one()
        if new is None:  # spawned before, under this name (a restart repeats the spawn)
            ids.append(str(existing))
            continue
        ids.append(child.child_id)
        refer(tx, child.child_id, parts)
        tx.wake(claimable=True)
        if child.budget is not None:  # the child's own, whatever its parent spends
            insert_budget(tx, child.child_id, child.budget)
    return ids


# What a completing run must not leave open (the shared reads), read with the fence.
_OPEN_WORK = ", EXISTS ({}), ARRAY ({}), ARRAY ({})".format(*_ends.OPEN_WORK)

# The run's end in one statement: its final transition and row, a parent suspended on it made
# due, its end's waiters' rows gone, the forks sharing it and whether it has streams (the shared
# SQL), all on one clock.
_CLOSE = "WITH now AS MATERIALIZED (SELECT CAST(:now AS BIGINT) AS ms)," + (
    " closed AS (UPDATE agent_runs SET last_seq = last_seq + 1, updated_at = :now"
    f"{_ends.ENDING} WHERE id = ? RETURNING last_seq, parent_run_id),"
    " logged AS (INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
    " SELECT ?, last_seq, ?, ?, NULL, now.ms FROM closed, now),"
    f" woke AS ({_ends.MAKE_PARENT_DUE.format(lock=POSTGRES.lock_nowait)} RETURNING 1),"
    " waited AS (DELETE FROM run_waiters WHERE run_id = ? RETURNING 1)"
    " SELECT parent_run_id, EXISTS (SELECT 1 FROM woke), EXISTS (SELECT 1 FROM waited),"
    f" ARRAY ({_ends.SHARERS}), EXISTS ({_ends.STREAMED}) FROM closed"
).replace(":now", "(SELECT ms FROM now)")


def finish(tx: Tx, lease: Lease, status: RunStatus, payload_json: str, result_json: str | None) -> None:
    """:func:`zincir._store._ends.finish` in two statements: the fence, with the open work read
    beside it, and the end."""
    assert isinstance(tx, PostgresTx)  # this store's
    run_id = lease.run_id
    completing = status is RunStatus.COMPLETED
    open_work = None
    if completing:
        open_work = tx.fence_reading(lease, _OPEN_WORK, (run_id,) * 3)
    else:
        tx.fence(lease)
    # Sent before the checks are read, in their round trip: if the lease or the open work
    # refuses, the raise rolls the end back.
    closing = tx.send(
        _CLOSE,
        (
            *(status.value, _ends.stored_result(tx, run_id, result_json), run_id, run_id, _STATE_TRANSITION),
            stored(tx, run_id, payload_json),
            *(run_id, run_id, run_id, run_id, run_id),
        ),
    )
    if open_work is not None:
        _ends.require_no_open_work(run_id, *open_work.one())
    parent, made_due, told, sharers, streamed = closing.one()
    _ends.note_end(tx, run_id, parent, made_due=made_due, told=told)
    _ends.wake_sharers_and_followers(tx, run_id, sharers, streamed)
    if not completing:
        _ends.cancel_descendants(tx, run_id, f"its ancestor {run_id} ended {status.value}")


# What judge_lease requires of a batch's run (``run``, locked) and its call (``s``) at ``now``.
_LEASE_HELD = (
    "run.lease_owner = s.owner AND run.lease_epoch = s.epoch AND run.lease_expires_at > now.ms"
    f" AND run.status IN ({', '.join(repr(status) for status in LIVE)})"
)

# Several runs' steps in a group commit: their rows locked first (in id order, NOWAIT, as the
# fence of each would: a row held elsewhere refuses at once, before any value of theirs is
# stored), then one statement that reads the clock, judges every lease and inserts every new
# step. How many leases held and how many rows went in say whether every call succeeded as
# complete_step would have.
_LOCK_RUNS = f"SELECT 1 FROM agent_runs WHERE id = ANY(?::text[]) ORDER BY id{POSTGRES.lock_nowait}"
_COMPLETE_STEPS = (
    "WITH now AS MATERIALIZED (SELECT zincir_now_ms() AS ms),"
    " held AS (SELECT s.* FROM unnest(?::text[], ?::text[], ?::bigint[], ?::text[], ?::text[], ?::bigint[])"
    " AS s (run_id, name, epoch, owner, result, elapsed_ms) JOIN agent_runs AS run ON run.id = s.run_id, now"
    f" WHERE {_LEASE_HELD}),"
    " inserted AS (INSERT INTO steps (run_id, name, status, epoch, result, started_at, completed_at)"
    " SELECT held.run_id, held.name, 'completed', held.epoch, held.result, now.ms - held.elapsed_ms, now.ms"
    " FROM held, now ON CONFLICT (run_id, name) DO NOTHING RETURNING 1)"
    " SELECT (SELECT count(*) FROM held), (SELECT count(*) FROM inserted)"
)


def complete_steps(tx: Tx, calls: Sequence[tuple[Lease, str, str, int]]) -> list[str]:
    """:func:`zincir._store._log.complete_step` for several calls (its arguments after the
    transaction, each) in two statements, when each is the common case: the lease holds and the
    step is new. Otherwise :class:`BatchRefused`, and nothing of it is left in the transaction
    that the caller does not roll back: it runs each call on its own then, for its own answer."""
    tx.execute(_LOCK_RUNS, (sorted({lease.run_id for lease, _, _, _ in calls}),))  # read with the next
    columns: tuple[list[object], ...] = ([], [], [], [], [], [])
    for lease, name, result_json, elapsed_ms in calls:
        result = stored(tx, lease.run_id, result_json, whole=True)
        row = (lease.run_id, name, lease.epoch, lease.owner, result, elapsed_ms)
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    held, inserted = tx.one(_COMPLETE_STEPS, columns)
    if held != len(calls) or inserted != len(calls):
        raise BatchRefused(f"{len(calls)} steps: {held} leases held, {inserted} rows new")
    return [result_json for _, _, result_json, _ in calls]


# Several runs' ends in a group commit (a worker's runs that end together): their rows locked
# as the steps' are, then one statement that judges every lease and every completing run's open
# work, ends the runs that pass, logs their ends, makes the parents suspended on them due,
# deletes their end's waiters, and answers one row per run it ended. A run with a live child does
# not pass, whatever its end: a completing one is refused for it, and a failing one's cascade
# must come right after its own end, before the batch's other ends (its child's, say).
# OFFSET 0 keeps each read a probe of the run's own rows: without it the planner may read every
# live run once into a hash table (as it did in comparison 4, on statistics from before the
# workload: a thousand runs read per batch of eight ends).
_CANDIDATE, _OPEN_CALLS, _LIVE_CHILDREN = (
    f"EXISTS ({read} OFFSET 0)" for read in _ends.open_work("s.run_id")
)
_FINISH_RUNS = (
    "WITH now AS MATERIALIZED (SELECT zincir_now_ms() AS ms),"
    " passing AS (SELECT s.* FROM unnest(?::text[], ?::bigint[], ?::text[], ?::text[], ?::text[], ?::text[])"
    " AS s (run_id, epoch, owner, status, result, payload) JOIN agent_runs AS run ON run.id = s.run_id, now"
    f" WHERE {_LEASE_HELD} AND NOT {_LIVE_CHILDREN}"
    f" AND (s.status <> 'completed' OR NOT ({_CANDIDATE} OR {_OPEN_CALLS}))),"
    " closed AS (UPDATE agent_runs AS run SET last_seq = run.last_seq + 1, updated_at = now.ms"
    f"{_ends.ending('passing.status', 'passing.result')} FROM passing, now WHERE run.id = passing.run_id"
    " RETURNING run.id, run.last_seq, run.parent_run_id, passing.payload),"
    " logged AS (INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
    " SELECT closed.id, closed.last_seq, ?, closed.payload, NULL, now.ms FROM closed, now),"
    # A guard: a parent that ends in this batch is running, not waiting (and no row may be
    # updated twice in one statement).
    " woke AS (UPDATE agent_runs SET next_attempt_at = (SELECT ms FROM now) WHERE id IN (SELECT p.id"
    " FROM agent_runs AS p JOIN closed ON p.id = closed.parent_run_id WHERE p.status = 'waiting'"
    " AND p.id NOT IN (SELECT id FROM closed)"
    " AND (p.next_attempt_at IS NULL OR p.next_attempt_at > (SELECT ms FROM now)) AND EXISTS (SELECT 1"
    " FROM run_waits AS w WHERE w.run_id = p.id AND w.kind = 'child' AND w.wake_key = closed.id)"
    " FOR NO KEY UPDATE OF p NOWAIT) RETURNING id),"
    " waited AS (DELETE FROM run_waiters WHERE run_id IN (SELECT id FROM closed) RETURNING run_id)"
    " SELECT closed.id, closed.parent_run_id,"
    " EXISTS (SELECT 1 FROM woke WHERE woke.id = closed.parent_run_id),"
    " EXISTS (SELECT 1 FROM waited WHERE waited.run_id = closed.id),"
    f" ARRAY ({_ends.sharers('closed.id')}), EXISTS ({_ends.streamed('closed.id')})"
    " FROM closed"
)


def finish_runs(tx: Tx, calls: Sequence[tuple[Lease, RunStatus, str, str | None]]) -> list[None]:
    """:func:`finish` for several calls (its arguments after the transaction, each) in two
    statements, when each is the common case: the lease holds, the run has no live child, and a
    completing run has no open work either. Otherwise :class:`BatchRefused` (the caller rolls
    back and runs each call on its own). With no live child, a failed run has no descendant to
    cancel."""
    run_ids = [lease.run_id for lease, _, _, _ in calls]
    if len(set(run_ids)) < len(run_ids):
        raise BatchRefused("one run's end twice")  # the second is refused alone, by its fence
    tx.execute(_LOCK_RUNS, (sorted(run_ids),))  # read with the next
    columns: tuple[list[object], ...] = ([], [], [], [], [], [])
    for lease, status, payload_json, result_json in calls:
        row = (
            *(lease.run_id, lease.epoch, lease.owner, status.value),
            _ends.stored_result(tx, lease.run_id, result_json),
            stored(tx, lease.run_id, payload_json),
        )
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    ended = {row[0]: row[1:] for row in tx.all(_FINISH_RUNS, (*columns, _STATE_TRANSITION))}
    if len(ended) < len(calls):
        raise BatchRefused(f"{len(calls)} ends: {len(ended)} passed their checks")
    for lease, _, _, _ in calls:
        run_id = lease.run_id
        parent, made_due, told, sharers, streamed = ended[run_id]
        _ends.note_end(tx, run_id, parent, made_due=made_due, told=told)
        _ends.wake_sharers_and_followers(tx, run_id, sharers, streamed)
    return [None] * len(calls)


def _spawned_event(child: NewChild) -> str:
    return _dump({"child_id": child.child_id, "name": child.name, "role": child.role})


def _look(tx: Tx, parent_id: str, child_id: str, timeout_ms: int | None) -> Reply:
    """The join's record (stored by the first call, read by later ones) and the child, in one
    statement: the join of a run that is not a child (nor shared by a fork) stores nothing."""
    return tx.send(
        f"WITH child AS (SELECT {RUN_COLUMNS}, EXISTS ({SHARES}) AS shared FROM agent_runs WHERE id = ?),"
        " recorded AS (INSERT INTO joins (run_id, child_id, deadline, created_at)"
        " SELECT ?, child.id, now.ms + ?, now.ms FROM child, (SELECT CAST(:now AS BIGINT) AS ms) AS now"
        " WHERE child.parent_run_id = ? OR child.shared"
        " ON CONFLICT (run_id, child_id) DO UPDATE SET run_id = joins.run_id"
        " RETURNING deadline, completed_at, timed_out)"
        " SELECT child.*, recorded.* FROM child LEFT JOIN recorded ON true",
        (parent_id, child_id, child_id, parent_id, timeout_ms, parent_id),
    )


def _mark(tx: Tx, parent_id: str, child_id: str, type: EventType, payload_json: str, timed_out: bool) -> None:
    """The join's end and the event that says so, in one statement."""
    ended = ", timed_out = 1" if timed_out else ""
    tx.execute(
        f"WITH ended AS (UPDATE joins SET completed_at = :now{ended} WHERE run_id = ? AND child_id = ?),"
        " allocated AS (UPDATE agent_runs SET last_seq = last_seq + 1, updated_at = :now"
        " WHERE id = ? RETURNING last_seq)"
        " INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
        " SELECT ?, last_seq, ?, ?, ?, :now FROM allocated",
        (
            *(parent_id, child_id, parent_id, parent_id, type.value),
            *(stored(tx, parent_id, payload_json), f"join:{child_id}"),
        ),
    )


# Keyed by the operations as a writer is handed them (in the class, ``finish`` is the staticmethod).
_BATCH_FORMS: Mapping[Callable[..., Any], Callable[..., list[Any]]] = types.MappingProxyType(
    {Store.complete_step: complete_steps, finish: finish_runs}
)


class PostgresStore(Store):
    """The shared operations, but for these."""

    # Two statements where the shared form sends seven (the fence, three reads of open work,
    # the end logged, a parent made due, its waiters' rows gone): see the module's docstring.
    finish = staticmethod(finish)
    # One statement per child (the shared form: two), all sent behind the lock: a batch of 100
    # takes 31-34 ms against 38-48 (see the module's docstring).
    spawn_children = staticmethod(spawn_children)
    # One statement per child's look and one per join ended (the shared form: two each):
    # joining 100 ended children takes 47-50 ms against 76-78.
    await_child = staticmethod(functools.partial(await_child, look=_look, mark=_mark))
    join_children = staticmethod(functools.partial(join_children, look=_look, mark=_mark))
    # A group commit's steps, or ends, of several runs in two statements, where each alone
    # sends two: see complete_steps and finish_runs.
    batch_forms = _BATCH_FORMS
