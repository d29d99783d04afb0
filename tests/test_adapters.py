"""zincir.adapters against the SDKs' own types: responses built as the SDKs parse them, recorded,
rebuilt from the log, checked against the SDKs' param types, and sent through the SDK clients to a
mock transport, with every block (thinking signatures above all) intact byte for byte."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import anthropic
import httpx2
import openai
import pydantic
import pytest
import trio
from anthropic.types import Message, MessageParam
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

import zincir
from zincir import adapters
from zincir.adapters import anthropic as za
from zincir.adapters import openai as zo

from .helpers import dump

GOAL = "Fix the failing test in parser.py."

# A signature as the API sends it: opaque base64, with characters JSON and URLs treat specially.
SIGNATURE = "EqQBCkYIBRgCIkB+/x9Yz0/a==\u2028Zm9v+YmFy/Lw=="


def anthropic_message(content: list[dict[str, Any]], stop_reason: str = "end_turn", **usage: Any) -> Message:
    """A Message as the SDK parses the API's JSON."""
    return Message.model_validate(
        {
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5-20250929",
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": 1200, "output_tokens": 80, **usage},
        }
    )


TEXT = [{"type": "text", "text": "The parser drops the last token: an off-by-one in `tokens[:-1]`."}]
TOOL_USE = [
    {"type": "text", "text": "Let me look at the file."},
    {"type": "tool_use", "id": "toolu_01A", "name": "read_file", "input": {"path": "parser.py"}},
]
THINKING = [
    {"type": "thinking", "thinking": "The test expects 3 tokens; we return 2.\n\nCheck the slice.",
     "signature": SIGNATURE},
    {"type": "text", "text": "I'll run the tests first."},
    {"type": "tool_use", "id": "toolu_01B", "name": "run", "input": {"argv": ["pytest", "-q"]}},
]  # fmt: skip
MIXED = [
    {"type": "thinking", "thinking": "Two edits, then the tests. ünïcödé ✓", "signature": SIGNATURE[::-1]},
    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"},
    {"type": "text", "text": "Editing the slice, per the docs.",
     "citations": [{"type": "char_location", "cited_text": "tokens[:-1]", "document_index": 0,
                    "document_title": "parser.py", "start_char_index": 10, "end_char_index": 21}]},
    {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search", "input": {"query": "slice"}},
    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01",
     "content": [{"type": "web_search_result", "url": "https://docs.python.org/3/", "title": "Python",
                  "encrypted_content": "EqgfCioIARgBIiQ3", "page_age": None}]},
    {"type": "tool_use", "id": "toolu_01C", "name": "edit_file",
     "input": {"path": "parser.py", "old": "tokens[:-1]", "new": "tokens", "nested": {"a": [1, 2.5, None]}}},
    {"type": "tool_use", "id": "toolu_01D", "name": "run", "input": {"argv": ["pytest", "-q"]}},
]  # fmt: skip

ANTHROPIC_CASES = {"text": TEXT, "tool_use": TOOL_USE, "thinking": THINKING, "mixed": MIXED}


def materialize(value: Any) -> Any:
    """A value pydantic validated, with its lazy iterables read (which is when they validate)."""
    if isinstance(value, dict):
        return {k: materialize(v) for k, v in value.items()}
    if isinstance(value, pydantic.BaseModel):
        return materialize(value.model_dump(mode="json", exclude_unset=True))
    if isinstance(value, list | tuple) or type(value).__name__ == "ValidatorIterator":
        return [materialize(v) for v in value]
    return value


def conforms(param_type: Any, value: Any) -> None:
    """``value`` validates as ``param_type`` and nothing of it is dropped on the way (a key the
    type does not know would be)."""
    adapter = pydantic.TypeAdapter(param_type)  # alive while its lazy iterators are read
    validated = materialize(adapter.validate_python(copy.deepcopy(value)))
    del adapter
    assert validated == value


def on_the_wire(text: str, body: bytes) -> bool:
    """Whether ``text`` is in a request's JSON body as one string, escaped either way."""
    return any(json.dumps(text, ensure_ascii=ascii).encode() in body for ascii in (True, False))


class Capture:
    """A mock transport that keeps each request and answers with ``reply`` (the n-th request
    with ``reply(n)``, when it is a function)."""

    def __init__(self, reply: dict[str, Any] | Callable[[int], dict[str, Any]]) -> None:
        self.reply = reply
        self.requests: list[bytes] = []

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request.content)
        reply = self.reply(len(self.requests)) if callable(self.reply) else self.reply
        return httpx2.Response(200, json=reply)

    @property
    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = json.loads(self.requests[-1])
        return body


async def send_anthropic(messages: list[MessageParam], reply: dict[str, Any] | None = None) -> Capture:
    capture = Capture(reply or anthropic_message(TEXT).to_dict(mode="json"))
    async with (
        httpx2.AsyncClient(transport=httpx2.MockTransport(capture.handle)) as http,
        anthropic.AsyncAnthropic(api_key="test", base_url="http://api.invalid", http_client=http) as client,
    ):
        await client.messages.create(model="claude-sonnet-4-5", max_tokens=1024, messages=messages)
    return capture


def chat_completion(message: dict[str, Any], finish_reason: str = "stop", **usage: Any) -> ChatCompletion:
    """A ChatCompletion as the SDK parses the API's JSON."""
    return ChatCompletion.model_validate(
        {
            "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
            "object": "chat.completion",
            "created": 1741569952,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 900, "completion_tokens": 60, "total_tokens": 960, **usage},
        }
    )


def function_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


OPENAI_TEXT = {"role": "assistant", "content": "The slice drops a token.", "refusal": None, "annotations": []}
OPENAI_TOOLS = {
    "role": "assistant",
    "content": "Reading and running.",
    "refusal": None,
    "annotations": [],
    # Arguments exactly as a model writes them: odd spacing, key order, escapes, non-ASCII.
    "tool_calls": [
        function_call("call_Ab1", "read_file", '{ "path" :"parser.py",\n "encoding":"utf-8" }'),
        function_call("call_Ab2", "run", '{"argv": ["pytest", "-q"], "note": "ünï \\u2713"}'),
    ],
}
OPENAI_MIXED = {
    "role": "assistant",
    "content": None,
    "refusal": None,
    "annotations": [{"type": "url_citation", "url_citation": {"url": "https://docs.python.org/3/",
                     "title": "Python", "start_index": 0, "end_index": 6}}],
    "tool_calls": [
        function_call("call_Ab3", "edit_file", '{"path": "parser.py", "new": "tokens"'),  # cut short
        {"id": "call_Ab4", "type": "custom", "custom": {"name": "patch", "input": "*** Begin Patch\n"}},
        function_call("call_Ab5", "run", '{"x": NaN}'),  # not JSON either
    ],
}  # fmt: skip
OPENAI_CASES = {"text": OPENAI_TEXT, "tools": OPENAI_TOOLS, "mixed": OPENAI_MIXED}


async def send_openai(messages: list[ChatCompletionMessageParam]) -> Capture:
    capture = Capture(chat_completion(OPENAI_TEXT).to_dict(mode="json"))
    async with (
        httpx2.AsyncClient(transport=httpx2.MockTransport(capture.handle)) as http,
        openai.AsyncOpenAI(api_key="test", base_url="http://api.invalid/v1", http_client=http) as client,
    ):
        await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
    return capture


async def answer_all(
    run: zincir.Run, result: Callable[[zincir.ToolCall], Any] = lambda c: {"ok": c.name}
) -> None:
    for pending in await run.pending_tools():
        await run.record_tool_result(pending.call.id, result(pending.call))


def llm_calls(state: zincir.DurableState) -> list[dict[str, Any]]:
    return [e.payload for e in state.events if e.type == zincir.EventType.LLM_CALL]


# -- Anthropic ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(ANTHROPIC_CASES))
async def test_an_anthropic_message_round_trips_block_for_block(db: zincir.Database, case: str) -> None:
    blocks = ANTHROPIC_CASES[case]
    message = anthropic_message(blocks, "tool_use" if case != "text" else "end_turn")
    async with zincir.open_run(db, config={"goal": GOAL}) as run:
        seq = await za.record(run, message)
        state = await run.state()
        [payload] = llm_calls(state)
        assert state.events[seq].type == zincir.EventType.LLM_CALL
        # Every block as the API sent it: the recorded content is the response's JSON content.
        assert payload["content"] == blocks
        assert payload["stop_reason"] == message.stop_reason
        uses = [b for b in blocks if b["type"] == "tool_use"]
        assert payload["tool_calls"] == [{"id": b["id"], "name": b["name"], "args": b["input"]} for b in uses]
        # The intents are durable, one per tool_use block, in order.
        assert [p.call for p in await run.pending_tools()] == [
            zincir.ToolCall(b["id"], b["name"], b["input"]) for b in uses
        ]
        await answer_all(run)
        rebuilt = za.messages(await run.state())

    conforms(list[MessageParam], rebuilt)
    assert rebuilt[0] == {"role": "user", "content": [{"type": "text", "text": GOAL}]}
    assert rebuilt[1] == {"role": "assistant", "content": blocks}
    if uses:
        assert rebuilt[2] == {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": b["id"], "content": json.dumps({"ok": b["name"]})}
                for b in uses
            ],
        }
    else:  # the request must end with the user: the run went on after the model stopped
        assert rebuilt[2] == {
            "role": "user",
            "content": [{"type": "text", "text": adapters._common.DEFAULT_NUDGE}],
        }
    # The SDK sends them, and what reaches the wire is the response's blocks, byte for byte.
    capture = await send_anthropic(rebuilt)
    assert capture.body["messages"] == rebuilt
    assert capture.body["messages"][1]["content"] == blocks
    for block in blocks:
        if block["type"] == "thinking":
            assert on_the_wire(block["signature"], capture.requests[-1])


async def test_anthropic_usage_and_cost_are_recorded_and_debited(db: zincir.Database) -> None:
    message = anthropic_message(
        TOOL_USE, "tool_use", cache_creation_input_tokens=300, cache_read_input_tokens=2000
    )
    prices = {"claude-sonnet-4-5": adapters.Price(input=3.0, output=15.0, cache_write=3.75, cache_read=0.3),
              "claude-opus": adapters.Price(input=15.0, output=75.0)}  # fmt: skip
    budget = zincir.Budget(tokens=1_000_000, cost=10.0)
    async with zincir.open_run(db, config={"goal": GOAL}, budget=budget) as run:
        await za.record(run, message, prices=prices)
        [payload] = llm_calls(await run.state())
        usage = await run.usage()
    expected_cost = (1200 * 3.0 + 80 * 15.0 + 300 * 3.75 + 2000 * 0.3) / 1e6
    assert payload["usage"] == {
        "input_tokens": 1200, "output_tokens": 80, "cache_creation_input_tokens": 300,
        "cache_read_input_tokens": 2000, "model": "claude-sonnet-4-5-20250929",
        "response_id": "msg_01XFDUDYJgAACzvnptvVoYEL", "cost": pytest.approx(expected_cost),
    }  # fmt: skip
    assert usage is not None
    assert usage.spent.input_tokens == 1200 + 300 + 2000 and usage.spent.output_tokens == 80
    assert usage.spent.cost == pytest.approx(expected_cost)
    assert usage.spent.model_calls == 1 and usage.spent.tool_calls == 1


async def test_results_recorded_after_a_restart_answer_their_own_tool_use(db: zincir.Database) -> None:
    first = anthropic_message(THINKING, "tool_use")
    async with zincir.open_run(db, config={"goal": GOAL}) as run:
        await za.record(run, first)
        await run.start_tool("toolu_01B")  # then the process goes away
    async with zincir.open_run(db, run.id) as again:  # a new owner: the result lands after that
        [pending] = await again.pending_tools()
        await again.execute(pending, exit_zero)
        second = anthropic_message(MIXED, "tool_use")
        await za.record(again, second)
        # The model's two calls answered out of order, with a foreign event between them.
        await again.record_tool_result("toolu_01D", "2 passed")
        await again.record_response("(a note)", [], "end_turn")
        await again.record_tool_result("toolu_01C", {"edited": True})
        rebuilt = za.messages(await again.state())
    conforms(list[MessageParam], rebuilt)
    assert [m["role"] for m in rebuilt] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert rebuilt[1]["content"] == THINKING and rebuilt[3]["content"] == MIXED
    assert rebuilt[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_01B", "content": '{"exit": 0}'}
    ]
    assert rebuilt[4]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_01D", "content": "2 passed"},
        {"type": "tool_result", "tool_use_id": "toolu_01C", "content": '{"edited": true}'},
    ]
    assert rebuilt[5]["content"] == [{"type": "text", "text": "(a note)"}]  # record_response's own text
    capture = await send_anthropic(rebuilt)
    assert capture.body["messages"] == rebuilt


async def _async(value: Any) -> Any:
    return value


async def exit_zero(pending: zincir.PendingToolCall) -> Any:
    return {"exit": 0}


async def two_hits(pending: zincir.PendingToolCall) -> Any:
    return ["a", "b"]


async def test_a_fresh_context_starts_from_the_accepted_checkpoint(db: zincir.Database) -> None:
    async def verify(state: zincir.CheckpointState) -> zincir.Verification:
        return zincir.Verification(True, ["tests pass"])

    claim = {"completed": ["fixed the slice"], "remaining": ["add a test"], "artifacts": [],
             "failed_attempts": [], "evidence": ["2 passed"]}  # fmt: skip
    cp = [{"type": "tool_use", "id": "toolu_cp", "name": zincir.SUBMIT_CHECKPOINT, "input": claim}]
    async with zincir.open_run(db, config={"goal": GOAL}) as run:
        await za.record(run, anthropic_message(TOOL_USE, "tool_use"))
        await answer_all(run)
        await za.record(run, anthropic_message(cp, "tool_use"))
        results = await adapters.run_tools(
            run, {}, claim=lambda p: _async(zincir.CheckpointState.from_json(p.call.args)), verify=verify
        )
        assert results == {
            "toolu_cp": {"accepted": True, "verification": {"evidence": ["tests pass"], "passed": True}}
        }
        assert llm_calls(await run.state()) == []  # nothing after the checkpoint yet
        await za.record(run, anthropic_message(THINKING, "tool_use"))
        await answer_all(run)
        state = await run.state()
    rebuilt = za.messages(state)
    conforms(list[MessageParam], rebuilt)
    assert state.checkpoint is not None
    [goal, checkpoint] = rebuilt[0]["content"]  # type: ignore[misc]
    assert goal == {"type": "text", "text": GOAL}
    header, body = checkpoint["text"].split("\n", 1)
    assert header.endswith("round 1") and json.loads(body) == {**claim, "data": {}}
    assert [m["role"] for m in rebuilt] == ["user", "assistant", "user"] and rebuilt[1]["content"] == THINKING


async def test_messages_refuses_while_a_call_is_unanswered_and_needs_a_goal(db: zincir.Database) -> None:
    async with zincir.open_run(db, config={"model": "x"}) as run:
        await za.record(run, anthropic_message(TOOL_USE, "tool_use"))
        state = await run.state()
    with pytest.raises(
        zincir.InvalidArgument, match=rf"run {run.id}: tool calls \['toolu_01A'\] have no result"
    ):
        za.messages(state, goal=GOAL)
    with pytest.raises(zincir.InvalidArgument, match=rf"run {run.id}: its config has no 'goal'"):
        zo.messages(state)
    with pytest.raises(zincir.InvalidArgument, match=rf"run {run.id}: the goal must be a non-empty string"):
        za.messages(state, goal="")


async def test_bad_input_is_refused_and_writes_nothing(db: zincir.Database) -> None:
    async with zincir.open_run(db, config={"goal": GOAL}) as run:
        before = dump(db)
        with pytest.raises(zincir.InvalidArgument, match=rf"run {run.id}: record\(\) takes an anthropic"):
            await za.record(run, chat_completion(OPENAI_TEXT))  # type: ignore[arg-type]
        with pytest.raises(zincir.InvalidArgument, match=rf"run {run.id}: record\(\) takes an openai"):
            await zo.record(run, anthropic_message(TEXT))  # type: ignore[arg-type]
        with pytest.raises(zincir.InvalidArgument, match=r"no entry for model 'claude-sonnet-4-5-20250929'"):
            await za.record(run, anthropic_message(TEXT), prices={"gpt-4o": adapters.Price(1, 2)})
        with pytest.raises(zincir.InvalidArgument, match="stream with stream_to=NAME"):
            await za.create(run, None, stream=True)  # type: ignore[arg-type]
        with pytest.raises(zincir.InvalidArgument, match="stream with stream_to=NAME"):
            await zo.create(run, None, stream=True)  # type: ignore[arg-type]
        for adapter in (za, zo):
            with pytest.raises(zincir.InvalidArgument, match="the stream name"):
                await adapter.create(run, None, stream_to="", model="m")  # type: ignore[attr-defined]
        with pytest.raises(zincir.InvalidArgument, match="no result in results"):
            za.tool_results(await run.pending_tools() + [_pending(run)], {})
        assert dump(db) == before
    with pytest.raises(zincir.InvalidArgument, match="Price.input must be a finite number"):
        adapters.Price(input=float("nan"), output=1)
    with pytest.raises(zincir.InvalidArgument, match="Price.cache_read must be"):
        adapters.Price(input=1, output=1, cache_read=-1)


def _pending(run: zincir.Run) -> zincir.PendingToolCall:
    return zincir.PendingToolCall(zincir.ToolCall("c1", "t"), 1, "tool_call:c1", run.fencing_token)


async def test_create_checks_the_budget_calls_and_records(db: zincir.Database) -> None:
    def reply(n: int) -> dict[str, Any]:
        uses = [{**TOOL_USE[1], "id": f"toolu_0{n}"}]
        return anthropic_message(uses, "tool_use").to_dict(mode="json")

    capture = Capture(reply)
    async with (
        httpx2.AsyncClient(transport=httpx2.MockTransport(capture.handle)) as http,
        anthropic.AsyncAnthropic(api_key="test", base_url="http://api.invalid", http_client=http) as client,
        zincir.open_run(db, config={"goal": GOAL}, budget=zincir.Budget(tokens=1500)) as run,
    ):
        params: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 512}
        got = await za.create(run, client, messages=za.messages(await run.state()), **params)
        assert got.to_dict(mode="json") == reply(1) and len(capture.requests) == 1
        assert llm_calls(await run.state())[0]["content"] == reply(1)["content"]
        await answer_all(run)
        with pytest.raises(zincir.BudgetExceeded):  # recorded, then over the limit
            await za.create(run, client, messages=za.messages(await run.state()), **params)
        assert len(capture.requests) == 2 and len(llm_calls(await run.state())) == 2
        await answer_all(run)
        with pytest.raises(zincir.BudgetExceeded):  # spent: no request leaves
            await za.create(run, client, messages=za.messages(await run.state()), **params)
        assert len(capture.requests) == 2


# -- OpenAI ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(OPENAI_CASES))
async def test_an_openai_completion_round_trips_with_its_arguments_verbatim(
    db: zincir.Database, case: str
) -> None:
    sent = OPENAI_CASES[case]
    completion = chat_completion(sent, "tool_calls" if "tool_calls" in sent else "stop")
    async with zincir.open_run(db, config={"goal": GOAL}) as run:
        await zo.record(run, completion)
        [payload] = llm_calls(await run.state())
        assert payload["content"] == sent  # the message as the API sent it
        assert payload["stop_reason"] == completion.choices[0].finish_reason
        calls = [zincir.ToolCall(**c) for c in payload["tool_calls"]]
        assert [p.call for p in await run.pending_tools()] == calls
        await answer_all(run)
        rebuilt = zo.messages(await run.state(), system="Be careful.")
    if case == "tools":
        assert calls == [
            zincir.ToolCall("call_Ab1", "read_file", {"path": "parser.py", "encoding": "utf-8"}),
            zincir.ToolCall("call_Ab2", "run", {"argv": ["pytest", "-q"], "note": "ünï ✓"}),
        ]
    if case == "mixed":
        assert calls == [
            zincir.ToolCall(
                "call_Ab3", "edit_file", {"unparsed_arguments": '{"path": "parser.py", "new": "tokens"'}
            ),
            zincir.ToolCall("call_Ab4", "patch", {"input": "*** Begin Patch\n"}),
            zincir.ToolCall("call_Ab5", "run", {"unparsed_arguments": '{"x": NaN}'}),
        ]
    conforms(list[ChatCompletionMessageParam], rebuilt)
    assert rebuilt[:2] == [{"role": "system", "content": "Be careful."}, {"role": "user", "content": GOAL}]
    assistant = {k: v for k, v in sent.items() if k not in ("annotations", "refusal")}
    assert rebuilt[2] == assistant  # annotations are not a request's; a null refusal is left out
    tail = rebuilt[3:]
    if "tool_calls" in sent:
        assert tail == [
            {"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"ok": call.name})}
            for c, call in zip(sent["tool_calls"], calls, strict=True)
        ]
    else:
        assert tail == [{"role": "user", "content": adapters._common.DEFAULT_NUDGE}]
    capture = await send_openai(rebuilt)
    assert capture.body["messages"] == rebuilt
    for call in sent.get("tool_calls") or []:
        if call["type"] == "function":  # the model's own text, not a re-encoding of the parsed args
            assert on_the_wire(call["function"]["arguments"], capture.requests[-1])


async def test_openai_usage_cost_and_a_price_table_by_prefix(db: zincir.Database) -> None:
    completion = chat_completion(OPENAI_TOOLS, "tool_calls", prompt_tokens_details={"cached_tokens": 400})
    prices = {"gpt-4o": adapters.Price(2.5, 10.0), "gpt-4o-mini": adapters.Price(0.15, 0.6, cache_read=0.075)}
    async with zincir.open_run(db, config={"goal": GOAL}, budget=zincir.Budget(cost=1.0)) as run:
        await zo.record(run, completion, prices=prices)
        [payload] = llm_calls(await run.state())
        usage = await run.usage()
    cost = (500 * 0.15 + 400 * 0.075 + 60 * 0.6) / 1e6  # the longest matching key: gpt-4o-mini
    assert payload["usage"]["cost"] == pytest.approx(cost)
    assert payload["usage"]["model"] == "gpt-4o-mini-2024-07-18"
    assert payload["usage"]["prompt_tokens"] == 900 and payload["usage"]["completion_tokens"] == 60
    assert usage is not None and usage.spent.cost == pytest.approx(cost)
    assert usage.spent.input_tokens == 900 and usage.spent.output_tokens == 60


async def test_openai_rebuilds_record_response_text_and_tool_results_helper(db: zincir.Database) -> None:
    async with zincir.open_run(db, config={"goal": GOAL}) as run:
        await run.record_response("plain text", [zincir.ToolCall("c1", "search", {"q": "x"})], "tool_calls")
        pending = await run.pending_tools()
        results = await adapters.run_tools(run, {"search": two_hits})
        state = await run.state()
    assert zo.tool_results(pending, results) == [
        {"role": "tool", "tool_call_id": "c1", "content": '["a", "b"]'}
    ]
    assert za.tool_results(pending, results) == [
        {"type": "tool_result", "tool_use_id": "c1", "content": '["a", "b"]'}
    ]
    rebuilt = zo.messages(state)
    conforms(list[ChatCompletionMessageParam], rebuilt)
    assert rebuilt[1:] == [
        {"role": "assistant", "content": "plain text",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "search", "arguments": '{"q": "x"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '["a", "b"]'},
    ]  # fmt: skip
    rebuilt_a = za.messages(state)
    conforms(list[MessageParam], rebuilt_a)
    assert rebuilt_a[1]["content"] == [
        {"type": "text", "text": "plain text"},
        {"type": "tool_use", "id": "c1", "name": "search", "input": {"q": "x"}},
    ]


# -- run_tools -----------------------------------------------------------------------------------


async def test_run_tools_executes_probes_answers_unknown_tools_and_decides_checkpoints(
    db: zincir.Database,
) -> None:
    ran: list[str] = []

    async def edit(pending: zincir.PendingToolCall) -> Any:
        ran.append(pending.call.id)
        return {"edited": pending.call.args}

    async def already_edited(pending: zincir.PendingToolCall) -> Any:
        return zincir.Done({"found": pending.call.id})

    async def verify(state: zincir.CheckpointState) -> zincir.Verification:
        return zincir.Verification(not state.remaining, {"remaining": state.remaining})

    claim = {"completed": ["x"], "remaining": ["y"], "artifacts": [], "failed_attempts": [], "evidence": []}
    async with zincir.open_run(db, config={"goal": GOAL}) as run:
        await run.record_response(
            "",
            [zincir.ToolCall("cp", zincir.SUBMIT_CHECKPOINT, claim), zincir.ToolCall("e1", "edit", {"a": 1}),
             zincir.ToolCall("e2", "edit", {"a": 2}), zincir.ToolCall("u1", "delete_repo", {})],
            "tool_use",
        )  # fmt: skip
        await run.start_tool("e2")  # a crash left e2 started: its probe looks before it runs
        with pytest.raises(
            zincir.InvalidArgument, match=rf"run {run.id}: submit_checkpoint calls \['cp'\] are pending"
        ):
            await adapters.run_tools(run, {"edit": edit})
        results = await adapters.run_tools(
            run, {"edit": edit}, reconcile={"edit": already_edited},
            claim=lambda p: _async(zincir.CheckpointState.from_json(p.call.args)), verify=verify,
        )  # fmt: skip
        events = (await run.state()).events
    assert list(results) == ["e1", "e2", "u1", "cp"]  # the checkpoint after its siblings
    assert ran == ["e1"]
    assert results["e2"] == {"found": "e2"}
    assert results["u1"] == {"error": "there is no tool named 'delete_repo'; use one of ['edit']"}
    assert results["cp"] == {
        "accepted": False,
        "verification": {"evidence": {"remaining": ["y"]}, "passed": False},
    }
    recorded = {e.payload["call_id"]: e.payload for e in events if e.type == zincir.EventType.TOOL_RESULT}
    assert recorded["e2"] == {"call_id": "e2", "content": {"found": "e2"}, "reconciled": True}
    assert {k: v["content"] for k, v in recorded.items()} == results


async def test_run_tools_decides_a_candidate_whose_verification_was_interrupted(db: zincir.Database) -> None:
    async def crash(state: zincir.CheckpointState) -> zincir.Verification:
        raise RuntimeError("the verifier's process died")

    async def verify(state: zincir.CheckpointState) -> zincir.Verification:
        return zincir.Verification(True, "ok")

    state = zincir.CheckpointState(completed=["x"])
    async with zincir.open_run(db, config={"goal": GOAL}) as run:
        await run.record_response("", [zincir.ToolCall("cp", zincir.SUBMIT_CHECKPOINT, state.to_json())], "x")
        with pytest.raises(RuntimeError):
            await run.checkpoint("cp", state, crash)
        results = await adapters.run_tools(run, {}, claim=lambda p: _async(state), verify=verify)
        assert results == {"cp": {"accepted": True, "verification": {"evidence": "ok", "passed": True}}}
        assert await run.pending_tools() == [] and (await run.state()).checkpoint is not None
        await run.complete()


def test_the_adapters_run_under_trio_without_asyncio() -> None:
    """The SDK clients make their requests under trio.run (sniffio sees Trio; no asyncio loop)."""

    async def main() -> tuple[int, int]:
        a = await send_anthropic([{"role": "user", "content": "hi"}])
        o = await send_openai([{"role": "user", "content": "hi"}])
        return len(a.requests), len(o.requests)

    assert trio.run(main) == (1, 1)


def test_the_public_names_of_the_adapters_are_pinned() -> None:
    assert adapters.__all__ == ["Price", "run_tools"]
    assert adapters.Price.__module__ == "zincir.adapters"
    for sdk in (za, zo):
        assert sorted(sdk.__all__) == ["Price", "create", "messages", "record", "run_tools", "tool_results"]
        assert sdk.Price is adapters.Price and sdk.run_tools is adapters.run_tools
    # Importing zincir.adapters needs neither SDK.
    code = (
        "import sys; sys.modules['anthropic'] = None; sys.modules['openai'] = None\n"
        "import zincir.adapters; print(zincir.adapters.Price(input=1, output=2).cost(input=10**6, output=0))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1.0"
