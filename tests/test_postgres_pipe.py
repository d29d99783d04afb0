"""zincir's PostgreSQL session on libpq's pipeline (``zincir._postgres._pipe``), at its edges.

A real server and real connections; faults come from a second connection holding a lock, from
``pg_terminate_backend``, and from a process with many files open. The session is driven the
way a database thread drives it (begin, an operation's statements, savepoints, commit).
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterator

import psycopg
import pytest

from zincir import DatabaseBusy, StorageError
from zincir._postgres._connection import PostgresSession


@pytest.fixture
def pg_url(pg_url: str) -> str:
    """The shared fixture's new database, with the two tables these tests write."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE runs (id int PRIMARY KEY)")
        conn.execute("INSERT INTO runs VALUES (0)")
    return pg_url


@pytest.fixture
def session(pg_url: str) -> Iterator[PostgresSession]:
    session = PostgresSession(pg_url, "test writer", read_only=False, clock=None)
    yield session
    session.close()


def items(url: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [row[0] for row in conn.execute("SELECT id FROM items ORDER BY id")]


def backend_pid(session: PostgresSession) -> int:
    conn = session._conn
    assert conn is not None
    return conn.info.backend_pid


@contextlib.contextmanager
def row_locked_elsewhere(url: str) -> Iterator[None]:
    with psycopg.connect(url) as other:
        other.execute("SELECT 1 FROM runs WHERE id = 0 FOR UPDATE")
        yield
        other.rollback()


def lock_then_insert(session: PostgresSession, item: int) -> None:
    """As zincir's fenced writes do: the run's lock, a write sent behind it, then the lock read."""
    tx = session.tx()
    lock = tx.send("SELECT id FROM runs WHERE id = 0 FOR NO KEY UPDATE NOWAIT")
    tx.execute("INSERT INTO items VALUES (%s)", (item,))
    lock.one()


def test_a_failed_read_with_writes_behind_it_fails_its_operation_alone(
    session: PostgresSession, pg_url: str
) -> None:
    """A group commit: the middle operation's lock fails while its INSERT is still unread.
    The statements the server skipped behind it are not a lost connection: the transaction
    goes on on the same connection, and the neighbours commit."""
    session.begin()
    pid = backend_pid(session)
    session.savepoint()
    session.tx().execute("INSERT INTO items VALUES (1)")
    session.end_operation()
    session.release_savepoint()
    session.savepoint()
    with row_locked_elsewhere(pg_url), pytest.raises(psycopg.errors.LockNotAvailable):
        lock_then_insert(session, 2)
    assert not session.transaction_lost()
    session.rollback_to_savepoint()
    session.release_savepoint()
    session.savepoint()
    session.tx().execute("INSERT INTO items VALUES (3)")
    session.end_operation()
    session.release_savepoint()
    session.commit()
    assert items(pg_url) == [1, 3]
    assert backend_pid(session) == pid


def test_a_lone_operation_that_failed_so_keeps_its_connection(session: PostgresSession, pg_url: str) -> None:
    session.begin()
    pid = backend_pid(session)
    with row_locked_elsewhere(pg_url), pytest.raises(psycopg.errors.LockNotAvailable) as failed:
        lock_then_insert(session, 1)
    assert isinstance(session.translate(failed.value), DatabaseBusy)
    session.rollback()
    session.begin()
    lock_then_insert(session, 2)
    session.commit()
    assert items(pg_url) == [2]
    assert backend_pid(session) == pid


def test_a_connection_lost_mid_transaction_is_not_replaced_inside_it(
    session: PostgresSession, pg_url: str
) -> None:
    """Statements after the loss must fail, not start a new transaction on a fresh connection
    whose COMMIT would answer COMMIT having committed nothing of the first part."""
    session.begin()
    tx = session.tx()
    tx.execute("INSERT INTO items VALUES (1)")
    assert tx.one("SELECT 1") == (1,)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (backend_pid(session),))
    with pytest.raises(psycopg.OperationalError) as lost:
        tx.one("SELECT 2")
    assert isinstance(session.translate(lost.value), StorageError)  # and the connection discarded
    with pytest.raises(psycopg.OperationalError, match="lost during the transaction"):
        tx.execute("INSERT INTO items VALUES (2)")
    with pytest.raises(StorageError, match="unknown"):
        session.commit()
    session.rollback()
    assert items(pg_url) == []
    session.begin()  # the next transaction connects again
    session.tx().execute("INSERT INTO items VALUES (3)")
    session.commit()
    assert items(pg_url) == [3]


def test_reading_rows_of_a_statement_without_rows_is_an_error(session: PostgresSession) -> None:
    session.begin()
    tx = session.tx()
    with pytest.raises(psycopg.ProgrammingError, match="no rows"):
        tx.send("INSERT INTO items VALUES (1)").one()
    session.rollback()


def test_connections_past_descriptor_1024_work(session: PostgresSession, pg_url: str) -> None:
    """A busy process has many files open; select() cannot wait on a descriptor past 1023."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:  # the limit of this process only, restored below
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        session.begin()
        assert backend_pid(session) and session._conn is not None
        assert session._conn.pgconn.socket >= 1024
        lock_then_insert(session, 1)
        session.commit()
        session.begin()  # begin looks for a hang-up on the idle connection first
        session.rollback()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert items(pg_url) == [1]


def test_a_statement_whose_prepare_failed_is_not_run_by_that_name(
    session: PostgresSession, pg_url: str
) -> None:
    """The second sending of a text prepares it; if the PREPARE fails, the error is the
    statement's, and the name is forgotten: once the statement can work, it does."""
    query = "SELECT label FROM items WHERE id = %s"
    for _ in range(3):  # unprepared, then the PREPARE that fails, then unprepared again
        session.begin()
        with pytest.raises(psycopg.errors.UndefinedColumn):
            session.tx().send(query, (1,)).one()
        session.rollback()
    assert session._pipe is not None and not session._pipe._prepared  # tried, and forgotten
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("ALTER TABLE items ADD COLUMN label text")
        admin.execute("INSERT INTO items VALUES (1, 'one')")
    for _ in range(2):  # the second time prepared, for real
        session.begin()
        assert session.tx().send(query, (1,)).one() == ("one",)
        session.commit()
    assert session._pipe is not None and len(session._pipe._prepared) == 1
