"""The OpenAI adapter: the official ``openai`` SDK's Chat Completions, durably (extra ``openai``).

::

    from zincir.adapters import openai as zo

    completion = await zo.create(run, client, model=..., tools=...,
                                 messages=zo.messages(await run.state(), system=SYSTEM))
    await zo.run_tools(run, {"write_file": write_file, ...}, claim=claim, verify=verify)

- :func:`record` stores a ``ChatCompletion``'s first choice as the SDK returns it: its message
  (content, refusal, tool calls with their arguments exactly as the model wrote them, and
  whatever else the API sent), its finish reason, its tool calls as durable tool intents (the
  arguments parsed), and its usage (with ``model``, ``response_id`` and, given a price table,
  ``cost``) for the budget, all in one transaction (:meth:`Run.record_response`).
- :func:`messages` rebuilds the chat messages of the next request from :meth:`Run.state`: the
  system prompt if given, the goal and the latest accepted checkpoint as user messages, then each
  recorded response as an assistant message followed by a ``tool`` message for each of its calls.
- :func:`tool_results` turns tool results into ``tool`` messages; :func:`create` is one durable
  model call. The SDK runs under Trio as it is (its HTTP stack is ``httpx2``).

docs/adapters.md is the guide.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from typing import Any, cast

from openai import AsyncOpenAI
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessageParam,
    ChatCompletionToolMessageParam,
)

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

# Beside content (and audio, by its id): the fields of a response message that a request's assistant
# message takes back. The rest (annotations, say) stay in the log but are not sent.
_ASSISTANT_FIELDS = ("refusal", "tool_calls", "function_call", "name")


async def record(run: Run, completion: ChatCompletion, *, prices: Prices | None = None) -> int:
    """Record the first choice of ``completion`` (with its tool intents, usage and cost) in one
    transaction; returns the seq of its ``llm_call`` event.

    The event's ``content`` is the choice's message as the API sent it (the SDK's ``to_dict()``),
    ``stop_reason`` its ``finish_reason``, ``tool_calls`` one per tool call (a function call's
    arguments parsed from JSON; arguments that are not valid JSON are kept as
    ``{"unparsed_arguments": text}``, for the tool to answer with an error; a custom tool's
    input as ``{"input": text}``), and ``usage`` the SDK's usage plus ``model`` and
    ``response_id``, and ``cost`` when ``prices`` is given. Raises what
    :meth:`Run.record_response` raises, after recording a response that reached a budget limit.
    """
    if not isinstance(completion, ChatCompletion):
        raise InvalidArgument(
            f"run {run.id}: record() takes an openai ChatCompletion, not {type(completion).__name__}"
        )
    if not completion.choices:
        raise InvalidArgument(f"run {run.id}: completion {completion.id!r} has no choices to record")
    price = price_of(prices, completion.model, f"run {run.id}")
    choice = completion.choices[0]
    message = cast("dict[str, Any]", choice.message.to_dict(mode="json"))
    calls = [_tool_call(call) for call in message.get("tool_calls") or []]
    usage: dict[str, Any] = {}
    if completion.usage is not None:
        usage.update(completion.usage.to_dict(mode="json"))
    usage["model"] = completion.model
    usage["response_id"] = completion.id
    if price is not None:
        usage["cost"] = _cost(price, usage)
    return await run.record_response(message, calls, choice.finish_reason or "", usage=usage)


def _tool_call(call: dict[str, Any]) -> ToolCall:
    if call.get("type") == "custom":
        return ToolCall(call["id"], call["custom"]["name"], {"input": call["custom"]["input"]})
    function = call["function"]
    return ToolCall(call["id"], function["name"], _arguments(function["arguments"]))


def _refuse(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


_ARGUMENTS = json.JSONDecoder(parse_constant=_refuse)  # NaN and Infinity are not JSON either; one
# decoder for every call (json.loads would build one per call with parse_constant given)


def _arguments(text: str) -> JSONValue:
    try:
        return _ARGUMENTS.decode(text)
    except ValueError:
        return {"unparsed_arguments": text}


def _cost(price: Price, usage: Mapping[str, Any]) -> float:
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    cached, written = tokens(details, "cached_tokens"), tokens(details, "cache_write_tokens")
    return price.cost(
        input=max(0, tokens(usage, "prompt_tokens") - cached - written),
        output=tokens(usage, "completion_tokens"),
        cache_write=written,
        cache_read=cached,
    )


async def create(
    run: Run,
    client: AsyncOpenAI,
    *,
    prices: Prices | None = None,
    stream_to: str | None = None,
    **params: Any,
) -> ChatCompletion:
    """One durable model call: ``client.chat.completions.create(**params)``, after what zincir
    does before a paid call (the durable model-call mark, refused while the budget is spent), and its
    response recorded (:func:`record`) before it is returned.

    ``stream_to="answer"`` makes the call a stream (``client.chat.completions.stream``, asking
    for usage in its last chunk unless ``stream_options`` says otherwise) and sends each piece of
    its content, as it arrives, to the run's stream of that name (:meth:`Run.stream`, a string
    per chunk); the completion the SDK assembles from the chunks is recorded, as a non-streaming
    call's would be (docs/streams.md). Pass ``stream=True`` never: raw chunks are no completion."""
    if params.get("stream"):
        raise InvalidArgument(f"run {run.id}: create() records whole completions; stream with stream_to=NAME")
    completion: ChatCompletion = await durable_call(
        run,
        params,
        prices,
        stream_to,
        lambda: client.chat.completions.create(**params),
        lambda name: _streamed(run, client, name, params),
    )
    await record(run, completion, prices=prices)
    return completion


async def _streamed(run: Run, client: AsyncOpenAI, name: str, params: dict[str, Any]) -> ChatCompletion:
    """The call as a stream: its content deltas sent to the run's stream ``name``; the final
    completion, as a plain ``ChatCompletion`` (the helper's parsed fields left out)."""
    params = {"stream_options": {"include_usage": True}, **params}
    async with run.stream(name) as out, client.chat.completions.stream(**params) as events:
        async for event in events:
            if event.type == "content.delta" and event.delta:
                await out.send(event.delta)
        final = await events.get_final_completion()
    sent = cast("dict[str, Any]", final.to_dict(mode="json"))
    for choice in sent["choices"]:
        choice["message"].pop("parsed", None)
        for call in choice["message"].get("tool_calls") or []:
            call.get("function", {}).pop("parsed_arguments", None)
    return ChatCompletion.model_validate(sent)


def messages(
    state: DurableState,
    *,
    system: str | None = None,
    goal: str | None = None,
    nudge: str | None = DEFAULT_NUDGE,
) -> list[ChatCompletionMessageParam]:
    """The chat messages of the next request, rebuilt from ``state`` (:meth:`Run.state`).

    - ``system`` as a system message, if given; the goal (``goal``, or the run's config
      ``{"goal": ...}``) as a user message; the latest accepted checkpoint, if any, as another.
    - Each response recorded since, as an assistant message with its content and its tool calls
      as the model wrote them (arguments byte for byte), followed by a ``tool`` message for each
      call, wherever its result stands in the log.
    - After a response that asked for no tool, ``nudge`` as a user message (``None``: none).

    A response recorded by :meth:`Run.record_response` directly (text content) is rebuilt from
    its text and tool calls. Raises InvalidArgument while a tool call has no result.
    """
    talk = conversation_of(state, goal)
    out: list[dict[str, Any]] = []
    if system is not None:
        out.append({"role": "system", "content": system})
    out += [_user(text) for text in talk.opening]
    for turn in talk.turns:
        out.append(_assistant(turn.response))
        out += [_tool(call_id, content) for call_id, content in turn.results]
        out += [_user(text) for text in turn.after_results(nudge)]
    return cast("list[ChatCompletionMessageParam]", out)


def tool_results(
    pending: Iterable[PendingToolCall], results: Mapping[str, JSONValue]
) -> list[ChatCompletionToolMessageParam]:
    """A ``tool`` message for each of ``pending`` (in order), from ``results`` by call id (as
    :func:`run_tools` returns them). A result that is not a string is sent as JSON."""
    return cast("list[ChatCompletionToolMessageParam]", answers(pending, results, _tool))


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _tool(call_id: str, content: JSONValue) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": result_text(content)}


def _assistant(response: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message of a recorded response: the fields a request takes back, as
    recorded, when :func:`record` recorded it; else built from its text and tool calls."""
    content = response.get("content")
    if isinstance(content, dict) and content.get("role") == "assistant":
        message: dict[str, Any] = {"role": "assistant", "content": copy.deepcopy(content.get("content"))}
        message.update(
            (k, copy.deepcopy(content[k])) for k in _ASSISTANT_FIELDS if content.get(k) is not None
        )
        audio = content.get("audio")
        if isinstance(audio, dict) and "id" in audio:
            message["audio"] = {"id": audio["id"]}
        if message["content"] is None and not message.get("tool_calls") and not message.get("function_call"):
            message["content"] = ""  # an assistant message with neither is taken only as ""
        return message
    calls = [
        {
            "id": c["id"],
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["args"])},
        }
        for c in response.get("tool_calls") or []
    ]
    text = content if isinstance(content, str) or content is None else result_text(content)
    built: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        built["tool_calls"] = calls
    return built
