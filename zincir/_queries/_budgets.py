"""Budgets: each run's spend against its limits, and that spend in words.

The spend is computed by :func:`zincir._budget.usage_of`, as a run's own owner computes it;
a damaged budget row is shown as no budget rather than failing the page.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .._budget import BUDGET_COLUMNS, Usage, usage_of
from .._errors import InvalidArgument
from ._connect import Reader
from ._values import as_text

__all__ = ["budget_lines", "budgets_of", "spend_text"]


def budgets_of(conn: Reader, run_ids: Sequence[str], now_ms: int) -> dict[str, Usage]:
    """The spend against the limits of each run that has a budget (a database from before
    budgets, schema version 4 or older, has none)."""
    if not run_ids or not conn.has_table("budgets"):
        return {}
    marks = ", ".join("?" * len(run_ids))
    rows = conn.execute(
        "SELECT b.run_id, CASE WHEN r.status IN ('completed', 'failed', 'cancelled') THEN r.updated_at"
        f" ELSE ? END - r.created_at, {', '.join('b.' + c for c in BUDGET_COLUMNS.split(', '))}"
        f" FROM budgets AS b JOIN agent_runs AS r ON r.id = b.run_id WHERE b.run_id IN ({marks})",
        [now_ms, *run_ids],
    )
    found = {}
    for run_id, age, *row in rows:
        try:
            found[as_text(run_id)] = usage_of(row, int(age))
        except (TypeError, ValueError, InvalidArgument):  # a damaged row: shown as none
            continue
    return found


_SHOWN: Final = (
    ("tokens", "tokens"), ("input", "input_tokens"), ("output", "output_tokens"), ("cost", "cost"),
    ("calls", "model_calls"), ("tools", "tool_calls"), ("wall", "wall_time"),
)  # fmt: skip


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.4g}"


def spend_text(usage: Usage) -> str:
    """Spend against limits in a few words, e.g. ``tokens 1,200/200,000 · cost 0.4/5``."""
    s, limits = usage.spent, usage.limits
    parts = []
    for label, name in _SHOWN:
        spent = s.tokens if name == "tokens" else getattr(s, name)
        limit = getattr(limits, name)
        if limit is None and not (name in ("tokens", "cost") and spent):
            continue
        shown = (
            f"{spent:,.0f}s" if name == "wall_time" else f"{spent:,.4g}" if name == "cost" else f"{spent:,}"
        )
        parts.append(f"{label} {shown}" + ("" if limit is None else f"/{_number(limit)}"))
    if limits.max_identical_tool_calls is not None:
        parts.append(f"repeats {s.identical_tool_calls}/{limits.max_identical_tool_calls}")
    if limits.max_responses_without_progress is not None:
        parts.append(f"stalled {s.responses_without_progress}/{limits.max_responses_without_progress}")
    return " · ".join(parts) or "no limits, nothing spent"


def budget_lines(usage: Usage) -> list[tuple[str, object, object, object]]:
    """Each limit of a budget as ``(name, spent, limit, left)``; limit and left are None where
    the budget sets no limit."""
    spent, limits, left = usage.spent, usage.limits, usage.remaining
    pairs = [
        ("tokens", spent.tokens), ("input_tokens", spent.input_tokens),
        ("output_tokens", spent.output_tokens), ("cost", spent.cost), ("model_calls", spent.model_calls),
        ("tool_calls", spent.tool_calls),
        ("wall_time", round(spent.wall_time, 1)), ("max_identical_tool_calls", spent.identical_tool_calls),
        ("max_responses_without_progress", spent.responses_without_progress),
    ]  # fmt: skip
    return [(name, value, getattr(limits, name), getattr(left, name)) for name, value in pairs]
