"""What a run has done: its checkpoints, its durable steps, and its tool calls.

Stored states, verifications and results can be large: the lists cut each to a prefix in
SQL, and one whole item is read by its key (:func:`get_checkpoint`, :func:`get_step`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from .._payloads import cut_texts
from .._sql import Dialect
from ._connect import Reader
from ._keys import check_limit, comparable
from ._runs import RunDetail
from ._values import (
    Int,
    OptInt,
    as_int,
    as_opt_int,
    as_opt_text,
    as_size,
    as_text,
    json_columns,
    name_column,
    was_cut,
)

__all__ = [
    "CheckpointRow",
    "IntentRow",
    "StepRow",
    "candidate_checkpoint",
    "get_checkpoint",
    "get_step",
    "list_checkpoints",
    "list_intents",
    "list_steps",
    "open_state",
    "reconciled_results",
    "start_marks",
    "verification_interrupted",
]


@attrs.frozen
class CheckpointRow:
    """A checkpoint candidate or decision. ``state``/``verification`` are stored JSON text.

    Each may be only a prefix of the stored value: ``*as_size`` is the stored length in
    characters and ``*_truncated`` says whether it was cut.
    """

    id: Int
    round: Int
    tool_call_id: str
    status: str
    based_on_event_seq: Int
    decision_event_seq: OptInt
    state: str
    verification: str | None
    created_at: Int
    decided_at: OptInt
    state_size: int = 0
    verification_size: int = 0
    state_truncated: bool = False
    verification_truncated: bool = False

    @property
    def truncated(self) -> bool:
        return self.state_truncated or self.verification_truncated


@attrs.frozen
class StepRow:
    """A durable step. ``result`` is stored JSON text, possibly cut (``truncated``)."""

    name: str
    status: str
    epoch: Int
    result: str | None
    started_at: Int
    completed_at: OptInt
    result_size: int = 0
    truncated: bool = False


def _checkpoint_sql(d: Dialect, max_chars: int | None) -> str:
    return (
        f"SELECT {d.int_column('id')}, {d.int_column('round')}, {name_column('tool_call_id')},"
        f" {name_column('status')},"
        f" {d.int_column('based_on_event_seq')}, {d.int_column('decision_event_seq')},"
        f" {json_columns('state', max_chars)}, {json_columns('verification', max_chars)},"
        f" {d.int_column('created_at')}, {d.int_column('decided_at')} FROM checkpoints"
    )


def _cut_checkpoints(conn: Reader, rows: Sequence[Sequence[Any]], max_chars: int | None) -> list[Any]:
    return cut_texts(conn, rows, (6, 8), max_chars)


def _checkpoint(row: Sequence[Any], max_chars: int | None) -> CheckpointRow:
    state_size, verification_size = as_size(row[7]), as_size(row[9])
    return CheckpointRow(
        id=as_int(row[0]),
        round=as_int(row[1]),
        tool_call_id=as_text(row[2]),
        status=as_text(row[3]),
        based_on_event_seq=as_int(row[4]),
        decision_event_seq=as_opt_int(row[5]),
        state=as_text(row[6]),
        verification=as_opt_text(row[8]),
        created_at=as_int(row[10]),
        decided_at=as_opt_int(row[11]),
        state_size=state_size,
        verification_size=verification_size,
        state_truncated=was_cut(max_chars, state_size),
        verification_truncated=row[8] is not None and was_cut(max_chars, verification_size),
    )


def list_checkpoints(
    conn: Reader, run_id: str, *, limit: int | None = None, max_chars: int | None = None
) -> tuple[CheckpointRow, ...]:
    """The run's checkpoints by round (the first ``limit`` rounds; all by default).

    ``max_chars`` cuts ``state`` and ``verification`` to a prefix in SQL, so a long list of
    large states costs only the prefixes (see :func:`get_checkpoint` for one whole row).
    """
    d = conn.dialect
    rows = conn.execute(
        _checkpoint_sql(d, max_chars) + " WHERE run_id = ? ORDER BY round LIMIT ?",
        (run_id, d.limit(limit)),
    )
    return tuple(_checkpoint(row, max_chars) for row in _cut_checkpoints(conn, list(rows), max_chars))


def get_checkpoint(conn: Reader, run_id: str, round: object) -> CheckpointRow | None:
    """One checkpoint by round, with its whole state and verification, or ``None``."""
    d = conn.dialect
    if not comparable(d, round, int):
        return None
    sql = _checkpoint_sql(d, None) + " WHERE run_id = ? AND round = ?"
    row = conn.execute(sql, (run_id, round)).fetchone()
    return None if row is None else _checkpoint(_cut_checkpoints(conn, [row], None)[0], None)


def candidate_checkpoint(conn: Reader, run_id: str) -> CheckpointRow | None:
    """The run's undecided candidate (there is one at most), its values cut to 8 KiB; by the
    status index, whatever the number of rounds."""
    sql = _checkpoint_sql(conn.dialect, 8192) + " WHERE run_id = ? AND status = 'candidate' LIMIT 1"
    row = conn.execute(sql, (run_id,)).fetchone()
    return None if row is None else _checkpoint(_cut_checkpoints(conn, [row], 8192)[0], 8192)


def verification_interrupted(run: RunDetail, candidate: CheckpointRow, now_ms: int) -> bool:
    """Whether a candidate's verification was interrupted, rather than (maybe) under way.

    The owner proposes the candidate, runs the verifier and records its decision, logging
    nothing in between. So the verification is over, undecided, once the log has events past
    the proposal (the verifier failed and the run went on, or a new owner took over), or once
    no owner holds the run (it crashed, ended, or is suspended).
    """
    proposed = candidate.based_on_event_seq  # the proposal is the event after it
    held = (
        run.status == "running"
        and run.lease_owner is not None
        and type(run.lease_expires_at) is int
        and run.lease_expires_at > now_ms
    )
    later = type(proposed) is int and type(run.event_count) is int and run.event_count > proposed + 2
    return later or not held


#: How a result that a reconcile probe found ends: zincir writes event payloads as compact JSON
#: with sorted keys, so ``"reconciled": true`` of ``{"call_id", "content", "reconciled"}`` is last.
_RECONCILED = '%,"reconciled":true}'
#: The same, of a payload whose content is stored in parts (zincir._payloads): its last literal,
#: matched with an escape character that is not the backslash (PostgreSQL's default).
_RECONCILED_IN_PARTS = '%,\\"reconciled\\":true}"]'


def reconciled_results(conn: Reader, run_id: str, seqs: Sequence[object]) -> frozenset[object]:
    """Which of the ``tool_result`` events at ``seqs`` a reconcile probe found (by primary key)."""
    wanted = sorted({s for s in seqs if type(s) is int})
    if not wanted:
        return frozenset()
    rows = conn.execute(
        f"SELECT {conn.dialect.int_column('seq')} FROM events WHERE run_id = ? AND type = 'tool_result'"
        f" AND seq IN ({', '.join('?' * len(wanted))}) AND (payload LIKE ? OR payload LIKE ? ESCAPE '|')",
        [run_id, *wanted, _RECONCILED, _RECONCILED_IN_PARTS],
    )
    return frozenset(as_int(row[0]) for row in rows)


def _step_sql(d: Dialect, max_chars: int | None) -> str:
    return (
        f"SELECT {name_column('name')}, {name_column('status')}, {d.int_column('epoch')},"
        f" {json_columns('result', max_chars)},"
        f" {d.int_column('started_at')}, {d.int_column('completed_at')} FROM steps"
    )


def _step(row: Sequence[Any], max_chars: int | None) -> StepRow:
    size = as_size(row[4])
    return StepRow(
        name=as_text(row[0]),
        status=as_text(row[1]),
        epoch=as_int(row[2]),
        result=as_opt_text(row[3]),
        started_at=as_int(row[5]),
        completed_at=as_opt_int(row[6]),
        result_size=size,
        truncated=row[3] is not None and was_cut(max_chars, size),
    )


def list_steps(
    conn: Reader, run_id: str, *, limit: int | None = None, max_chars: int | None = None
) -> tuple[StepRow, ...]:
    """The run's durable steps by start time (the first ``limit``; all by default).

    ``max_chars`` cuts each ``result`` to a prefix in SQL (see :func:`get_step`).
    """
    d = conn.dialect
    rows = conn.execute(
        _step_sql(d, max_chars) + " WHERE run_id = ? ORDER BY started_at, name LIMIT ?",
        (run_id, d.limit(limit)),
    )
    return tuple(_step(row, max_chars) for row in cut_texts(conn, list(rows), (3,), max_chars))


def get_step(conn: Reader, run_id: str, name: str) -> StepRow | None:
    """One step by name, with its whole result, or ``None``."""
    sql = _step_sql(conn.dialect, None) + " WHERE run_id = ? AND name = ?"
    row = conn.execute(sql, (run_id, name)).fetchone()
    return None if row is None else _step(cut_texts(conn, [row], (3,), None)[0], None)


@attrs.frozen
class IntentRow:
    """A tool intent and what is known of it: ``done`` (it has a result; ``done, found by a
    probe`` when a reconcile probe found it: ``reconciled``), ``started, outcome unknown`` (its
    tool began at least once: a crash may have come before or after the effect), ``never
    started`` (safe to run), or ``checkpoint candidate, undecided`` (a ``submit_checkpoint``
    call whose candidate awaits its verifier's decision). Databases older than start marks say
    ``pending``."""

    call_id: str
    name: str
    state: str
    started: int | None
    last_started_at: OptInt
    reconciled: bool = False


def start_marks(conn: Reader) -> str:
    """SQL for an intent's start marks, ``started`` (a count) and ``last_started_at``: two NULLs
    on a database from before start marks."""
    if not conn.has_column("tool_intents", "started"):
        return "NULL, NULL"
    d = conn.dialect
    return f"{d.int_column('started')}, {d.int_column('last_started_at')}"


def open_state(started: object) -> str:
    """What is known of an intent that has no result, by its start count (None: a database from
    before start marks)."""
    if started is None:
        return "pending"
    return "started, outcome unknown" if started else "never started"


def list_intents(conn: Reader, run_id: str, *, limit: int = 100) -> tuple[IntentRow, ...]:
    """The run's open intents first (oldest first), then the latest done ones, ``limit`` in all."""
    d = conn.dialect
    rows = list(
        conn.execute(
            f"SELECT {name_column('call_id')}, {name_column('name')}, {d.int_column('result_seq')},"
            f" {start_marks(conn)} FROM tool_intents WHERE run_id = ? ORDER BY result_seq IS NOT NULL,"
            " CASE WHEN result_seq IS NULL THEN intent_seq ELSE -intent_seq END LIMIT ?",
            (run_id, check_limit(limit)),
        )
    )
    found_by_probe = reconciled_results(conn, run_id, [r[2] for r in rows if r[2] is not None])
    candidate = candidate_checkpoint(conn, run_id)
    found = []
    for call_id, name, result_seq, count, last in rows:
        reconciled = result_seq is not None and as_int(result_seq) in found_by_probe
        if result_seq is not None:
            state = "done, found by a probe" if reconciled else "done"
        elif candidate is not None and as_text(call_id) == candidate.tool_call_id:
            state = "checkpoint candidate, undecided"
        else:
            state = open_state(count)
        found.append(
            IntentRow(as_text(call_id), as_text(name), state, as_opt_int(count), as_opt_int(last), reconciled)  # type: ignore[arg-type]
        )
    return tuple(found)
