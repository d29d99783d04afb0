"""The durable agent of durable_agent.py, driven by the official OpenAI SDK under Trio.

Run it offline (a local stub plays the model):   .venv/bin/python examples/openai_agent.py
Against the real API:                            OPENAI_API_KEY=... .venv/bin/python examples/openai_agent.py
Resume after a crash:                            ZINCIR_RESUME=1 .venv/bin/python examples/openai_agent.py

Needs the extra: pip install 'zincir[openai]'. The SDK's ``AsyncOpenAI`` runs under
``trio.run`` as it is: its HTTP stack (httpx2 / httpcore2) and its retry sleeps (anyio) detect
Trio through sniffio.

What makes it durable:

- Each model response is recorded (content, tool calls, finish reason and token usage) with
  a durable intent for each tool call, in one transaction.
- The prompt of every model call is rebuilt from the log: the system prompt, the goal from
  the run's config, the latest *accepted* checkpoint, and the responses and tool results
  recorded after it. After a crash the recorded responses are reused as they are; pending
  tool intents are executed from the log. The model is only called when the log has no
  unanswered intent, so a response that reached the log is never paid for twice. (A call
  that was in flight when the process died is repeated: its answer never reached the log.)
- The file tool is idempotent (the call id names the file), so a tool re-run after a crash
  never writes twice.
- The run has a budget (tokens, model calls, and three identical tool calls at most), debited
  with each recorded response, so a restart keeps counting instead of spending from zero. The
  loop checks it before every model call; once it is spent the run stops, unfinished, until
  the budget is raised (``zincir budget RUN_ID --tokens N``) and the run resumed.
- The model's checkpoint names its artifacts with labels; the agent replaces them with the
  measured content identities of what the tool wrote (``zincir.artifacts``), keeps the labels
  in the checkpoint's ``data``, and a verifier accepts the checkpoint only if those files exist
  with exactly that content (a label left among the artifacts is never accepted).

Environment:
  OPENAI_API_KEY         use the real API (otherwise the offline stub); OPENAI_BASE_URL works too
  OPENAI_MODEL           the model for the real API (default gpt-4o-mini)
  ZINCIR_DATABASE_PATH   database file, or a postgresql:// URL (default zincir.db)
  ZINCIR_OUTPUT_DIR      where the tool writes (default output)
  ZINCIR_TOKEN_BUDGET    the run's token budget (default 50000; a resumed run keeps its own)
  ZINCIR_RESUME=1        resume every pending or running run of this example (role
                         openai-agent) instead of creating one. This fences the previous
                         owner (force=True): only do it once you know that process is dead,
                         or two processes will run the same tools.
  ZINCIR_STUB_CALL_LOG   the stub appends one line per model call it answers to this file
  ZINCIR_PAUSE_BEFORE_TOOL_MS, ZINCIR_PAUSE_AFTER_TOOL_MS, ZINCIR_PAUSE_IN_VERIFY_MS,
  ZINCIR_PAUSE_AFTER_CHECKPOINT_MS
                         pauses at crash boundaries, for tests that kill the process there
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import trio

# The demo beside this file (examples/ is on sys.path when this file runs as a script).
from durable_agent import in_flight, pause, print_run
from durable_agent import write_file as write_file_once
from openai import AsyncOpenAI
from openai.types.chat import (
    ChatCompletionMessageParam,
    ChatCompletionMessageToolCall,
    ChatCompletionMessageToolCallUnion,
    ChatCompletionToolParam,
)

import zincir
from zincir import CheckpointState, Verification, artifacts

GOAL = "Save the word hello with the write_file tool, then submit a checkpoint of your progress."
ROLE = "openai-agent"
MAX_ROUNDS = 10  # model calls per process: any real loop needs a bound
CHECKPOINT_HEADER = "Latest accepted checkpoint (verified; continue from here):"
NUDGE = "The run is not finished: keep working toward the goal and call submit_checkpoint when it is met."

SYSTEM_PROMPT = """You are a careful agent working toward a goal with tools.
- write_file(content) saves content to a new file and returns {"content": ..., "ok": true}.
- submit_checkpoint(completed, remaining, artifacts, failed_attempts, evidence) reports your
  progress. It is verified independently: list the files you wrote as artifacts, and put every
  unfinished part of the goal in remaining (leave remaining empty only when the goal is met).
Work in small steps and call submit_checkpoint once the goal is met."""

TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Save content to a new file; returns what was saved.",
            "parameters": {
                "type": "object",
                "properties": {"content": {"type": "string", "description": "What to save."}},
                "required": ["content"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    },
    {
        "type": "function",
        "function": {
            "name": zincir.SUBMIT_CHECKPOINT,
            "description": "Report verified progress toward the goal.",
            "parameters": {
                "type": "object",
                "properties": {
                    name: {"type": "array", "items": {"type": "string"}, "description": description}
                    for name, description in [
                        ("completed", "What is done."),
                        ("remaining", "What is still to do; empty when the goal is met."),
                        ("artifacts", "The files you produced."),
                        ("failed_attempts", "What you tried that did not work."),
                        ("evidence", "Why you believe the completed items are done."),
                    ]
                },
                "required": ["completed", "remaining", "artifacts", "failed_attempts", "evidence"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    },
]


# -- the tool: the demo's idempotent file tool, fed the model's (unchecked) arguments -------------


async def write_file(out: Path, call_id: str, args: Any) -> dict[str, Any]:
    content = args.get("content") if isinstance(args, dict) else None
    if not isinstance(content, str):
        return {"ok": False, "error": "write_file needs a string argument 'content'"}
    return await write_file_once(out, call_id, {"content": content})


# -- checkpoints: measured artifacts and the verifier --------------------------------------------


async def verify(state: CheckpointState) -> Verification:
    """Accept only measured artifacts that exist and still have the content that was measured."""
    await pause("IN_VERIFY")
    unverified = await artifacts.mismatches(state.artifacts)  # changed, missing, or only a label
    passed = bool(state.artifacts) and not unverified
    return Verification(passed, {"unverified": [f"{a.kind}: {a.path}" for a in unverified]})


def written_files(events: list[zincir.Event], out: Path) -> list[Path]:
    """The files that write_file calls in ``events`` reported as written."""
    writes = {
        e.payload["call_id"]
        for e in events
        if e.type == zincir.EventType.TOOL_CALL and e.payload["name"] == "write_file"
    }
    return [
        out / f"{e.payload['call_id']}.json"
        for e in events
        if e.type == zincir.EventType.TOOL_RESULT
        and e.payload["call_id"] in writes
        and isinstance(e.payload["content"], dict)
        and e.payload["content"].get("ok") is True
    ]


def strings(args: Any, field: str) -> list[str]:
    value = args.get(field) if isinstance(args, dict) else None
    return [str(item) for item in value] if isinstance(value, list) else []


async def checkpoint_state(state: zincir.DurableState, args: Any, out: Path) -> CheckpointState:
    """The model's claim, with its artifact labels replaced by measured identities: those of
    the previous accepted checkpoint (kept as measured then) and of every file written since.
    The labels themselves stay in ``data``, beside the claim, for the next context to read."""
    previous = state.checkpoint.state.artifacts if state.checkpoint is not None else []
    measured = [(await artifacts.identify(path)).to_json() for path in written_files(state.events, out)]
    return CheckpointState(
        completed=strings(args, "completed"),
        remaining=strings(args, "remaining"),
        artifacts=[*previous, *measured],
        failed_attempts=strings(args, "failed_attempts"),
        evidence=strings(args, "evidence"),
        data={"artifact_labels": strings(args, "artifacts")},
    )


# -- the model: prompts rebuilt from the log, responses recorded with their usage ----------------


def goal_of(config: Any) -> str:
    """The goal in a run's config (``{"goal": ...}``), or the example's own."""
    goal = config.get("goal") if isinstance(config, dict) else None
    return goal if isinstance(goal, str) else GOAL


def build_messages(goal: str, state: zincir.DurableState) -> list[ChatCompletionMessageParam]:
    """The prompt for the next model call, from the run's goal and the durable log alone:
    system prompt, goal, latest accepted checkpoint, then the responses and tool results
    recorded after it."""
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"Goal: {goal}"},
    ]
    if state.checkpoint is not None:
        checkpoint = json.dumps(state.checkpoint.state.to_json(), sort_keys=True)
        messages.append({"role": "user", "content": f"{CHECKPOINT_HEADER}\n{checkpoint}"})
    for event in state.events:
        payload = event.payload
        if event.type == zincir.EventType.LLM_CALL:
            calls = payload["tool_calls"]
            if calls:
                messages.append(
                    {
                        "role": "assistant",
                        "content": payload["content"],
                        "tool_calls": [
                            {
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": call["name"], "arguments": json.dumps(call["args"])},
                            }
                            for call in calls
                        ],
                    }
                )
            else:  # the model stopped, yet the run went on: say why
                messages.append({"role": "assistant", "content": payload["content"] or ""})
                messages.append({"role": "user", "content": NUDGE})
        elif event.type == zincir.EventType.TOOL_RESULT:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": payload["call_id"],
                    "content": json.dumps(payload["content"]),
                }
            )
    return messages


def tool_call_from_sdk(call: ChatCompletionMessageToolCallUnion) -> zincir.ToolCall:
    """A zincir ToolCall from the SDK's type: id, function name, and the parsed arguments."""
    if isinstance(call, ChatCompletionMessageToolCall):
        try:
            args = json.loads(call.function.arguments)
        except json.JSONDecodeError:  # recorded as it came; the tool answers with an error
            args = {"unparsed_arguments": call.function.arguments}
        return zincir.ToolCall(call.id, call.function.name, args)
    return zincir.ToolCall(call.id, call.custom.name, {"input": call.custom.input})


async def ask_model(run: zincir.Run, client: AsyncOpenAI, model: str, state: zincir.DurableState) -> None:
    """One paid model call; its response is in the log before anything acts on it."""
    completion = await client.chat.completions.create(
        model=model, messages=build_messages(goal_of(run.config), state), tools=TOOLS
    )
    choice = completion.choices[0]
    await run.record_response(
        choice.message.content,
        [tool_call_from_sdk(call) for call in choice.message.tool_calls or []],
        choice.finish_reason,
        usage=completion.usage.model_dump() if completion.usage is not None else None,
    )


# -- the durable loop ----------------------------------------------------------------------------


async def run_pending_tools(run: zincir.Run, out: Path) -> None:
    """Execute the intents that have no result, from the log (never by asking the model again)."""
    pending = await run.pending_tools()
    # A submit_checkpoint is decided once its sibling calls have results: run those first.
    for item in sorted(pending, key=lambda p: p.call.name == zincir.SUBMIT_CHECKPOINT):
        call = item.call
        if call.name == "write_file":
            await run.record_tool_result(call.id, await write_file(out, call.id, call.args))
        elif call.name == zincir.SUBMIT_CHECKPOINT:
            claimed = await checkpoint_state(await run.state(), call.args, out)
            await run.checkpoint(call.id, claimed, verify)
        else:
            await run.record_tool_result(call.id, {"ok": False, "error": f"there is no tool {call.name!r}"})


async def drive(run: zincir.Run, client: AsyncOpenAI, model: str, out: Path) -> None:
    """Continue the run from whatever its log says, until it completes."""
    candidate = await run.pending_checkpoint()
    if candidate is not None:  # a crash interrupted a verification: decide the stored candidate
        await run.verify_checkpoint(candidate, verify)
    for _ in range(MAX_ROUNDS):
        await run_pending_tools(run, out)
        state = await run.state()
        if state.checkpoint is not None and not state.checkpoint.state.remaining:
            await pause("AFTER_CHECKPOINT")
            await run.complete()
            return
        try:
            await run.check_budget()  # before paying for the next call
            await ask_model(run, client, model, state)
        except zincir.BudgetExceeded as exc:  # the response that reached it is recorded
            print(f"stopped: {exc}. Raise it (zincir budget {run.id} --tokens N), then resume", flush=True)
            return
    await run.fail(f"no accepted checkpoint without remaining work after {MAX_ROUNDS} model calls")


# -- the offline stub: a scripted model behind the SDK's own HTTP stack --------------------------


class StubModel:
    """A Chat Completions endpoint for ``httpx2.MockTransport``: it answers from the request
    alone, like a model: write the file, then submit a checkpoint, then say it is done."""

    def __init__(self, call_log: Path | None = None) -> None:
        self.calls = 0
        self.call_log = call_log

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        if request.method != "POST" or not request.url.path.endswith("/chat/completions"):
            return httpx2.Response(404, json={"error": {"message": f"no route {request.url.path}"}})
        body = json.loads(request.content)
        message, finish_reason = self.reply(body["messages"])
        self.calls += 1
        if self.call_log is not None:
            line = {
                "pid": os.getpid(),
                "finish_reason": finish_reason,
                "prompt_call_ids": [m["tool_call_id"] for m in body["messages"] if m["role"] == "tool"],
                "reply_call_ids": [call["id"] for call in message.get("tool_calls", [])],
            }
            with self.call_log.open("a") as log:
                log.write(json.dumps(line) + "\n")
        prompt_tokens = len(json.dumps(body["messages"])) // 4
        return httpx2.Response(
            200,
            json={
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 20,
                          "total_tokens": prompt_tokens + 20},
            },
        )  # fmt: skip

    @staticmethod
    def reply(messages: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
        names = {
            call["id"]: call["function"]["name"]
            for m in messages
            if m["role"] == "assistant"
            for call in m.get("tool_calls") or []
        }
        answered = [
            (names.get(m["tool_call_id"]), m["tool_call_id"]) for m in messages if m["role"] == "tool"
        ]
        resumed = any(m["role"] == "user" and CHECKPOINT_HEADER in m["content"] for m in messages)
        call_id = f"call_{uuid.uuid4().hex[:24]}"
        if resumed or any(name == zincir.SUBMIT_CHECKPOINT for name, _ in answered):
            return {"role": "assistant", "content": "done"}, "stop"
        written = [f"{id_}.json" for name, id_ in answered if name == "write_file"]
        if written:
            name = zincir.SUBMIT_CHECKPOINT
            args: dict[str, Any] = {
                "completed": ["Saved hello with write_file"],
                "remaining": [],
                "artifacts": written,
                "failed_attempts": [],
                "evidence": ["write_file returned ok: true"],
            }
            content = "The file is written; submitting a checkpoint."
        else:
            name, args, content = "write_file", {"content": "hello"}, "I'll save the word."
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        return {"role": "assistant", "content": content, "tool_calls": [call]}, "tool_calls"


@asynccontextmanager
async def open_model() -> AsyncIterator[tuple[AsyncOpenAI, str, str]]:
    """The SDK's async client and model name: the real API if OPENAI_API_KEY is set, else the
    stub, reached through the SDK's real request path with a mock transport."""
    if os.environ.get("OPENAI_API_KEY"):
        async with AsyncOpenAI(timeout=120.0) as client:
            yield client, os.environ.get("OPENAI_MODEL", "gpt-4o-mini"), "openai"
        return
    call_log = os.environ.get("ZINCIR_STUB_CALL_LOG")
    stub = StubModel(Path(call_log) if call_log else None)
    async with (
        httpx2.AsyncClient(transport=httpx2.MockTransport(stub.handle)) as http,
        AsyncOpenAI(api_key="offline-stub", base_url="http://stub.invalid/v1", http_client=http) as client,
    ):
        yield client, "stub-model", "openai-stub"


def budget() -> zincir.Budget:
    tokens = int(os.environ.get("ZINCIR_TOKEN_BUDGET", "50000"))
    return zincir.Budget(tokens=tokens, model_calls=MAX_ROUNDS, max_identical_tool_calls=3)


async def main(db_path: str, out: Path) -> list[str]:
    """Start a run (or, with ZINCIR_RESUME=1, resume every in-flight one); return the run ids."""
    done: list[str] = []
    async with open_model() as (client, model, provider), zincir.open_database(db_path) as db:
        run_ids: list[str | None] = [None]  # None: start a new run
        if os.environ.get("ZINCIR_RESUME"):
            run_ids = list(await in_flight(db, ROLE))
            print(f"resuming {len(run_ids)} run(s)", flush=True)
        for run_id in run_ids:
            async with zincir.open_run(
                db,
                run_id,
                role=ROLE,
                provider=provider,
                config={"goal": GOAL, "model": model},
                force=run_id is not None,  # resuming: the previous owner is known to be dead
                budget=budget(),  # a new run's; a resumed one keeps its own
            ) as run:
                print(f"run {run.id} (epoch {run.epoch}, model {model})", flush=True)
                await drive(run, client, model, out)
                usage = await run.usage()
                if usage is not None:
                    print(
                        f"spent: {usage.spent.tokens} tokens in {usage.spent.model_calls} model calls",
                        flush=True,
                    )
            print_run(await db.state(run.id), await db.events(run.id))
            done.append(run.id)
    return done


if __name__ == "__main__":
    output = Path(os.environ.get("ZINCIR_OUTPUT_DIR", "output"))
    output.mkdir(parents=True, exist_ok=True)
    trio.run(main, os.environ.get("ZINCIR_DATABASE_PATH", "zincir.db"), output)
