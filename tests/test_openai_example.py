"""examples/openai_agent.py against its offline stub: the official SDK's async client under Trio,
responses recorded with their usage, and no model response paid for twice after a SIGKILL."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx2  # noqa: F401 - the test extra installs it: a missing one fails here
import openai  # noqa: F401 - the test extra installs it: a missing one fails here
import pytest
import trio

import zincir

from .helpers import REPO

EXAMPLE = REPO / "examples" / "openai_agent.py"


def load_example(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    # As when it runs as a script: its directory (with the demo it builds on) is importable.
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    spec = importlib.util.spec_from_file_location("zincir_openai_agent_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def resume(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run the example once more with ZINCIR_RESUME=1, as a person would after a crash."""
    return subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=tmp_path,
        env=offline_env(tmp_path, ZINCIR_RESUME="1"),
        capture_output=True,
        text=True,
        timeout=30,
    )


def offline_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment without an API key (the stub, never the network) or stray zincir knobs."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ZINCIR_PAUSE_", "ZINCIR_RESUME"))
    }
    env.update(
        ZINCIR_DATABASE_PATH=str(tmp_path / "zincir.db"),
        ZINCIR_OUTPUT_DIR=str(tmp_path / "output"),
        ZINCIR_STUB_CALL_LOG=str(tmp_path / "stub-calls.jsonl"),
        **extra,
    )
    return env


def stub_calls(tmp_path: Path) -> list[dict[str, Any]]:
    log = tmp_path / "stub-calls.jsonl"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def effect_files(out: Path) -> list[Path]:
    """The files the tool published, each run's in a directory named by its id."""
    return sorted(out.glob("*/*.json"))


async def test_a_run_completes_with_one_accepted_checkpoint_and_usage_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith(("OPENAI_", "ZINCIR_PAUSE_", "ZINCIR_RESUME")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ZINCIR_STUB_CALL_LOG", str(tmp_path / "stub-calls.jsonl"))
    example = load_example(monkeypatch)
    out = tmp_path / "output"
    out.mkdir()

    await example.main(str(tmp_path / "zincir.db"), out)

    async with zincir.open_database(tmp_path / "zincir.db") as db:
        [run_id] = [r.id for r in await db.runs()]
        state = await db.state(run_id)
        events = await db.events(run_id)
        chunks = [chunk async for chunk in zincir.read_stream(db, run_id, "answer")]
    assert state.run.status == zincir.RunStatus.COMPLETED
    assert state.run.provider == "openai-stub"
    types = [e.type.value for e in events]
    assert types.count("checkpoint_accepted") == 1 and "checkpoint_rejected" not in types
    [effect] = effect_files(out)
    assert effect.parent == out / run_id
    assert json.loads(effect.read_text()) == {"content": "hello", "ok": True}
    # The accepted checkpoint carries the measured identity of that file, not the model's label.
    assert state.checkpoint is not None
    [artifact] = state.checkpoint.state.artifacts
    assert artifact == (await zincir.artifacts.identify(effect)).to_json()
    assert artifact["kind"] == "file"
    assert state.checkpoint.state.data == {"artifact_labels": [effect.name]}  # the model's own words
    # Every response is stored with the usage the SDK reported, and tool calls from its types.
    responses = [e.payload for e in events if e.type == zincir.EventType.LLM_CALL]
    assert len(responses) == len(stub_calls(tmp_path)) == 2
    for response in responses:
        usage = response["usage"]
        assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] == 20
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert response["stop_reason"] == "tool_calls"
    assert responses[0]["tool_calls"][0]["name"] == "write_file"
    assert responses[0]["tool_calls"][0]["args"] == {"content": "hello"}
    assert responses[1]["tool_calls"][0]["name"] == zincir.SUBMIT_CHECKPOINT
    assert f"{responses[0]['tool_calls'][0]['id']}.json" == effect.name
    # Their text was streamed to the run's stream "answer" as it arrived, a word at a time.
    said = "".join(r["content"]["content"] for r in responses)
    assert "".join(c.data for c in chunks) == said and len(chunks) > len(responses)
    assert {(c.attempt, c.restarted) for c in chunks} == {(1, False)}


async def answer_chunks(db_path: Path) -> list[tuple[int, bool]]:
    """(attempt, restarted) of each chunk of the only run's stream "answer"."""
    async with zincir.open_database(db_path) as db:
        [run] = await db.runs()
        return [(c.attempt, c.restarted) async for c in zincir.read_stream(db, run.id, "answer")]


def test_a_killed_run_resumes_without_paying_for_a_recorded_response_again(tmp_path: Path) -> None:
    out = tmp_path / "output"
    db_path = tmp_path / "zincir.db"
    first = subprocess.Popen(
        [sys.executable, str(EXAMPLE)],
        cwd=tmp_path,
        env=offline_env(tmp_path, ZINCIR_PAUSE_AFTER_TOOL_MS="60000"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The effect is published (and its temp file gone); its result is not yet recorded.
        deadline = time.monotonic() + 20
        while not (effect_files(out) and not list(out.glob("*/.*.tmp"))):
            assert first.poll() is None, first.communicate()[1]
            assert time.monotonic() < deadline, "the example never reached its tool's effect"
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        assert first.stderr is not None
        first.stderr.close()
    assert first.returncode == -signal.SIGKILL
    conn = sqlite3.connect(db_path)
    try:
        assert conn.execute("SELECT status FROM agent_runs").fetchall() == [("running",)]
    finally:
        conn.close()
    [killed_call] = stub_calls(tmp_path)  # the first process paid for exactly one response
    [effect] = effect_files(out)
    inode = effect.stat().st_ino

    resumed = resume(tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming 1 run(s)" in resumed.stdout and "status=completed" in resumed.stdout

    conn = sqlite3.connect(db_path)
    try:
        assert conn.execute("SELECT status FROM agent_runs").fetchall() == [("completed",)]
        types = [t for (t,) in conn.execute("SELECT type FROM events ORDER BY seq")]
        llm_calls = types.count("llm_call")
        [(first_result,)] = conn.execute(
            "SELECT payload FROM events WHERE type = 'tool_result' ORDER BY seq LIMIT 1"
        ).fetchall()
    finally:
        conn.close()
    assert types == [
        "state_transition",
        "model_call_started",  # the call's mark, before the request left
        "llm_call",  # its response, which closes the mark
        "tool_call",
        "tool_started",  # run_tools records the start before the tool runs
        "attempt_lost",  # the resume took the killed process's lease: its attempt left no record
        "lease_taken_over",
        "tool_result",  # found by the probe: the file the killed process published
        "model_call_started",
        "llm_call",
        "tool_call",
        "checkpoint_proposed",
        "checkpoint_accepted",
        "tool_result",
        "state_transition",
    ]
    assert json.loads(first_result) == {
        "call_id": effect.stem,
        "content": {"content": "hello", "ok": True},
        "reconciled": True,
    }
    # The killed process streamed its call's text; the resumed one's is a restart, not a splice.
    streamed = trio.run(answer_chunks, db_path)
    first_of_2 = streamed.index((2, True))
    assert set(streamed[:first_of_2]) == {(1, False)} and set(streamed[first_of_2 + 1 :]) == {(2, False)}
    # Exactly one effect: the resumed tool found the published file instead of writing again.
    assert effect_files(out) == [effect] and effect.stat().st_ino == inode
    # No response was paid for twice: every stub call across both processes is one llm_call.
    calls = stub_calls(tmp_path)
    assert len(calls) == llm_calls == 2
    assert calls[0] == killed_call and calls[1]["pid"] != killed_call["pid"]
    # The resumed prompt was rebuilt from the log: it carried the killed process's tool call.
    assert calls[1]["prompt_call_ids"] == killed_call["reply_call_ids"] == [effect.stem]

    # Resuming again finds nothing in flight and calls no model.
    again = resume(tmp_path)
    assert again.returncode == 0, again.stderr
    assert "resuming 0 run(s)" in again.stdout
    assert len(stub_calls(tmp_path)) == 2 and effect_files(out) == [effect]


def test_a_spent_budget_stops_the_run_until_it_is_raised_and_the_count_survives(tmp_path: Path) -> None:
    env = offline_env(tmp_path, ZINCIR_TOKEN_BUDGET="1")
    first = subprocess.run(
        [sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
    )
    assert first.returncode == 0, first.stderr
    assert "stopped:" in first.stdout and "budget exceeded: tokens" in first.stdout
    assert len(stub_calls(tmp_path)) == 1  # the call that spent it, recorded; no second one
    conn = sqlite3.connect(tmp_path / "zincir.db")
    [(run_id, status)] = conn.execute("SELECT id, status FROM agent_runs").fetchall()
    (spent,) = conn.execute("SELECT input_tokens + output_tokens FROM budgets").fetchone()
    conn.close()
    assert status == "running" and spent > 1
    raised = subprocess.run(
        [str(REPO / ".venv" / "bin" / "zincir"), "budget", run_id, "--tokens", "100000",
         "--db", str(tmp_path / "zincir.db")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert raised.returncode == 0, raised.stderr
    again = resume(tmp_path)
    assert again.returncode == 0, again.stderr
    assert "status=completed" in again.stdout
    [line] = [x for x in again.stdout.splitlines() if x.startswith("spent:")]
    assert int(line.split()[1]) > spent  # counted on from the first process's spend, not from 0
