"""``zincir fork`` and ``zincir diff``, and a database from before forks (both backends)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import trio
from click.testing import CliRunner, Result

import zincir
from zincir._cli import main

from .helpers import dump, insert_started_run, rows
from .test_forks import research_run, trail


async def cli(db: zincir.Database | str, *args: str) -> Result:
    target = db if isinstance(db, str) else db.path
    return await trio.to_thread.run_sync(lambda: CliRunner().invoke(main, [*args, "--db", target]))


async def test_zincir_fork_prints_the_new_run_and_records_who_forked(db: zincir.Database) -> None:
    source, seqs = await research_run(db)
    done = await cli(db, "fork", source[:8], "--at", str(seqs["second_end"]), "--config", '{"prompt": "v2"}',
                     "--by", "ada", "--reason", "fix the prompt")  # fmt: skip
    assert done.exit_code == 0, done.output
    fork = done.stdout.strip()
    record = (await db.state(fork)).run
    assert (record.forked_from, record.fork_seq, record.config) == (
        source,
        seqs["second_end"],
        {"prompt": "v2"},
    )
    assert trail(db, fork)[0][:2] == ("fork", "ada")
    at_checkpoint = await cli(db, "fork", source, "--at-checkpoint", "1")
    assert at_checkpoint.exit_code == 0, at_checkpoint.output
    assert (await db.state(at_checkpoint.stdout.strip())).run.fork_seq == seqs["checkpoint"]
    # Shown with the run: where it came from, and the source's forks.
    shown = json.loads((await cli(db, "show", fork, "--json")).stdout)["run"]
    assert (shown["forked_from"], shown["fork_seq"]) == (source, seqs["second_end"])
    source_shown = await cli(db, "show", source)
    assert fork in source_shown.stdout and "forks (2)" in source_shown.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--at", "9999"], "past the end of its log"),
        (["--at-checkpoint", "5"], "no accepted checkpoint of round 5"),
        (["--at", "1", "--at-checkpoint", "1"], "give --at SEQ or --at-checkpoint ROUND"),
        ([], "give --at SEQ or --at-checkpoint ROUND"),
        (["--at", "1", "--config", "{nope"], "not JSON"),
    ],
)
async def test_zincir_fork_refuses_a_bad_fork_point_and_writes_nothing(
    db: zincir.Database, args: list[str], message: str
) -> None:
    source, _ = await research_run(db)
    before = dump(db)
    refused = await cli(db, "fork", source, *args)
    assert refused.exit_code != 0 and message in refused.output
    assert dump(db) == before


async def test_zincir_diff_shows_where_a_fork_parts_from_its_source(db: zincir.Database) -> None:
    source, seqs = await research_run(db)
    at = seqs["second_end"]
    fork = await zincir.fork_run(db, source, at, config={"prompt": "v2"})
    async with zincir.open_run(db, fork) as run:
        for pending in await run.pending_tools():
            await run.record_tool_result(pending.call.id, "redone")
        await run.record_response("v2 says", [], "end_turn", usage={"input_tokens": 7, "output_tokens": 3})
        await run.complete()

    text = await cli(db, "diff", source, fork)
    assert text.exit_code == 0, text.output
    assert f"common prefix: {at + 1} events (seq 0..{at})" in text.stdout
    assert f"first divergence at seq {at + 1}:" in text.stdout
    assert "pay (inherited)" in text.stdout and "v2 says" in text.stdout
    assert "B: 1 model calls, 0 tool calls, 7 input tokens, 3 output tokens" in text.stdout

    data: dict[str, Any] = json.loads((await cli(db, "diff", source, fork, "--json")).stdout)
    assert data["common_prefix"] == data["first_divergence"] == at + 1
    assert data["a"]["first"]["type"] == "tool_result" and data["b"]["first"]["type"] == "forked"
    assert (data["b"]["forked_from"], data["b"]["fork_seq"]) == (source, at)
    assert [i["kind"] for i in data["b"]["items"]][:2] == ["forked", "result"]
    assert data["b"]["spend"]["input_tokens"] == 7 and data["a"]["spend"]["model_calls"] == 1

    # A run against itself: nothing parts. A fork of a fork is compared with its first source
    # from the lineage (what the copy shares is not read again, but counted).
    same = json.loads((await cli(db, "diff", source, source, "--json")).stdout)
    assert same["first_divergence"] is None and same["common_prefix"] == len(await db.events(source))
    second = await zincir.fork_run(db, fork, at + 3)
    chained = json.loads((await cli(db, "diff", source, second, "--json")).stdout)
    assert chained["common_prefix"] == at + 1


async def test_zincir_diff_of_two_unrelated_runs_parts_at_their_first_difference(db: zincir.Database) -> None:
    ids = []
    for content in ("same", "same"):
        async with zincir.open_run(db) as run:
            await run.record_response(content, [], "end_turn")
            await run.record_response(f"{content} {len(ids)}", [], "end_turn")
            ids.append(run.id)
    data = json.loads((await cli(db, "diff", *ids, "--json")).stdout)
    assert data["common_prefix"] == 2  # the first transition and the first response
    assert data["a"]["items"][0]["text"] == "same 0" and data["b"]["items"][0]["text"] == "same 1"
    unknown = await cli(db, "diff", ids[0], "00000000-0000-4000-8000-000000000000")
    assert unknown.exit_code != 0 and "not found" in unknown.output


async def test_a_version_10_database_gains_forks_and_keeps_its_runs(
    db_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zincir import _schema

    every = _schema.load
    with monkeypatch.context() as patch:
        patch.setattr(_schema, "load", lambda backend: every(backend)[:10])
        async with zincir.open_database(db_target) as old:
            source = str(uuid.uuid4())
            insert_started_run(old, source)  # with SQL: this code writes columns schema 10 lacks
            before = rows(old, "SELECT id, status, last_seq FROM agent_runs")
        shown = await cli(db_target, "show", source, "--json")  # read by this code before it migrates
        assert shown.exit_code == 0 and json.loads(shown.stdout)["run"]["forked_from"] is None
    async with zincir.open_database(db_target) as new:
        assert rows(new, "SELECT id, status, last_seq FROM agent_runs") == before
        fork = await zincir.fork_run(new, source, 0)
        [record] = [r for r in await new.runs() if r.id == fork]
        assert (record.forked_from, record.fork_seq) == (source, 0)
        async with zincir.open_run(new, fork) as run:  # the fork of an old run runs
            assert [e.type for e in await new.events(fork)][:2] == ["state_transition", "forked"]
            await run.complete()
