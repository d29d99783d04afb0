"""The database layer: writer thread, group commit, cancellation, migrations, bad files."""

from __future__ import annotations

import collections
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import zincir
from zincir._sqlite._connection import Tx
from zincir._sqlite._migrations import load_migrations

from .helpers import dump, file_digest, rows, scalar, start_python

SCRATCH = "CREATE TABLE IF NOT EXISTS scratch (value TEXT NOT NULL UNIQUE)"


def insert(tx: Tx, value: str) -> int:
    tx.execute(SCRATCH)
    return tx.execute("INSERT INTO scratch (value) VALUES (?)", (value,)).lastrowid or 0


def fail_after_insert(tx: Tx, value: str) -> None:
    insert(tx, value)
    raise RuntimeError("operation failed on purpose")


def values(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[0] for row in conn.execute("SELECT value FROM scratch ORDER BY value")]
    finally:
        conn.close()


def writes_on_the_thread(db: zincir.Database) -> None:
    """Send every write to the writer thread, also those that would run inline on the Trio
    thread: for tests that hold the writer thread with a :class:`Gate` to queue writes behind
    it (an inline Gate would hold up the Trio thread instead)."""
    for writer in db._writers:
        writer._inline = False


class Gate:
    """Holds the writer thread inside an operation until the test opens it (after
    :func:`writes_on_the_thread`)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()

    def hold(self, tx: Tx) -> str:
        self.entered.set()
        assert self.opened.wait(10), "the test never opened the gate"
        insert(tx, "held")
        return "held"

    def pause(self, tx: object) -> None:
        """Like hold, but without writing anything: for any backend."""
        self.entered.set()
        assert self.opened.wait(10), "the test never opened the gate"

    async def wait_entered(self) -> None:
        await trio.to_thread.run_sync(self.entered.wait, 10)


async def test_new_file_has_every_table(db: zincir.Database, db_path: Path) -> None:
    conn = sqlite3.connect(db_path)
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
    conn.close()
    expected = {"agent_runs", "events", "checkpoints", "steps", "timers", "messages", "tool_intents"}
    assert expected <= tables
    assert journal == "wal"
    versions = scalar(db_path, "SELECT group_concat(version) FROM zincir_schema_migrations")
    assert versions == ",".join(str(m.version) for m in load_migrations())


async def test_a_write_is_committed_when_its_await_returns(db: zincir.Database, db_path: Path) -> None:
    await db._write(insert, "one")
    # A separate connection sees it, so it was committed, not just executed.
    assert values(db_path) == ["one"]


async def test_queued_operations_share_one_commit(db: zincir.Database, db_path: Path) -> None:
    await db._write(insert, "warm-up")
    commits: list[str] = []
    writes_on_the_thread(db)
    gate = Gate()
    db._writers[0]._session._conn.set_trace_callback(
        lambda sql: commits.append(sql) if sql == "COMMIT" else None
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(db._write, gate.hold)
        await gate.wait_entered()
        for i in range(20):
            nursery.start_soon(db._write, insert, f"v{i:02}")
        await trio.testing.wait_all_tasks_blocked()
        gate.opened.set()
    db._writers[0]._session._conn.set_trace_callback(None)
    # The held operation commits alone; the 20 queued behind it share one transaction.
    assert commits == ["COMMIT", "COMMIT"]
    assert len(values(db_path)) == 22


async def test_a_failing_operation_does_not_roll_back_its_neighbours(
    db: zincir.Database, db_path: Path
) -> None:
    writes_on_the_thread(db)
    gate = Gate()
    outcomes: dict[str, object] = {}

    async def submit(name: str, fn: object, value: str) -> None:
        try:
            outcomes[name] = await db._write(fn, value)  # type: ignore[arg-type]
        except Exception as exc:
            outcomes[name] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(db._write, gate.hold)
        await gate.wait_entered()
        nursery.start_soon(submit, "before", insert, "before")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(submit, "failing", fail_after_insert, "failing")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(submit, "duplicate", insert, "before")  # violates UNIQUE
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(submit, "after", insert, "after")
        await trio.testing.wait_all_tasks_blocked()
        gate.opened.set()
    assert isinstance(outcomes["failing"], RuntimeError)
    assert isinstance(outcomes["duplicate"], zincir.StorageError)
    assert "UNIQUE" in str(outcomes["duplicate"])
    assert values(db_path) == ["after", "before", "held"]


def _scratch(tx: Any, value: str) -> str:
    """A write of either backend that fails for a value written before (UNIQUE)."""
    tx.execute(SCRATCH)
    tx.execute("INSERT INTO scratch (value) VALUES (?)", (value,))
    return value


async def _one_batch(db: zincir.Database, *calls: tuple[Any, ...]) -> dict[int, object]:
    """Run ``calls`` ((fn, *args) each) as one group commit of the writer thread: queued behind
    a held operation, in order. Each call's result or error, by position."""
    writes_on_the_thread(db)
    entered, opened = threading.Event(), threading.Event()
    outcomes: dict[int, object] = {}

    def hold(tx: Any) -> None:
        entered.set()
        assert opened.wait(10), "the test never let the writer go"

    async def submit(i: int, fn: Any, *args: Any) -> None:
        try:
            outcomes[i] = await db._write(fn, *args)
        except Exception as exc:
            outcomes[i] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(db._write, hold)
        await trio.to_thread.run_sync(entered.wait)
        for i, call in enumerate(calls):
            nursery.start_soon(submit, i, *call)
            await trio.testing.wait_all_tasks_blocked()
        opened.set()
    return outcomes


def _counting_savepoints(db: zincir.Database, monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()

    def counting(name: str, method: Any) -> Any:
        def counted() -> None:
            counts[name] += 1
            method()

        return counted

    for writer in db._writers:
        for name in ("savepoint", "rollback_to_savepoint"):
            monkeypatch.setattr(writer._session, name, counting(name, getattr(writer._session, name)))
    return counts


async def test_a_batch_takes_savepoints_only_to_run_again_after_an_operation_failed(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A savepoint per operation costs two statements on every write; operations rarely fail.
    # So a batch runs without them, and one that fails rolls the batch back: it runs again, each
    # operation in a savepoint of its own, and only the failing one is undone.
    calls: list[str] = []

    def counted(tx: Any, value: str) -> str:
        calls.append(value)
        return _scratch(tx, value)

    savepoints = _counting_savepoints(db, monkeypatch)
    assert await _one_batch(db, (counted, "a"), (counted, "b"), (counted, "c")) == {0: "a", 1: "b", 2: "c"}
    assert calls == ["a", "b", "c"] and not savepoints
    calls.clear()
    outcomes = await _one_batch(db, (counted, "d"), (counted, "a"), (counted, "e"))  # "a" is UNIQUE
    assert calls == ["d", "a", "d", "a", "e"]  # rolled back at "a", then run again guarded
    assert outcomes[0] == "d" and outcomes[2] == "e" and isinstance(outcomes[1], zincir.StorageError)
    assert savepoints == {"savepoint": 3, "rollback_to_savepoint": 1}
    assert sorted(row[0] for row in rows(db, "SELECT value FROM scratch")) == ["a", "b", "c", "d", "e"]


async def test_a_run_key_remembered_by_an_operation_rolled_back_is_forgotten(db_target: str) -> None:
    # A new run's key is remembered as it is stored; if its transaction rolls back, the key is
    # in no database, and must never seal a value of a run created again under that id.
    async with zincir.open_database(db_target, encryption_key=bytes(range(32))) as db:
        sealer = db._writers[0].sealer
        assert sealer is not None and all(writer.sealer is sealer for writer in db._writers)
        key = sealer.fresh("not-a-run")

        def remember(tx: Any) -> None:
            sealer._remember("not-a-run", key)  # as Sealer.store does, within the transaction

        def fail(tx: Any) -> None:
            raise RuntimeError("operation failed on purpose")

        outcomes = await _one_batch(db, (remember,), (fail,))
        assert outcomes[0] is None and isinstance(outcomes[1], RuntimeError)
        assert sealer._cached("not-a-run") is None


async def test_a_cancelled_caller_waits_for_the_outcome(db: zincir.Database, db_path: Path) -> None:
    writes_on_the_thread(db)
    gate = Gate()
    returned: list[str] = []
    scope = trio.CancelScope()

    async def caller() -> None:
        with scope:
            returned.append(await db._write(gate.hold))
            await trio.lowlevel.checkpoint()
            returned.append("not reached: the cancellation is delivered here")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller)
        await gate.wait_entered()
        scope.cancel()  # cancels the caller while its operation runs
        await trio.testing.wait_all_tasks_blocked()
        assert returned == []  # still waiting: the operation's outcome is not known yet
        gate.opened.set()
    assert scope.cancelled_caught
    assert returned == ["held"]
    assert values(db_path) == ["held"]


async def test_a_caller_cancelled_before_submitting_writes_nothing(
    db: zincir.Database, db_path: Path
) -> None:
    await db._write(insert, "first")
    with trio.CancelScope() as scope:
        scope.cancel()
        await db._write(insert, "never")
    assert values(db_path) == ["first"]


async def test_closing_drains_the_queue_and_later_operations_fail(db_path: Path) -> None:
    async with zincir.open_database(db_path) as db, trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(db._write, insert, f"v{i:02}")
        await trio.testing.wait_all_tasks_blocked()
    assert len(values(db_path)) == 50
    with pytest.raises(zincir.DatabaseClosed, match="closed"):
        await db._write(insert, "late")
    assert not db._writers[0]._thread.is_alive()
    assert not db._reader._thread.is_alive()


@pytest.mark.sqlite_only  # drives the writer with SQLite's own statements
async def test_reads_see_one_snapshot(db: zincir.Database) -> None:
    await db._write(insert, "a")

    def read_twice(tx: Tx) -> tuple[int, int]:
        first = tx.one("SELECT count(*) FROM scratch")[0]
        # Another connection commits between our two reads; the snapshot must not move.
        other = sqlite3.connect(db.path)
        other.execute("INSERT INTO scratch (value) VALUES ('b')")
        other.commit()
        other.close()
        return first, tx.one("SELECT count(*) FROM scratch")[0]

    assert await db._read(read_twice) == (1, 1)


@pytest.mark.sqlite_only  # drives the writer with SQLite's own statements
async def test_reads_cannot_write(db: zincir.Database) -> None:
    await db._write(insert, "a")
    with pytest.raises(zincir.StorageError, match="readonly"):
        await db._read(insert, "b")


async def test_bad_options_are_refused(db_path: Path) -> None:
    with pytest.raises(zincir.InvalidArgument, match="synchronous"):
        async with zincir.open_database(db_path, synchronous="off"):  # type: ignore[arg-type]
            pass
    assert not db_path.exists()


async def test_normal_synchronous_level(db_path: Path) -> None:
    async with zincir.open_database(db_path, synchronous="normal") as db:
        level = await db._write(lambda tx: tx.one("PRAGMA synchronous")[0])
    assert level == 1  # NORMAL


def test_database_has_no_public_constructor() -> None:
    with pytest.raises(TypeError, match="open_database"):
        zincir.Database()


# -- migrations ---------------------------------------------------------------------------------

OPEN_AFTER_SIGNAL = """
    import os, sys, time, trio, zincir
    path, go = sys.argv[1], sys.argv[2]
    print("ready", flush=True)  # imported and waiting: the processes start together
    while not os.path.exists(go):
        time.sleep(0.0005)
    async def main():
        async with zincir.open_database(path):
            pass
    trio.run(main)
    print("opened")
"""


def open_from_processes_at_once(target: str, go: Path, count: int = 4) -> None:
    """Open one new database from ``count`` processes released at the same instant; each must
    open it without an error."""
    procs = [start_python(OPEN_AFTER_SIGNAL, target, str(go)) for _ in range(count)]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        go.touch()
        results = [p.communicate(timeout=60) for p in procs]
    finally:
        for proc in procs:
            proc.kill()
    for proc, (out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
        assert out.strip() == "opened"


def test_two_processes_opening_a_new_file_migrate_it_once(db_path: Path, tmp_path: Path) -> None:
    open_from_processes_at_once(str(db_path), tmp_path / "go")
    assert scalar(db_path, "SELECT count(*) FROM zincir_schema_migrations") == len(load_migrations())


async def test_reopening_keeps_the_data(db_path: Path) -> None:
    async with zincir.open_database(db_path) as db:
        await db._write(insert, "kept")
    async with zincir.open_database(db_path) as db:
        assert await db._read(lambda tx: tx.one("SELECT value FROM scratch")[0]) == "kept"


async def assert_refused_unchanged(path: Path, error: type[Exception], match: str) -> None:
    before = file_digest(path)
    with pytest.raises(error, match=match):
        async with zincir.open_database(path):
            pass
    assert file_digest(path) == before


async def test_a_newer_schema_is_refused_and_left_unchanged(db_path: Path) -> None:
    async with zincir.open_database(db_path):
        pass
    conn = sqlite3.connect(db_path)
    conn.execute("INSERT INTO zincir_schema_migrations VALUES (999, '0999_future', 0)")
    conn.commit()
    conn.close()
    await assert_refused_unchanged(db_path, zincir.SchemaError, "schema version 999, newer")


async def test_another_sqlite_database_is_refused_and_left_unchanged(db_path: Path) -> None:
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    await assert_refused_unchanged(db_path, zincir.SchemaError, "not a zincir database")


async def test_a_garbage_file_is_refused_and_left_unchanged(db_path: Path) -> None:
    db_path.write_bytes(os.urandom(8192))
    await assert_refused_unchanged(db_path, zincir.SchemaError, "not a zincir database")


async def test_a_truncated_database_is_refused_and_left_unchanged(db_path: Path) -> None:
    async with zincir.open_database(db_path) as db:
        for i in range(200):
            await db._write(insert, f"{i:04}" * 100)
    db_path.write_bytes(db_path.read_bytes()[:3000])
    await assert_refused_unchanged(db_path, zincir.SchemaError, "not a zincir database")


async def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(zincir.StorageError, match="cannot open database"):
        async with zincir.open_database(tmp_path):
            pass


async def test_a_read_only_location_is_refused(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root ignores directory permissions; /proc refuses new files even to root.
        path = Path("/proc/zincir-test.db")
    else:
        tmp_path.chmod(0o555)
        path = tmp_path / "zincir.db"
    with pytest.raises(zincir.StorageError, match="cannot open database"):
        async with zincir.open_database(path):
            pass
    assert not path.exists()


async def test_a_full_disk_fails_one_operation_and_recovers(db: zincir.Database, db_path: Path) -> None:
    await db._write(insert, "small")
    pages = await db._write(lambda tx: tx.one("PRAGMA page_count")[0])
    before = dump(db_path)
    await db._write(lambda tx: tx.execute(f"PRAGMA max_page_count = {pages}"))
    with pytest.raises(zincir.StorageError, match="the database or disk is full"):
        await db._write(insert, "x" * 200_000)
    assert dump(db_path) == before
    await db._write(lambda tx: tx.execute("PRAGMA max_page_count = 1073741823"))
    await db._write(insert, "x" * 200_000)
    assert len(values(db_path)) == 2
