"""JSON views of the records, as ``zincir export``, the CLI's ``--json`` and the inspector's API
give them.

Stored JSON is decoded (never failing, see :func:`._values.json_value`); a value cut to a
prefix is given as that text, with its full size, since a prefix is not the value. A
:class:`._values.Malformed` placeholder becomes its description.
"""

from __future__ import annotations

from typing import Any

from ._events import EventRow
from ._outsiders import OutsiderAction
from ._progress import CheckpointRow, IntentRow, StepRow
from ._runs import RunDetail, RunSummary
from ._streams import StreamChunkRow
from ._values import json_field, json_value, plain
from ._waits import Awaiting, TimerRow

__all__ = [
    "awaiting_to_json",
    "checkpoint_to_json",
    "event_to_json",
    "intent_to_json",
    "outsider_action_to_json",
    "run_to_json",
    "step_to_json",
    "stream_chunk_to_json",
    "timer_to_json",
]


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
        "version": run.version,
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
        data["forked_from"] = run.forked_from
        data["fork_seq"] = plain(run.fork_seq)
        data["forks"] = [{"fork_seq": plain(f.fork_seq), "id": f.run.id} for f in run.forks]
        data["fingerprints"] = None if run.fingerprints is None else json_value(run.fingerprints)
        if run.erased_at is not None:  # its payloads read as {"erased": true} (docs/payloads.md)
            data["erased_at"] = plain(run.erased_at)
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
    return _with_cuts(
        data,
        state=(c.state_truncated, c.state_size),
        verification=(c.verification_truncated, c.verification_size),
    )


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
    return _with_cuts(data, result=(step.truncated, step.result_size))


def stream_chunk_to_json(run_id: str, chunk: StreamChunkRow) -> dict[str, Any]:
    """A JSON-ready dict of a stream's chunk; a cut value is its prefix, listed in ``truncated``."""
    data: dict[str, Any] = {
        "stream": chunk.name,
        "offset": plain(chunk.offset),
        "attempt": plain(chunk.attempt),
        "restarted": chunk.restarted,
        "data": json_field(chunk.data, chunk.truncated),
        "created_at": plain(chunk.created_at),
        "run_id": run_id,
    }
    return _with_cuts(data, data=(chunk.truncated, chunk.size))


def _with_cuts(data: dict[str, Any], /, **values: tuple[bool, int]) -> dict[str, Any]:
    """``data`` with ``truncated``, the stored size of each value cut to a prefix (if any was),
    by field; ``values``: each value's (cut, stored size)."""
    cut = {field: size for field, (truncated, size) in values.items() if truncated}
    if cut:
        data["truncated"] = cut
    return data


def timer_to_json(run_id: str, timer: TimerRow) -> dict[str, Any]:
    return {
        "name": timer.name,
        "wake_at": plain(timer.wake_at),
        "created_at": plain(timer.created_at),
        "completed_at": plain(timer.completed_at),
        "run_id": run_id,
    }


def awaiting_to_json(item: Awaiting) -> dict[str, Any]:
    return {
        "kind": item.kind,
        "name": item.name,
        "target": item.target,
        "since": plain(item.since),
        "until": plain(item.until),
        "wakes": item.wakes,
    }


def intent_to_json(intent: IntentRow) -> dict[str, Any]:
    return {
        "call_id": intent.call_id,
        "name": intent.name,
        "state": intent.state,
        "started": intent.started,
        "last_started_at": plain(intent.last_started_at),
        "reconciled": intent.reconciled,
    }


def outsider_action_to_json(item: OutsiderAction) -> dict[str, Any]:
    return {
        "id": plain(item.id),
        "action": item.action,
        "by": item.by,
        "detail": json_value(item.detail) if not item.detail_truncated else item.detail,
        "detail_truncated": item.detail_truncated,
        "created_at": plain(item.created_at),
    }
