"""What a newcomer hit in the inspector and the CLI (issue 19, "Fixes"), on both backends."""

from __future__ import annotations

import itertools
import json
import types
import uuid

import pytest
import trio
from click.testing import CliRunner, Result

import zincir
from zincir import _ownership
from zincir._cli import main

from .agent_scenarios import conversation_run, long_run
from .test_inspector_agent_view import page


def cli(*args: str) -> Result:
    env = {"ZINCIR_DATABASE_PATH": None, "ZINCIR_UI_ADDRESS": None}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


async def test_a_type_filtered_first_page_has_no_previous(db: zincir.Database) -> None:
    run_id = await long_run(db, responses=100)
    api = json.loads(await page(db, f"/api/runs/{run_id}/events?type=tool_result&limit=10"))
    assert [e["seq"] for e in api["events"]][:2] == [3, 6]
    assert api["has_before"] is False and api["prev_before"] is None  # seqs 0-2 are other types
    first = await page(db, f"/runs/{run_id}?type=tool_result&limit=10")
    assert "← Previous" not in first and "⇤ First" not in first and "Next →" in first
    # Following Next, then Previous, comes back to a full page, never an empty one.
    second = json.loads(
        await page(db, f"/api/runs/{run_id}/events?type=tool_result&limit=10&after={api['next_after']}")
    )
    back = json.loads(
        await page(db, f"/api/runs/{run_id}/events?type=tool_result&limit=10&before={second['prev_before']}")
    )
    assert [e["seq"] for e in back["events"]] == [e["seq"] for e in api["events"]]
    # Symmetrically, the last filtered page has no Next (a complete run ends with other types).
    last = json.loads(await page(db, f"/api/runs/{run_id}/events?type=tool_call&limit=10&before=end"))
    assert last["has_after"] is False and last["next_after"] is None


async def test_one_checkpoint_has_its_own_page_naming_round_and_id(db: zincir.Database) -> None:
    run_id = await conversation_run(db)
    text = await page(db, f"/runs/{run_id}/checkpoints/1")
    assert "<h1>Checkpoint round 1</h1>" in text and "checkpoint id 1" in text
    assert "Verdict: passed" in text and "<li>pytest: 12 passed</li>" in text
    assert "original goal" in text and f'href="/runs/{run_id}/checkpoints/2">next round →' in text
    assert f'href="/api/runs/{run_id}/checkpoints/1"' in text
    candidate = await page(db, f"/runs/{run_id}/checkpoints/2")
    assert "Undecided" in candidate and f'<a href="/runs/{run_id}/checkpoints/1">round 1</a>' in candidate
    assert "latest round" in candidate
    assert "no checkpoint round 9" in await page(db, f"/runs/{run_id}/checkpoints/9", 404)
    await page(db, f"/runs/{run_id}/checkpoints/x%20y", 400)
    # The run page's table and the conversation's cards link to it, with both names.
    run_page = await page(db, f"/runs/{run_id}")
    assert f'<a href="/runs/{run_id}/checkpoints/1">round 1</a>' in run_page
    assert '<th class="num">Id</th>' in run_page


async def test_an_ended_run_has_no_next_attempt(db: zincir.Database) -> None:
    run_id = await long_run(db, responses=1)
    text = await page(db, f"/runs/{run_id}")
    assert "none: the run has ended" in text
    shown = await trio.to_thread.run_sync(cli, "show", "--db", db.path, run_id)
    assert "next attempt none (the run has ended)" in shown.stdout


async def test_the_cli_takes_an_unambiguous_run_id_prefix(db: zincir.Database) -> None:
    run_id = await long_run(db, responses=1)
    for command in ("show", "checkpoints", "events", "export", "tree"):
        result = await trio.to_thread.run_sync(cli, command, "--db", db.path, run_id[:8])
        assert result.exit_code == 0, (command, result.output)
        assert result.stderr == ""
    shown = await trio.to_thread.run_sync(cli, "show", "--db", db.path, run_id[:6].upper())
    assert run_id in shown.stdout
    unknown = await trio.to_thread.run_sync(cli, "show", "--db", db.path, "ffff0000")
    assert unknown.exit_code == 1 and "no run id starts with 'ffff0000'" in unknown.stderr
    short = await trio.to_thread.run_sync(cli, "show", "--db", db.path, "abc")
    assert short.exit_code == 1 and "its first 4 characters or more" in short.stderr


async def test_an_ambiguous_prefix_is_a_clear_error(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = itertools.count(1)
    monkeypatch.setattr(
        _ownership, "uuid", types.SimpleNamespace(uuid4=lambda: uuid.UUID(int=next(counter), version=4))
    )
    ids = []
    for _ in range(3):
        async with zincir.open_run(db) as run:
            ids.append(run.id)
    monkeypatch.undo()
    result = await trio.to_thread.run_sync(cli, "show", "--db", db.path, "00000000")
    assert result.exit_code == 1
    assert f"run id prefix '00000000' is ambiguous: {ids[0]}, {ids[1]}, … start with it" in result.stderr
    whole = await trio.to_thread.run_sync(cli, "show", "--db", db.path, ids[2].upper())  # a whole id
    assert whole.exit_code == 0 and ids[2] in whole.stdout
