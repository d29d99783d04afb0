"""A durable coding agent on the official Anthropic SDK: it edits a file, runs the tests, commits
the fix and has it verified, and survives a crash anywhere on the way.

Run it offline (a stand-in plays the model):  .venv/bin/python examples/anthropic_agent.py
Against the real API:         ANTHROPIC_API_KEY=... .venv/bin/python examples/anthropic_agent.py
Resume after a crash:         .venv/bin/zincir worker examples.anthropic_agent:handler --until-idle
Crash-test it:                .venv/bin/zincir crash-test examples.anthropic_agent:handler

Needs the extra: pip install 'zincir[anthropic]'. ``AsyncAnthropic`` runs under ``trio.run`` as it
is. The project it works on is a small git repository that the agent creates in ZINCIR_WORKSPACE
(default ``workspace``) if it is not there: ``calc.add`` subtracts, and its test fails.

What zincir does here (docs/adapters.md): ``za.create`` records every response as the SDK
returned it (thinking blocks and their signatures included) with a durable intent per
``tool_use`` block; ``za.messages`` rebuilds the next request from the log alone (goal, latest
accepted checkpoint, responses and tool results since), so a resumed run sends the model the
very blocks it wrote; ``run_tools`` executes pending intents, probing first for an edit or a
commit that a crash left unrecorded, and decides the checkpoint with an independent verifier
(the tests pass at the committed HEAD, the workspace is exactly what was measured). The model's
text streams live to the run's stream ``answer`` (``zincir stream RUN_ID answer --follow``).

Environment: ANTHROPIC_API_KEY / ANTHROPIC_MODEL (the real API; otherwise the stand-in),
ZINCIR_DATABASE_PATH (default zincir.db, or a postgresql:// URL), ZINCIR_WORKSPACE.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import trio
from anthropic import AsyncAnthropic
from anthropic.types import ToolParam

import zincir
from zincir import CheckpointState, PendingToolCall, Verification, artifacts
from zincir.adapters import anthropic as za
from zincir.testing import effect_ledger

GOAL = (
    "calc.add is wrong and its test fails: fix it, run the tests, commit the fix, then submit a checkpoint."
)
SYSTEM = "You are a careful coding agent. Work in small steps with your tools; verify before you commit."
MAX_ROUNDS = 12  # model calls per attempt: any real loop needs a bound


def tool(name: str, description: str, **properties: Any) -> ToolParam:
    schema: dict[str, object] = {"type": "object", "properties": properties, "required": list(properties)}
    return {"name": name, "description": description, "input_schema": schema}


STRINGS = {"type": "array", "items": {"type": "string"}}
TOOLS = [
    tool("edit_file", "Replace the text old by new in a file.", path={"type": "string"},
         old={"type": "string"}, new={"type": "string"}),
    tool("run_command", "Run python (tests), git status or git diff.", argv=STRINGS),
    tool("git_commit", "Commit every change in the workspace.", message={"type": "string"}),
]  # fmt: skip
TOOLS.append(tool(zincir.SUBMIT_CHECKPOINT, "Report verified progress.", completed=STRINGS, remaining=STRINGS,
                  evidence=STRINGS))  # fmt: skip

# -- the workspace: a git repository and the agent's tools on it ----------------------------------

# Reproducible commits: the same change on the same parent is the same commit, so a commit made
# again after a crash is recognisable, and two runs of the example end at the same HEAD.
GIT_ENV = {"GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@example.invalid",
           "GIT_COMMITTER_NAME": "agent", "GIT_COMMITTER_EMAIL": "agent@example.invalid",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
           "GIT_CONFIG_GLOBAL": os.devnull, "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
PROJECT = {
    ".gitignore": "__pycache__/\n",
    "calc.py": "def add(a, b):\n    return a - b\n",
    "test_calc.py": "import unittest\n\nfrom calc import add\n\n\nclass TestAdd(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n",
}


class Workspace:
    def __init__(self, root: Path) -> None:
        self.root = root

    async def sh(self, *argv: str, cwd: Path | None = None) -> tuple[int, str]:
        argv = (sys.executable, *argv[1:]) if argv[0] == "python" else argv
        done = await trio.run_process(
            argv, cwd=cwd or self.root, env={**os.environ, **GIT_ENV}, capture_stdout=True,
            stderr=subprocess.STDOUT, check=False,
        )  # fmt: skip
        return done.returncode, done.stdout.decode(errors="replace")[-2000:]

    async def prepare(self) -> None:
        """Create the project (once: a crash halfway leaves only a scratch directory)."""
        if await trio.Path(self.root, ".git").exists():
            return
        scratch = self.root.with_name(f".{self.root.name}.new")
        await trio.to_thread.run_sync(lambda: shutil.rmtree(scratch, ignore_errors=True))
        for name, text in PROJECT.items():
            await trio.Path(scratch, name).parent.mkdir(parents=True, exist_ok=True)
            await trio.Path(scratch, name).write_text(text)
        for argv in (
            ["git", "init", "-q", "-b", "main"],
            ["git", "add", "-A"],
            ["git", "commit", "-qm", "Start"],
        ):
            await self.sh(*argv, cwd=scratch)
        await trio.Path(scratch).rename(self.root)

    async def edit_file(self, pending: PendingToolCall) -> Any:
        args = pending.call.args
        path = trio.Path(self.root, args["path"])
        text = await path.read_text()
        if text.count(args["old"]) != 1:
            return {
                "error": f"{args['path']} holds {args['old']!r} {text.count(args['old'])} times, not once"
            }
        await path.write_text(text.replace(args["old"], args["new"]))
        await effect_ledger().record(pending.effect_key)  # for zincir crash-test; a no-op elsewhere
        return {"edited": args["path"]}

    async def edited(self, pending: PendingToolCall) -> Any:
        """The probe of an edit a crash left unrecorded: done if the new text is there."""
        args = pending.call.args
        text = await trio.Path(self.root, args["path"]).read_text()
        return {"edited": args["path"]} if args["new"] in text and args["old"] not in text else None

    async def run_command(self, pending: PendingToolCall) -> Any:
        argv = pending.call.args["argv"]
        if not argv or (argv[0] != "python" and argv[:2] not in (["git", "status"], ["git", "diff"])):
            return {"error": "only python, git status and git diff may run"}
        code, output = await self.sh(*argv)
        return {"exit_code": code, "output": output}

    async def git_commit(self, pending: PendingToolCall) -> Any:
        message = f"{pending.call.args['message']}\n\nEffect: {pending.effect_key}"
        await self.sh("git", "add", "-A")
        code, output = await self.sh("git", "commit", "-qm", message)
        if code == 0:
            await effect_ledger().record(pending.effect_key)
        return await self.committed(pending) or {"error": output}

    async def committed(self, pending: PendingToolCall) -> Any:
        """The probe of a commit: the commit whose message names this call's effect key."""
        _, found = await self.sh("git", "log", "--format=%H", "-F", f"--grep=Effect: {pending.effect_key}")
        return {"commit": found.strip()} if found.strip() else None

    # -- the checkpoint: what the agent claims, measured; and an independent verifier ------------

    async def claim(self, pending: PendingToolCall) -> CheckpointState:
        args = pending.call.args
        measured = await artifacts.identify(self.root)  # HEAD, and a hash of uncommitted changes
        return CheckpointState(completed=args["completed"], remaining=args["remaining"],
                               evidence=args["evidence"], artifacts=[measured.to_json()])  # fmt: skip

    async def verify(self, state: CheckpointState) -> Verification:
        changed = await artifacts.mismatches(state.artifacts)
        tests, output = await self.sh("python", "-m", "unittest", "-q")
        status = (await self.sh("git", "status", "--porcelain"))[1]
        passed = not changed and tests == 0 and not status
        return Verification(passed, {"tests": output.splitlines()[-1:], "uncommitted": status.split()})


# -- the durable loop ------------------------------------------------------------------------------


async def handler(run: zincir.Run) -> None:
    """Continue the run from its log until its work is verified (a worker handler)."""
    workspace = Workspace(Path(await trio.Path(os.environ.get("ZINCIR_WORKSPACE", "workspace")).absolute()))
    await workspace.prepare()
    tools = {"edit_file": workspace.edit_file, "run_command": workspace.run_command,
             "git_commit": workspace.git_commit}  # fmt: skip
    probes = {"edit_file": workspace.edited, "git_commit": workspace.committed}
    async with open_model() as (client, model):
        for _ in range(MAX_ROUNDS):
            await za.run_tools(run, tools, reconcile=probes, claim=workspace.claim, verify=workspace.verify)
            state = await run.state()
            if state.checkpoint is not None and not state.checkpoint.state.remaining:
                await run.complete()
                return
            await za.create(
                run, client, model=model, system=SYSTEM, tools=TOOLS, messages=za.messages(state),
                max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 2048}, stream_to="answer",
            )  # fmt: skip
    await run.fail(f"no verified fix after {MAX_ROUNDS} model calls")


async def main(db_path: str) -> None:
    async with zincir.open_database(db_path) as db, zincir.open_run(db, config={"goal": GOAL}) as run:
        print(f"run {run.id}; see it with: .venv/bin/zincir show {run.id}", flush=True)
        await handler(run)


# -- the model: the real API, or a stand-in behind the SDK's own HTTP stack -------------------------


@asynccontextmanager
async def open_model() -> AsyncIterator[tuple[AsyncAnthropic, str]]:
    if os.environ.get("ANTHROPIC_API_KEY"):
        async with AsyncAnthropic(timeout=300.0) as client:
            yield client, os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-4-5")
        return
    transport = httpx2.MockTransport(StandIn().handle)
    async with (
        httpx2.AsyncClient(transport=transport) as http,
        AsyncAnthropic(api_key="stand-in", base_url="http://stand-in.invalid", http_client=http) as client,
    ):
        yield client, "stand-in"


TESTS = ["python", "-m", "unittest", "-q"]


class StandIn:
    """The Messages API as a scripted coding model: run the tests, fix calc.add, rerun them, commit,
    submit a checkpoint. It signs its thinking and, like the real API, refuses a request whose
    earlier thinking blocks come back altered."""

    KEY = b"stand-in signing key"

    def sign(self, thinking: str) -> str:
        return base64.b64encode(hmac.digest(self.KEY, thinking.encode(), "sha256")).decode()

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        turns: list[dict[str, Any]] = body["messages"]
        for block in (b for m in turns if m["role"] == "assistant" for b in m["content"]):
            if block["type"] == "thinking" and block["signature"] != self.sign(block["thinking"]):
                error = {"type": "invalid_request_error", "message": "Invalid signature in thinking block"}
                return httpx2.Response(400, json={"type": "error", "error": error})
        thought, text, use = self.next_step(turns)
        content = [
            {"type": "thinking", "thinking": thought, "signature": self.sign(thought)},
            {"type": "text", "text": text},
        ]
        if use is not None:  # an id unique in the run, and the same for the same log
            count = 1 + sum(b["type"] == "tool_use" for m in turns[1:] for b in m["content"])
            context = hashlib.sha256(json.dumps(turns[0]).encode()).hexdigest()[:8]
            content.append(
                {"type": "tool_use", "id": f"toolu_{context}{count:03d}", "name": use[0], "input": use[1]}
            )
        message = {
            "id": "msg_" + hashlib.sha256(request.content).hexdigest()[:24],
            "type": "message", "role": "assistant", "model": body["model"], "content": content,
            "stop_reason": "tool_use" if use else "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": len(request.content) // 4, "output_tokens": 50},
        }  # fmt: skip
        return self.streamed(message) if body.get("stream") else httpx2.Response(200, json=message)

    @staticmethod
    def streamed(message: dict[str, Any]) -> httpx2.Response:
        """The message as the API streams it (server-sent events): each block starts empty, then
        its content comes as deltas (text a word at a time), then it stops."""
        usage = message["usage"]
        start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
        events: list[tuple[str, dict[str, Any]]] = [("message_start", {"message": start})]
        for index, block in enumerate(message["content"]):
            deltas: list[dict[str, Any]]
            if block["type"] == "thinking":
                empty: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
                deltas = [
                    {"type": "thinking_delta", "thinking": block["thinking"]},
                    {"type": "signature_delta", "signature": block["signature"]},
                ]
            elif block["type"] == "text":
                empty = {"type": "text", "text": ""}
                deltas = [{"type": "text_delta", "text": w} for w in re.findall(r"\S+\s*", block["text"])]
            else:  # tool_use
                empty = {**block, "input": {}}
                deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
            events.append(("content_block_start", {"index": index, "content_block": empty}))
            events += [("content_block_delta", {"index": index, "delta": delta}) for delta in deltas]
            events.append(("content_block_stop", {"index": index}))
        ended: dict[str, Any] = {"stop_reason": message["stop_reason"], "stop_sequence": None}
        events.append(("message_delta", {"delta": ended, "usage": {"output_tokens": usage["output_tokens"]}}))
        events.append(("message_stop", {}))
        text = "".join(
            f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n" for name, data in events
        )
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=text.encode())

    @staticmethod
    def next_step(turns: list[dict[str, Any]]) -> tuple[str, str, tuple[str, Any] | None]:
        """Thinking, text and the next tool call (or None), from what the last call returned."""
        names = {b["id"]: b["name"] for m in turns[1:] for b in m["content"] if b["type"] == "tool_use"}
        results = [
            b for m in turns[1:] if m["role"] == "user" for b in m["content"] if b["type"] == "tool_result"
        ]
        last, said = (
            (names[results[-1]["tool_use_id"]], json.loads(results[-1]["content"])) if results else ("", {})
        )
        if "Latest accepted checkpoint" in json.dumps(turns[0]) or last == "submit_checkpoint":
            return "The fix is committed and verified.", "Done.", None
        if last == "git_commit" and "commit" in said:
            claim = {"completed": ["fixed calc.add", "committed the fix"], "remaining": [],
                     "evidence": ["python -m unittest: OK"]}  # fmt: skip
            return (
                "Committed; now have it verified.",
                "Submitting a checkpoint.",
                ("submit_checkpoint", claim),
            )
        if last == "run_command" and said.get("exit_code") == 0:
            return "The tests pass now.", "Committing the fix.", ("git_commit", {"message": "Fix calc.add"})
        if last == "run_command":
            edit = {"path": "calc.py", "old": "return a - b", "new": "return a + b"}
            return "add(2, 3) is not 5: it subtracts.", "Fixing calc.add.", ("edit_file", edit)
        if last == "edit_file":
            return (
                "Edited; the tests must say so.",
                "Running the tests again.",
                ("run_command", {"argv": TESTS}),
            )
        return "First, what fails?", "Running the tests.", ("run_command", {"argv": TESTS})


if __name__ == "__main__":
    trio.run(main, os.environ.get("ZINCIR_DATABASE_PATH", "zincir.db"))
