"""SQLite writes run inline on the Trio thread while its writer thread is idle, and go to the
thread when the file is locked by another process, commits are slow, or a value is large."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import trio.testing

import zincir
from zincir._sqlite import _connection
from zincir._sqlite._connection import BUSY_TIMEOUT_MS, CHECKPOINT_EVERY_COMMITS, SQLiteSession, Tx
from zincir._threads import INLINE_ARGUMENT_CHARS, INLINE_COMMIT_SECONDS, MAX_BATCH

from .test_database import SCRATCH, values


def insert(tx: Tx, value: str) -> str:
    tx.execute(SCRATCH)
    tx.execute("INSERT INTO scratch (value) VALUES (?)", (value,))
    return threading.current_thread().name


def fail_after_insert(tx: Tx, value: str) -> None:
    insert(tx, value)
    raise RuntimeError("operation failed on purpose")


ON_TRIO = threading.current_thread().name  # pytest's thread runs the Trio loop


@pytest.fixture
async def sqlite_db(db_path: Path) -> AsyncIterator[zincir.Database]:
    async with zincir.open_database(db_path) as db:
        await db._write(insert, "warm-up")
        # A new file's first commit can be slow on a busy machine: start from a clean average.
        db._writers[0]._commit_seconds = 0.0
        yield db


def count_commits(db: zincir.Database) -> list[str]:
    commits: list[str] = []
    db._writers[0]._session._conn.set_trace_callback(  # type: ignore[attr-defined]
        lambda sql: commits.append(sql) if sql == "COMMIT" else None
    )
    return commits


async def test_a_lone_write_runs_on_the_trio_thread_and_is_committed_when_it_returns(
    sqlite_db: zincir.Database, db_path: Path
) -> None:
    assert await sqlite_db._write(insert, "one") == ON_TRIO
    assert values(db_path) == ["one", "warm-up"]  # another connection sees it: committed


async def test_writes_of_one_scheduler_pass_share_one_inline_commit(
    sqlite_db: zincir.Database, db_path: Path
) -> None:
    commits = count_commits(sqlite_db)
    threads: list[str] = []

    async def write(i: int) -> None:
        threads.append(await sqlite_db._write(insert, f"v{i:02}"))

    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(write, i)
    assert commits == ["COMMIT"]
    assert threads == [ON_TRIO] * 20
    assert len(values(db_path)) == 21


async def test_a_failing_operation_inline_does_not_roll_back_its_neighbours(
    sqlite_db: zincir.Database, db_path: Path
) -> None:
    outcomes: dict[str, object] = {}

    async def submit(name: str, fn: object, value: str) -> None:
        try:
            outcomes[name] = await sqlite_db._write(fn, value)  # type: ignore[arg-type]
        except Exception as exc:
            outcomes[name] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, "before", insert, "before")
        nursery.start_soon(submit, "failing", fail_after_insert, "failing")
        nursery.start_soon(submit, "duplicate", insert, "warm-up")  # violates UNIQUE
        nursery.start_soon(submit, "after", insert, "after")
    assert isinstance(outcomes["failing"], RuntimeError)
    assert isinstance(outcomes["duplicate"], zincir.StorageError)
    assert outcomes["before"] == outcomes["after"] == ON_TRIO
    assert values(db_path) == ["after", "before", "warm-up"]


async def test_a_file_locked_by_another_process_is_waited_out_on_the_thread_not_the_loop(
    sqlite_db: zincir.Database, db_path: Path
) -> None:
    other = sqlite3.connect(db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the write lock, as another process would hold it
    ticks = 0
    written: list[str] = []

    async def write() -> None:
        written.append(await sqlite_db._write(insert, "after the lock"))

    async def tick() -> None:
        nonlocal ticks
        while not written:
            ticks += 1
            await trio.sleep(0.005)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            nursery.start_soon(tick)
            while ticks < 5:  # the loop runs on while the write waits for the lock
                await trio.sleep(0.005)
            assert written == []
            other.execute("COMMIT")
    finally:
        other.close()
    assert written == [f"zincir-writer:{db_path}"]
    assert values(db_path) == ["after the lock", "warm-up"]


class _HeldLock:
    """The clock the writer's wait for the lock reads and sleeps on: its sleeps pass no real time,
    and another connection's write lock is released when this clock reaches ``release_at``."""

    def __init__(self, db_path: Path, release_at: float) -> None:
        self.now = 0.0
        self.released_at: float | None = None
        self._release_at = release_at
        self.holder = sqlite3.connect(db_path, isolation_level=None)
        self.holder.execute("BEGIN IMMEDIATE")  # the write lock, as another process would hold it

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.released_at is None and self.now >= self._release_at:
            self.holder.execute("COMMIT")
            self.released_at = self.now


@pytest.mark.parametrize("held_for", [0.004, 0.04, 0.5, 4.9])
def test_the_writer_takes_a_lock_freed_by_another_process_within_a_poll_of_its_release(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, held_for: float
) -> None:
    # SQLite's own busy handler sleeps 1, 2, 5 ... 100 ms: a writer that met another process's
    # short transaction (a prune batch) slept long past its end. The writer polls instead.
    lock = _HeldLock(db_path, held_for)
    monkeypatch.setattr(_connection, "time", lock)
    conn = sqlite3.connect(db_path, isolation_level=None)
    session = SQLiteSession(conn, str(db_path), lambda: 0, writer=True)
    try:
        session.begin()
        assert lock.released_at is not None
        assert lock.now - held_for <= _connection._POLL_CAP_S + 1e-9
        session.rollback()
        lock.now = 0.0  # and then a lock held past the busy timeout is still given up on time
        lock.holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            session.begin()
        assert lock.now == pytest.approx(BUSY_TIMEOUT_MS / 1000)
    finally:
        conn.close()
        lock.holder.close()


async def test_tasks_writing_in_lockstep_share_one_commit_per_round(
    sqlite_db: zincir.Database, db_path: Path
) -> None:
    # The first task of a round writes again while the others it answered are still to run in
    # the same scheduler pass (before or after it: Trio orders a pass at random): it waits
    # for them.
    commits = count_commits(sqlite_db)

    async def writer(i: int) -> None:
        for round_ in range(8):
            await sqlite_db._write(insert, f"{round_}-{i:02}")

    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(writer, i)
    assert len(commits) == 8
    assert len(values(db_path)) == 8 * 20 + 1


async def test_slow_commits_send_writes_to_the_thread_until_they_are_fast_again(
    sqlite_db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = sqlite_db._writers[0]._session
    commit = session.commit
    disk_is_slow = True

    def commit_on_a_slow_disk(wakes: object) -> None:
        if disk_is_slow:
            time.sleep(INLINE_COMMIT_SECONDS * 3)
        commit(wakes)  # type: ignore[arg-type]

    monkeypatch.setattr(session, "commit", commit_on_a_slow_disk)
    on_thread = f"zincir-writer:{sqlite_db.path}"
    slow = [await sqlite_db._write(insert, "slow 0")]
    assert slow == [ON_TRIO]  # one slow commit does not tip the average ...
    while len(slow) < 20 and slow[-1] == ON_TRIO:
        slow.append(await sqlite_db._write(insert, f"slow {len(slow)}"))
    assert slow[-1] == on_thread  # ... more do: the loop is no longer held up by them
    disk_is_slow = False
    fast = [await sqlite_db._write(insert, "fast 0")]
    assert fast == [on_thread]  # still judged by the slow ones, and measured on the thread ...
    while len(fast) < 200 and fast[-1] == on_thread:
        fast.append(await sqlite_db._write(insert, f"fast {len(fast)}"))
    assert fast[-1] == ON_TRIO  # ... until fast commits there bring the average down


async def test_slow_operations_do_not_count_as_a_slow_disk(sqlite_db: zincir.Database) -> None:
    # Their SQL would hold the GIL on the thread too: only the COMMIT's wait counts.
    def insert_slowly(tx: Tx, value: str) -> str:
        time.sleep(INLINE_COMMIT_SECONDS * 3)
        return insert(tx, value)

    assert await sqlite_db._write(insert_slowly, "slow 0") == ON_TRIO
    for i in range(1, 20):
        await sqlite_db._write(insert_slowly, f"slow {i}")
    # Twenty operations of 6 ms each: the average would be above 5 ms if they counted.
    assert sqlite_db._writers[0]._commit_seconds < INLINE_COMMIT_SECONDS * 1.5


async def test_a_large_value_is_written_on_the_thread(sqlite_db: zincir.Database, db_path: Path) -> None:
    large = "x" * (INLINE_ARGUMENT_CHARS + 1)
    assert await sqlite_db._write(insert, large) == f"zincir-writer:{db_path}"
    # The size sent that one write to the thread, not the route: small writes come back inline.
    # (Not necessarily the very next one: on a loaded machine the large write's time, measured
    # on the thread, can lift the average above the inline limit for a few writes.)
    small = [await sqlite_db._write(insert, "small 0")]
    while len(small) < 200 and small[-1] != ON_TRIO:
        small.append(await sqlite_db._write(insert, f"small {len(small)}"))
    assert small[-1] == ON_TRIO


class Interrupt(BaseException):
    """Not an Exception: what no operation's error handling expects."""


async def test_an_interrupted_inline_transaction_is_rolled_back_and_its_neighbours_told(
    sqlite_db: zincir.Database, db_path: Path
) -> None:
    def interrupt(tx: Tx, value: str) -> None:
        insert(tx, value)
        raise Interrupt

    outcomes: list[BaseException | str] = []

    async def write(fn: object, value: str) -> None:
        try:
            await sqlite_db._write(fn, value)  # type: ignore[arg-type]
            outcomes.append("written")
        except BaseException as exc:  # every kind: what each writer is told is the point
            outcomes.append(exc)

    async with trio.open_nursery() as nursery:  # four writes, gathered into one transaction
        nursery.start_soon(write, interrupt, "interrupted")
        for i in range(3):
            nursery.start_soon(write, insert, f"neighbour {i}")
    # The task that ran the batch gets the interruption; every other one an error, none hangs.
    assert sum(isinstance(o, Interrupt) for o in outcomes) == 1
    told = [o for o in outcomes if isinstance(o, zincir.StorageError)]
    assert len(told) == 3
    assert all("interrupted" in str(exc) for exc in told)
    assert values(db_path) == ["warm-up"]  # rolled back
    assert await sqlite_db._write(insert, "next") == ON_TRIO  # and the connection is usable


async def test_a_disk_filling_in_an_inline_batch_hands_it_to_the_thread_for_outcomes_of_their_own(
    sqlite_db: zincir.Database, db_path: Path
) -> None:
    def cap_the_disk(tx: Tx) -> None:
        (pages,) = tx.one("PRAGMA page_count")
        tx.execute(f"PRAGMA max_page_count = {pages + 4}")  # room for the small ones only

    await sqlite_db._write(cap_the_disk)
    big = "x" * 40_000  # about ten pages, still small enough to be written inline
    assert len(big) <= INLINE_ARGUMENT_CHARS
    outcomes: dict[str, object] = {}

    async def write(name: str, value: str) -> None:
        try:
            outcomes[name] = await sqlite_db._write(insert, value)
        except zincir.StorageError as exc:
            outcomes[name] = exc

    async with trio.open_nursery() as nursery:  # one inline batch, which SQLite aborts
        for name, value in (("a", "small a"), ("big", big), ("b", "small b")):
            nursery.start_soon(write, name, value)
    assert isinstance(outcomes["big"], zincir.StorageError)
    assert "the database or disk is full" in str(outcomes["big"])
    # The small ones committed, on the thread, once each had a transaction of its own.
    assert outcomes["a"] == outcomes["b"] == f"zincir-writer:{db_path}"
    assert values(db_path) == ["small a", "small b", "warm-up"]


async def test_every_inline_write_lets_the_other_tasks_run(sqlite_db: zincir.Database) -> None:
    # Each await of a write is a schedule point, as when it waited for the thread: a loop of
    # writes cannot starve the run's heartbeat or anything else on the loop.
    others_ran = 0
    done = False

    async def other() -> None:
        nonlocal others_ran
        while not done:
            others_ran += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        await trio.lowlevel.checkpoint()
        before = others_ran
        for i in range(100):
            sqlite_db._writers[0]._commit_seconds = 0.0  # a slow commit on a busy machine aside
            assert await sqlite_db._write(insert, f"w{i}") == ON_TRIO
        done = True
    # Once per write, give or take the first and last (Trio orders each pass's tasks at random).
    assert others_ran - before >= 99


async def test_a_large_value_joining_a_gathered_batch_sends_the_batch_to_the_thread(
    sqlite_db: zincir.Database, db_path: Path
) -> None:
    large = "x" * (INLINE_ARGUMENT_CHARS + 1)
    seen: dict[str, str] = {}

    async def write(name: str, value: str) -> None:
        seen[name] = await sqlite_db._write(insert, value)

    async with trio.open_nursery() as nursery:  # one pass: the small one may gather, the large joins
        nursery.start_soon(write, "small", "small")
        nursery.start_soon(write, "large", large)
    assert seen == {"small": f"zincir-writer:{db_path}", "large": f"zincir-writer:{db_path}"}
    assert len(values(db_path)) == 3


async def test_more_writes_in_one_pass_than_one_batch_holds_go_to_the_thread(
    sqlite_db: zincir.Database, db_path: Path
) -> None:
    threads: set[str] = set()

    async def write(i: int) -> None:
        threads.add(await sqlite_db._write(insert, f"v{i:04}"))

    async with trio.open_nursery() as nursery:
        for i in range(MAX_BATCH + 10):
            nursery.start_soon(write, i)
    assert threads == {f"zincir-writer:{db_path}"}
    assert len(values(db_path)) == MAX_BATCH + 11


async def test_the_wal_is_checkpointed_on_the_thread_never_inside_an_inline_commit(
    sqlite_db: zincir.Database, db_path: Path
) -> None:
    session = sqlite_db._writers[0]._session
    assert session._conn.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)  # type: ignore[attr-defined]
    seen = []
    for i in range(2 * CHECKPOINT_EVERY_COMMITS + 1):
        sqlite_db._writers[0]._commit_seconds = 0.0  # a slow commit on a busy machine aside
        seen.append(await sqlite_db._write(insert, f"v{i:04}"))
    on_thread = [i for i, name in enumerate(seen) if name != ON_TRIO]
    # The warm-up made one commit: the 199th write since is the 200th commit, the next is due.
    assert on_thread == [CHECKPOINT_EVERY_COMMITS - 1, 2 * CHECKPOINT_EVERY_COMMITS]
    other = sqlite3.connect(db_path)
    try:  # what the thread's checkpoint copied, another connection need not
        busy, frames, copied = other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    finally:
        other.close()
    assert busy == 0 and frames == copied
