"""Rows as zincir hands them out: the same columns on every backend, decoded here once.

The storage operations open encrypted values first (``zincir._crypto.unseal_rows`` with the
columns named here); a value of an erased run decodes to ``zincir.ERASED``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import attrs

from ._crypto import CONFIG, ERASED, ERASED_TEXT, EVENT, RESULT, STATE, VERIFICATION, unseal_rows
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

if TYPE_CHECKING:
    from ._store._tx import Tx

RUN_SEALED: Final = {5: CONFIG, 8: RESULT}
CHECKPOINT_SEALED: Final = {7: STATE, 8: VERIFICATION}
EVENT_SEALED: Final = {2: EVENT}


def _load(text: str) -> Any:
    return ERASED if text == ERASED_TEXT else decode(text)


def runs_of(tx: Tx, rows: list[Any]) -> list[RunRecord]:
    return [to_run(row) for row in unseal_rows(tx, rows, RUN_SEALED)]


def events_of(tx: Tx, run_id: str, rows: list[Any]) -> list[Event]:
    return [to_event(run_id, row) for row in unseal_rows(tx, rows, EVENT_SEALED)]


def checkpoint_of(tx: Tx, row: Any) -> Checkpoint:
    return to_checkpoint(unseal_rows(tx, [row], CHECKPOINT_SEALED)[0])


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
        id, parent, role, provider, RunStatus(status), _load(config), created_at, updated_at,
        None if result is None else _load(result), forked_from, fork_seq, version,
        {} if prints is None else decode(prints),
    )  # fmt: skip


def to_event(run_id: str, row: Any) -> Event:
    seq, type, payload, key, created_at = row
    return Event(run_id, seq, EventType(type), _load(payload), key, created_at)


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
