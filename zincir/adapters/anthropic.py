"""The Anthropic adapter: the official ``anthropic`` SDK's Messages API, durably (extra ``anthropic``).

::

    from zincir.adapters import anthropic as za

    message = await za.create(run, client, model=..., max_tokens=..., system=..., tools=...,
                              messages=za.messages(await run.state()))
    await za.run_tools(run, {"edit_file": edit_file, ...}, claim=claim, verify=verify)

- :func:`record` stores a ``Message`` as the SDK returns it: every content block (thinking blocks
  with their signatures, redacted thinking, text with citations, server tool blocks, and block
  types this code has never heard of) exactly as the API sent it, its ``tool_use`` blocks as
  durable tool intents, and its usage (with ``model``, ``response_id`` and, given a price table,
  ``cost``) for the budget, all in one transaction (:meth:`Run.record_response`).
- :func:`messages` rebuilds the ``messages`` of the next request from :meth:`Run.state`: the
  goal and the latest accepted checkpoint in the first user turn, then each recorded response
  as an assistant turn, its blocks as they were, each answered by its ``tool_result`` blocks in
  the user turn after it.
- :func:`tool_results` turns tool results into ``tool_result`` blocks; :func:`create` is one
  durable model call. The SDK runs under Trio as it is (its HTTP stack is ``httpx2``).

docs/adapters.md is the guide.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, cast

from anthropic import AsyncAnthropic
from anthropic.types import Message, MessageParam, ToolResultBlockParam

from .. import DurableState, InvalidArgument, PendingToolCall, Run, ToolCall
from ._common import (
    DEFAULT_NUDGE,
    JSONValue,
    Price,
    Prices,
    answers,
    conversation_of,
    durable_call,
    price_of,
    result_text,
    tokens,
)
from ._tools import run_tools

__all__ = ["Price", "create", "messages", "record", "run_tools", "tool_results"]


async def record(run: Run, message: Message, *, prices: Prices | None = None) -> int:
    """Record ``message`` (with its tool intents, usage and cost) in one transaction; returns
    the seq of its ``llm_call`` event.

    The event's ``content`` is the list of content blocks as the API sent them (the SDK's
    ``to_dict()``: fields it did not send are left out), ``stop_reason`` the message's (``""``
    if it has none), ``tool_calls`` one per ``tool_use`` block, and ``usage`` the SDK's usage
    plus ``model`` and ``response_id``, and ``cost`` when ``prices`` is given (the budget is
    debited from these). Raises what :meth:`Run.record_response` raises, after recording a
    response that reached a budget limit.
    """
    if not isinstance(message, Message):
        raise InvalidArgument(
            f"run {run.id}: record() takes an anthropic.types.Message, not {type(message).__name__}"
        )
    price = price_of(prices, message.model, f"run {run.id}")
    sent = message.to_dict(mode="json")
    content: list[dict[str, Any]] = sent["content"]  # type: ignore[assignment]
    calls = [ToolCall(b["id"], b["name"], b["input"]) for b in content if b.get("type") == "tool_use"]
    usage: dict[str, Any] = {**cast("dict[str, Any]", sent["usage"]), "model": message.model}
    usage["response_id"] = message.id
    if price is not None:
        usage["cost"] = price.cost(
            input=tokens(usage, "input_tokens"),
            output=tokens(usage, "output_tokens"),
            cache_write=tokens(usage, "cache_creation_input_tokens"),
            cache_read=tokens(usage, "cache_read_input_tokens"),
        )
    return await run.record_response(content, calls, message.stop_reason or "", usage=usage)


async def create(
    run: Run,
    client: AsyncAnthropic,
    *,
    prices: Prices | None = None,
    stream_to: str | None = None,
    **params: Any,
) -> Message:
    """One durable model call: ``client.messages.create(**params)``, after what zincir does
    before a paid call (the durable model-call mark, refused while the budget is spent), and its
    response recorded (:func:`record`) before it is returned.

    ``stream_to="answer"`` makes the call a stream (``client.messages.stream``) and sends each
    piece of its text, as it arrives, to the run's stream of that name (:meth:`Run.stream`, a
    string per chunk); the message the SDK assembles from the events is recorded, as a
    non-streaming call's would be (docs/streams.md). Pass ``stream=True`` never: a raw event
    stream is not a message to record."""
    if params.get("stream"):
        raise InvalidArgument(
            f"run {run.id}: create() records whole messages; stream with stream_to=NAME, or record"
            " a stream's final message with record()"
        )
    message: Message = await durable_call(
        run,
        params,
        prices,
        stream_to,
        lambda: client.messages.create(**params),
        lambda name: _streamed(run, client, name, params),
    )
    await record(run, message, prices=prices)
    return message


async def _streamed(run: Run, client: AsyncAnthropic, name: str, params: dict[str, Any]) -> Message:
    """The call as a stream: its text deltas sent to the run's stream ``name``; the final message."""
    async with run.stream(name) as out, client.messages.stream(**params) as events:
        async for text in events.text_stream:
            if text:
                await out.send(text)
        return await events.get_final_message()


def messages(
    state: DurableState, *, goal: str | None = None, nudge: str | None = DEFAULT_NUDGE
) -> list[MessageParam]:
    """The ``messages`` of the next request, rebuilt from ``state`` (:meth:`Run.state`).

    - The first user turn: the goal (``goal``, or the run's config ``{"goal": ...}``), then the
      latest accepted checkpoint, if any (its round and state, as JSON).
    - Each response recorded since, as an assistant turn with its content blocks as recorded
      (thinking signatures byte for byte); each ``tool_use`` answered by a ``tool_result`` block
      in the user turn right after it, wherever its result stands in the log.
    - After a response that asked for no tool, ``nudge`` as a user turn (the request must end
      with one); ``None`` leaves it to you.

    A response recorded by :meth:`Run.record_response` directly (text content) becomes a text
    block and ``tool_use`` blocks. Raises InvalidArgument while a tool call has no result.
    """
    talk = conversation_of(state, goal)
    out: list[dict[str, Any]] = []
    _add(out, "user", [_text(text) for text in talk.opening])
    for turn in talk.turns:
        _add(out, "assistant", _assistant_blocks(turn.response))
        answer = [_result(call_id, content) for call_id, content in turn.results]
        _add(out, "user", answer + [_text(text) for text in turn.after_results(nudge)])
    return cast("list[MessageParam]", out)


def tool_results(
    pending: Iterable[PendingToolCall], results: Mapping[str, JSONValue]
) -> list[ToolResultBlockParam]:
    """A ``tool_result`` block for each of ``pending`` (in order), from ``results`` by call id
    (as :func:`run_tools` returns them): the content of the user turn that answers them. A
    result that is not a string is sent as JSON."""
    return cast("list[ToolResultBlockParam]", answers(pending, results, _result))


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _result(call_id: str, content: JSONValue) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": result_text(content)}


def _add(out: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Append a turn, or extend the previous one of the same role: the API alternates roles."""
    if not blocks:
        return
    if out and out[-1]["role"] == role:
        out[-1]["content"].extend(blocks)
    else:
        out.append({"role": role, "content": blocks})


def _assistant_blocks(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The blocks of a recorded response: as recorded, when :func:`record` recorded it (a copy:
    the caller may change the list it gets); else built from its text and tool calls."""
    content = response.get("content")
    if isinstance(content, list) and all(isinstance(b, dict) and "type" in b for b in content):
        return copy.deepcopy(content)
    blocks = []
    if isinstance(content, str):
        if content:
            blocks.append(_text(content))
    elif content is not None:
        blocks.append(_text(result_text(content)))
    for call in response.get("tool_calls") or []:
        args = call["args"]
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": call["name"],
                "input": args if isinstance(args, dict) else {"args": args},
            }
        )
    return blocks
