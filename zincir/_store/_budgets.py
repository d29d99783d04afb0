"""A run's budget: what its responses spend, its limits, and loop detection's window.

A run without a budget has no row in ``budgets``: nothing here is done for it.
"""

from __future__ import annotations

from .._budget import BUDGET_COLUMNS, Debit, Exceeded, exceeded_event, judge_debit, loop_of
from .._json import dump_trusted as _dump
from .._types import EventType, ToolCall
from .._validation import MAX_INT
from ._tx import Tx
from ._types import Lease


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
