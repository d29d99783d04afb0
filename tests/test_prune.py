"""zincir.prune and ``zincir prune`` (issue 37, docs/retention.md): ended runs go with all their
rows, in batches, families together, never a live run or what a live run refers to."""

from __future__ import annotations

import datetime
import signal
import sqlite3
from pathlib import Path
from typing import Any

import click
import pytest
import trio
from click.testing import CliRunner

import zincir
from bench.prune.seed import seed_runs
from zincir import _prune as _prune_module
from zincir._cli import main
from zincir._database import storage
from zincir._store import _prune as _store_prune
from zincir._store._prune import RUN_TABLES

from .conftest import ManualClock
from .helpers import insert_started_run, rows, scalar, start_python

DAY = 86_400.0
NOT_A_RUNS_TABLE = {"zincir_schema_migrations", "payload_content", "encryption_keys"}


def _at(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


def _tables(db: zincir.Database) -> set[str]:
    if db.backend == "postgresql":
        found = rows(db, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    else:
        found = rows(db, "SELECT name FROM sqlite_master WHERE type = 'table'")
    return {row[0] for row in found}


def _text_columns(db: zincir.Database) -> list[tuple[str, str]]:
    if db.backend == "postgresql":
        found = rows(
            db,
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND data_type = 'text'",
        )
        return [(row[0], row[1]) for row in found]
    return [
        (table, row[1])
        for table in sorted(_tables(db))
        for row in rows(db, f"PRAGMA table_info({table})")
        if row[2].upper() == "TEXT"
    ]


def _mentions(db: zincir.Database, run_id: str) -> dict[str, int]:
    """Rows of any table with ``run_id`` in any text column: what a run leaves behind (one
    statement over every column of every table)."""
    columns = _text_columns(db)
    counts = " UNION ALL ".join(
        f"SELECT '{table}.{column}', count(*) FROM {table} WHERE {column} = ?" for table, column in columns
    )
    return {name: int(count) for name, count in rows(db, counts, (run_id,) * len(columns)) if count}


_CHECKPOINT_LISTS = ("completed", "remaining", "artifacts", "failed_attempts", "evidence")


async def _accept(candidate: zincir.Checkpoint) -> zincir.Verification:
    return zincir.Verification(True, ["ok"])


async def _rich_run(db: zincir.Database) -> str:
    """A completed run with a row in most tables: events, tool intents, a checkpoint, steps, a
    timer, a signal and its wait, the audit trail, a budget and its tool counts, a stream."""
    async with zincir.open_run(db, budget=zincir.Budget(tokens=10_000, max_identical_tool_calls=5)) as run:
        await zincir.send_signal(db, run.id, "go", {"n": 1}, key="k1", by="test")
        assert await run.wait_for_signal("w", "go") == {"n": 1}
        call = zincir.ToolCall("c1", "search", {"q": 1})
        await run.record_response("", [call, zincir.ToolCall("cp", zincir.SUBMIT_CHECKPOINT, {})], "tool_use")
        await run.record_tool_result("c1", {"hits": 1})
        await run.checkpoint("cp", {k: [] for k in _CHECKPOINT_LISTS}, _accept)
        await run.step("s", _value, 1)
        await run.sleep("nap", 0)
        async with run.stream("out") as out:
            await out.send("hello")
        await run.complete({"ok": True})
    return run.id


async def _value(n: int) -> int:
    return n


async def _completed(db: zincir.Database, **kwargs: Any) -> str:
    async with zincir.open_run(db, **kwargs) as run:
        await run.complete()
    return run.id


def _later(clock: ManualClock, seconds: float = 1) -> datetime.datetime:
    return _at(clock() + round(seconds * 1000))


async def test_a_sqlite_batch_holds_2_runs_by_default_a_postgresql_batch_10(
    clocked_db: zincir.Database, clock: ManualClock
) -> None:
    # Small batches: a live writer waits for a batch's deletes on SQLite, and flushes the WAL
    # they wrote with its COMMIT on PostgreSQL (docs/retention.md).
    for _ in range(11):
        await _completed(clocked_db)
    clock.advance(DAY)
    report = await zincir.prune(clocked_db, finished_before=_later(clock))
    assert (report.runs, report.batches) == (11, 6 if clocked_db.backend == "sqlite" else 2)


async def test_a_prune_pauses_after_each_batch_as_long_as_it_took(
    clocked_db: zincir.Database, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The live writers keep the database (a lock, a disk, a server's cores and WAL) for at
    # least half of the time a prune runs.
    pauses: list[float] = []

    class _RecordedSleeps:
        @staticmethod
        async def sleep(seconds: float) -> None:
            pauses.append(seconds)
            await trio.lowlevel.checkpoint()

    for _ in range(3):
        await _completed(clocked_db)
    clock.advance(DAY)
    took: list[float] = []
    monkeypatch.setattr(_prune_module, "trio", _RecordedSleeps)
    report = await zincir.prune(
        clocked_db, finished_before=_later(clock), batch_size=1, progress=lambda r: took.append(r.seconds)
    )
    assert report.batches == 3 and len(pauses) == 3
    extra = _prune_module._EXTRA_PAUSE_S[clocked_db.backend]
    # Each pause is the batch's own time (a part of the time the prune had taken by then) plus
    # the backend's extra, never less than the extra alone.
    assert all(extra < pause <= elapsed + extra for pause, elapsed in zip(pauses, took, strict=True))


async def test_bulk_writes_commit_and_refuse_a_closed_database(db_target: str) -> None:
    def rename(tx: Any, run_id: str) -> int:
        return int(tx.count("UPDATE agent_runs SET role = ? WHERE id = ?", ("renamed", run_id)))

    async with zincir.open_database(db_target) as db:
        async with zincir.open_run(db) as run:
            await run.complete()
        async with storage(db).bulk_writes() as write:
            assert await write(rename, run.id) == 1
        assert (await db.state(run.id)).run.role == "renamed"
    with pytest.raises(zincir.DatabaseClosed):
        async with storage(db).bulk_writes() as write:
            await write(rename, run.id)


async def test_a_pruned_run_leaves_no_row_anywhere_and_live_runs_stay(
    clocked_db: zincir.Database, clock: ManualClock
) -> None:
    db = clocked_db
    rich = await _rich_run(db)
    before = _mentions(db, rich)
    assert {
        "events.run_id",
        "steps.run_id",
        "signals.run_id",
        "stream_chunks.run_id",
        "budgets.run_id",
    } <= set(before)
    async with zincir.open_run(db) as live:
        await live.step("s", _value, 2)
    clock.advance(DAY)
    report = await zincir.prune(db, finished_before=_later(clock))
    assert (report.runs, report.batches, report.kept_for_family, report.dry_run) == (1, 1, 0, False)
    assert report.rows["agent_runs"] == 1 and report.rows["events"] == before["events.run_id"]
    assert report.total_rows == sum(before.values()) - before.get("tool_intents.effect_run_id", 0)
    assert _mentions(db, rich) == {}
    assert (await db.state(live.id)).run.status is zincir.RunStatus.RUNNING
    with pytest.raises(zincir.RunNotFound):
        await db.state(rich)


@pytest.mark.parametrize("encrypted", [False, True], ids=["clear", "encrypted"])
async def test_a_prune_frees_the_large_values_and_keys_only_its_runs_had(
    db_target: str, clock: ManualClock, encrypted: bool
) -> None:
    big = "x" * 10_000  # above the content store's threshold: stored by reference
    key = bytes(range(32)) if encrypted else None
    async with zincir.open_database(db_target, clock=clock, encryption_key=key) as db:
        async with zincir.open_run(db, config={"prompt": big}) as old:
            await old.complete({"answer": big + "?"})
        clock.advance(DAY)
        cutoff = _later(clock)
        clock.advance(DAY)
        async with zincir.open_run(db, config={"prompt": big}) as new:
            await new.complete()
        # In clear the two configs share a part; encrypted, each run's parts are its own.
        parts = 3 if encrypted else 2
        assert scalar(db, "SELECT count(*) FROM payload_content") == parts
        report = await zincir.prune(db, finished_before=cutoff)
        assert (report.runs, report.rows["payload_refs"]) == (1, 2)
        assert report.rows["payload_content"] == parts - 1  # all but what the new run refers to
        assert report.rows["run_keys"] == int(encrypted)
        assert (await db.state(new.id)).run.config == {"prompt": big}
        report = await zincir.prune(db, finished_before=_later(clock))
        assert (report.runs, report.rows["payload_content"]) == (1, 1)
        assert scalar(db, "SELECT count(*) FROM payload_content") == 0
        assert scalar(db, "SELECT count(*) FROM run_keys") == 0


async def test_a_prune_sweeps_parts_a_crashed_prune_left_even_with_no_run_to_delete(
    db: zincir.Database,
) -> None:
    # What a prune killed between its last batch and its sweep leaves: a part no run refers to.
    rows(db, "INSERT INTO payload_content (digest, body, size, created_at) VALUES ('ab', '\"x\"', 3, 0)")
    report = await zincir.prune(db, finished_before=datetime.datetime.now(datetime.UTC))
    assert (report.runs, report.rows.get("payload_content")) == (0, 1)
    assert scalar(db, "SELECT count(*) FROM payload_content") == 0


async def test_only_runs_ended_before_the_cutoff_go_and_keep_latest_keeps_the_last(
    clocked_db: zincir.Database, clock: ManualClock
) -> None:
    db = clocked_db
    ended = []
    for _ in range(5):
        ended.append(await _completed(db))
        clock.advance(60)
    cutoff = _at(clock())
    young = await _completed(db)
    assert (await zincir.prune(db, finished_before=cutoff, dry_run=True)).runs == 5
    # The two that ended last are the young one and the last of the five.
    dry = await zincir.prune(db, finished_before=cutoff, keep_latest=2, dry_run=True)
    assert (dry.runs, dry.dry_run) == (4, True)
    assert len(await db.runs()) == 6  # a dry run deletes nothing
    report = await zincir.prune(db, finished_before=cutoff, keep_latest=2)
    assert report.runs == 4 and report.rows == dry.rows
    assert {r.id for r in await db.runs()} == {ended[4], young}
    # Fewer ended than keep_latest: every one is kept, however old.
    assert (await zincir.prune(db, finished_before=_later(clock), keep_latest=3)).runs == 0
    assert len(await db.runs()) == 2


async def test_statuses_choose_which_ended_runs_go(clocked_db: zincir.Database, clock: ManualClock) -> None:
    db = clocked_db
    done = await _completed(db)
    async with zincir.open_run(db) as run:
        await run.fail("broken")
    clock.advance(60)
    report = await zincir.prune(db, finished_before=_later(clock), statuses=["failed"])
    assert report.runs == 1
    assert [r.id for r in await db.runs()] == [done]


async def test_a_status_with_no_run_left_is_not_looked_for_again(
    clocked_db: zincir.Database, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before PostgreSQL 18 an index scan runs past a row comparison's end: a status with
    # nothing left would read every later run of it in each batch.
    async with zincir.open_run(clocked_db) as run:
        await run.fail("broken")
    clock.advance(1)
    for _ in range(5):
        await _completed(clocked_db)
    clock.advance(60)
    looked_for: list[tuple[str, ...]] = []
    candidates = _store_prune._candidates

    def traced(tx: Any, spec: Any, after: Any, exhausted: frozenset[str] = frozenset()) -> Any:
        looked_for.append(tuple(status for status in spec.statuses if status not in exhausted))
        return candidates(tx, spec, after, exhausted)

    monkeypatch.setattr(_store_prune, "_candidates", traced)
    report = await zincir.prune(
        clocked_db, finished_before=_later(clock), statuses=["completed", "failed"], batch_size=2
    )
    assert report.runs == 6
    # The first batch takes the one failed run (it ended first) and one completed run: no
    # batch after it looks for a failed one again.
    assert looked_for == [("completed", "failed"), ("completed",), ("completed",), ("completed",)]


async def test_a_family_goes_together_and_only_once_every_member_ended(
    clocked_db: zincir.Database, clock: ManualClock
) -> None:
    db = clocked_db
    async with zincir.open_run(db) as parent:
        child = await parent.spawn("c")
    async with zincir.open_run(db, child) as run:
        await run.complete()
    clock.advance(DAY)
    # The child ended long ago, but its parent is live: neither goes.
    report = await zincir.prune(db, finished_before=_later(clock))
    assert (report.runs, report.kept_for_family) == (0, 1)
    async with zincir.open_run(db, parent.id) as run:
        await run.join(child)
        await run.complete()
    report = await zincir.prune(db, finished_before=_later(clock, -60))
    assert (report.runs, report.kept_for_family) == (0, 1)  # the parent ended just now
    clock.advance(DAY)
    report = await zincir.prune(db, finished_before=_later(clock))
    assert (report.runs, report.rows["agent_runs"], report.rows["joins"]) == (2, 2, 1)
    assert await db.runs() == []


async def test_a_fork_keeps_its_source_while_it_is_live(
    clocked_db: zincir.Database, clock: ManualClock
) -> None:
    db = clocked_db
    async with zincir.open_run(db) as source:
        await source.record_response("hi", [], "end_turn")
        await source.complete()
    fork = await zincir.fork_run(db, source.id, 1)
    clock.advance(DAY)
    report = await zincir.prune(db, finished_before=_later(clock))
    assert (report.runs, report.kept_for_family) == (0, 1)
    await zincir.cancel_run(db, fork, "done with it")
    clock.advance(DAY)
    report = await zincir.prune(db, finished_before=_later(clock))
    assert report.runs == 2


async def test_a_reused_run_id_replays_nothing_of_the_pruned_run(
    clocked_db: zincir.Database, clock: ManualClock
) -> None:
    # The failure an interrupted garbage collection caused elsewhere: a workflow id used again
    # found the old run's step results. Here every key is a run's (steps, signals, tool calls,
    # effect keys <run>:tool_call:<id>), and the run's rows go in one transaction with it.
    db = clocked_db
    async with zincir.open_run(db) as old:
        await old.step("charge", _value, 100)
        await zincir.send_signal(db, old.id, "go", 1, key="once")
        await old.record_response("", [zincir.ToolCall("pay", "pay", {})], "tool_use")
        await old.record_tool_result("pay", {"paid": True})
        await old.complete()
    clock.advance(DAY)
    assert (await zincir.prune(db, finished_before=_later(clock))).runs == 1
    insert_started_run(db, old.id)  # the same id, as a new run
    calls = []

    async def charge() -> int:
        calls.append(1)
        return 7

    async with zincir.open_run(db, old.id) as new:
        assert await new.step("charge", charge) == 7 and calls == [1]
        second = await zincir.send_signal(db, new.id, "go", 2, key="once")
        assert scalar(db, "SELECT count(*) FROM signals WHERE run_id = ?", (new.id,)) == 1
        assert await new.wait_for_signal("w", "go") == 2
        await new.record_response("", [zincir.ToolCall("pay", "pay", {})], "tool_use")
        [pending] = await new.pending_tools()
        assert pending.effect_key == f"{old.id}:tool_call:pay" and second > 0
    assert scalar(db, "SELECT count(*) FROM outsider_actions WHERE run_id = ?", (old.id,)) == 1


async def test_every_table_of_the_schema_is_pruned_or_known_to_hold_no_run(db: zincir.Database) -> None:
    # A migration that adds a table holding a run's rows must add it to RUN_TABLES.
    covered = {table for table, _ in RUN_TABLES}
    if db.backend == "sqlite":
        covered.discard("run_waiters")
    assert _tables(db) == covered | NOT_A_RUNS_TABLE


async def test_foreign_keys_are_enforced_on_the_writers(db: zincir.Database) -> None:
    def orphan(tx: Any) -> None:
        tx.execute(
            "INSERT INTO events (run_id, seq, type, payload, created_at) VALUES (?, 0, 'x', '{}', 0)",
            ("00000000-0000-4000-8000-000000000000",),
        )

    with pytest.raises(zincir.StorageError):
        await storage(db).write(orphan)


async def test_bad_arguments_are_refused(db: zincir.Database) -> None:
    now = datetime.datetime.now(datetime.UTC)
    with pytest.raises(zincir.InvalidArgument, match="timezone-aware"):
        await zincir.prune(db, finished_before=now.replace(tzinfo=None))
    with pytest.raises(zincir.InvalidArgument, match="ended statuses"):
        await zincir.prune(db, finished_before=now, statuses=["running"])
    with pytest.raises(zincir.InvalidArgument):
        await zincir.prune(db, finished_before=now, keep_latest=-1)
    with pytest.raises(zincir.InvalidArgument):
        await zincir.prune(db, finished_before=now, batch_size=0)


@pytest.mark.postgresql_only
async def test_a_run_whose_row_is_held_is_passed_over_on_postgresql(
    clocked_db: zincir.Database, clock: ManualClock
) -> None:
    db = clocked_db
    import psycopg

    held, free = await _completed(db), await _completed(db)
    clock.advance(DAY)
    with psycopg.connect(db.path) as conn:
        # As a transaction inserting a row that refers to the run holds it.
        conn.execute("SELECT id FROM agent_runs WHERE id = %s FOR KEY SHARE", (held,))
        report = await zincir.prune(db, finished_before=_later(clock))
        assert (report.runs, report.kept_for_family) == (1, 1)
    assert [r.id for r in await db.runs()] == [held]
    assert free not in {r.id for r in await db.runs()}
    assert (await zincir.prune(db, finished_before=_later(clock))).runs == 1


@pytest.mark.sqlite_only
async def test_the_file_shrinks_after_a_prune(tmp_path: Path) -> None:
    path = tmp_path / "zincir.db"
    async with zincir.open_database(path) as db:
        for n in range(40):
            async with zincir.open_run(db) as run:  # each its own text: none stored once for all
                await run.record_response(f"{n} " + "x" * 20_000, [], "end_turn")
                await run.complete()
    full = path.stat().st_size
    assert scalar(path, "PRAGMA auto_vacuum") == 2  # incremental, set when the file was made
    async with zincir.open_database(path) as db:
        report = await zincir.prune(db, finished_before=_at(zincir.wall_clock_ms() + 1000))
        assert report.runs == 40
    assert path.stat().st_size < full / 4


async def test_the_cli_prunes_with_progress_and_a_summary(
    clocked_db: zincir.Database, clock: ManualClock, db_target: str
) -> None:
    db = clocked_db
    for _ in range(3):
        await _completed(db)
    # The CLI's "now" is the wall clock; the runs ended in 2023 on the test's clock.

    def cli(*args: str, target: str = db_target) -> Any:
        return CliRunner().invoke(main, ["prune", *args, "--db", target])

    as_url = db_target if db.backend == "postgresql" else f"sqlite:///{db_target}"  # both forms
    dry = await trio.to_thread.run_sync(lambda: cli("--older-than", "30d", "--dry-run", target=as_url))
    assert dry.exit_code == 0, dry.output
    assert "would delete 3 runs" in dry.stdout and len(await db.runs()) == 3
    done = await trio.to_thread.run_sync(cli, "--older-than", "30d", "--batch", "2")
    assert done.exit_code == 0, done.output
    assert "deleted 3 runs" in done.stdout
    # Progress after the first batch, then once a second: the second batch came sooner.
    progress = done.stderr.splitlines()
    assert len(progress) == 1 and progress[0].startswith("batch 1: 2 runs, "), progress
    assert await db.runs() == []
    bad = await trio.to_thread.run_sync(cli, "--older-than", "30 days")
    assert bad.exit_code == 2 and "30d, 12h, 90m" in bad.output


async def test_the_cli_prunes_an_encrypted_database_with_the_key_from_the_environment(
    db_target: str, clock: ManualClock
) -> None:
    key = bytes(range(32))
    async with zincir.open_database(db_target, clock=clock, encryption_key=key) as db:
        await _completed(db, config={"secret": "s"})

    def cli(env: dict[str, str]) -> Any:
        return CliRunner().invoke(main, ["prune", "--older-than", "30d", "--db", db_target], env=env)

    refused = await trio.to_thread.run_sync(cli, {"ZINCIR_ENCRYPTION_KEY": ""})
    assert refused.exit_code == 1 and "ZINCIR_ENCRYPTION_KEY" in refused.output
    done = await trio.to_thread.run_sync(cli, {"ZINCIR_ENCRYPTION_KEY": key.hex()})
    assert done.exit_code == 0, done.output
    assert "deleted 1 runs" in done.stdout
    assert scalar(db, "SELECT count(*) FROM run_keys") == 0


def test_the_cli_takes_durations() -> None:
    from zincir._cli_prune import parse_duration

    assert parse_duration("30d") == datetime.timedelta(days=30)
    assert parse_duration("12h") == datetime.timedelta(hours=12)
    assert parse_duration("90m") == datetime.timedelta(minutes=90)
    assert parse_duration("45s") == datetime.timedelta(seconds=45)
    for too_far in ("999999999d", "99999999999999d"):
        with pytest.raises(click.BadParameter, match="before any date"):
            parse_duration(too_far)


_PRUNE_IN_A_CHILD = """
import datetime, sys, trio, zincir

async def main():
    async with zincir.open_database(sys.argv[1]) as db:
        def progress(report):
            print("batch", report.batches, flush=True)
        await zincir.prune(db, finished_before=datetime.datetime.now(datetime.UTC), batch_size=10,
                           progress=progress)
        print("done", flush=True)

trio.run(main)
"""


async def test_a_prune_killed_mid_batch_leaves_every_run_whole_or_gone(db_target: str, backend: str) -> None:
    async with zincir.open_database(db_target):
        pass
    ids = seed_runs(db_target, 300, events=12, ended_ms=zincir.wall_clock_ms() - 60_000)
    target = Path(db_target) if backend == "sqlite" else None

    def count(sql: str) -> int:
        if target is not None:
            conn = sqlite3.connect(target)
            try:
                return int(conn.execute(sql).fetchone()[0])
            finally:
                conn.close()
        import psycopg

        with psycopg.connect(db_target) as conn:
            row = conn.execute(sql).fetchone()
            assert row is not None
            return int(row[0])

    proc = start_python(_PRUNE_IN_A_CHILD, db_target)
    try:
        assert proc.stdout is not None
        line = await trio.to_thread.run_sync(proc.stdout.readline)
        assert line.startswith("batch"), line + proc.stderr.read() if proc.stderr else line
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
        proc.communicate()
    left = count("SELECT count(*) FROM agent_runs")
    assert 0 < left < len(ids)
    # Whole: every run left has all its rows; gone: no row of it is left anywhere.
    assert count("SELECT count(*) FROM events") == 12 * left
    assert count("SELECT count(*) FROM steps") == left
    assert count("SELECT count(*) FROM signals") == left
    assert count("SELECT count(*) FROM outsider_actions") == left
    assert count("SELECT count(*) FROM events WHERE run_id NOT IN (SELECT id FROM agent_runs)") == 0


@pytest.mark.postgresql_only
async def test_a_family_that_grew_after_it_was_read_stays_on_postgresql(
    clocked_db: zincir.Database, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fork made between a batch's read of the families and its lock of their rows: the batch
    # reads the relations again under the lock and leaves the family.
    db = clocked_db
    from zincir._store import _prune

    source = await _completed(db)
    clock.advance(DAY)
    read_relations = _prune._relations

    def then_fork(tx: Any, start: Any) -> Any:
        edges = read_relations(tx, start)
        insert_started_run(db, fork_id)
        rows(db, "UPDATE agent_runs SET forked_from = ? WHERE id = ?", (source, fork_id))
        return edges

    fork_id = "00000000-0000-4000-8000-00000000f04c"
    monkeypatch.setattr(_prune, "_relations", then_fork)
    report = await zincir.prune(db, finished_before=_later(clock))
    assert (report.runs, report.kept_for_family) == (0, 1)
    assert {r.id for r in await db.runs()} == {source, fork_id}


@pytest.mark.postgresql_only
async def test_a_batch_locks_no_row_of_a_live_family_on_postgresql(
    clocked_db: zincir.Database, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An ended child of a live parent is a candidate, and its family is read; while the batch's
    # transaction is open, the live parent's owner can still write its row.
    db = clocked_db
    import psycopg

    from zincir._store import _prune

    async with zincir.open_run(db) as parent:
        child = await parent.spawn("c")
        await zincir.cancel_run(db, child, "ended")
        await _completed(db)  # a family of its own, ended: it goes
        clock.advance(DAY)
        judged = _prune._judged
        writable: list[bool] = []

        def and_try_the_parent(families: Any, rows_: Any, spec: Any) -> Any:
            with psycopg.connect(db.path, autocommit=True) as conn:
                try:
                    conn.execute("SET lock_timeout = '50ms'")
                    conn.execute("SELECT 1 FROM agent_runs WHERE id = %s FOR UPDATE NOWAIT", (parent.id,))
                    writable.append(True)
                except psycopg.errors.LockNotAvailable:
                    writable.append(False)
            return judged(families, rows_, spec)

        monkeypatch.setattr(_prune, "_judged", and_try_the_parent)
        report = await zincir.prune(db, finished_before=_later(clock))
        assert (report.runs, report.kept_for_family) == (1, 1)  # gone; the child stays
        assert writable and all(writable)
        assert {r.id for r in await db.runs()} == {parent.id, child}


@pytest.mark.sqlite_only
async def test_zincir_vacuum_shrinks_a_file_made_without_auto_vacuum(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    async with zincir.open_database(path) as db:
        for n in range(20):
            async with zincir.open_run(db) as run:
                await run.record_response(f"{n} " + "x" * 20_000, [], "end_turn")
                await run.complete()
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("PRAGMA auto_vacuum = NONE")  # as a file of an older zincir
    old.execute("VACUUM")
    old.close()
    async with zincir.open_database(path) as db:
        assert (await zincir.prune(db, finished_before=_at(zincir.wall_clock_ms() + 1000))).runs == 20
    full = path.stat().st_size
    assert scalar(path, "PRAGMA freelist_count") > 0  # freed, but kept in the file

    result = await trio.to_thread.run_sync(lambda: CliRunner().invoke(main, ["vacuum", "--db", str(path)]))
    assert result.exit_code == 0, result.output
    assert path.stat().st_size < full - 300_000
    assert scalar(path, "PRAGMA auto_vacuum") == 2
