"""What waiting runs await, and until when, as ``zincir runs``, ``zincir show`` and the inspector
show it (docs/signals.md), on both backends."""

from __future__ import annotations

import functools
import json
from typing import Any

import trio
from click.testing import CliRunner, Result

import zincir
from zincir._cli import main
from zincir._inspector import create_app

from .helpers import scalar, until
from .test_suspension import new_runs, working

HOST = "127.0.0.1:8787"


def cli(*args: str) -> Result:
    env = {"ZINCIR_DATABASE_PATH": None, "ZINCIR_UI_ADDRESS": None}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


async def page(db: zincir.Database, url: str) -> str:
    app = create_app(db.path, HOST)
    response = await app.test_client().open(url, method="GET", headers={"Host": HOST})
    assert response.status_code == 200
    return await response.get_data(as_text=True)


async def suspended_and_blocked(db: zincir.Database) -> tuple[str, str, int]:
    """A run suspended on signal "go" (wait "w", 1 h deadline) and one completed run."""
    suspended, done = await new_runs(db, 2)
    async with zincir.open_run(db, done) as run:
        await run.complete()

    async def handler(run: zincir.Run) -> None:
        await run.wait_for_signal("w", "go", timeout=3600)

    async with working(db, handler, suspend_after=0):
        await until(lambda: _waiting(db, suspended))
    deadline = scalar(db, "SELECT deadline FROM waits WHERE run_id = ?", (suspended,))
    assert isinstance(deadline, int)
    return suspended, done, deadline


async def _waiting(db: zincir.Database, run_id: str) -> bool:
    return (await db.state(run_id)).run.status is zincir.RunStatus.WAITING


async def test_runs_and_show_say_what_a_suspended_run_awaits_and_until_when(db: zincir.Database) -> None:
    suspended, done, deadline = await suspended_and_blocked(db)

    listed = cli("runs", "--db", db.path, "--status", "waiting")
    assert listed.exit_code == 0, listed.output
    [header, row, *_] = listed.stdout.splitlines()
    assert header.split()[-1] == "AWAITS"
    assert row.split()[:2] == [suspended, "waiting"]
    assert "signal 'go' (wait 'w') until" in row
    assert done not in listed.stdout
    assert "waiting 1" in listed.stdout

    shown = cli("show", "--db", db.path, suspended)
    assert shown.exit_code == 0, shown.output
    assert "awaiting (1)" in shown.stdout
    assert "suspended: no process holds it; a worker resumes it at" in shown.stdout
    assert "next attempt" in shown.stdout
    data = json.loads(cli("show", "--db", db.path, suspended, "--json").stdout)
    assert data["awaiting"] == [
        {
            "kind": "signal",
            "name": "w",
            "target": "go",
            "since": data["awaiting"][0]["since"],
            "until": deadline,
            "wakes": True,
        }
    ]
    assert data["run"]["status"] == "waiting"
    assert json.loads(cli("show", "--db", db.path, done, "--json").stdout)["awaiting"] == []


async def test_an_in_process_wait_is_shown_while_the_owner_blocks(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await run.record_response("", [zincir.ToolCall("c1", "send_refund", {"eur": 5})], "tool_use")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run.wait_for_approval, "c1")
            await until(lambda: _requested(db, run.id))
            data = json.loads(
                (await trio.to_thread.run_sync(cli, "show", "--db", db.path, run.id, "--json")).stdout
            )
            assert [(a["kind"], a["name"], a["target"], a["until"]) for a in data["awaiting"]] == [
                ("approval", "c1", "send_refund", None)
            ]
            assert data["run"]["status"] == "running"
            nursery.cancel_scope.cancel()


async def _requested(db: zincir.Database, run_id: str) -> bool:
    return scalar(db, "SELECT count(*) FROM approvals WHERE run_id = ?", (run_id,)) == 1


async def test_the_inspector_shows_a_waiting_tab_and_what_the_run_awaits(db: zincir.Database) -> None:
    suspended, done, _ = await suspended_and_blocked(db)

    runs = await page(db, "/?status=waiting")
    assert 'class="tab s-waiting"' in runs
    assert suspended in runs and done not in runs
    assert "signal &#39;go&#39; (wait &#39;w&#39;)" in runs  # Jinja2 escapes ' as &#39;

    detail = await page(db, f"/runs/{suspended}")
    assert 'id="awaiting"' in detail
    assert "Suspended: no process holds this run." in detail
    assert "<code>w</code>" in detail
    assert "when what it awaits arrives" not in detail  # it has a deadline: that is shown instead
    api = json.loads(await page(db, f"/api/runs/{suspended}"))
    assert [(a["kind"], a["name"], a["target"]) for a in api["awaiting"]] == [("signal", "w", "go")]


async def test_show_and_the_inspector_list_every_wait_a_suspended_run_wakes_on(db: zincir.Database) -> None:
    [run_id] = await new_runs(db, 1)

    async def three_waits(run: zincir.Run) -> None:  # whichever comes first (docs/waits.md)
        if not await run.pending_tools():
            await run.record_response("deploy?", [zincir.ToolCall("c1", "deploy", {})], "tool_use")
        async with trio.open_nursery() as race:
            for wait in (
                functools.partial(run.wait_for_approval, "c1"),
                functools.partial(run.wait_for_signal, "abort", "abort"),
                functools.partial(run.sleep, "cooldown", 3600),
            ):
                race.start_soon(_then_cancel, wait, race.cancel_scope)
        await run.complete()

    async with working(db, three_waits, suspend_after=0.05):
        await until(lambda: _waiting(db, run_id))
    wake_at = scalar(db, "SELECT wake_at FROM timers WHERE run_id = ?", (run_id,))
    data = json.loads(cli("show", "--db", db.path, run_id, "--json").stdout)
    assert sorted((a["kind"], a["name"], a["target"], a["until"], a["wakes"]) for a in data["awaiting"]) == [
        ("approval", "c1", "deploy", None, True),
        ("signal", "abort", "abort", None, True),
        ("sleep", "cooldown", "", wake_at, True),
    ]
    assert data["run"]["next_attempt_at"] == wake_at  # the earliest deadline of the three
    shown = cli("show", "--db", db.path, run_id).stdout
    assert "awaiting (3)" in shown and "WAKES IT" in shown
    detail = await page(db, f"/runs/{run_id}")
    assert detail.count('class="flag wakes-flag"') == 3


async def _then_cancel(wait: Any, scope: trio.CancelScope) -> None:
    await wait()
    scope.cancel()
