"""What both adapters share: prices, the mark before a model call, and the walk from a run's
durable state to a conversation (which the adapters then write in their SDK's shapes).

Nothing here imports a model SDK. docs/adapters.md describes the behaviour.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final, TypeVar

import attrs

from .. import Checkpoint, DurableState, EventType, InvalidArgument, PendingToolCall, Run
from .._validation import check_name

JSONValue = Any
"""What ``json.dumps(value, allow_nan=False)`` accepts (as everywhere in zincir)."""

__all__ = [
    "DEFAULT_NUDGE",
    "Conversation",
    "JSONValue",
    "Price",
    "Turn",
    "answers",
    "before_model_call",
    "checkpoint_text",
    "conversation_of",
    "durable_call",
    "goal_of",
    "price_of",
    "request_tokens",
    "result_text",
]

DEFAULT_NUDGE: Final = "Continue toward the goal; call your tools when you need them."
"""What a rebuilt conversation says after a response that asked for no tool, when the run goes
on all the same: the next request must end with the user's turn."""

CHECKPOINT_HEADER: Final = "Latest accepted checkpoint (verified; continue from here):"


def _rate(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None and attribute.name.startswith("cache_"):
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise InvalidArgument(f"Price.{attribute.name} must be a finite number of at least 0, not {value!r}")


@attrs.frozen
class Price:
    """What a model costs per million tokens, in the currency of your budget's ``cost``.

    ``cache_write`` prices Anthropic's ``cache_creation_input_tokens``; ``cache_read`` prices
    Anthropic's ``cache_read_input_tokens`` and OpenAI's cached prompt tokens
    (``prompt_tokens_details.cached_tokens``). Either defaults to ``input`` when not given.
    """

    input: float = attrs.field(validator=_rate)
    output: float = attrs.field(validator=_rate)
    cache_write: float | None = attrs.field(default=None, validator=_rate)
    cache_read: float | None = attrs.field(default=None, validator=_rate)

    def cost(self, *, input: int, output: int, cache_write: int = 0, cache_read: int = 0) -> float:
        """The cost of a response with these token counts (uncached input, output, input
        written to and read from the prompt cache)."""
        write = self.input if self.cache_write is None else self.cache_write
        read = self.input if self.cache_read is None else self.cache_read
        return (input * self.input + output * self.output + cache_write * write + cache_read * read) / 1e6


Prices = Price | Mapping[str, Price]
"""A price for every model, or a table by model name (see :func:`price_of`)."""


def price_of(prices: Prices | None, model: str, where: str) -> Price | None:
    """The price of ``model``: ``prices`` itself, or the entry of the table whose key is the
    longest prefix of the model name (``"gpt-4o-mini"`` prices ``"gpt-4o-mini-2024-07-18"``, as
    the API names the model it ran). No table: None. A table without the model: InvalidArgument,
    before anything is written (a cost silently left out would let a budget overspend)."""
    if prices is None or isinstance(prices, Price):
        return prices
    if not isinstance(prices, Mapping):
        raise InvalidArgument(f"{where}: prices must be a Price or a mapping of model names to Price")
    key = max((k for k in prices if isinstance(k, str) and model.startswith(k)), key=len, default=None)
    if key is None:
        raise InvalidArgument(
            f"{where}: the price table has no entry for model {model!r} (it prices {sorted(prices)!r})"
        )
    price = prices[key]
    if not isinstance(price, Price):
        raise InvalidArgument(f"{where}: the price of {key!r} must be a Price, not {price!r}")
    return price


def tokens(usage: Mapping[str, Any], key: str) -> int:
    """A token count of an SDK's usage (missing or null: 0)."""
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


async def before_model_call(run: Run, request: Mapping[str, Any], prices: Prices | None) -> int:
    """Everything zincir does before a paid model call, in one place for both adapters: the
    durable mark that the call is in flight (:meth:`Run.start_model_call`), sized by
    ``request`` (the SDK call's keyword arguments, see :func:`request_tokens`) and priced by
    ``prices`` for the requested model, so that a reply lost with its process is charged. It
    raises :class:`BudgetExceeded` while the run's budget is spent, so a spent budget costs no
    further request. Returns the mark's seq."""
    model = request.get("model")
    model = model if isinstance(model, str) and 0 < len(model) <= 255 else None
    size = request_tokens(request)
    try:
        price = None if model is None else price_of(prices, model, f"run {run.id}")
    except InvalidArgument:  # the name the API reports may be priced where the alias asked is not
        price = None  # (and record() judges the table by that name)
    cost = None if price is None else price.cost(input=size, output=0)
    return await run.start_model_call(size, model=model, cost=cost)


Response = TypeVar("Response")


async def durable_call(
    run: Run,
    params: dict[str, Any],
    prices: Prices | None,
    stream_to: str | None,
    call: Callable[[], Awaitable[Response]],
    streamed: Callable[[str], Awaitable[Response]],
) -> Response:
    """An adapter's ``create`` after its own checks: the stream's name checked (before the
    call's mark is written), :func:`before_model_call`, then the SDK's call (``call()``, or
    ``streamed(stream_to)``), traced as the call's span. The caller records the response."""
    if stream_to is not None:
        stream_to = check_name(stream_to, f"run {run.id}: the stream name")
    await before_model_call(run, params, prices)
    with run._in_model_call():  # work (no suspension under it), traced as the call's span
        return await (call() if stream_to is None else streamed(stream_to))


CHARS_PER_TOKEN: Final = 4
"""The rule of thumb a request's size in tokens is estimated by (no tokenizer is called)."""


def request_tokens(request: Mapping[str, Any]) -> int:
    """An estimate of a request's input tokens: its JSON (the messages, system prompt and tool
    definitions; anything not JSON as its text) in characters, divided by
    :data:`CHARS_PER_TOKEN`. Counting exactly would cost a call to the provider."""
    text = json.dumps(request, default=str, ensure_ascii=False, separators=(",", ":"))
    return -(-len(text) // CHARS_PER_TOKEN)


# -- from a durable state to a conversation -----------------------------------------------------


@attrs.define
class Turn:
    """A recorded response (its ``llm_call`` payload), the results recorded for its tool calls
    (in log order), and the results of calls it does not own recorded after it (``orphans``:
    calls asked for before the latest accepted checkpoint)."""

    response: dict[str, Any]
    results: list[tuple[str, JSONValue]] = attrs.field(factory=list)
    orphans: list[tuple[str, JSONValue]] = attrs.field(factory=list)

    @property
    def call_ids(self) -> list[str]:
        return [call["id"] for call in self.response.get("tool_calls") or []]

    def after_results(self, nudge: str | None) -> list[str]:
        """What the user says after the turn's results: the orphans' results, then ``nudge``
        after a response that asked for no tool (``None``: nothing)."""
        texts = [orphan_text(*o) for o in self.orphans]
        if not self.call_ids and nudge is not None:
            texts.append(nudge)
        return texts


@attrs.define
class Conversation:
    """The material of a prompt, in order: the goal, the latest accepted checkpoint, the
    results recorded before the first response of the state (``orphans``), then its turns."""

    goal: str
    checkpoint: Checkpoint | None
    orphans: list[tuple[str, JSONValue]]
    turns: list[Turn]

    @property
    def opening(self) -> list[str]:
        """What the user says first: the goal, the checkpoint (if any), the orphans' results."""
        texts = [self.goal]
        if self.checkpoint is not None:
            texts.append(checkpoint_text(self.checkpoint))
        return texts + [orphan_text(*o) for o in self.orphans]


def conversation_of(state: DurableState, goal: str | None) -> Conversation:
    """Walk ``state`` (from :meth:`Run.state`) into turns: each ``llm_call`` opens one, and each
    ``tool_result`` joins the turn that asked for its call, wherever it stands in the log (a
    result recorded after a restart, or after a later response, still answers its own call).
    Other events (starts, checkpoints, waits, transitions) are not part of the conversation.
    Raises InvalidArgument if a tool call has no result yet: the model cannot be asked again
    before every call it made is answered."""
    where = f"run {state.run.id}"
    goal = goal_of(state, goal)
    turns: list[Turn] = []
    orphans: list[tuple[str, JSONValue]] = []
    owner: dict[str, Turn] = {}
    for event in state.events:
        if event.type == EventType.LLM_CALL:
            turn = Turn(event.payload)
            turns.append(turn)
            owner.update((call_id, turn) for call_id in turn.call_ids)
        elif event.type == EventType.TOOL_RESULT:
            call_id, content = event.payload["call_id"], event.payload["content"]
            if call_id in owner:
                owner[call_id].results.append((call_id, content))
            else:
                (turns[-1].orphans if turns else orphans).append((call_id, content))
    unanswered = [c for turn in turns for c in turn.call_ids if c not in {r for r, _ in turn.results}]
    if unanswered:
        raise InvalidArgument(
            f"{where}: tool calls {unanswered!r} have no result yet: run the pending tools"
            " (run_tools) before asking the model again"
        )
    return Conversation(goal, state.checkpoint, orphans, turns)


def goal_of(state: DurableState, goal: str | None) -> str:
    """``goal`` if given, else the run's config ``{"goal": ...}`` (a string)."""
    if goal is None:
        config = state.run.config
        goal = config.get("goal") if isinstance(config, dict) else None
        if goal is None:
            raise InvalidArgument(
                f"run {state.run.id}: its config has no 'goal' (a string) and no goal= was given"
            )
    if not isinstance(goal, str) or not goal:
        raise InvalidArgument(f"run {state.run.id}: the goal must be a non-empty string, not {goal!r}")
    return goal


def checkpoint_text(checkpoint: Checkpoint) -> str:
    """The latest accepted checkpoint as a fresh context reads it: its round and its state."""
    body = json.dumps(checkpoint.state.to_json(), sort_keys=True, ensure_ascii=False)
    return f"{CHECKPOINT_HEADER} round {checkpoint.round}\n{body}"


def result_text(content: JSONValue) -> str:
    """A tool result as the model reads it: a string as it is, anything else as JSON. The same
    text whether it comes from the log or straight from the tool, so a prompt rebuilt after a
    restart is the prompt the model saw (and its prompt cache still applies)."""
    return content if isinstance(content, str) else json.dumps(content, sort_keys=True, ensure_ascii=False)


def orphan_text(call_id: str, content: JSONValue) -> str:
    return f"Result of the earlier tool call {call_id}:\n{result_text(content)}"


Answer = TypeVar("Answer")


def answers(
    pending: Iterable[PendingToolCall],
    results: Mapping[str, JSONValue],
    answer: Callable[[str, JSONValue], Answer],
) -> list[Answer]:
    """``answer(call id, result)`` for each of ``pending``, in order, from ``results`` by call
    id; InvalidArgument for a call without one."""
    found = []
    for item in pending:
        if item.call.id not in results:
            raise InvalidArgument(f"tool call {item.call.id!r} ({item.call.name}) has no result in results")
        found.append(answer(item.call.id, results[item.call.id]))
    return found
