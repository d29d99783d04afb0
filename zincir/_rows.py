"""Rows as zincir hands them out: the same columns on every backend, decoded here once.

The storage operations read the JSON value columns named here through ``zincir._payloads``
(which opens encrypted ones); a value of an erased run decodes to ``zincir.ERASED``.
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from ._crypto import ERASED, ERASED_TEXT
from ._json import decode
from ._types import Checkpoint, CheckpointState, Event, EventType, RunRecord, RunStatus, Verification

RUN_COLUMNS = (
    "id, parent_run_id, role, provider, status, config, created_at, updated_at, result,"
    " forked_from, fork_seq, version, fingerprints"
)
CHECKPOINT_COLUMNS = (
    "id, run_id, round, tool_call_id, based_on_event_seq, decision_event_seq, status, state,"
    " verification, created_at, decided_at"
)
EVENT_COLUMNS = "seq, type, payload, idempotency_key, created_at"
# Where the JSON value columns are in each (read through zincir._payloads before decoding).
RUN_JSON = (5, 8)
CHECKPOINT_JSON = (7, 8)
EVENT_JSON = (2,)


def decode_value(text: str) -> Any:
    """A JSON value column's value, read through ``zincir._payloads``: ``zincir.ERASED`` for
    an erased run's."""
    return ERASED if text == ERASED_TEXT else decode(text)


def to_run(row: Any) -> RunRecord:
    (
        id,
        parent,
        role,
        provider,
        status,
        config,
        created_at,
        updated_at,
        result,
        forked_from,
        fork_seq,
        version,
        prints,
    ) = row
    return RunRecord(
        id, parent, role, provider, RunStatus(status), decode_value(config), created_at, updated_at,
        None if result is None else decode_value(result), forked_from, fork_seq, version,
        {} if prints is None else decode(prints),
    )  # fmt: skip


def to_event(run_id: str, row: Any) -> Event:
    seq, type, payload, key, created_at = row
    return Event(run_id, seq, EventType(type), decode_value(payload), key, created_at)


def to_checkpoint(row: Any) -> Checkpoint:
    (id, run_id, round, call_id, based_on, decision, status, state, verification, created, decided) = row
    verdict = None
    if verification == ERASED_TEXT:
        verdict = Verification(False, ERASED)
    elif verification is not None:
        data = decode(verification)
        verdict = Verification(bool(data["passed"]), data.get("evidence"))
    return Checkpoint(
        id, run_id, round, call_id, based_on, decision, status,
        _ERASED_STATE if state == ERASED_TEXT else CheckpointState.from_json(decode(state)), verdict,
        created, decided,
    )  # fmt: skip


_ERASED_STATE: Final = attrs.evolve(
    CheckpointState.from_json({f.name: [] for f in attrs.fields(CheckpointState) if f.name != "data"}),
    data=ERASED,
)
"""An erased run's checkpoint state: its lists empty, its ``data`` ``zincir.ERASED``."""
