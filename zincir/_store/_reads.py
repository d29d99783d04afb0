"""Reading a run: its row, its log, its steps (no writes; a run that is not there is RunNotFound)."""

from __future__ import annotations

from typing import Any

from .._errors import RunNotFound
from .._payloads import resolved, texts
from .._rows import (
    CHECKPOINT_COLUMNS,
    CHECKPOINT_JSON,
    EVENT_COLUMNS,
    EVENT_JSON,
    RUN_COLUMNS,
    RUN_JSON,
    to_checkpoint,
    to_event,
    to_run,
)
from .._types import Checkpoint, Event, RunRecord, RunStatus
from ._tx import Tx


def get_run(tx: Tx, run_id: str) -> RunRecord:
    """The run as stored. RunNotFound."""
    return _run_of(tx, run_id, tx.one(f"SELECT {RUN_COLUMNS} FROM agent_runs WHERE id = ?", (run_id,)))


def _run_of(tx: Tx, run_id: str, row: Any) -> RunRecord:
    if row is None:
        raise RunNotFound(f"run {run_id} does not exist")
    return to_run(resolved(tx, [row], RUN_JSON)[0])


def list_runs(tx: Tx, status: RunStatus | None, role: str | None, limit: int) -> list[RunRecord]:
    """Runs, oldest first."""
    value = None if status is None else status.value
    rows = tx.all(
        f"SELECT {RUN_COLUMNS} FROM agent_runs WHERE (CAST(? AS TEXT) IS NULL OR status = ?)"
        " AND (CAST(? AS TEXT) IS NULL OR role = ?) ORDER BY created_at, id LIMIT ?",
        (value, value, role, role, limit),
    )
    return [to_run(row) for row in resolved(tx, rows, RUN_JSON)]


def events_after(tx: Tx, run_id: str, after_seq: int, limit: int | None = None) -> list[Event]:
    rows = tx.all(
        f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
        (run_id, after_seq, tx.dialect.limit(limit)),
    )
    return [to_event(run_id, row) for row in resolved(tx, rows, EVENT_JSON)]


def events_page(tx: Tx, run_id: str, after_seq: int, limit: int | None) -> list[Event]:
    """Events with seq > ``after_seq``, in order. RunNotFound."""
    get_run(tx, run_id)  # an unknown run is an error, not an empty page
    return events_after(tx, run_id, after_seq, limit)


_LATEST_ACCEPTED = (
    f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE run_id = ? AND status = 'accepted'"
    " ORDER BY round DESC LIMIT 1"
)


def latest_accepted(tx: Tx, run_id: str) -> Checkpoint | None:
    row = tx.one(_LATEST_ACCEPTED, (run_id,))
    return None if row is None else to_checkpoint(resolved(tx, [row], CHECKPOINT_JSON)[0])


def durable_state(tx: Tx, run_id: str) -> tuple[RunRecord, Checkpoint | None, list[Event]]:
    """The run, its latest accepted checkpoint, and the events after that checkpoint's decision
    and the tool result that answered it (seq > decision + 1). RunNotFound. The events' bound
    is sent as a value: the planner picks the index range for a value, not for a subquery's."""
    run = tx.send(f"SELECT {RUN_COLUMNS} FROM agent_runs WHERE id = ?", (run_id,))
    accepted = tx.send(_LATEST_ACCEPTED, (run_id,))  # with the run's read: one round trip
    record = _run_of(tx, run_id, run.one())
    row = accepted.one()
    checkpoint = None if row is None else to_checkpoint(resolved(tx, [row], CHECKPOINT_JSON)[0])
    after = (
        -1
        if checkpoint is None or checkpoint.decision_event_seq is None
        else checkpoint.decision_event_seq + 1
    )
    return record, checkpoint, events_after(tx, run_id, after)


def completed_step_names(tx: Tx, run_id: str) -> list[str]:
    return [
        row[0]
        for row in tx.all("SELECT name FROM steps WHERE run_id = ? AND status = 'completed'", (run_id,))
    ]


def step_result(tx: Tx, run_id: str, name: str) -> str | None:
    """The stored JSON result of a completed step, or None."""
    row = tx.one(
        "SELECT result FROM steps WHERE run_id = ? AND name = ? AND status = 'completed'", (run_id, name)
    )
    return None if row is None else str(texts(tx, [row[0]])[0])
