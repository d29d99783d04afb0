"""A durable agent on the official OpenAI SDK under Trio: it saves a word with a file tool and has
its work verified, through zincir.adapters.openai.

Run it offline (a local stub plays the model):   .venv/bin/python examples/openai_agent.py
Against the real API:                            OPENAI_API_KEY=... .venv/bin/python examples/openai_agent.py
Resume after a crash:                            ZINCIR_RESUME=1 .venv/bin/python examples/openai_agent.py
Crash-test it:   .venv/bin/zincir crash-test examples.openai_agent:handler --config '{"goal": "Save hello."}'

Needs the extra: pip install 'zincir[openai]'. The SDK's ``AsyncOpenAI`` runs under
``trio.run`` as it is: its HTTP stack (httpx2 / httpcore2) and its retry sleeps (anyio) detect
Trio through sniffio.

What makes it durable (docs/adapters.md):

- ``zo.create`` checks the budget, calls the model, and records the completion as the SDK
  returned it (the message with its tool calls' arguments exactly as the model wrote them, the
  finish reason, the usage) with a durable intent for each tool call, in one transaction.
- ``zo.messages`` rebuilds the prompt of every model call from the log alone: the system prompt,
  the goal from the run's config, the latest *accepted* checkpoint, and the responses and tool
  results recorded after it. After a crash the recorded responses are reused as they are;
  ``run_tools`` executes the pending intents from the log. The model is only called when the log
  has no unanswered intent, so a response that reached the log is never paid for twice. (A call
  that was in flight when the process died is repeated: its answer never reached the log.)
- ``stream_to="answer"`` streams the model's text, as it arrives, to the run's stream
  ``answer`` (``zincir stream RUN_ID answer --follow``); the completion recorded is the whole one.
- The file tool writes ``<run id>/<call id>.json``, whole or not at all; a call that a crash left
  unrecorded is probed first, and the file it published is its result: it never writes twice.
- The run has a budget (tokens, model calls, and three identical tool calls at most), debited
  with each recorded response, so a restart keeps counting instead of spending from zero; once
  it is spent the run stops, unfinished, until the budget is raised (``zincir budget RUN_ID
  --tokens N``) and the run resumed.
- The model's checkpoint names its artifacts with labels; the agent replaces them with the
  measured content identities of the files the run wrote (``zincir.artifacts``), keeps the
  labels in the checkpoint's ``data``, and a verifier accepts the checkpoint only if those files
  exist with exactly that content (a label left among the artifacts is never accepted).

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
  ZINCIR_PAUSE_AFTER_TOOL_MS
                         a pause after the tool's effect, before its result is recorded, for
                         tests that kill the process there
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import trio
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionToolParam

import zincir
from zincir import CheckpointState, PendingToolCall, Verification, artifacts
from zincir.adapters import openai as zo
from zincir.testing import effect_ledger

GOAL = "Save the word hello with the write_file tool, then submit a checkpoint of your progress."
ROLE = "openai-agent"
MAX_ROUNDS = 10  # model calls per process: any real loop needs a bound
CHECKPOINT_HEADER = "Latest accepted checkpoint"  # how zo.messages introduces it (the stub looks)
NUDGE = "The run is not finished: keep working toward the goal and call submit_checkpoint when it is met."

SYSTEM_PROMPT = """You are a careful agent working toward a goal with tools.
- write_file(content) saves content to a new file and returns {"content": ..., "ok": true}.
- submit_checkpoint(completed, remaining, artifacts, failed_attempts, evidence) reports your
  progress. It is verified independently: list the files you wrote as artifacts, and put every
  unfinished part of the goal in remaining (leave remaining empty only when the goal is met).
Work in small steps and call submit_checkpoint once the goal is met."""


def function(name: str, description: str, properties: dict[str, Any]) -> ChatCompletionToolParam:
    """A strict function tool whose every property is required."""
    schema: dict[str, object] = {"type": "object", "properties": properties, "required": list(properties)}
    schema["additionalProperties"] = False
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema, "strict": True},
    }


def strings(description: str) -> dict[str, Any]:
    return {"type": "array", "items": {"type": "string"}, "description": description}


CLAIM = {
    "completed": strings("What is done."),
    "remaining": strings("What is still to do; empty when the goal is met."),
    "artifacts": strings("The files you produced."),
    "failed_attempts": strings("What you tried that did not work."),
    "evidence": strings("Why you believe the completed items are done."),
}
TOOLS = [
    function("write_file", "Save content to a new file; returns what was saved.",
             {"content": {"type": "string", "description": "What to save."}}),
]  # fmt: skip
TOOLS.append(function(zincir.SUBMIT_CHECKPOINT, "Report verified progress toward the goal.", CLAIM))


async def pause(boundary: str) -> None:
    milliseconds = int(os.environ.get(f"ZINCIR_PAUSE_{boundary}_MS", "0"))
    if milliseconds:
        print(f"pausing {milliseconds} ms at {boundary.lower()}", flush=True)
        await trio.sleep(milliseconds / 1000)


# -- the tool: a file written whole, once per call ------------------------------------------------


def publish(path: Path, content: dict[str, Any]) -> None:
    """Write ``path`` whole or not at all: a temporary file, flushed to disk, renamed over it."""
    temp = path.with_name(f".{path.name}.tmp")
    with temp.open("w") as f:
        json.dump(content, f)
        f.flush()
        os.fsync(f.fileno())
    temp.rename(path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the new name itself must survive power loss
    finally:
        os.close(directory)


async def write_file(out: Path, pending: PendingToolCall) -> dict[str, Any]:
    content = pending.call.args.get("content") if isinstance(pending.call.args, dict) else None
    if not isinstance(content, str):
        return {"ok": False, "error": "write_file needs a string argument 'content'"}
    result = {"content": content, "ok": True}
    await trio.to_thread.run_sync(publish, out / f"{pending.call.id}.json", result)
    await effect_ledger().record(pending.effect_key)  # for zincir crash-test; a no-op elsewhere
    await pause("AFTER_TOOL")
    return result


async def published(out: Path, pending: PendingToolCall) -> Any:
    """The probe of a call that a crash left unrecorded: the file it published, if any."""
    path = trio.Path(out, f"{pending.call.id}.json")
    return json.loads(await path.read_text()) if await path.exists() else None


# -- checkpoints: measured artifacts and the verifier --------------------------------------------


async def verify(state: CheckpointState) -> Verification:
    """Accept only measured artifacts that exist and still have the content that was measured."""
    unverified = await artifacts.mismatches(state.artifacts)  # changed, missing, or only a label
    evidence = {"unverified": [f"{a.kind}: {a.path}" for a in unverified]}
    return Verification(bool(state.artifacts) and not unverified, evidence)


def texts(args: Any, field: str) -> list[str]:
    value = args.get(field) if isinstance(args, dict) else None
    return [str(item) for item in value] if isinstance(value, list) else []


async def claim(out: Path, pending: PendingToolCall) -> CheckpointState:
    """The model's claim, with its artifact labels replaced by the measured identities of the
    files this run wrote; the labels stay in ``data``, for the next context to read."""
    claimed = {field: texts(pending.call.args, field) for field in CLAIM}
    files = sorted(await trio.Path(out).glob("*.json"))
    measured = [(await artifacts.identify(path)).to_json() for path in files]
    return CheckpointState(claimed["completed"], claimed["remaining"], measured, claimed["failed_attempts"],
                           claimed["evidence"], data={"artifact_labels": claimed["artifacts"]})  # fmt: skip


# -- the durable loop ----------------------------------------------------------------------------


async def drive(run: zincir.Run, client: AsyncOpenAI, model: str, output: Path) -> None:
    """Continue the run from whatever its log says, until it completes."""
    out = output / run.id  # the run's own files
    await trio.Path(out).mkdir(parents=True, exist_ok=True)
    tools = {"write_file": functools.partial(write_file, out)}
    probes = {"write_file": functools.partial(published, out)}
    for _ in range(MAX_ROUNDS):
        await zo.run_tools(run, tools, reconcile=probes, claim=functools.partial(claim, out), verify=verify)
        state = await run.state()
        if state.checkpoint is not None and not state.checkpoint.state.remaining:
            await run.complete()
            return
        try:
            messages = zo.messages(state, system=SYSTEM_PROMPT, nudge=NUDGE)
            await zo.create(run, client, model=model, messages=messages, tools=TOOLS, stream_to="answer")
        except zincir.BudgetExceeded as exc:  # before the call, or after recording the one that spent it
            print(f"stopped: {exc}. Raise it (zincir budget RUN_ID --tokens N), then resume", flush=True)
            return
    await run.fail(f"no accepted checkpoint without remaining work after {MAX_ROUNDS} model calls")


async def handler(run: zincir.Run) -> None:
    """The same loop as a worker handler (``zincir worker``, ``zincir crash-test``); it writes
    under ZINCIR_OUTPUT_DIR (default: output, in the working directory)."""
    output = await trio.Path(os.environ.get("ZINCIR_OUTPUT_DIR", "output")).absolute()
    async with open_model() as (client, model, _):
        await drive(run, client, model, Path(output))


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
        completion = {
            "id": f"chatcmpl-{hashlib.sha256(request.content).hexdigest()[:29]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 20,
                "total_tokens": prompt_tokens + 20,
            },
        }
        return self.streamed(completion) if body.get("stream") else httpx2.Response(200, json=completion)

    @staticmethod
    def streamed(completion: dict[str, Any]) -> httpx2.Response:
        """The completion as the API streams it (server-sent events): the content a word at a
        time, the tool calls, the finish reason, then the usage."""
        head = {key: completion[key] for key in ("id", "created", "model")}
        head["object"] = "chat.completion.chunk"
        [choice] = completion["choices"]
        message = choice["message"]
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        deltas += [{"content": word} for word in re.findall(r"\S+\s*", message["content"] or "")]
        calls = message.get("tool_calls", [])
        deltas += [{"tool_calls": [{"index": i, **call}]} for i, call in enumerate(calls)]
        ends: list[tuple[dict[str, Any], str | None]] = [({}, choice["finish_reason"])]
        chunks = [
            {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            for delta, finish in [(delta, None) for delta in deltas] + ends
        ]
        chunks.append({**head, "choices": [], "usage": completion["usage"]})
        # No closing "data: [DONE]": the SDK stops reading there and leaves its event generator
        # unfinished, for Trio to warn about (a ResourceWarning) when it is collected.
        text = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=text.encode())

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
        # The same conversation gets the same call id (so a crash test can compare checkpoints),
        # and every request of a run is a new conversation (so ids are never reused).
        call_id = f"call_{hashlib.sha256(json.dumps(messages).encode()).hexdigest()[:24]}"
        if resumed or any(name == "submit_checkpoint" for name, _ in answered):
            return {"role": "assistant", "content": "done"}, "stop"
        written = [f"{id_}.json" for name, id_ in answered if name == "write_file"]
        if written:
            name = "submit_checkpoint"
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


async def main(db_path: str, output: Path) -> None:
    """Start a run (or, with ZINCIR_RESUME=1, resume every in-flight one)."""
    tokens = int(os.environ.get("ZINCIR_TOKEN_BUDGET", "50000"))  # a new run's; a resumed one keeps its own
    budget = zincir.Budget(tokens=tokens, model_calls=MAX_ROUNDS, max_identical_tool_calls=3)
    async with open_model() as (client, model, provider), zincir.open_database(db_path) as db:
        run_ids: list[str | None] = [None]  # None: start a new run
        if os.environ.get("ZINCIR_RESUME"):  # this example's unfinished runs (others may share the database)
            statuses = ("running", "pending", "waiting")
            run_ids = [r.id for s in statuses for r in await db.runs(status=s, role=ROLE, limit=10_000)]
            print(f"resuming {len(run_ids)} run(s)", flush=True)
        for run_id in run_ids:
            # Resuming fences the previous owner (force=True): it must be known to be dead.
            config, force = {"goal": GOAL, "model": model}, run_id is not None
            async with zincir.open_run(
                db, run_id, role=ROLE, provider=provider, config=config, force=force, budget=budget
            ) as run:
                await drive(run, client, model, output)
                usage = await run.usage()
            if usage is not None:  # (every run of this example has a budget)
                print(f"spent: {usage.spent.tokens} tokens in {usage.spent.model_calls} model calls")
            print(f"run {run.id}  status={(await db.state(run.id)).run.status.value}", flush=True)


if __name__ == "__main__":
    trio.run(
        main,
        os.environ.get("ZINCIR_DATABASE_PATH", "zincir.db"),
        Path(os.environ.get("ZINCIR_OUTPUT_DIR", "output")).absolute(),
    )
