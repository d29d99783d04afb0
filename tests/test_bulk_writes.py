"""SQLite's bulk session (zincir/_sqlite/_bulk.py): a prune's batches read without the write
lock, write only what they read, make way for live writers, and are durable once it returns."""

from __future__ import annotations

import datetime
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import trio

import zincir
from zincir._crypto import Sealer
from zincir._errors import StorageError
from zincir._payloads import Payloads
from zincir._sqlite import _bulk
from zincir._sqlite._bulk import OPTIMISTIC_TRIES, BulkSession
from zincir._sqlite._connection import connect
from zincir._store import Tx

pytestmark = pytest.mark.sqlite_only


async def _create(path: Path) -> None:
    async with zincir.open_database(path):
        pass


@pytest.fixture
def session(db_path: Path) -> Iterator[BulkSession]:
    trio.run(_create, db_path)
    with sqlite3.connect(db_path, isolation_level=None) as conn:
        conn.execute("CREATE TABLE t (x INTEGER)")
    bulk = BulkSession(str(db_path), lambda: 0, Payloads(), None)
    yield bulk
    bulk.close()


def _other(db_path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 0")
    return conn


@pytest.fixture
def other(session: BulkSession, db_path: Path) -> Iterator[sqlite3.Connection]:
    """A live writer's connection to the session's file, that never waits for its lock."""
    conn = _other(db_path)
    yield conn
    conn.close()


def _values(db_path: Path) -> list[int]:
    with sqlite3.connect(db_path) as conn:
        return sorted(row[0] for row in conn.execute("SELECT x FROM t"))


def test_a_batch_reads_again_when_another_writer_committed_after_its_reads(
    session: BulkSession, other: sqlite3.Connection, db_path: Path
) -> None:
    seen: list[int] = []

    def write_what_was_read(tx: Tx) -> None:
        (count,) = tx.one("SELECT count(*) FROM t")
        seen.append(count)
        if len(seen) == 1:  # a live writer commits while the batch has only read: it can
            other.execute("INSERT INTO t VALUES (-1)")
        tx.execute("INSERT INTO t VALUES (?)", (count,))

    session.write(write_what_was_read)
    assert seen == [0, 1]  # the first try's write was refused: what it read had changed
    assert session.refusals == 1
    assert _values(db_path) == [-1, 1]


def test_a_batch_refused_again_and_again_takes_the_lock_before_it_reads(
    session: BulkSession, other: sqlite3.Connection, db_path: Path
) -> None:
    tries: list[bool] = []

    def write_unless_refused(tx: Tx) -> None:
        tx.one("SELECT count(*) FROM t")
        try:  # a writer that always commits between the batch's reads and its write, if it can
            other.execute("INSERT INTO t VALUES (-1)")
            tries.append(True)
        except sqlite3.OperationalError:  # locked: the batch holds the lock from its BEGIN
            tries.append(False)
        tx.execute("INSERT INTO t VALUES (1)")

    session.write(write_unless_refused)
    assert tries == [True] * OPTIMISTIC_TRIES + [False]
    assert _values(db_path) == [-1] * OPTIMISTIC_TRIES + [1]


def test_a_failed_batch_is_a_storage_error_and_writes_nothing(session: BulkSession, db_path: Path) -> None:
    def half_then_fail(tx: Tx) -> None:
        tx.execute("INSERT INTO t VALUES (1)")
        tx.execute("INSERT INTO no_such_table VALUES (1)")

    with pytest.raises(StorageError, match="no_such_table"):
        session.write(half_then_fail)
    assert _values(db_path) == []
    assert session.refusals == 0


async def test_each_batch_is_fsynced_after_its_commit_with_the_lock_free(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[tuple[str, bool]] = []
    sync = os.fsync

    def recording_fsync(fd: int) -> None:
        other = _other(db_path)
        try:
            other.execute("BEGIN IMMEDIATE")  # a live writer need not wait for this fsync
            other.execute("ROLLBACK")
            free = True
        except sqlite3.OperationalError:
            free = False
        finally:
            other.close()
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), free))
        sync(fd)

    monkeypatch.setattr(_bulk.os, "fsync", recording_fsync)
    async with zincir.open_database(db_path) as db:
        for _ in range(3):
            async with zincir.open_run(db) as run:
                await run.complete()
        later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=1)
        report = await zincir.prune(db, finished_before=later, batch_size=1)
    assert report.batches == 3
    # One fsync per batch; none for the last try, or the content sweep: they deleted nothing.
    assert synced == [(f"{db_path}-wal", True)] * 3
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT count(*) FROM agent_runs").fetchone() == (0,)


def test_the_bulk_connection_commits_without_an_fsync_and_keeps_foreign_keys(session: BulkSession) -> None:
    def settings(tx: Tx) -> tuple[int, int]:
        return tx.one("PRAGMA synchronous")[0], tx.one("PRAGMA foreign_keys")[0]

    assert session.write(settings) == (1, 1)  # NORMAL: no fsync in a COMMIT; foreign keys on


async def test_a_prune_through_a_symlinked_path_finds_the_wal_beside_the_real_file(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    link = tmp_path / "links" / "zincir.db"
    link.symlink_to(tmp_path / "real" / "zincir.db")
    async with zincir.open_database(link) as db:
        async with zincir.open_run(db) as run:
            await run.complete()
        later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=1)
        assert (await zincir.prune(db, finished_before=later)).runs == 1
    assert not (tmp_path / "links" / "zincir.db-wal").exists()


def test_on_an_encrypted_database_the_bulk_connection_zeroes_what_it_frees(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trio.run(_create, db_path)

    def connect_without_secure_delete(path: str, synchronous: str) -> sqlite3.Connection:
        conn = connect(path, synchronous)
        conn.execute("PRAGMA secure_delete = OFF")  # as a SQLite built without it has it
        return conn

    def secure_delete(tx: Tx) -> int:
        return int(tx.one("PRAGMA secure_delete")[0])

    monkeypatch.setattr(_bulk, "connect", connect_without_secure_delete)
    for sealer, zeroed in ((None, 0), (cast(Sealer, object()), 1)):
        bulk = BulkSession(str(db_path), lambda: 0, Payloads(), sealer)
        try:
            assert bulk.write(secure_delete) == zeroed
        finally:
            bulk.close()
