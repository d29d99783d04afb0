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

from typing import Any

from .._budget import Usage
from .._sql import KEY_CHARS, Cursor, Dialect, ReadOnly
from .._target import display_target
from ._budgets import budget_lines, budgets_of, spend_text
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
    decode_key,
    encode_key,
    key_json,
    parse_cursor,
    parse_run_id,
    resolve_run_id,
)
from ._outsiders import OutsiderAction, list_outsider_actions
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
    json_field,
    json_value,
    parse_json,
    plain,
    raw_value,
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


def outsider_action_to_json(item: OutsiderAction) -> dict[str, Any]:
    return {
        "id": plain(item.id),
        "action": item.action,
        "by": item.by,
        "detail": json_value(item.detail) if not item.detail_truncated else item.detail,
        "detail_truncated": item.detail_truncated,
        "created_at": plain(item.created_at),
    }
