"""examples/approval_agent.py as the README runs it: under `zincir worker`, approved from another
process, with the worker SIGKILLed while the run waits; on both backends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

import zincir

from .helpers import REPO
from .postgres_server import fresh_database

ZINCIR = str(REPO / ".venv" / "bin" / "zincir")


@pytest.fixture
def database(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    if backend == "sqlite":
        yield str(tmp_path / "zincir.db")
        return
    with fresh_database(request.getfixturevalue("postgres_admin_url")) as url:
        yield url


def worker(database: str, env: dict[str, str], *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [ZINCIR, "worker", "examples.approval_agent:handler", "--db", database, *options],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


# Killed while it waits in the process (it holds the lease: the next worker waits out its 2 s),
# or killed once the run is suspended (no lease: the next worker takes it at once, although the
# lease TTL is 30 s; polls are 30 s apart too, so only the decision's wake-up can explain it).
WAYS = {
    "waiting in the process": ("--suspend-after", "never", "--lease-ttl", "2", "--poll-interval", "0.2"),
    "suspended": ("--suspend-after", "0.5", "--lease-ttl", "30", "--poll-interval", "30"),
}


def suspended(event: zincir.Event) -> bool:
    return event.type is zincir.EventType.STATE_TRANSITION and event.payload.get("to") == "waiting"


async def events_of(database: str, run_id: str) -> list[zincir.Event]:
    async with zincir.open_database(database) as db:
        return await db.events(run_id)


async def until(database: str, run_id: str, seen: Callable[[zincir.Event], bool]) -> list[zincir.Event]:
    with trio.fail_after(30):
        while True:  # another process's progress: there is no event to await
            events = await events_of(database, run_id)
            if any(seen(e) for e in events):
                return events
            await trio.sleep(0.1)


def requested(event: zincir.Event) -> bool:
    return event.type is zincir.EventType.APPROVAL_REQUESTED


def completed(event: zincir.Event) -> bool:
    return event.type is zincir.EventType.STATE_TRANSITION and event.payload.get("to") == "completed"


@pytest.mark.parametrize("way", WAYS)
async def test_the_approval_agent_survives_its_worker_killed_while_waiting(
    database: str, tmp_path: Path, way: str
) -> None:
    env = {**os.environ, "ZINCIR_DATABASE_PATH": database, "ZINCIR_LEDGER": str(tmp_path / "refunds.jsonl")}
    started = await trio.run_process(
        [sys.executable, "examples/approval_agent.py", "start"], cwd=REPO, env=env, capture_stdout=True
    )
    run_id = started.stdout.decode().strip()
    first = worker(database, env, *WAYS[way])
    try:
        events = await until(database, run_id, suspended if way == "suspended" else requested)
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()
    [request] = [e.payload for e in events if e.type is zincir.EventType.APPROVAL_REQUESTED]
    approve = await trio.run_process(
        [ZINCIR, "approve", run_id, request["call_id"], "--by", "ada", "--hash", request["args_hash"],
         "--db", database],
        env=env, capture_stdout=True, capture_stderr=True, check=False,
    )  # fmt: skip
    assert approve.returncode == 0, approve.stderr
    assert b"send_refund" in approve.stdout and b"approved by ada" in approve.stdout
    second = worker(database, env, *WAYS[way])
    try:
        with trio.fail_after(15):
            events = await until(database, run_id, completed)
    finally:
        second.send_signal(signal.SIGTERM)
        _, err = second.communicate(timeout=30)
    assert second.returncode == 0, err
    kinds = [e.type for e in events]
    assert kinds.count(zincir.EventType.APPROVAL_REQUESTED) == 1
    assert kinds.count(zincir.EventType.APPROVAL_DECIDED) == 1
    paid = (tmp_path / "refunds.jsonl").read_text().splitlines()
    assert [json.loads(line)["amount"] for line in paid] == [120]
