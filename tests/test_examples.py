"""The examples a newcomer runs first, run as they would run them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

import zincir

from .helpers import REPO
from .postgres_server import fresh_database


@pytest.fixture
def database(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """What the examples get as ZINCIR_DATABASE_PATH: their default file, or a PostgreSQL URL."""
    if backend == "sqlite":
        yield str(tmp_path / "zincir.db")
        return
    with fresh_database(request.getfixturevalue("postgres_admin_url")) as url:
        yield url


def status_of_runs(database: str) -> list[str]:
    async def read() -> list[str]:
        async with zincir.open_database(database) as db:
            return [r.status.value for r in await db.runs()]

    return trio.run(read)


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


def test_the_demo_completes_a_run_and_prints_its_log(tmp_path: Path, database: str) -> None:
    out = run_example("durable_agent.py", tmp_path, ZINCIR_DATABASE_PATH=database)
    assert "status=completed" in out
    for event_type in ("llm_call", "tool_call", "checkpoint_proposed", "checkpoint_accepted"):
        assert event_type in out
    assert (tmp_path / "output" / "call_1.json").read_text() == '{"content": "hello", "ok": true}'
    assert status_of_runs(database) == ["completed"]
    # Running it again starts a second run; resuming finds nothing left to do.
    resumed = run_example("durable_agent.py", tmp_path, ZINCIR_RESUME="1", ZINCIR_DATABASE_PATH=database)
    assert "resuming 0 run(s)" in resumed


def test_automatic_resume_recovers_a_killed_process(tmp_path: Path, database: str) -> None:
    out = run_example("automatic_resume.py", tmp_path, ZINCIR_DATABASE_PATH=database)
    assert "child process died with signal 9" in out
    assert "claimed run" in out
    assert "hello from epoch 2" in out
    assert "'to': 'completed'" in out
    assert status_of_runs(database) == ["completed"]


def test_fork_and_compare_fixes_a_wrong_answer_without_searching_again(tmp_path: Path, database: str) -> None:
    out = run_example("fork_and_compare.py", tmp_path, ZINCIR_DATABASE_PATH=database)
    assert "original" in out and ": The capital of Australia is Sydney." in out
    assert ": The capital of Australia is Canberra." in out
    # The fork inherited the search's result: the search ran once for both runs.
    assert "the search ran 1 time(s)" in out
    assert "common prefix: 3 events (seq 0..2)" in out
    assert "search-1 (inherited)" in out
    assert status_of_runs(database) == ["completed", "completed"]


def test_the_blue_green_example_drains_the_old_version_on_its_own_worker(
    tmp_path: Path, database: str
) -> None:
    out = run_example("blue_green.py", tmp_path, ZINCIR_DATABASE_PATH=database)
    assert out.splitlines() == [
        "old run {'handled_by': '2026-12-01'}",
        "new run {'handled_by': '2026-12-08'}",
        "2026-12-01 still draining: 1 live run(s)",
        "old run that waited {'handled_by': '2026-12-01'}",
        "2026-12-01 drained: 0 live run(s); stopping its worker",
    ]
    assert status_of_runs(database) == ["completed"] * 3
