"""The run's log and what hangs off it: events, reads, steps, sleeps, checkpoints.

Each function is one storage operation (or a helper of several), run inside one transaction
(see :mod:`zincir._store._tx`). A write on behalf of a run's owner is fenced: it calls
``tx.fence(lease)`` first, and raises LeaseLost, RunTerminal or RunNotFound if the lease does
not hold.
"""

from __future__ import annotations

from .._budget import Debit, Exceeded
from .._errors import (
    CheckpointNotPending,
    ConflictingResult,
    DuplicateToolCall,
    InvalidArgument,
    NoDurableIntent,
)
from .._json import decode
from .._json import dump_trusted as _dump
from .._payloads import resolved, stored, texts
from .._rows import CHECKPOINT_COLUMNS, CHECKPOINT_JSON, to_checkpoint
from .._types import Checkpoint, EventType
from . import _budgets
from ._reads import step_result
from ._tx import Tx
from ._types import SUBMIT_CHECKPOINT, IntentRow, Lease

# -- appending events -------------------------------------------------------------------------


def allocate(tx: Tx, run_id: str, count: int, run_set: str = "") -> int:
    """Reserve ``count`` consecutive seqs for the run; returns the first. ``run_set`` (``,
    column = value`` assignments) changes more of the run's row in the same UPDATE."""
    (last,) = tx.one(
        f"UPDATE agent_runs SET last_seq = last_seq + ?, updated_at = :now{run_set} WHERE id = ?"
        " RETURNING last_seq",
        (count, run_id),
    )
    return int(last) - count + 1


def insert_event(
    tx: Tx, run_id: str, seq: int, type: EventType, payload_json: str, key: str | None = None
) -> None:
    """One event at a seq :func:`allocate` reserved."""
    tx.execute(
        "INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
        " VALUES (?, ?, ?, ?, ?, :now)",
        (run_id, seq, type.value, stored(tx, run_id, payload_json), key),
    )


def append(tx: Tx, run_id: str, type: EventType, payload_json: str, key: str | None = None) -> int:
    """One event at the run's next seq; its seq (``tx.log``, read)."""
    return int(tx.log(run_id, type, payload_json, key).one()[0])


# -- durable steps and sleeps -----------------------------------------------------------------


def complete_step(tx: Tx, lease: Lease, name: str, result_json: str, elapsed_ms: int) -> str:
    """Store a step's result (the first one wins) and return the stored one. Fenced."""
    tx.fence(lease)
    # A count, not RETURNING: sqlite3 runs a RETURNING statement several µs slower. (Folding
    # the fence into this INSERT as INSERT ... SELECT was measured too: no cheaper.)
    inserted = tx.count(
        "INSERT INTO steps (run_id, name, status, epoch, result, started_at, completed_at)"
        " VALUES (?, ?, 'completed', ?, ?, :now - ?, :now) ON CONFLICT (run_id, name) DO NOTHING",
        (lease.run_id, name, lease.epoch, stored(tx, lease.run_id, result_json, whole=True), elapsed_ms),
    )
    if inserted:
        return result_json  # the common case: no second read of what was just written
    first = step_result(tx, lease.run_id, name)
    assert first is not None
    return first


def schedule_timer(tx: Tx, lease: Lease, name: str, delay_ms: int) -> tuple[int, bool]:
    """Store the wake time on the first call (later calls keep it); (ms left until it,
    completed). Fenced."""
    tx.fence(lease)
    tx.execute(
        "INSERT INTO timers (run_id, name, wake_at, created_at) VALUES (?, ?, :now + ?, :now)"
        " ON CONFLICT (run_id, name) DO NOTHING",
        (lease.run_id, name, delay_ms),
    )
    wake_at, completed_at = tx.one(
        "SELECT wake_at, completed_at FROM timers WHERE run_id = ? AND name = ?", (lease.run_id, name)
    )
    return max(0, int(wake_at) - tx.now), completed_at is not None


def complete_timer(tx: Tx, lease: Lease, name: str) -> None:
    """Fenced."""
    tx.fence(lease)
    tx.execute(
        "UPDATE timers SET completed_at = :now WHERE run_id = ? AND name = ? AND completed_at IS NULL",
        (lease.run_id, name),
    )


# -- checkpoints ------------------------------------------------------------------------------


def propose_checkpoint(tx: Tx, lease: Lease, call_id: str, state_json: str) -> Checkpoint:
    """Store a candidate for a pending ``submit_checkpoint`` intent, before any verifier runs.
    Fenced; CheckpointNotPending."""
    tx.fence(lease)
    where = f"run {lease.run_id}: checkpoint call {call_id!r}"
    row = tx.one(
        "SELECT name, response_seq, result_seq FROM tool_intents WHERE run_id = ? AND call_id = ?",
        (lease.run_id, call_id),
    )
    if row is None:
        raise CheckpointNotPending(f"{where} has no durable intent")
    name, response_seq, result_seq = row
    if name != SUBMIT_CHECKPOINT:
        raise CheckpointNotPending(f"{where} is a {name!r} call, not {SUBMIT_CHECKPOINT}")
    if result_seq is not None:
        raise CheckpointNotPending(f"{where} was already decided")
    siblings = tx.send(  # the three reads travel together
        f"SELECT call_id FROM tool_intents{tx.dialect.indexed('idx_tool_intents_pending')}"
        " WHERE run_id = ? AND result_seq IS NULL AND response_seq = ? AND call_id != ? ORDER BY intent_seq",
        (lease.run_id, response_seq, call_id),
    )
    undecided = tx.send(
        "SELECT 1 FROM checkpoints WHERE run_id = ? AND status = 'candidate'", (lease.run_id,)
    )
    next_round = tx.send(
        "SELECT coalesce(max(round), 0) + 1 FROM checkpoints WHERE run_id = ?", (lease.run_id,)
    )
    if waiting := siblings.all():
        ids = ", ".join(repr(r[0]) for r in waiting)
        raise CheckpointNotPending(f"{where} must wait for the results of its sibling calls {ids}")
    if undecided.one():
        raise CheckpointNotPending(f"run {lease.run_id} already has an undecided checkpoint candidate")
    (round,) = next_round.one()
    seq = allocate(tx, lease.run_id, 1)
    (checkpoint_id,) = tx.one(
        "INSERT INTO checkpoints (run_id, round, tool_call_id, based_on_event_seq, status, state,"
        " created_at) VALUES (?, ?, ?, ?, 'candidate', ?, :now) RETURNING id",
        (lease.run_id, round, call_id, seq - 1, stored(tx, lease.run_id, state_json, whole=True)),
    )
    payload = _dump({"checkpoint_id": checkpoint_id, "round": round, "state": decode(state_json)})
    key = f"checkpoint:{checkpoint_id}:proposed"
    insert_event(tx, lease.run_id, seq, EventType.CHECKPOINT_PROPOSED, payload, key)
    return get_checkpoint(tx, lease.run_id, checkpoint_id)


def get_checkpoint(tx: Tx, run_id: str, checkpoint_id: int) -> Checkpoint:
    row = tx.one(
        f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE id = ? AND run_id = ?", (checkpoint_id, run_id)
    )
    if row is None:
        raise CheckpointNotPending(f"run {run_id} has no checkpoint {checkpoint_id}")
    return to_checkpoint(resolved(tx, [row], CHECKPOINT_JSON)[0])


def candidate(tx: Tx, lease: Lease, checkpoint_id: int | None) -> Checkpoint | None:
    """The run's undecided candidate, the stored one whatever a caller holds (only if it has
    ``checkpoint_id``, when given). Fenced."""
    tx.fence(lease)
    return _candidate(tx, lease.run_id, checkpoint_id)


def _candidate(tx: Tx, run_id: str, checkpoint_id: int | None) -> Checkpoint | None:
    row = tx.one(
        f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE run_id = ? AND status = 'candidate'", (run_id,)
    )
    if row is None:
        return None
    found = to_checkpoint(resolved(tx, [row], CHECKPOINT_JSON)[0])
    if checkpoint_id is not None and found.id != checkpoint_id:
        return None
    return found


def decide_checkpoint(
    tx: Tx, lease: Lease, checkpoint_id: int, verification_json: str, passed: bool
) -> Checkpoint:
    """Record the decision, its event and the tool result answering the intent, at once.
    Fenced; CheckpointNotPending."""
    tx.fence(lease)
    current = _candidate(tx, lease.run_id, checkpoint_id)
    if current is None:
        raise CheckpointNotPending(
            f"run {lease.run_id}: checkpoint {checkpoint_id} is not an undecided candidate"
        )
    status = "accepted" if passed else "rejected"
    seq = allocate(tx, lease.run_id, 2)
    tx.execute(
        "UPDATE checkpoints SET status = ?, verification = ?, decision_event_seq = ?, decided_at = :now"
        " WHERE id = ?",
        (status, stored(tx, lease.run_id, verification_json, whole=True), seq, checkpoint_id),
    )
    if passed:
        _budgets.reset_loop_window(tx, lease.run_id)
    verification = decode(verification_json)
    decision = _dump({"checkpoint_id": checkpoint_id, "verification": verification})
    event_type = EventType.CHECKPOINT_ACCEPTED if passed else EventType.CHECKPOINT_REJECTED
    insert_event(tx, lease.run_id, seq, event_type, decision, f"checkpoint:{checkpoint_id}:{status}")
    content = {"accepted": passed, "verification": verification}
    result = _dump({"call_id": current.tool_call_id, "content": content})
    key = f"checkpoint:{checkpoint_id}:tool_result"
    insert_event(tx, lease.run_id, seq + 1, EventType.TOOL_RESULT, result, key)
    tx.execute(
        "UPDATE tool_intents SET result_seq = ? WHERE run_id = ? AND call_id = ?",
        (seq + 1, lease.run_id, current.tool_call_id),
    )
    return get_checkpoint(tx, lease.run_id, checkpoint_id)


def _inherited_as(stored_json: str, payload_json: str) -> bool:
    """Whether a result a fork inherited (docs/forks.md) is this one, but for its mark."""
    stored = decode(stored_json)
    return (
        isinstance(stored, dict)
        and "inherited" in stored
        and ({k: v for k, v in stored.items() if k != "inherited"} == decode(payload_json))
    )


# -- model responses and tools ----------------------------------------------------------------


def record_response(
    tx: Tx, lease: Lease, llm_payload_json: str, intents: list[IntentRow], debit: Debit
) -> tuple[int, Exceeded | None]:
    """Append ``llm_call`` and one ``tool_call`` intent per call, and debit the run's budget
    (logging a limit the first time it is reached); the seq of ``llm_call``, and the limit the
    run has reached, if any. The reply closes the run's model-call mark, if one is open (see
    :mod:`zincir._store._calls`). Fenced; DuplicateToolCall."""
    tx.fence(lease)
    if intents:
        among, params = tx.dialect.any_of("call_id", [i.call_id for i in intents])
        reused = tx.all(
            f"SELECT call_id FROM tool_intents WHERE run_id = ? AND {among} ORDER BY call_id",
            (lease.run_id, *params),
        )
        if reused:
            ids = ", ".join(repr(r[0]) for r in reused)
            raise DuplicateToolCall(f"run {lease.run_id}: tool call id {ids} was already used in this run")
    seq = allocate(tx, lease.run_id, 1 + len(intents), ", model_call_seq = NULL")
    insert_event(tx, lease.run_id, seq, EventType.LLM_CALL, llm_payload_json)
    for offset, intent in enumerate(intents, start=1):
        key = f"tool_call:{intent.call_id}"
        insert_event(tx, lease.run_id, seq + offset, EventType.TOOL_CALL, intent.payload_json, key)
        tx.execute(
            "INSERT INTO tool_intents (run_id, call_id, name, intent_seq, response_seq,"
            " response_tool_count) VALUES (?, ?, ?, ?, ?, ?)",
            (lease.run_id, intent.call_id, intent.name, seq + offset, seq, len(intents)),
        )
    return seq, _budgets.debit_budget(tx, lease.run_id, debit)


def pending_tools(tx: Tx, lease: Lease) -> list[tuple[str, int, int, int | None, str]]:
    """(tool_call payload, response_tool_count, starts, last start, the run its effect belongs
    to) of each intent without a result, in order. Fenced (a read: the reader judges the lease
    from its snapshot)."""
    tx.fence(lease)
    rows = tx.all(
        "SELECT e.payload, t.response_tool_count, t.started, t.last_started_at, t.effect_run_id"
        " FROM tool_intents AS t JOIN events AS e ON e.run_id = t.run_id AND e.seq = t.intent_seq"
        " WHERE t.run_id = ? AND t.result_seq IS NULL ORDER BY t.intent_seq",
        (lease.run_id,),
    )
    return [
        (payload, int(count), int(started), last, effect_run or lease.run_id)
        for payload, count, started, last, effect_run in resolved(tx, rows, (0,))
    ]


def start_tool(tx: Tx, lease: Lease, call_id: str) -> int:
    """Count a start of a pending intent's tool and log ``tool_started``; the attempt number.
    Fenced; NoDurableIntent, InvalidArgument (it has a result)."""
    tx.fence(lease)
    row = tx.one(
        "UPDATE tool_intents SET started = started + 1, last_started_at = :now"
        " WHERE run_id = ? AND call_id = ? AND result_seq IS NULL RETURNING started",
        (lease.run_id, call_id),
    )
    if row is None:
        known = tx.one("SELECT 1 FROM tool_intents WHERE run_id = ? AND call_id = ?", (lease.run_id, call_id))
        if known is None:
            raise NoDurableIntent(f"run {lease.run_id}: tool call {call_id!r} has no durable intent")
        raise InvalidArgument(f"run {lease.run_id}: tool call {call_id!r} already has a result")
    tx.log(lease.run_id, EventType.TOOL_STARTED, _dump({"attempt": int(row[0]), "call_id": call_id}))
    return int(row[0])


def record_tool_result(tx: Tx, lease: Lease, call_id: str, payload_json: str) -> int:
    """Append ``tool_result`` for an intent; an identical repeat is a no-op. Fenced;
    NoDurableIntent, ConflictingResult, InvalidArgument (a checkpoint call)."""
    tx.fence(lease)
    row = tx.one(
        "SELECT name, result_seq FROM tool_intents WHERE run_id = ? AND call_id = ?", (lease.run_id, call_id)
    )
    if row is None:
        raise NoDurableIntent(f"run {lease.run_id}: tool call {call_id!r} has no durable intent")
    name, result_seq = row
    if name == SUBMIT_CHECKPOINT:
        raise InvalidArgument(
            f"run {lease.run_id}: {call_id!r} is a {SUBMIT_CHECKPOINT} call;"
            " its result comes from run.checkpoint() and the verifier"
        )
    if result_seq is not None:
        (first,) = texts(
            tx, tx.one("SELECT payload FROM events WHERE run_id = ? AND seq = ?", (lease.run_id, result_seq))
        )
        if first != payload_json and not _inherited_as(first, payload_json):
            raise ConflictingResult(
                f"run {lease.run_id}: tool call {call_id!r} already has a different result"
            )
        return int(result_seq)
    seq = append(tx, lease.run_id, EventType.TOOL_RESULT, payload_json, f"tool_result:{call_id}")
    tx.execute(
        "UPDATE tool_intents SET result_seq = ? WHERE run_id = ? AND call_id = ?",
        (seq, lease.run_id, call_id),
    )
    return seq
