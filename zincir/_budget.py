"""Budgets: limits stored with a run, spend debited in the transaction that records each
response, and the judgement of both, shared by the backends (which only store the numbers)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, TypeGuard

import attrs

from ._errors import BudgetExceeded, InvalidArgument, LoopDetected, NoProgress
from ._json import dump_trusted
from ._types import ToolCall
from ._validation import MAX_INT, check_int, check_seconds

__all__ = [
    "BUDGET_COLUMNS",
    "LIMIT_COLUMNS",
    "Budget",
    "CountedCall",
    "Debit",
    "Exceeded",
    "Spend",
    "SpendSum",
    "Usage",
    "debit_of",
    "exceeded_error",
    "exceeded_event",
    "judge",
    "judge_charge",
    "judge_debit",
    "loop_of",
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
    ``max_identical_tool_calls``: a response that asks for a tool call made this many times
    with the same arguments since the latest accepted checkpoint (or the start) is a loop; the
    count starts again at each accepted checkpoint, and a response that repeats nothing that
    often is no loop. ``max_responses_without_progress``: this many responses since the latest
    accepted checkpoint (or the start) is no progress.
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
    ``identical_tool_calls``: how often the most repeated tool call of the latest response was
    made, with the same arguments, since the latest accepted checkpoint (0 after an accepted
    checkpoint, and after a response without tool calls); ``repeated_call``: that call, when
    it was made more than once (the inspector's views leave it None)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    model_calls: int = 0
    tool_calls: int = 0
    wall_time: float = 0.0
    identical_tool_calls: int = 0
    responses_without_progress: int = 0
    repeated_call: ToolCall | None = None

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


def usage_of(row: Any, elapsed_ms: int, repeated_call: ToolCall | None = None) -> Usage:
    """A Usage from a row of BUDGET_COLUMNS and the run's age (and the call its count of
    identical tool calls counts, which the row names by id only)."""
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
    age = max(0, elapsed_ms) / 1000
    spend = Spend(s_in, s_out, float(s_cost), s_calls, s_tools, age, s_identical, s_responses, repeated_call)
    return Usage(spend, limits)


@attrs.frozen
class CountedCall:
    """A tool intent of a response as loop detection counts it: the call, and the hash of its
    name and canonical arguments (identical calls share it)."""

    call: ToolCall
    args_hash: str


@attrs.frozen
class Debit:
    """What one recorded response costs: its tokens and cost (from ``usage``), one model
    call, and its tool intents (for loop detection)."""

    input_tokens: int
    output_tokens: int
    cost: float
    calls: tuple[CountedCall, ...]

    def counts(self) -> dict[str, int]:
        """How often each args hash occurs in the response (a response may repeat a call)."""
        counted: dict[str, int] = {}
        for counted_call in self.calls:
            counted[counted_call.args_hash] = counted.get(counted_call.args_hash, 0) + 1
        return counted


@attrs.frozen
class SpendSum:
    """What model responses spent, added up from the usage recorded with them (a fork's copied
    budget and a diff's sides count their responses with it)."""

    model_calls: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0

    def plus(self, debit: Debit, tool_calls: int) -> SpendSum:
        """With one more response: its debit and the number of tool calls it asked for."""
        return SpendSum(
            self.model_calls + 1,
            self.tool_calls + tool_calls,
            self.input_tokens + debit.input_tokens,
            self.output_tokens + debit.output_tokens,
            self.cost + debit.cost,
        )

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


def loop_of(debit: Debit, window_counts: Mapping[str, int]) -> tuple[int, ToolCall | None]:
    """A response's loop count: how often its most repeated call has been made within the
    window (``window_counts``: by args hash, this response included), and that call if it was
    made more than once (the first such call of the response on a tie)."""
    most, repeated = 0, None
    for counted in debit.calls:
        count = window_counts[counted.args_hash]
        if count > most:
            most, repeated = count, counted.call
    return most, repeated if most > 1 else None


def debit_of(usage: Mapping[str, Any] | None, calls: tuple[CountedCall, ...], what: str) -> Debit:
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
    """A limit a response reached (or was past already): which, and what to say; for a loop,
    the call that was repeated and how often."""

    limit: str
    message: str
    call: ToolCall | None = None
    count: int | None = None


def exceeded_error(run_id: str, exceeded: Exceeded) -> BudgetExceeded:
    message = f"run {run_id}: {exceeded.message}"
    if exceeded.limit == "max_identical_tool_calls":
        call = exceeded.call
        return LoopDetected(
            message,
            exceeded.limit,
            call_id=None if call is None else call.id,
            tool=None if call is None else call.name,
        )
    if exceeded.limit == "max_responses_without_progress":
        return NoProgress(message, exceeded.limit)
    return BudgetExceeded(message, exceeded.limit)


def exceeded_event(reached: Exceeded) -> tuple[str, dict[str, Any]]:
    """The event type and payload that log a limit reached (a loop's names its call)."""
    kinds = {"max_identical_tool_calls": "loop_detected", "max_responses_without_progress": "no_progress"}
    payload: dict[str, Any] = {"limit": reached.limit, "message": reached.message}
    if reached.call is not None:
        payload.update(call_id=reached.call.id, tool=reached.call.name, count=reached.count)
    return kinds.get(reached.limit, "budget_exceeded"), payload


# Where the spend starts in a row of BUDGET_COLUMNS, and its two counters.
_SPENT_AT: Final = len(LIMIT_COLUMNS)
_IDENTICAL_AT: Final = _SPENT_AT + 5
_WITHOUT_PROGRESS_AT: Final = _SPENT_AT + 6


def judge_debit(
    row: Any, debit: Debit, identical: int, repeated: ToolCall | None
) -> tuple[Exceeded | None, bool]:
    """Judge a debit from the budget row it left (BUDGET_COLUMNS, as the UPDATE returned it,
    before its loop count was set) and the response's loop count (:func:`loop_of`): the limit
    reached, if any, and whether to log it. A limit of spend is logged when the debit crossed
    it; a loop, at every response that repeats a call that often (each is a loop of its own).
    Wall time is not judged here (the owner's heartbeat keeps it), so the run's age does not
    matter."""
    after = list(row)
    after[_IDENTICAL_AT] = identical
    reached = judge(usage_of(after, 0, repeated))
    before = list(row)
    before[_SPENT_AT:] = [
        row[_SPENT_AT] - debit.input_tokens, row[_SPENT_AT + 1] - debit.output_tokens,
        row[_SPENT_AT + 2] - debit.cost, row[_SPENT_AT + 3] - 1, row[_SPENT_AT + 4] - len(debit.calls),
        0, row[_WITHOUT_PROGRESS_AT] - 1,
    ]  # fmt: skip
    return reached, reached is not None and judge(usage_of(before, 0)) is None


def judge_charge(row: Any, input_tokens: int, cost: float) -> tuple[Exceeded | None, bool]:
    """Judge the charge of a model call whose reply was never recorded (its request's tokens
    and estimated cost, one model call) from the budget row it left (BUDGET_COLUMNS): the limit
    reached, if any, and whether to log it (the charge crossed it). The loop and progress
    counters are the responses', and a lost call changes neither."""
    reached = judge(usage_of(row, 0))
    before = list(row)
    before[_SPENT_AT : _SPENT_AT + 4] = [
        row[_SPENT_AT] - input_tokens, row[_SPENT_AT + 1], row[_SPENT_AT + 2] - cost, row[_SPENT_AT + 3] - 1,
    ]  # fmt: skip
    return reached, reached is not None and judge(usage_of(before, 0)) is None


_SHOWN_ARGS: Final = 120  # characters of a repeated call's arguments that a message shows


def _shown(call: ToolCall) -> str:
    args = dump_trusted(call.args)
    if len(args) > _SHOWN_ARGS:
        args = args[:_SHOWN_ARGS] + "…"
    return f"{call.name}({args})"


def judge(usage: Usage) -> Exceeded | None:
    """The first limit ``usage`` has reached, as an Exceeded; None within every limit."""
    for name in usage.exceeded():
        limit = getattr(usage.limits, name)
        spent = dict(usage._pairs())[name]
        if name == "max_identical_tool_calls":
            call = usage.spent.repeated_call
            what = "one tool call" if call is None else f"tool call {call.id!r}, {_shown(call)},"
            message = (
                f"a loop: {what} was made {spent:g} times with the same arguments since the latest"
                f" accepted checkpoint (limit {limit})"
            )
            return Exceeded(name, message, call, int(spent))
        if name == "max_responses_without_progress":
            return Exceeded(
                name, f"no progress: {spent} responses since the latest accepted checkpoint (limit {limit})"
            )
        return Exceeded(name, f"budget exceeded: {name} spent {spent:g} of {limit:g}")
    return None
