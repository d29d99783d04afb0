"""PostgreSQL's own way of the few operations where it is measurably faster than the shared one.

Every other operation is :mod:`zincir._store`'s. Here, a data-modifying CTE (which SQLite does
not have) does in one statement per child what the shared form needs two for: a batch of a
hundred children sent behind the lock is a hundred statements, not two hundred (measured:
``docs/architecture.md``, "Where a backend has its own way").
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from .._json import dump_trusted as _dump
from .._rows import RUN_COLUMNS
from .._store import Reply, Store, Tx
from .._store._budgets import insert_budget
from .._store._children import await_child, join_children
from .._store._types import Lease, NewChild
from .._types import EventType

__all__ = ["PostgresStore"]


def spawn_children(tx: Tx, lease: Lease, children: Sequence[NewChild]) -> list[str]:
    """:func:`zincir._store._children.spawn_children`, one statement per child: it inserts the
    child and, if the child is new, logs ``child_spawned`` in the parent's log; it returns the
    new child's id, or the one spawned under that name before."""
    tx.fence(lease)
    parent_id = lease.run_id
    inserts = [
        tx.send(
            "WITH now AS MATERIALIZED (SELECT CAST(:now AS BIGINT) AS ms),"
            " spawned AS (INSERT INTO agent_runs (id, parent_run_id, role, provider, status, config,"
            " created_at, updated_at, next_attempt_at, spawn_name, traceparent)"
            " SELECT ?, ?, ?, ?, 'pending', ?, now.ms, now.ms, now.ms, ?, ? FROM now"
            " ON CONFLICT (parent_run_id, spawn_name) WHERE spawn_name IS NOT NULL DO NOTHING RETURNING id),"
            " allocated AS (UPDATE agent_runs SET last_seq = last_seq + 1, updated_at = (SELECT ms FROM now)"
            " WHERE id = ? AND EXISTS (SELECT 1 FROM spawned) RETURNING last_seq),"
            " logged AS (INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
            " SELECT ?, last_seq, ?, ?, ?, now.ms FROM allocated, now)"
            " SELECT (SELECT id FROM spawned),"
            " (SELECT id FROM agent_runs WHERE parent_run_id = ? AND spawn_name = ?)",
            (
                *(child.child_id, parent_id, child.role, child.provider, child.config_json, child.name),
                child.traceparent,
                parent_id,
                *(parent_id, EventType.CHILD_SPAWNED.value, _spawned_event(child), f"spawn:{child.name}"),
                *(parent_id, child.name),
            ),
        )
        for child in children
    ]
    ids = []
    for child, insert in zip(children, inserts, strict=True):
        new, existing = insert.one()
        if new is None:  # spawned before, under this name (a restart repeats the spawn)
            ids.append(str(existing))
            continue
        ids.append(child.child_id)
        tx.wake(claimable=True)
        if child.budget is not None:  # the child's own, whatever its parent spends
            insert_budget(tx, child.child_id, child.budget)
    return ids


def _spawned_event(child: NewChild) -> str:
    return _dump({"child_id": child.child_id, "name": child.name, "role": child.role})


def _look(tx: Tx, parent_id: str, child_id: str, timeout_ms: int | None) -> Reply:
    """The join's record (stored by the first call, read by later ones) and the child, in one
    statement: the join of a run that is not a child stores nothing."""
    return tx.send(
        f"WITH child AS (SELECT {RUN_COLUMNS} FROM agent_runs WHERE id = ?),"
        " recorded AS (INSERT INTO joins (run_id, child_id, deadline, created_at)"
        " SELECT ?, child.id, now.ms + ?, now.ms FROM child, (SELECT CAST(:now AS BIGINT) AS ms) AS now"
        " WHERE child.parent_run_id = ?"
        " ON CONFLICT (run_id, child_id) DO UPDATE SET run_id = joins.run_id"
        " RETURNING deadline, completed_at, timed_out)"
        " SELECT child.*, recorded.* FROM child LEFT JOIN recorded ON true",
        (child_id, parent_id, timeout_ms, parent_id),
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
        (parent_id, child_id, parent_id, parent_id, type.value, payload_json, f"join:{child_id}"),
    )


class PostgresStore(Store):
    """The shared operations, but for these."""

    # One statement per child (the shared form: two), all sent behind the lock: a batch of 100
    # takes 31-34 ms against 38-48 (see the module's docstring).
    spawn_children = staticmethod(spawn_children)
    # One statement per child's look and one per join ended (the shared form: two each):
    # joining 100 ended children takes 47-50 ms against 76-78.
    await_child = staticmethod(functools.partial(await_child, look=_look, mark=_mark))
    join_children = staticmethod(functools.partial(join_children, look=_look, mark=_mark))
