"""Budgets: limits stored with a run, spend debited in the transaction that records each
response, and the judgement of both, shared by the backends (which only store the numbers)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, TypeGuard

import attrs

from ._errors import BudgetExceeded, InvalidArgument, LoopDetected, NoProgress
from ._validation import MAX_INT, check_int, check_seconds

__all__ = [
    "BUDGET_COLUMNS",
    "LIMIT_COLUMNS",
    "Budget",
    "Debit",
    "Exceeded",
    "Spend",
    "Usage",
    "debit_of",
    "exceeded_error",
    "exceeded_event",
    "judge",
    "judge_debit",
    "usage_of",
]

MAX_COST: Final = 1e15
_COUNTS: Final = ("tokens", "input_tokens", "output_tokens", "model_calls", "tool_calls")


def _count_limit(what: str) -> Any:
    def check(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is not None:
            check_int(value, f"Budget.{attribute.name} ({what})", minimum=0)

    return attrs.field(default=None, validator=check)


def _finite_number(value: object) -> TypeGuard[int | float]:
    """An int or a finite float (an int too large for a float is finite too: never convert it)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or math.isfinite(value)


def _check_cost(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if not _finite_number(value):
        raise InvalidArgument(f"Budget.cost must be a finite number, not {value!r}")
    if not 0 <= value <= MAX_COST:
        raise InvalidArgument(f"Budget.cost must be from 0 to {MAX_COST:g}, not {value!r}")


def _check_wall_time(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        check_seconds(value, "Budget.wall_time", exclusive=True)


@attrs.frozen
class Budget:
    """Limits for one run, kept across restarts; None leaves a limit off.

    ``tokens`` counts input and output tokens together; ``cost`` is in whatever unit the
    responses' ``usage["cost"]`` uses; ``wall_time`` is seconds since the run was created.
    ``max_identical_tool_calls``: the same tool with the same arguments this many times is a
    loop; ``max_responses_without_progress``: this many responses since the latest accepted
    checkpoint (or the start) is no progress.
    """

    tokens: int | None = _count_limit("input and output tokens")
    input_tokens: int | None = _count_limit("tokens")
    output_tokens: int | None = _count_limit("tokens")
    cost: float | None = attrs.field(default=None, validator=_check_cost)
    model_calls: int | None = _count_limit("responses")
    tool_calls: int | None = _count_limit("tool intents")
    wall_time: float | None = attrs.field(default=None, validator=_check_wall_time)
    max_identical_tool_calls: int | None = _count_limit("identical tool calls")
    max_responses_without_progress: int | None = _count_limit("responses")

    def to_row(self) -> tuple[Any, ...]:
        """The limit columns, in LIMIT_COLUMNS order (wall time in ms)."""
        wall = None if self.wall_time is None else math.ceil(self.wall_time * 1000)
        return (
            self.tokens, self.input_tokens, self.output_tokens,
            None if self.cost is None else float(self.cost), self.model_calls, self.tool_calls,
            wall, self.max_identical_tool_calls, self.max_responses_without_progress,
        )  # fmt: skip


LIMIT_COLUMNS: Final = (
    "max_tokens", "max_input_tokens", "max_output_tokens", "max_cost", "max_model_calls",
    "max_tool_calls", "max_wall_time_ms", "max_identical_tool_calls", "max_responses_without_progress",
)  # fmt: skip
_SPENT_COLUMNS: Final = (
    "input_tokens", "output_tokens", "cost", "model_calls", "tool_calls", "most_identical_tool_calls",
    "responses_without_progress",
)  # fmt: skip
BUDGET_COLUMNS: Final = ", ".join((*LIMIT_COLUMNS, *_SPENT_COLUMNS))
"""What a store reads of a budget row, in this order (see usage_of)."""


@attrs.frozen
class Spend:
    """What a run has spent. ``wall_time``: seconds since it was created;
    ``identical_tool_calls``: the most calls of one tool with the same arguments."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    model_calls: int = 0
    tool_calls: int = 0
    wall_time: float = 0.0
    identical_tool_calls: int = 0
    responses_without_progress: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@attrs.frozen
class Usage:
    """A run's spend against its limits (:meth:`Run.usage`)."""

    spent: Spend
    limits: Budget

    @property
    def remaining(self) -> Budget:
        """What is left of each limit (never below zero); None where there is no limit."""
        left = {}
        for name, spent in self._pairs():
            limit = getattr(self.limits, name)
            left[name] = None if limit is None else max(type(limit)(0), limit - spent)
        return Budget(**left)

    def exceeded(self) -> list[str]:
        """The limits reached, in Budget's order ("max_identical_tool_calls" for a loop)."""
        return [
            n
            for n, spent in self._pairs()
            if (limit := getattr(self.limits, n)) is not None and spent >= limit
        ]

    def _pairs(self) -> list[tuple[str, float]]:
        s = self.spent
        return [
            ("tokens", s.tokens), ("input_tokens", s.input_tokens), ("output_tokens", s.output_tokens),
            ("cost", s.cost), ("model_calls", s.model_calls), ("tool_calls", s.tool_calls),
            ("wall_time", s.wall_time), ("max_identical_tool_calls", s.identical_tool_calls),
            ("max_responses_without_progress", s.responses_without_progress),
        ]  # fmt: skip


def usage_of(row: Any, elapsed_ms: int) -> Usage:
    """A Usage from a row of BUDGET_COLUMNS and the run's age."""
    (tokens, inp, out, cost, calls, tools, wall_ms, identical, responses, *spent) = row
    limits = Budget(
        tokens,
        inp,
        out,
        cost,
        calls,
        tools,
        None if wall_ms is None else wall_ms / 1000,
        identical,
        responses,
    )
    s_in, s_out, s_cost, s_calls, s_tools, s_identical, s_responses = spent
    return Usage(
        Spend(
            s_in, s_out, float(s_cost), s_calls, s_tools, max(0, elapsed_ms) / 1000, s_identical, s_responses
        ),
        limits,
    )


@attrs.frozen
class Debit:
    """What one recorded response costs: its tokens and cost (from ``usage``), one model
    call, and its tool intents (name and args hash each, for loop detection)."""

    input_tokens: int
    output_tokens: int
    cost: float
    calls: tuple[tuple[str, str], ...]


def debit_of(usage: Mapping[str, Any] | None, calls: tuple[tuple[str, str], ...], what: str) -> Debit:
    """The debit of a response: tokens in Anthropic's keys (``input_tokens``, ``output_tokens``,
    plus ``cache_creation_input_tokens`` and ``cache_read_input_tokens``) or OpenAI's
    (``prompt_tokens``, ``completion_tokens``), and ``cost``; missing ones count 0."""
    usage = usage or {}

    def tokens(*keys: str) -> int:
        total = 0
        for key in keys:
            value = usage.get(key)
            if value is not None:
                total += check_int(value, f"{what}: usage[{key!r}]", minimum=0)
        return min(total, MAX_INT)

    inp = tokens("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    inp = inp or tokens("prompt_tokens")
    out = tokens("output_tokens") or tokens("completion_tokens")
    cost = usage.get("cost", 0)
    if not _finite_number(cost) or cost < 0:
        raise InvalidArgument(f"{what}: usage['cost'] must be a finite number of at least 0, not {cost!r}")
    return Debit(inp, out, float(min(cost, MAX_COST)), calls)


@attrs.frozen
class Exceeded:
    """A limit a response reached (or was past already): which, and what to say."""

    limit: str
    message: str


def exceeded_error(run_id: str, exceeded: Exceeded) -> BudgetExceeded:
    kind = {"max_identical_tool_calls": LoopDetected, "max_responses_without_progress": NoProgress}
    return kind.get(exceeded.limit, BudgetExceeded)(f"run {run_id}: {exceeded.message}", exceeded.limit)


def exceeded_event(reached: Exceeded) -> tuple[str, dict[str, str]]:
    """The event type and payload that log a limit reached."""
    kinds = {"max_identical_tool_calls": "loop_detected", "max_responses_without_progress": "no_progress"}
    return kinds.get(reached.limit, "budget_exceeded"), {"limit": reached.limit, "message": reached.message}


def judge_debit(row: Any, most_identical: int, debit: Debit) -> tuple[Exceeded | None, bool]:
    """Judge a debit from the budget row it left (BUDGET_COLUMNS, as the UPDATE returned it)
    and the highest count of identical tool calls after it: the limit reached, if any, and
    whether it is newly reached (the row before the debit was within every limit). Wall time
    is not judged here (the owner's heartbeat keeps it), so the run's age does not matter."""
    before, after = list(row), list(row)
    after[-2] = most_identical
    before[9:] = [
        row[9] - debit.input_tokens, row[10] - debit.output_tokens, row[11] - debit.cost, row[12] - 1,
        row[13] - len(debit.calls), row[-2], row[-1] - 1,
    ]  # fmt: skip
    reached = judge(usage_of(after, 0))
    return reached, reached is not None and judge(usage_of(before, 0)) is None


def judge(usage: Usage) -> Exceeded | None:
    """The first limit ``usage`` has reached, as an Exceeded; None within every limit."""
    for name in usage.exceeded():
        limit = getattr(usage.limits, name)
        spent = dict(usage._pairs())[name]
        if name == "max_identical_tool_calls":
            return Exceeded(
                name, f"a loop: one tool was called {spent} times with the same arguments (limit {limit})"
            )
        if name == "max_responses_without_progress":
            return Exceeded(
                name, f"no progress: {spent} responses since the latest accepted checkpoint (limit {limit})"
            )
        return Exceeded(name, f"budget exceeded: {name} spent {spent:g} of {limit:g}")
    return None
