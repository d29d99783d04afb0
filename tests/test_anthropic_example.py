"""examples/anthropic_agent.py, the coding agent on the official Anthropic SDK, against its stand-in:
it fixes, tests, commits and has its fix verified, sending back every thinking block it recorded
(the stand-in refuses an altered one, as the API does), and a SIGKILL between the commit and its
recorded result is resumed by `zincir worker` without a second commit; the model's text is streamed
to the run's stream "answer", and the resumed attempt's is flagged as a restart."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import anthropic
import httpx2
import pytest
import trio

import zincir

from .helpers import REPO

EXAMPLE = REPO / "examples" / "anthropic_agent.py"
ZINCIR = str(Path(sys.executable).parent / "zincir")


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    """The example's module, offline (the stand-in), working in a fresh workspace."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("ZINCIR_WORKSPACE", str(tmp_path / "workspace"))
    spec = importlib.util.spec_from_file_location("zincir_anthropic_agent_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def git(workspace: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(workspace), *args], capture_output=True, text=True, check=True
    ).stdout


async def test_the_agent_fixes_tests_commits_and_has_it_verified(
    db: zincir.Database, example: ModuleType, tmp_path: Path
) -> None:
    async with zincir.open_run(db, config={"goal": example.GOAL}) as run:
        await example.handler(run)
    state = await db.state(run.id)
    events = await db.events(run.id)
    assert state.run.status is zincir.RunStatus.COMPLETED
    workspace = tmp_path / "workspace"
    # The fix, committed once, with the call's effect key; the tests pass and nothing is left over.
    assert git(workspace, "log", "--format=%s").split("\n")[:2] == ["Fix calc.add", "Start"]
    calls = [e.payload for e in events if e.type == zincir.EventType.TOOL_CALL]
    [commit_call] = [c for c in calls if c["name"] == "git_commit"]
    assert f"Effect: {run.id}:tool_call:{commit_call['call_id']}" in git(
        workspace, "log", "-1", "--format=%B"
    )
    assert (workspace / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert git(workspace, "status", "--porcelain") == ""
    # The accepted checkpoint is bound to that commit, with nothing uncommitted.
    assert state.checkpoint is not None and state.checkpoint.status == "accepted"
    [artifact] = state.checkpoint.state.artifacts
    assert artifact["kind"] == "git" and artifact["commit"] == git(workspace, "rev-parse", "HEAD").strip()
    assert artifact == (await zincir.artifacts.identify(workspace)).to_json()
    # Each response as the SDK returned it: a signed thinking block first, then text and a tool use,
    # with the usage the stand-in reported; every later request carried them back unaltered (the
    # stand-in answers 400 otherwise, and the SDK raises).
    responses = [e.payload for e in events if e.type == zincir.EventType.LLM_CALL]
    assert len(responses) == 5
    for response in responses:
        thinking, text, use = response["content"]
        assert thinking["type"] == "thinking" and thinking["signature"] == example.StandIn().sign(
            thinking["thinking"]
        )
        assert text["type"] == "text" and use["type"] == "tool_use"
        assert response["tool_calls"] == [{"id": use["id"], "name": use["name"], "args": use["input"]}]
        assert response["usage"]["input_tokens"] > 0 and response["usage"]["model"] == "stand-in"
    assert [r["tool_calls"][0]["name"] for r in responses] == [
        "run_command", "edit_file", "run_command", "git_commit", zincir.SUBMIT_CHECKPOINT,
    ]  # fmt: skip
    # Their text was streamed to the run's stream "answer" as it arrived, a word at a time.
    chunks = [chunk async for chunk in zincir.read_stream(db, run.id, "answer")]
    said = "".join(b["text"] for r in responses for b in r["content"] if b["type"] == "text")
    assert "".join(c.data for c in chunks) == said and len(chunks) > len(responses)
    assert {(c.attempt, c.restarted) for c in chunks} == {(1, False)}


async def test_the_stand_in_refuses_an_altered_thinking_block(example: ModuleType) -> None:
    """So that a run completing against it shows the signatures went back byte for byte."""
    stand_in = example.StandIn()
    thought = "add(2, 3) is not 5: it subtracts."
    turns = [
        {"role": "user", "content": [{"type": "text", "text": "Fix calc.add."}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": thought + " ", "signature": stand_in.sign(thought)},
            {"type": "text", "text": "Fixing."},
        ]},
        {"role": "user", "content": [{"type": "text", "text": "Go on."}]},
    ]  # fmt: skip
    async with (
        httpx2.AsyncClient(transport=httpx2.MockTransport(stand_in.handle)) as http,
        anthropic.AsyncAnthropic(api_key="x", base_url="http://stand-in.invalid", http_client=http) as client,
    ):
        with pytest.raises(anthropic.BadRequestError, match="Invalid signature in thinking block"):
            await client.messages.create(model="stand-in", max_tokens=1024, messages=turns)  # type: ignore[arg-type]
        turns[1]["content"][0]["thinking"] = thought  # type: ignore[index]
        reply = await client.messages.create(model="stand-in", max_tokens=1024, messages=turns)  # type: ignore[arg-type]
    assert reply.content[0].type == "thinking"


def test_killed_between_its_commit_and_the_result_a_worker_resumes_it_without_a_second_commit(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "ZINCIR_"))}
    env |= {
        "ZINCIR_DATABASE_PATH": str(tmp_path / "zincir.db"),
        "ZINCIR_WORKSPACE": str(tmp_path / "workspace"),
    }
    # The 16th write is the commit's result (after four model calls, each with its mark): the
    # commit is made, its result never recorded.
    killed = subprocess.run(
        [sys.executable, str(EXAMPLE)], cwd=tmp_path, env={**env, "ZINCIR_CRASH_AT": "before:16:root"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    workspace = tmp_path / "workspace"
    assert git(workspace, "log", "--format=%s").split("\n")[:2] == ["Fix calc.add", "Start"]
    resumed = subprocess.run(
        [ZINCIR, "worker", "examples.anthropic_agent:handler", "--until-idle"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert git(workspace, "log", "--format=%s").split("\n") == ["Fix calc.add", "Start", ""]  # one commit

    async def read() -> tuple[zincir.RunRecord, list[zincir.Event], list[zincir.StreamChunk]]:
        async with zincir.open_database(tmp_path / "zincir.db") as db:
            [record] = await db.runs()
            chunks = [chunk async for chunk in zincir.read_stream(db, record.id, "answer")]
            return record, await db.events(record.id), chunks

    record, events, chunks = trio.run(read)
    assert record.status is zincir.RunStatus.COMPLETED
    [commit_id] = [e.payload["call_id"] for e in events if e.payload.get("name") == "git_commit"]
    [commit_result] = [
        e.payload for e in events if e.type == "tool_result" and e.payload["call_id"] == commit_id
    ]
    assert commit_result["reconciled"] is True  # found by the probe, not made again
    assert commit_result["content"] == {"commit": git(workspace, "rev-parse", "HEAD").strip()}
    assert [e.type.value for e in events].count("attempt_lost") == 1
    assert json.dumps(events[-1].payload) == '{"from": "running", "to": "completed"}'
    # The killed process streamed four calls' text; the worker's call is a restart, not a splice.
    attempts = [(c.attempt, c.restarted) for c in chunks]
    first_of_2 = attempts.index((2, True))
    assert set(attempts[:first_of_2]) == {(1, False)} and set(attempts[first_of_2 + 1 :]) == {(2, False)}
