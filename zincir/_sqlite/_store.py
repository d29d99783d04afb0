"""SQLite's own way of an operation where it is measurably faster than the shared one: a group
commit's steps of several runs, their leases read in one statement and their rows inserted by
one ``executemany``, where each step alone runs two statements and the Python around them
(docs/architecture.md, "Where a backend has its own way")."""

from __future__ import annotations

import types
from collections.abc import Sequence

from .._errors import ZincirError
from .._payloads import stored
from .._store import BatchRefused, Lease, Store, judge_lease
from ._connection import Tx

__all__ = ["SQLiteStore"]

_STEP_ROW = (
    "INSERT INTO steps (run_id, name, status, epoch, result, started_at, completed_at)"
    " VALUES (?, ?, 'completed', ?, ?, :now - ?, :now) ON CONFLICT (run_id, name) DO NOTHING"
)


def complete_steps(tx: Tx, calls: Sequence[tuple[Lease, str, str, int]]) -> list[str]:
    """:func:`zincir._store._log.complete_step` for several calls (its arguments after the
    transaction, each), when each is the common case: the lease holds and the step is new.
    Otherwise :class:`BatchRefused` (the caller rolls back and runs each call on its own)."""
    ids = tuple({lease.run_id for lease, _, _, _ in calls})
    found = tx.all(
        "SELECT id, status, lease_owner, lease_epoch, lease_expires_at FROM agent_runs"
        f" WHERE id IN ({', '.join('?' * len(ids))})",
        ids,
    )
    rows = {row[0]: row[1:] for row in found}
    now = tx.now
    for lease, _, _, _ in calls:
        try:
            judge_lease(lease, rows.get(lease.run_id), now)  # (builds no message when it holds)
        except ZincirError as exc:
            raise BatchRefused(str(exc)) from exc
    inserted = tx.count_many(
        _STEP_ROW,
        [
            (lease.run_id, name, lease.epoch, stored(tx, lease.run_id, result_json, whole=True), elapsed_ms)
            for lease, name, result_json, elapsed_ms in calls
        ],
    )
    if inserted != len(calls):
        raise BatchRefused(f"{len(calls)} steps, {inserted} new")
    return [result_json for _, _, result_json, _ in calls]


class SQLiteStore(Store):
    """The shared operations, with a batch form for steps."""

    batch_forms = types.MappingProxyType({Store.complete_step: complete_steps})
