"""The content store (docs/payloads.md): large JSON values stored once by SHA-256, referenced
from events, results, configs and chunks, freed by a sweep once no run refers to them, and
read back by every reader exactly as they were written."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner

import zincir
from zincir import _payloads
from zincir import _queries as q
from zincir._cli import main
from zincir._database import storage
from zincir._inspector import create_app
from zincir._store import SweptContent

from .conftest import ManualClock
from .helpers import rows, scalar, until

BIG = "line of a file that a tool read\n" * 320  # 10,240 characters: over the 4,096 default, and
# over the inspector's previews (8 KB), which read a prefix of it
MEGABYTE = "x" * 1_000_000


async def _ok(_: Any) -> zincir.Verification:
    return zincir.Verification(True, ["checked"])


async def _big_step() -> dict[str, str]:
    return {"rows": BIG}


async def _large_run(db: zincir.Database) -> str:
    """One run with a large value in every JSON value column there is."""
    async with zincir.open_run(db, role="reader", config={"prompt": BIG}) as run:
        await run.record_response(BIG, [zincir.ToolCall("c1", "read", {"path": BIG})], "tool_use")
        await run.start_tool("c1")
        await run.record_tool_result("c1", {"text": BIG})
        await run.step("load", _big_step)
        await zincir.send_signal(db, run.id, "go", {"note": BIG})
        await run.wait_for_signal("w", "go")
        async with run.stream("out") as out:
            await out.send({"chunk": BIG})
            await out.send("small")
        await run.record_response("", [zincir.ToolCall("s1", "submit_checkpoint", {})], "tool_use")
        state = {"completed": [BIG], "remaining": [], "artifacts": [], "failed_attempts": [], "evidence": []}
        await run.checkpoint("s1", state, _ok)
        await run.complete({"answer": BIG})
        return run.id


def _delete_run(db: zincir.Database, run_id: str) -> None:
    """Delete a run with SQL, its rows going with it (as prune will), foreign keys on."""
    if db.backend == "postgresql":
        rows(db, "DELETE FROM agent_runs WHERE id = ?", (run_id,))
        return
    conn = sqlite3.connect(db.path)
    conn.execute("PRAGMA foreign_keys = ON")
    with conn:
        conn.execute("DELETE FROM agent_runs WHERE id = ?", (run_id,))
    conn.close()


async def _sweep(db: zincir.Database) -> SweptContent:
    swept: SweptContent = await storage(db).write(storage(db).store.sweep_content, route=None)
    return swept


def _cli(target: str, *args: str) -> str:
    result = CliRunner().invoke(main, [*args, "--db", target], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


async def _inspector_json(target: str, run_id: str) -> Any:
    client = create_app(target, "127.0.0.1:8787").test_client()
    pages = []
    for url in (f"/api/runs/{run_id}", f"/api/runs/{run_id}/events"):
        response = await client.open(url, headers={"Host": "127.0.0.1:8787", "Accept": "application/json"})
        assert response.status_code == 200
        pages.append(json.loads(await response.get_data(as_text=True)))
    return pages


async def _everything_read(db: zincir.Database, run_id: str) -> Any:
    """What each reader gives for the run."""
    state = await db.state(run_id)
    chunks = [(c.offset, c.data) async for c in zincir.read_stream(db, run_id, "out")]
    return {
        "events": [(e.seq, e.type, e.payload) for e in await db.events(run_id)],
        "state": (state.run.config, state.run.result, state.checkpoint, [e.payload for e in state.events]),
        "chunks": chunks,
        "show": _cli(db.path, "show", run_id, "--json"),
        "export": _cli(db.path, "export", run_id),
        "inspector": await _inspector_json(db.path, run_id),
    }


# Row ids the two runs cannot share (signals and checkpoints are numbered database-wide).
_ROW_IDS = re.compile(r'(\\?"(?:signal_id|checkpoint_id|id)\\?": ?)\d+|(checkpoint:)\d+|(\bid=)\d+')


def _same_but_ids(a: Any, b: Any, a_id: str, b_id: str) -> None:
    text_a = _ROW_IDS.sub(r"\1\2\3N", json.dumps(a, default=repr, sort_keys=True))
    text_b = _ROW_IDS.sub(r"\1\2\3N", json.dumps(b, default=repr, sort_keys=True).replace(b_id, a_id))
    if text_a != text_b:  # where they part, readably
        at = next(i for i, (x, y) in enumerate(zip(text_a, text_b, strict=False)) if x != y)
        assert text_a[at - 300 : at + 200] == text_b[at - 300 : at + 200]
    assert text_a == text_b


async def test_every_reader_sees_the_same_values_with_the_store_on_and_off(db_target: str) -> None:
    clock = ManualClock()
    async with zincir.open_database(db_target, clock=clock, content_threshold=None) as db:
        inline = await _large_run(db)
    async with zincir.open_database(db_target, clock=clock) as db:
        parted = await _large_run(db)
        # Stored in parts: no column of the second run holds a large value inline.
        assert scalar(db, "SELECT max(length(payload)) FROM events WHERE run_id = ?", (parted,)) < 1000  # type: ignore[operator]
        assert scalar(db, "SELECT count(*) FROM payload_refs WHERE run_id = ?", (inline,)) == 0
        assert scalar(db, "SELECT count(*) FROM payload_refs WHERE run_id = ?", (parted,)) >= 8  # type: ignore[operator]
        read_inline = await _everything_read(db, inline)
        read_parted = await _everything_read(db, parted)
        _same_but_ids(read_inline, read_parted, inline, parted)
        # zincir diff compares values, not how they are stored: the logs are alike up to the
        # first signal received, whose signal id (numbered database-wide) differs.
        diff = json.loads(_cli(db.path, "diff", inline, parted, "--json"))
        assert read_inline["events"][5][1] == "signal_received"
        assert diff["common_prefix"] == 5
        assert read_inline["state"][0] == {"prompt": BIG}


async def test_a_megabyte_result_recorded_ten_times_is_stored_once(db_target: str) -> None:
    async with zincir.open_database(db_target) as db, zincir.open_run(db) as run:
        for i in range(10):
            await run.record_response("", [zincir.ToolCall(f"c{i}", "read", {"path": "big.txt"})], "tool_use")
            await run.record_tool_result(f"c{i}", MEGABYTE)
        stored = scalar(db, "SELECT sum(size) FROM payload_content")
        in_log = scalar(db, "SELECT sum(length(payload)) FROM events WHERE run_id = ?", (run.id,))
        assert 1_000_000 <= stored < 1_010_000  # type: ignore[operator]
        assert in_log < 10_000  # type: ignore[operator]
        results = [e.payload["content"] for e in await db.events(run.id) if e.type == "tool_result"]
        assert results == [MEGABYTE] * 10


@pytest.mark.sqlite_only
async def test_the_file_grows_by_the_result_about_once(db_path: Path) -> None:
    sizes = {}
    for threshold, name in ((None, "off"), (4096, "on")):
        path = db_path.with_name(f"{name}.db")
        async with (
            zincir.open_database(path, content_threshold=threshold) as db,
            zincir.open_run(db) as run,
        ):
            for i in range(10):
                await run.record_response("", [zincir.ToolCall(f"c{i}", "read", {})], "tool_use")
                await run.record_tool_result(f"c{i}", MEGABYTE)
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        sizes[name] = path.stat().st_size
    assert sizes["off"] > 10_000_000
    assert sizes["on"] < 1_500_000


async def test_a_sweep_frees_what_deleted_runs_referred_to(db_target: str) -> None:
    async with zincir.open_database(db_target) as db:
        kept = await _large_run(db)
        async with zincir.open_run(db, config={"prompt": BIG}) as run:  # shares the config with kept
            await run.record_response("", [zincir.ToolCall("c1", "read", {})], "tool_use")
            await run.record_tool_result("c1", {"only here": BIG})
            await run.complete()
            gone = run.id
        before = scalar(db, "SELECT count(*) FROM payload_content")
        _delete_run(db, gone)
        assert scalar(db, "SELECT count(*) FROM payload_refs WHERE run_id = ?", (gone,)) == 0
        swept = await _sweep(db)
        assert swept.parts == 1  # the part only the deleted run used; the shared config stays
        assert swept.chars == len(json.dumps({"only here": BIG}, separators=(",", ":")))
        assert scalar(db, "SELECT count(*) FROM payload_content") == before - 1  # type: ignore[operator]
        assert await _sweep(db) == SweptContent(0, 0)
        state = await db.state(kept)
        assert state.run.config == {"prompt": BIG} and state.run.result == {"answer": BIG}


async def test_a_fork_keeps_its_parts_after_its_source_is_deleted(db_target: str) -> None:
    async with zincir.open_database(db_target) as db:
        source = await _large_run(db)
        fork = await zincir.fork_run(db, source, at_seq=5)
        expected = [(e.seq, e.type, e.payload) for e in await db.events(source) if e.seq <= 5]
        rows(db, "DELETE FROM shared_children WHERE run_id = ?", (fork,))
        _delete_run(db, source)
        await _sweep(db)
        events = await db.events(fork)
        assert [(e.seq, e.type, e.payload) for e in events if e.seq <= 5] == expected
        assert (await db.state(fork)).run.config == {"prompt": BIG}
        async with zincir.open_run(db, fork) as run:  # the config as its new owner reads it
            assert run.config == {"prompt": BIG}


@pytest.mark.parametrize(
    "value",
    ["@", '@["x"]', '@[["00"]]', {"@": [["ab"]]}, ["@" + "a" * 64]],
    ids=["at", "literal", "reference", "object", "list"],
)
async def test_a_value_that_looks_like_a_reference_round_trips(db_target: str, value: Any) -> None:
    async with zincir.open_database(db_target, content_threshold=64) as db:
        async with zincir.open_run(db, config={"v": value}) as run:
            await run.record_response("", [zincir.ToolCall("c1", "echo", {})], "tool_use")
            await run.record_tool_result("c1", value)
            await run.record_response("", [zincir.ToolCall("c2", "echo", {})], "tool_use")
            await run.record_tool_result("c2", [value, BIG])
            run_id = run.id
        results = [e.payload["content"] for e in await db.events(run_id) if e.type == "tool_result"]
        assert results == [value, [value, BIG]]
        assert (await db.state(run_id)).run.config == {"v": value}


async def test_a_database_written_before_the_store_still_reads(db_target: str) -> None:
    async with zincir.open_database(db_target, content_threshold=None) as db:
        run_id = await _large_run(db)
    # As a database of schema version 14 was: no content tables, every value inline.
    for statement in (
        *(
            f"DROP TABLE {table}"
            for table in ("payload_refs", "payload_content", "run_keys", "encryption_keys")
        ),
        *(f"DROP INDEX {index}" for index in _SCHEMA_18_INDEXES),
        "DELETE FROM zincir_schema_migrations WHERE version >= 15",
    ):
        rows(db, statement)
    async with zincir.open_database(db_target) as db:  # migrated again
        assert scalar(db, "SELECT max(version) FROM zincir_schema_migrations") == 20
        events = await db.events(run_id)
        assert any(e.payload.get("to") == "completed" for e in events)
        assert (await db.state(run_id)).run.result == {"answer": BIG}


_SCHEMA_18_INDEXES = (
    "idx_signals_run",
    "idx_joins_child",
    "idx_waits_signal",
    "idx_messages_from",
    "idx_messages_to",
)


def test_parts_are_the_large_members_and_join_back() -> None:
    text = json.dumps(
        {"call_id": "c1", "content": BIG, "small": [1, 2]}, separators=(",", ":"), sort_keys=True
    )
    parts = _payloads.parts_of(text, 4096, whole=False)
    assert [isinstance(p, str) for p in parts] == [True, False, True]
    assert "".join(p if isinstance(p, str) else p.text for p in parts) == text
    assert len(_payloads.parts_of(text, 4096, whole=True)) == 1
    assert len(_payloads.parts_of("not json", 4, whole=False)) == 1


def test_the_threshold_is_checked() -> None:
    assert _payloads.check_threshold(0) is None and _payloads.check_threshold(None) is None
    for bad in (-1, 10, 4096.0, True):
        with pytest.raises(zincir.InvalidArgument):
            _payloads.check_threshold(bad)


async def test_a_small_step_writes_nothing_to_the_store(db_target: str) -> None:
    async with zincir.open_database(db_target) as db:
        async with zincir.open_run(db, config={"small": 1}) as run:

            async def small() -> int:
                return 1

            await run.step("s", small)
        assert scalar(db, "SELECT count(*) FROM payload_content") == 0
        assert scalar(db, "SELECT count(*) FROM payload_refs") == 0


async def test_a_child_spawned_again_with_a_large_config_is_stored_once(db_target: str) -> None:
    async with zincir.open_database(db_target) as db, zincir.open_run(db) as run:
        first = await run.spawn("helper", config={"brief": BIG})
        again = await run.spawn("helper", config={"brief": BIG})  # as a restart repeats it
        assert again == first
        assert scalar(db, "SELECT count(*) FROM payload_refs") == 1
        assert (await db.state(first)).run.config == {"brief": BIG}
        async with zincir.open_run(db, first) as child:
            assert child.config == {"brief": BIG}


async def test_a_reference_text_nobody_wrote_is_shown_as_it_is(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        run_id = run.id
    long_junk = "@" + "y" * 500
    for junk in ("@not json", "@[1, 2]", '@[["' + "0" * 64 + '"]]', long_junk):  # 3rd: never stored
        rows(db, "UPDATE events SET payload = ? WHERE run_id = ? AND seq = 0", (junk, run_id))
        conn = q.open_readonly(db.path)
        try:
            (event,) = q.list_events(conn, run_id, max_payload_chars=100).events
        finally:
            conn.close()
        assert event.payload == junk[:100]
        assert event.truncated == (junk is long_junk)


async def test_a_large_write_waits_out_a_sweep_on_postgresql(pg_url: str) -> None:
    """A sweep holds the content store's guard exclusive (here: held by hand): a write that
    stores a part is retried until the sweep ends, so it never refers to a part the sweep
    deleted; then it goes through."""
    import psycopg

    from zincir._postgres._tx import POSTGRES

    async with zincir.open_database(pg_url) as db, zincir.open_run(db) as run:
        await run.record_response("", [zincir.ToolCall("c1", "read", {})], "tool_use")
        sweeping = psycopg.connect(pg_url)
        sweeping.execute(POSTGRES.sweep_guard)  # a transaction holds it until commit
        done = trio.Event()

        async def write() -> None:
            await run.record_tool_result("c1", {"text": BIG})
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            await until(lambda: _waiting_for_guard(pg_url))
            assert not done.is_set()
            assert scalar(db, "SELECT count(*) FROM payload_refs") == 0
            sweeping.commit()
            sweeping.close()
        assert [e.payload["content"] for e in await db.events(run.id) if e.type == "tool_result"] == [
            {"text": BIG}
        ]


async def _waiting_for_guard(url: str) -> bool:
    return bool(_scalar_url(url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"))


def _scalar_url(url: str, sql: str) -> object:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]
