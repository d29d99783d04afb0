"""What runs wait for: signals, approvals, children, sleeps and budgets, with their deadlines.

Open waits come from their own tables (``waits``, ``approvals``, ``joins``, ``timers``); a
suspended run's wake-up conditions (``run_waits``) say which of them wake it, and a budget
has no table of open waits, so it appears only there. Databases from before a table existed
have none of its waits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from .._payloads import resolved
from ._connect import Reader
from ._keys import check_limit
from ._values import Int, OptInt, as_int, as_opt_int, as_text, json_value, name_column

__all__ = [
    "ApprovalRequest",
    "Awaiting",
    "TimerRow",
    "get_approval_request",
    "list_awaiting",
    "list_open_approvals",
    "list_timers",
]


@attrs.frozen
class TimerRow:
    name: str
    wake_at: Int
    created_at: Int
    completed_at: OptInt


def list_timers(conn: Reader, run_id: str, *, limit: int | None = None) -> tuple[TimerRow, ...]:
    """The run's durable timers by wake time (the first ``limit``; all by default)."""
    d = conn.dialect
    rows = conn.execute(
        f"SELECT {name_column('name')}, {d.int_column('wake_at')}, {d.int_column('created_at')},"
        f" {d.int_column('completed_at')}"
        " FROM timers WHERE run_id = ? ORDER BY wake_at, name LIMIT ?",
        (run_id, d.limit(limit)),
    )
    return tuple(TimerRow(as_text(r[0]), as_int(r[1]), as_int(r[2]), as_opt_int(r[3])) for r in rows)


@attrs.frozen
class ApprovalRequest:
    """An approval request, with the tool call it is for."""

    run_id: str
    call_id: str
    tool: str
    args: Any
    args_hash: str
    requested_at: int
    deadline: int | None
    approved: bool | None
    decided_by: str | None


_APPROVAL_SQL = (
    "SELECT a.run_id, a.call_id, a.tool_name, e.payload, a.args_hash, a.requested_at, a.deadline,"
    " a.approved, a.decided_by FROM approvals AS a"
    " JOIN tool_intents AS t ON t.run_id = a.run_id AND t.call_id = a.call_id"
    " JOIN events AS e ON e.run_id = t.run_id AND e.seq = t.intent_seq"
)


def _approval_request(row: Sequence[Any]) -> ApprovalRequest:
    run_id, call_id, tool, payload, hash_, requested_at, deadline, approved, by = row
    intent = json_value(payload)
    args = intent.get("args") if isinstance(intent, dict) else None
    return ApprovalRequest(
        as_text(run_id), as_text(call_id), as_text(tool), args, as_text(hash_), int(requested_at),
        None if deadline is None else int(deadline), None if approved is None else bool(approved),
        None if by is None else as_text(by),
    )  # fmt: skip


def list_open_approvals(
    conn: Reader, run_id: str | None, now_ms: int, *, limit: int
) -> tuple[ApprovalRequest, ...]:
    """Undecided requests that can still be decided (live run, call unanswered, deadline not
    passed), oldest first."""
    rows = conn.execute(
        f"{_APPROVAL_SQL} JOIN agent_runs AS r ON r.id = a.run_id"
        " WHERE a.decided_at IS NULL AND a.timed_out = 0 AND t.result_seq IS NULL"
        " AND r.status IN ('pending', 'running', 'waiting') AND (a.deadline IS NULL OR a.deadline > ?)"
        " AND (CAST(? AS TEXT) IS NULL OR a.run_id = ?) ORDER BY a.requested_at, a.run_id LIMIT ?",
        (now_ms, run_id, run_id, check_limit(limit)),
    )
    return tuple(_approval_request(r) for r in resolved(conn, list(rows), (3,)))


def get_approval_request(conn: Reader, run_id: str, call_id: str) -> ApprovalRequest | None:
    rows = list(conn.execute(f"{_APPROVAL_SQL} WHERE a.run_id = ? AND a.call_id = ?", (run_id, call_id)))
    return _approval_request(resolved(conn, rows, (3,))[0]) if rows else None


@attrs.frozen
class Awaiting:
    """One thing a run waits for: a signal (``name`` is the wait, ``target`` the topic), an
    approval (``name`` is the call id, ``target`` the tool), a child run to end (``name`` is its
    id), a sleep (``target`` is empty for both) or, for a run suspended on it, its budget raised
    (``name`` is the limit reached).
    ``until`` is the deadline or wake time; None waits for ever. ``wakes``: the run is
    suspended and this wait is one of those that wake it, whichever comes first."""

    run_id: str
    kind: str
    name: str
    target: str
    since: Int
    until: OptInt
    wakes: bool = False

    def describe(self) -> str:
        if self.kind == "signal":
            return f"signal {self.target!r} (wait {self.name!r})"
        if self.kind == "approval":
            return f"approval of call {self.name!r} ({self.target})"
        if self.kind == "child":
            return f"child run {self.name}"
        if self.kind == "budget":
            return f"its budget raised ({self.name} reached)"
        return f"sleep {self.name!r}"


def list_awaiting(conn: Reader, run_ids: Sequence[str]) -> dict[str, tuple[Awaiting, ...]]:
    """The open waits, approval requests and sleeps of each run, soonest deadline first (those
    without one last). A database from before signals (schema version 1) has sleeps only."""
    if not run_ids:
        return {}
    d = conn.dialect
    marks = ", ".join("?" * len(run_ids))
    parts = [
        f"SELECT run_id, 'sleep', {name_column('name')}, '', {d.int_column('created_at')},"
        f" {d.int_column('wake_at')}"
        f" FROM timers WHERE run_id IN ({marks}) AND completed_at IS NULL"
    ]
    if conn.has_table("joins"):
        parts.append(
            f"SELECT run_id, 'child', {name_column('child_id')}, '', {d.int_column('created_at')},"
            f" {d.int_column('deadline')}"
            f" FROM joins WHERE run_id IN ({marks}) AND completed_at IS NULL"
        )
    if conn.has_table("waits"):
        parts.append(
            f"SELECT run_id, 'signal', {name_column('name')}, {name_column('topic')},"
            f" {d.int_column('created_at')},"
            f" {d.int_column('deadline')} FROM waits WHERE run_id IN ({marks}) AND completed_at IS NULL"
        )
        parts.append(
            f"SELECT run_id, 'approval', {name_column('call_id')}, {name_column('tool_name')},"
            f" {d.int_column('requested_at')}, {d.int_column('deadline')} FROM approvals"
            f" WHERE run_id IN ({marks}) AND decided_at IS NULL AND timed_out = 0"
        )
    rows = conn.execute(" UNION ALL ".join(parts), [*run_ids] * len(parts))
    suspended = _suspended_on(conn, run_ids)
    found: dict[str, list[Awaiting]] = {}
    for run_id, kind, name, target, since, until in rows:
        wakes = (kind, as_text(name)) in suspended.get(as_text(run_id), {})
        item = Awaiting(
            as_text(run_id), kind, as_text(name), as_text(target), as_int(since), as_opt_int(until), wakes
        )
        found.setdefault(item.run_id, []).append(item)
    for run_id, waits in suspended.items():  # a budget has no table of open waits
        for (kind, name), since in waits.items():
            if kind == "budget":
                found.setdefault(run_id, []).append(Awaiting(run_id, kind, name, "", since, None, True))
    return {run_id: tuple(sorted(items, key=_soonest_first)) for run_id, items in found.items()}


def _suspended_on(conn: Reader, run_ids: Sequence[str]) -> dict[str, dict[tuple[str, str], Int]]:
    """For each of the runs that is suspended: the waits that wake it (kind, name), and since when."""
    if not conn.has_table("run_waits"):
        return {}
    marks = ", ".join("?" * len(run_ids))
    rows = conn.execute(
        f"SELECT w.run_id, w.kind, {name_column('w.name')}, {conn.dialect.int_column('w.created_at')}"
        " FROM run_waits AS w JOIN agent_runs AS r ON r.id = w.run_id"
        f" WHERE w.run_id IN ({marks}) AND r.status = 'waiting'",
        list(run_ids),
    )
    found: dict[str, dict[tuple[str, str], Int]] = {}
    for run_id, kind, name, since in rows:
        found.setdefault(as_text(run_id), {})[(as_text(kind), as_text(name))] = as_int(since)
    return found


def _soonest_first(item: Awaiting) -> tuple[bool, int, str]:
    return item.until is None, item.until if isinstance(item.until, int) else 0, item.name
