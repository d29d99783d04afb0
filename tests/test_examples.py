"""The examples a newcomer runs first, run as they would run them."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from .helpers import REPO


def run_example(name: str, cwd: Path, **env: str) -> str:
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / name)],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


def test_the_demo_completes_a_run_and_prints_its_log(tmp_path: Path) -> None:
    out = run_example("durable_agent.py", tmp_path)
    assert "status=completed" in out
    for event_type in ("llm_call", "tool_call", "checkpoint_proposed", "checkpoint_accepted"):
        assert event_type in out
    assert (tmp_path / "output" / "call_1.json").read_text() == '{"content": "hello", "ok": true}'
    conn = sqlite3.connect(tmp_path / "zincir.db")
    assert conn.execute("SELECT status FROM agent_runs").fetchall() == [("completed",)]
    conn.close()
    # Running it again starts a second run; resuming finds nothing left to do.
    assert "resuming 0 run(s)" in run_example("durable_agent.py", tmp_path, ZINCIR_RESUME="1")


def test_automatic_resume_recovers_a_killed_process(tmp_path: Path) -> None:
    out = run_example("automatic_resume.py", tmp_path)
    assert "child process died with signal 9" in out
    assert "claimed run" in out
    assert "hello from epoch 2" in out
    assert "'to': 'completed'" in out
