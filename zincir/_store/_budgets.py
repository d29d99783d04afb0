"""A run's budget: what its responses spend, its limits, and loop detection's window.

A run without a budget has no row in ``budgets``: nothing here is done for it.
"""

from __future__ import annotations

from typing import Any

from .._budget import (
    BUDGET_COLUMNS,
    LIMIT_COLUMNS,
    Debit,
    Exceeded,
    Usage,
    exceeded_event,
    judge,
    judge_charge,
    judge_debit,
    loop_of,
    usage_of,
)
from .._json import decode
from .._json import dump_trusted as _dump
from .._payloads import texts
from .._types import EventType, ToolCall
from .._validation import MAX_INT
from ._reads import get_run
from ._tx import Tx, lock_live_run
from ._types import Lease
from ._waits import make_due


def reset_loop_window(tx: Tx, run_id: str) -> None:
    """An accepted checkpoint is progress: the counts of responses without it and of identical
    tool calls start again (the window's counts cost a delete each, once: they were written)."""
    tx.execute(
        "UPDATE budgets SET responses_without_progress = 0, most_identical_tool_calls = 0,"
        " repeated_call_id = NULL WHERE run_id = ?",
        (run_id,),
    )
    tx.execute("DELETE FROM tool_call_counts WHERE run_id = ?", (run_id,))


def debit_budget(tx: Tx, run_id: str, debit: Debit) -> Exceeded | None:
    """Add a response's spend to the run's budget and count its tool calls within the loop
    window; log a limit it reaches (see judge_debit). The limit reached, if any."""
    d = tx.dialect  # a sum is capped at the largest BIGINT rather than overflow
    row = tx.one(
        f"UPDATE budgets SET input_tokens = {d.least}(input_tokens{d.wide} + ?, ?),"
        f" output_tokens = {d.least}(output_tokens{d.wide} + ?, ?), cost = cost + ?,"
        f" model_calls = model_calls + 1, tool_calls = {d.least}(tool_calls{d.wide} + ?, ?),"
        " responses_without_progress = responses_without_progress + 1, updated_at = :now"
        f" WHERE run_id = ? RETURNING {BUDGET_COLUMNS}, repeated_call_id",
        (
            debit.input_tokens,
            MAX_INT,
            debit.output_tokens,
            MAX_INT,
            debit.cost,
            len(debit.calls),
            MAX_INT,
            run_id,
        ),
    )
    if row is None:
        return None
    *spend, stored_repeat = row
    identical, repeated = 0, None
    if spend[7] is not None:  # max_identical_tool_calls
        identical, repeated = _count_calls(tx, run_id, debit)
        repeated_id = None if repeated is None else repeated.id
        if (identical, repeated_id) != (spend[-2], stored_repeat):
            tx.execute(
                "UPDATE budgets SET most_identical_tool_calls = ?, repeated_call_id = ? WHERE run_id = ?",
                (identical, repeated_id, run_id),
            )
    reached, log = judge_debit(spend, debit, identical, repeated)
    if reached is not None and log:
        log_exceeded(tx, run_id, reached)
    return reached


def charge_unanswered(tx: Tx, run_id: str, input_tokens: int, cost: float) -> Exceeded | None:
    """Charge the run's budget for a model call whose reply was never recorded: its request's
    tokens as input tokens, its estimated cost, one model call (see docs/adapters.md); log a
    limit the charge reaches. The limit reached, if any (None too for a run without a budget)."""
    d = tx.dialect
    row = tx.one(
        f"UPDATE budgets SET input_tokens = {d.least}(input_tokens{d.wide} + ?, ?), cost = cost + ?,"
        f" model_calls = model_calls + 1, updated_at = :now WHERE run_id = ? RETURNING {BUDGET_COLUMNS}",
        (input_tokens, MAX_INT, cost, run_id),
    )
    if row is None:
        return None
    reached, log = judge_charge(row, input_tokens, cost)
    if reached is not None and log:
        log_exceeded(tx, run_id, reached)
    return reached


def _count_calls(tx: Tx, run_id: str, debit: Debit) -> tuple[int, ToolCall | None]:
    """Count the response's tool calls in the window (since the latest accepted checkpoint,
    which empties it: see reset_loop_window); the response's loop count and its repeated call.
    A call twice in one response is one row with its count: PostgreSQL's ON CONFLICT cannot
    touch a row twice in one statement."""
    counts = debit.counts()
    if not counts:
        return 0, None
    values = ", ".join(["(?, ?, ?)"] * len(counts))
    window = tx.all(
        f"INSERT INTO tool_call_counts (run_id, args_hash, count) VALUES {values}"
        " ON CONFLICT (run_id, args_hash) DO UPDATE SET count = tool_call_counts.count + excluded.count"
        " RETURNING args_hash, count",
        tuple(x for hash_, n in counts.items() for x in (run_id, hash_, n)),
    )
    return loop_of(debit, {hash_: int(count) for hash_, count in window})


def log_exceeded(tx: Tx, run_id: str, reached: Exceeded) -> None:
    event, payload = exceeded_event(reached)
    tx.log(run_id, EventType(event), _dump(payload))


def note_exceeded(tx: Tx, lease: Lease, limit: str, message: str) -> None:
    """Log a limit the owner found reached (its wall time). Fenced."""
    tx.fence(lease)
    log_exceeded(tx, lease.run_id, Exceeded(limit, message))


def budget_usage(tx: Tx, run_id: str) -> Usage | None:
    """The run's spend against its limits; None if it has no budget. RunNotFound."""
    row = tx.one(f"SELECT {BUDGET_COLUMNS}, repeated_call_id FROM budgets WHERE run_id = ?", (run_id,))
    if row is None:
        get_run(tx, run_id)  # an unknown run is an error
        return None
    *spend, repeated_id = row
    return usage_of(
        spend, _age(tx, run_id), None if repeated_id is None else _intent(tx, run_id, repeated_id)
    )


def _age(tx: Tx, run_id: str) -> int:
    """How long the run has lived, in ms: until now, or until it ended (its wall time stops)."""
    (age,) = tx.one(
        "SELECT CASE WHEN status IN ('completed', 'failed', 'cancelled') THEN updated_at ELSE :now END"
        " - created_at FROM agent_runs WHERE id = ?",
        (run_id,),
    )
    return int(age)


def _intent(tx: Tx, run_id: str, call_id: str) -> ToolCall | None:
    """The tool call of an intent, as the model asked for it (found by its primary key)."""
    row = tx.one(
        "SELECT e.payload FROM tool_intents AS t JOIN events AS e ON e.run_id = t.run_id"
        " AND e.seq = t.intent_seq WHERE t.run_id = ? AND t.call_id = ?",
        (run_id, call_id),
    )
    if row is None:
        return None
    payload = decode(texts(tx, row)[0])
    return ToolCall(payload["call_id"], payload["name"], payload["args"])


def insert_budget(tx: Tx, run_id: str, limits: tuple[Any, ...]) -> None:
    """A budget for a run, with its limits in LIMIT_COLUMNS order."""
    columns = ", ".join(LIMIT_COLUMNS)
    marks = ", ".join(["?"] * len(LIMIT_COLUMNS))
    tx.execute(
        f"INSERT INTO budgets (run_id, {columns}, updated_at) VALUES (?, {marks}, :now)", (run_id, *limits)
    )


def set_budget(tx: Tx, run_id: str, changes: dict[str, Any]) -> None:
    """An outsider's change of limit columns (a run without a budget gets one, spending from
    now); a run suspended for its budget becomes due if it is within every limit again.
    RunNotFound, RunTerminal."""
    lock_live_run(tx, run_id, "status", "its budget can no longer change")
    if tx.one("SELECT 1 FROM budgets WHERE run_id = ?", (run_id,)) is None:
        insert_budget(tx, run_id, (None,) * len(LIMIT_COLUMNS))
    assignments = ", ".join(f"{column} = ?" for column in changes)
    tx.execute(
        f"UPDATE budgets SET {assignments}, updated_at = :now WHERE run_id = ?", (*changes.values(), run_id)
    )
    tx.wake(inbox=run_id)  # an owner watching its wall time looks again
    usage = budget_usage(tx, run_id)
    if usage is not None and judge(usage) is None:
        make_due(tx, run_id, "budget", "")


# When a run's budget of wall time runs out (its creation plus the limit), if it has one: a
# column of any statement about ``agent_runs`` (by its name, not an alias: SQLite's RETURNING
# takes no alias), searched by the budget's key.
WALL_END = (
    "(SELECT agent_runs.created_at + b.max_wall_time_ms FROM budgets AS b"
    " WHERE b.run_id = agent_runs.id AND b.max_wall_time_ms IS NOT NULL)"
)


def wall_end(tx: Tx, run_id: str) -> int | None:
    """When the run's budget of wall time runs out, if it has one."""
    row = tx.one(f"SELECT {WALL_END} FROM agent_runs WHERE id = ?", (run_id,))
    return None if row is None or row[0] is None else int(row[0])
