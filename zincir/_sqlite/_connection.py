"""SQLite connections: opening and validating a file, and the session a database thread drives."""

from __future__ import annotations

import itertools
import logging
import sqlite3
import time
from typing import Any, Final, final

import attrs

from .._errors import DatabaseBusy, StorageError
from . import _migrations

__all__ = ["SQLiteSession", "Tx", "open_connections", "storage_error"]

logger = logging.getLogger("zincir")

BUSY_TIMEOUT_MS: Final = 5000
# The writer checkpoints the WAL every this many commits (about 400 pages for sequential steps;
# SQLite's own automatic checkpoint waits for 1,000).
CHECKPOINT_EVERY_COMMITS: Final = 200
_SQLITE_BUSY_CODES: Final = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}


@final
@attrs.define
class Tx:
    """What an operation sees on the database thread: the connection, and "now"."""

    conn: sqlite3.Connection
    now: int
    """Milliseconds, read when the operation started, after the write lock was taken."""

    def one(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        return self.conn.execute(sql, params).fetchone()

    def all(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        return self.conn.execute(sql, params).fetchall()

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _SQLITE_BUSY_CODES


# SQLite's own busy handler sleeps these steps, then 100 ms at a time.
_BUSY_DELAYS: Final = (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.025, 0.025, 0.05, 0.05) + (0.1,) * (
    BUSY_TIMEOUT_MS // 100
)


def storage_error(exc: sqlite3.Error, path: str) -> StorageError:
    """Translate a sqlite3 error into the zincir error tree."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _SQLITE_BUSY_CODES:
        return DatabaseBusy(f"{path}: the database stayed locked by another writer ({exc})")
    if code is not None and code & 0xFF == sqlite3.SQLITE_FULL:
        return StorageError(f"{path}: the database or disk is full ({exc}); nothing was written")
    return StorageError(f"{path}: {exc}")


class SQLiteSession:
    """One sqlite3 connection, driven by one database thread."""

    def __init__(self, conn: sqlite3.Connection, path: str, clock: Any, *, writer: bool) -> None:
        self._conn = conn
        self._path = path
        self._clock = clock
        self._writer = writer
        self.busy_timeout_ms = BUSY_TIMEOUT_MS
        """How long the writer's BEGIN waits out another connection's write lock."""
        if writer:
            # The writer takes the write lock at BEGIN, so "now" is read after it is held. Its
            # BEGIN may be tried on the Trio thread, which must never sit in SQLite's busy
            # handler: the connection does not wait, and begin() waits in Python instead.
            conn.execute("PRAGMA busy_timeout = 0")
            # SQLite would checkpoint the WAL inside the COMMIT that fills it, on whichever
            # thread commits; the writer thread checkpoints it instead (see maintain()).
            conn.execute("PRAGMA wal_autocheckpoint = 0")
        self._commits = 0  # since the last checkpoint
        self._begin = "BEGIN IMMEDIATE" if writer else "BEGIN"

    def begin(self) -> None:
        if not self._writer:
            self._conn.execute(self._begin)
            return
        # Wait out another process's write lock as SQLite's busy handler would, as long.
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        for delay in itertools.chain(_BUSY_DELAYS, itertools.repeat(0.1)):
            if self.try_begin():
                return
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(delay, left))
        self._conn.execute(self._begin)  # the last try raises the busy error itself

    def try_begin(self) -> bool:
        try:
            self._conn.execute(self._begin)
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                return False
            raise
        return True

    def commit(self) -> None:
        self._conn.execute("COMMIT")
        self._commits += 1

    def maintenance_due(self) -> bool:
        return self._writer and self._commits >= CHECKPOINT_EVERY_COMMITS

    def maintain(self) -> None:
        if self.maintenance_due():
            self._commits = 0
            # PASSIVE: copies what no reader still needs, never waits for one.
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def rollback(self) -> None:
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error:
                logger.exception("rollback on %s failed", self._path)

    def savepoint(self) -> None:
        self._conn.execute("SAVEPOINT operation")

    def rollback_to_savepoint(self) -> None:
        self._conn.execute("ROLLBACK TO operation")

    def release_savepoint(self) -> None:
        self._conn.execute("RELEASE operation")

    def transaction_lost(self) -> bool:
        # After some errors (SQLITE_FULL among them) SQLite rolls the whole transaction back.
        return not self._conn.in_transaction

    def tx(self) -> Tx:
        return Tx(self._conn, self._clock())

    def translate(self, exc: Exception) -> Exception:
        return storage_error(exc, self._path) if isinstance(exc, sqlite3.Error) else exc

    def end_operation(self) -> None:
        pass  # every statement has run when it returns

    def may_run_again(self) -> bool:
        return False  # a local file: a failure is the answer

    def after_commit(self) -> None:
        pass

    def close(self) -> None:
        self._conn.close()


def _open_error(exc: sqlite3.Error, path: str) -> StorageError:
    error = storage_error(exc, path)
    if isinstance(error, DatabaseBusy):
        return error
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if code in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM):
        return StorageError(
            f"cannot open database {path!r}: {exc} (is its directory read-only or missing? a zincir"
            " database needs to create its -wal and -shm files beside it)"
        )
    return StorageError(f"cannot open database {path!r}: {exc}")


def _connect(path: str, synchronous: str) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise _open_error(exc, path) from exc
    try:
        # Wait out another connection's lock rather than mistake a locked file for a foreign one.
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        # Validate before anything else touches the file: a refused file stays unchanged.
        _migrations.applied_version(conn, path)
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
    except sqlite3.Error as exc:
        conn.close()
        raise _open_error(exc, path) from exc
    except BaseException:
        conn.close()
        raise
    return conn


def _enable_wal(conn: sqlite3.Connection, path: str) -> None:
    # Switching a new file to WAL needs a moment of exclusivity; a second process opening
    # the same new file can be told "locked" even with a busy timeout, so try for a while.
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if time.monotonic() > deadline:
                raise storage_error(exc, path) from exc
            time.sleep(0.01)
            continue
        if mode.lower() != "wal":
            raise StorageError(f"{path}: SQLite refused WAL mode (journal mode is {mode})")
        return


def open_connections(
    path: str, synchronous: str, now_ms: int
) -> tuple[sqlite3.Connection, sqlite3.Connection]:
    """The writer (migrated, in WAL mode) and a query-only reader."""
    writer = _connect(path, synchronous)
    try:
        try:
            _enable_wal(writer, path)
            _migrations.migrate(writer, path, now_ms)
        except sqlite3.Error as exc:
            raise storage_error(exc, path) from exc
        reader = _connect(path, synchronous)
        reader.execute("PRAGMA query_only = ON")
    except BaseException:
        writer.close()
        raise
    return writer, reader
