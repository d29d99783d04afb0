"""examples/fan_out.py as the README runs it: five researchers under `zincir worker
--max-concurrency 3`, the worker SIGKILLed mid-way and started again; on both backends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import trio

import zincir

from .helpers import REPO
from .test_approval_example import ZINCIR, database  # noqa: F401 - the fixture

OPTIONS = ("--max-concurrency", "3", "--lease-ttl", "2", "--poll-interval", "0.2", "--suspend-after", "1")


def worker(target: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [ZINCIR, "worker", "examples.fan_out:handler", "--db", target, *OPTIONS],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


async def family(target: str, lead: str) -> list[zincir.RunRecord]:
    async with zincir.open_database(target) as db:
        return [r for r in await db.runs(limit=1000) if r.parent_run_id == lead]


async def until_children(target: str, lead: str, done: int) -> list[zincir.RunRecord]:
    with trio.fail_after(60):
        while True:  # another process's progress: there is no event to await
            children = await family(target, lead)
            if sum(c.status is zincir.RunStatus.COMPLETED for c in children) >= done:
                return children
            await trio.sleep(0.1)


async def test_the_fan_out_survives_its_worker_killed_mid_way(database: str, tmp_path: Path) -> None:  # noqa: F811
    notes = tmp_path / "research.jsonl"
    env = {**os.environ, "ZINCIR_DATABASE_PATH": database, "ZINCIR_NOTES": str(notes),
           "ZINCIR_RESEARCH_SECONDS": "0.5"}  # fmt: skip
    started = await trio.run_process(
        [sys.executable, "examples/fan_out.py", "start"], cwd=REPO, env=env, capture_stdout=True
    )
    lead = started.stdout.decode().strip()
    first = worker(database, env)
    try:
        await until_children(database, lead, done=1)
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()
    before = {c.id for c in await family(database, lead)}
    assert sum(c.status is zincir.RunStatus.COMPLETED for c in await family(database, lead)) < 5
    second = worker(database, env)
    try:
        with trio.fail_after(60):
            while True:
                async with zincir.open_database(database) as db:
                    if (await db.state(lead)).run.status is zincir.RunStatus.COMPLETED:
                        result = (await db.state(lead)).run.result
                        break
                await trio.sleep(0.1)
    finally:
        second.send_signal(signal.SIGTERM)
        _, err = second.communicate(timeout=30)
    assert second.returncode == 0, err
    children = await family(database, lead)
    assert len(children) == 5 and before <= {c.id for c in children}  # the same five, no sixth
    assert all(c.status is zincir.RunStatus.COMPLETED for c in children)
    assert isinstance(result, dict) and len(result["notes"]) == 5
    written = [json.loads(line)["run"] for line in notes.read_text().splitlines()]
    assert set(written) == {c.id for c in children}  # each researcher's effect, at least once
