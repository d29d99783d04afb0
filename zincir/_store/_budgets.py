"""A run's budget: what its responses spend, its limits, and loop detection's window.

A run without a budget has no row in ``budgets``: nothing here is done for it.
"""

from __future__ import annotations

from ._tx import Tx


def reset_loop_window(tx: Tx, run_id: str) -> None:
    """An accepted checkpoint is progress: the counts of responses without it and of identical
    tool calls start again (the window's counts cost a delete each, once: they were written)."""
    tx.execute(
        "UPDATE budgets SET responses_without_progress = 0, most_identical_tool_calls = 0,"
        " repeated_call_id = NULL WHERE run_id = ?",
        (run_id,),
    )
    tx.execute("DELETE FROM tool_call_counts WHERE run_id = ?", (run_id,))
