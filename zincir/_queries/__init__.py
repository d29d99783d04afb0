"""Read-only queries over a zincir database, shared by ``zincir ui`` and the CLI.

Everything here is plain synchronous code over one :class:`ReadOnly` connection opened by
:func:`open_readonly`. This module knows no backend: each backend package brings its own
connection and its :class:`Dialect` (:mod:`zincir._sqlite._readonly`,
:mod:`zincir._postgres._readonly`) -- how it opens, checks the schema, looks up its catalog,
and reads an INTEGER column -- and the statements here are written once over that. Nothing
writes: SQLite is opened with ``mode=ro`` and PostgreSQL in read-only transactions, so the
database itself refuses writes, and no function issues one. Every list is bounded (keyset
pagination), so a run with a million events costs one page, never the whole log.

Rows are normalised before they leave this module, because SQLite (the tables are not
``STRICT``; PostgreSQL's columns are typed, so there these cases never arise) lets anyone
with write access store any type in any column:

- an INTEGER column gives an :class:`int`, or a :class:`Malformed` placeholder when the stored
  value is TEXT, BLOB, REAL or NULL (the placeholder keeps the value for keyset cursors);
- a TEXT column gives a :class:`str` (a BLOB is decoded as UTF-8 with replacement), cut to
  :data:`NAME_CHARS` characters;
- a JSON column is decoded by :func:`json_value`, which never fails: text that is not JSON,
  too deep, or holds ``NaN``/``Infinity`` stays usable (see there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import attrs

from .._budget import BUDGET_COLUMNS, Usage, usage_of
from .._errors import InvalidArgument
from .._sql import KEY_CHARS, Cursor, Dialect, ReadOnly
from .._target import display_target
from ._connect import REQUIRED_TABLES, Reader, open_readonly, read_snapshot
from ._events import (
    SCAN_WINDOW,
    EventPage,
    EventRow,
    event_types,
    get_event,
    iter_events,
    list_events,
)
from ._keys import (
    DEFAULT_PAGE,
    LATEST,
    MAX_PAGE,
    RUN_STATUSES,
    RunCursor,
    check_limit,
    decode_key,
    encode_key,
    key_json,
    parse_cursor,
    parse_run_id,
    resolve_run_id,
)
from ._progress import (
    CheckpointRow,
    IntentRow,
    StepRow,
    candidate_checkpoint,
    get_checkpoint,
    get_step,
    list_checkpoints,
    list_intents,
    list_steps,
    reconciled_results,
    verification_interrupted,
)
from ._runs import (
    CHILD_COUNT_CAP,
    STATUS_COUNT_CAP,
    FamilyNode,
    RunDetail,
    RunPage,
    RunSummary,
    count_runs,
    family_tree,
    get_run,
    list_runs,
)
from ._values import (
    MAX_INT,
    MAX_JSON_DEPTH,
    Int,
    Malformed,
    OptInt,
    as_int,
    as_opt_text,
    as_size,
    as_text,
    json_columns,
    json_field,
    json_value,
    name_column,
    parse_json,
    plain,
    raw_value,
    was_cut,
)
from ._waits import (
    ApprovalRequest,
    Awaiting,
    TimerRow,
    get_approval_request,
    list_awaiting,
    list_open_approvals,
    list_timers,
)

__all__ = [
    "CHILD_COUNT_CAP",
    "DEFAULT_PAGE",
    "KEY_CHARS",
    "LATEST",
    "MAX_INT",
    "MAX_JSON_DEPTH",
    "MAX_PAGE",
    "REQUIRED_TABLES",
    "RUN_STATUSES",
    "SCAN_WINDOW",
    "STATUS_COUNT_CAP",
    "ApprovalRequest",
    "Awaiting",
    "CheckpointRow",
    "Cursor",
    "Dialect",
    "EventPage",
    "EventRow",
    "FamilyNode",
    "Int",
    "IntentRow",
    "Malformed",
    "OptInt",
    "OutsiderAction",
    "ReadOnly",
    "Reader",
    "RunCursor",
    "RunDetail",
    "RunPage",
    "RunSummary",
    "StepRow",
    "TimerRow",
    "Usage",
    "awaiting_to_json",
    "budget_lines",
    "budgets_of",
    "candidate_checkpoint",
    "checkpoint_to_json",
    "count_runs",
    "decode_key",
    "display_target",
    "encode_key",
    "event_to_json",
    "event_types",
    "family_tree",
    "get_approval_request",
    "get_checkpoint",
    "get_event",
    "get_run",
    "get_step",
    "intent_to_json",
    "iter_events",
    "json_value",
    "key_json",
    "list_awaiting",
    "list_checkpoints",
    "list_events",
    "list_intents",
    "list_open_approvals",
    "list_outsider_actions",
    "list_runs",
    "list_steps",
    "list_timers",
    "open_readonly",
    "outsider_action_to_json",
    "parse_cursor",
    "parse_json",
    "parse_run_id",
    "raw_value",
    "read_snapshot",
    "reconciled_results",
    "resolve_run_id",
    "run_to_json",
    "spend_text",
    "step_to_json",
    "timer_to_json",
    "verification_interrupted",
]


# --------------------------------------------------------------------------- opening


# --------------------------------------------------------------------------- stored values


# --------------------------------------------------------------------------- keys and cursors


# --------------------------------------------------------------------------- validation


# --------------------------------------------------------------------------- records


# --------------------------------------------------------------------------- runs


# --------------------------------------------------------------------------- lineage, steps


# --------------------------------------------------------------------------- events


# --------------------------------------------------------------------------- JSON views


def run_to_json(run: RunDetail | RunSummary) -> dict[str, Any]:
    """A JSON-ready dict of a run (``config`` decoded, children as ids)."""
    data: dict[str, Any] = {
        "id": run.id,
        "parent_run_id": run.parent_run_id,
        "role": run.role,
        "provider": run.provider,
        "status": run.status,
        "created_at": plain(run.created_at),
        "updated_at": plain(run.updated_at),
        "event_count": plain(run.event_count),
        "lease_owner": run.lease_owner,
        "lease_expires_at": plain(run.lease_expires_at),
        "attempts": plain(run.attempts),
    }
    if isinstance(run, RunDetail):
        data["config"] = json_field(run.config, run.config_truncated)
        if run.config_truncated:
            data["config_size"] = run.config_size
        data["result"] = None if run.result is None else json_field(run.result, run.result_truncated)
        if run.result_truncated:
            data["result_size"] = run.result_size
        data["lease_epoch"] = plain(run.lease_epoch)
        data["next_attempt_at"] = plain(run.next_attempt_at)
        data["children"] = [child.id for child in run.children]
    return data


def event_to_json(run_id: str, event: EventRow) -> dict[str, Any]:
    data = {
        "run_id": run_id,
        "seq": plain(event.seq),
        "type": event.type,
        "payload": json_field(event.payload, event.truncated),
        "idempotency_key": event.idempotency_key,
        "created_at": plain(event.created_at),
    }
    if event.truncated:
        data["payload_size"] = event.payload_size
    return data


def checkpoint_to_json(run_id: str, checkpoint: CheckpointRow) -> dict[str, Any]:
    """A JSON-ready dict of a checkpoint; a cut value is its prefix, listed in ``truncated``."""
    c = checkpoint
    data: dict[str, Any] = {
        "id": plain(c.id),
        "round": plain(c.round),
        "tool_call_id": c.tool_call_id,
        "status": c.status,
        "based_on_event_seq": plain(c.based_on_event_seq),
        "decision_event_seq": plain(c.decision_event_seq),
        "state": json_field(c.state, c.state_truncated),
        "verification": json_field(c.verification, c.verification_truncated),
        "created_at": plain(c.created_at),
        "decided_at": plain(c.decided_at),
        "run_id": run_id,
    }
    cut = {"state": c.state_size} if c.state_truncated else {}
    if c.verification_truncated:
        cut["verification"] = c.verification_size
    if cut:
        data["truncated"] = cut
    return data


def step_to_json(run_id: str, step: StepRow) -> dict[str, Any]:
    """A JSON-ready dict of a step; a cut result is its prefix, listed in ``truncated``."""
    data: dict[str, Any] = {
        "name": step.name,
        "status": step.status,
        "epoch": plain(step.epoch),
        "result": json_field(step.result, step.truncated),
        "started_at": plain(step.started_at),
        "completed_at": plain(step.completed_at),
        "run_id": run_id,
    }
    if step.truncated:
        data["truncated"] = {"result": step.result_size}
    return data


def timer_to_json(run_id: str, timer: TimerRow) -> dict[str, Any]:
    return {
        "name": timer.name,
        "wake_at": plain(timer.wake_at),
        "created_at": plain(timer.created_at),
        "completed_at": plain(timer.completed_at),
        "run_id": run_id,
    }


# --------------------------------------------------------------------------- approvals


# --------------------------------------------------------------------------- what runs await


def awaiting_to_json(item: Awaiting) -> dict[str, Any]:
    return {
        "kind": item.kind,
        "name": item.name,
        "target": item.target,
        "since": plain(item.since),
        "until": plain(item.until),
        "wakes": item.wakes,
    }


# --------------------------------------------------------------------------- families


# --------------------------------------------------------------------------- budgets


def budgets_of(conn: Reader, run_ids: Sequence[str], now_ms: int) -> dict[str, Usage]:
    """The spend against the limits of each run that has a budget (a database from before
    budgets, schema version 4 or older, has none)."""
    if not run_ids or not conn.has_table("budgets"):
        return {}
    marks = ", ".join("?" * len(run_ids))
    rows = conn.execute(
        "SELECT b.run_id, CASE WHEN r.status IN ('completed', 'failed', 'cancelled') THEN r.updated_at"
        f" ELSE ? END - r.created_at, {', '.join('b.' + c for c in BUDGET_COLUMNS.split(', '))}"
        f" FROM budgets AS b JOIN agent_runs AS r ON r.id = b.run_id WHERE b.run_id IN ({marks})",
        [now_ms, *run_ids],
    )
    found = {}
    for run_id, age, *row in rows:
        try:
            found[as_text(run_id)] = usage_of(row, int(age))
        except (TypeError, ValueError, InvalidArgument):  # a damaged row: shown as none
            continue
    return found


_SHOWN: Final = (
    ("tokens", "tokens"), ("input", "input_tokens"), ("output", "output_tokens"), ("cost", "cost"),
    ("calls", "model_calls"), ("tools", "tool_calls"), ("wall", "wall_time"),
)  # fmt: skip


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.4g}"


def spend_text(usage: Usage) -> str:
    """Spend against limits in a few words, e.g. ``tokens 1,200/200,000 · cost 0.4/5``."""
    s, limits = usage.spent, usage.limits
    parts = []
    for label, name in _SHOWN:
        spent = s.tokens if name == "tokens" else getattr(s, name)
        limit = getattr(limits, name)
        if limit is None and not (name in ("tokens", "cost") and spent):
            continue
        shown = (
            f"{spent:,.0f}s" if name == "wall_time" else f"{spent:,.4g}" if name == "cost" else f"{spent:,}"
        )
        parts.append(f"{label} {shown}" + ("" if limit is None else f"/{_number(limit)}"))
    if limits.max_identical_tool_calls is not None:
        parts.append(f"repeats {s.identical_tool_calls}/{limits.max_identical_tool_calls}")
    if limits.max_responses_without_progress is not None:
        parts.append(f"stalled {s.responses_without_progress}/{limits.max_responses_without_progress}")
    return " · ".join(parts) or "no limits, nothing spent"


def budget_lines(usage: Usage) -> list[tuple[str, object, object, object]]:
    """Each limit of a budget as ``(name, spent, limit, left)``; limit and left are None where
    the budget sets no limit."""
    spent, limits, left = usage.spent, usage.limits, usage.remaining
    pairs = [
        ("tokens", spent.tokens), ("input_tokens", spent.input_tokens),
        ("output_tokens", spent.output_tokens), ("cost", spent.cost), ("model_calls", spent.model_calls),
        ("tool_calls", spent.tool_calls),
        ("wall_time", round(spent.wall_time, 1)), ("max_identical_tool_calls", spent.identical_tool_calls),
        ("max_responses_without_progress", spent.responses_without_progress),
    ]  # fmt: skip
    return [(name, value, getattr(limits, name), getattr(left, name)) for name, value in pairs]


# --------------------------------------------------------------------------- tool intents


def intent_to_json(intent: IntentRow) -> dict[str, Any]:
    return {
        "call_id": intent.call_id,
        "name": intent.name,
        "state": intent.state,
        "started": intent.started,
        "last_started_at": plain(intent.last_started_at),
        "reconciled": intent.reconciled,
    }


# --------------------------------------------------------------------------- audit trail


@attrs.frozen
class OutsiderAction:
    """One row of a run's audit trail: an outsider's write (schema version 7 and later).

    ``action`` is what was done (signal, approve, deny, cancel, retry_now, raise_budget),
    ``by`` who did it as the caller named them (``None``: nobody was named), ``detail`` the
    stored JSON text of what the write said (cut to a prefix, see ``detail_truncated``).
    """

    id: Int
    action: str
    by: str | None
    detail: str
    detail_truncated: bool
    created_at: Int


def list_outsider_actions(
    conn: Reader, run_id: str, *, limit: int | None = None, max_chars: int | None = 500
) -> tuple[OutsiderAction, ...]:
    """The run's latest outsiders' writes, newest first (one indexed read): the first
    ``limit`` (all by default), each ``detail`` cut to ``max_chars``. A database from before
    the audit trail (schema version 6 or older) has none."""
    if limit is not None:
        check_limit(limit)
    if not conn.has_table("outsider_actions"):
        return ()
    d = conn.dialect
    rows = conn.execute(
        f"SELECT {d.int_column('id')}, {name_column('action')}, {name_column('done_by')},"
        f" {json_columns('detail', max_chars)}, {d.int_column('created_at')}"
        " FROM outsider_actions WHERE run_id = ? ORDER BY id DESC LIMIT ?",
        (run_id, d.unlimited if limit is None else limit),
    )
    return tuple(
        OutsiderAction(
            as_int(r[0]),
            as_text(r[1]),
            as_opt_text(r[2]),
            as_text(r[3]),
            was_cut(max_chars, as_size(r[4])),
            as_int(r[5]),
        )
        for r in rows
    )


def outsider_action_to_json(item: OutsiderAction) -> dict[str, Any]:
    return {
        "id": plain(item.id),
        "action": item.action,
        "by": item.by,
        "detail": json_value(item.detail) if not item.detail_truncated else item.detail,
        "detail_truncated": item.detail_truncated,
        "created_at": plain(item.created_at),
    }
