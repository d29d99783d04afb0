"""SQLite connections: opening and validating a file, and the session a database thread drives."""

from __future__ import annotations

import itertools
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, final

from .. import _store
from .._errors import DatabaseBusy, StorageError
from .._payloads import Payloads
from .._sql import Dialect
from .._store._tx import PLACEHOLDERS, judge_lease
from .._store._types import Lease
from .._types import EventType
from .._wakes import Wakes
from . import _migrations

__all__ = ["SQLITE", "SQLiteSession", "Tx", "connect", "is_busy", "open_connections", "storage_error"]

logger = logging.getLogger("zincir")

BUSY_TIMEOUT_MS: Final = 5000
# The writer checkpoints the WAL every this many commits (about 400 pages for sequential steps;
# SQLite's own automatic checkpoint waits for 1,000).
CHECKPOINT_EVERY_COMMITS: Final = 200
_SQLITE_BUSY_CODES: Final = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}


# One writer holds the whole database from BEGIN: no row locks. A LIMIT of -1 is none, an IN
# list takes up to 500 values, the planner takes an index hint where it needs one, and a column
# holds whatever was stored in it (the tables are not STRICT).
SQLITE: Final = Dialect(
    "sqlite", least="min", greatest="max", unlimited=-1, chunk=500, index_hints=True, loose_types=True,
    reclaim_space=True, secure_delete="PRAGMA secure_delete = ON",
)  # fmt: skip

# ``?`` as SQLite's ``?NNN`` (so one value may serve several places) and ``:now`` as the last one.
_RENDERED: dict[str, tuple[str, bool]] = {}


def _render(sql: str) -> tuple[str, bool]:
    """The statement as sqlite3 takes it, and whether the operation's now is its last parameter."""
    rendered = _RENDERED.get(sql)
    if rendered is None:
        if ":now" in sql:
            count = sql.count("?")
            numbers = itertools.count(1)
            text = PLACEHOLDERS.sub(lambda m: f"?{next(numbers) if m.group() == '?' else count + 1}", sql)
            rendered = (text, True)
        else:
            rendered = (sql, False)
        if len(_RENDERED) >= 4096:
            _RENDERED.clear()  # statements built on the fly (IN lists) must not grow it for ever
        _RENDERED[sql] = rendered
    return rendered


@final
class _Done:
    """A statement's answer: it ran when it was sent."""

    __slots__ = ("_count", "_rows")

    def __init__(self, rows: list[Any], count: int) -> None:
        self._rows = rows
        self._count = count

    def one(self) -> Any:
        return self._rows[0] if self._rows else None

    def all(self) -> list[Any]:
        return self._rows

    def count(self) -> int:
        return self._count


@final
class Tx(_store.Tx):
    """What an operation sees on the database thread (see :class:`zincir._store.Tx`): the
    connection, and "now". Each statement runs as it is sent; the writer holds the whole
    database from BEGIN IMMEDIATE, so nothing here locks a row. (A prune's batch, on the bulk
    connection, takes the lock at its first write instead: zincir/_sqlite/_bulk.py.)"""

    dialect = SQLITE

    def __init__(self, conn: sqlite3.Connection, now: int) -> None:
        self.conn = conn
        self._now = now

    @property
    def now(self) -> int:
        """Milliseconds, read when the operation started, after the write lock was taken (on
        the bulk connection: before it, see zincir/_sqlite/_bulk.py)."""
        return self._now

    def _run(self, sql: str, params: Sequence[Any]) -> sqlite3.Cursor:
        text, now = _render(sql)
        return self.conn.execute(text, (*params, self._now) if now else params)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._run(sql, params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self._run(sql, params).fetchall()

    def count(self, sql: str, params: Sequence[Any] = ()) -> int:
        # rowcount, not RETURNING: sqlite3 runs a RETURNING statement several µs slower.
        return self._run(sql, params).rowcount

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self._run(sql, params)

    def count_many(self, sql: str, rows: list[tuple[Any, ...]]) -> int:
        """``sql`` for each row of parameters (one ``executemany``); how many rows it changed."""
        text, now = _render(sql)
        if now:
            rows = [(*row, self._now) for row in rows]
        return self.conn.executemany(text, rows).rowcount

    def send(self, sql: str, params: Sequence[Any] = ()) -> _Done:
        cursor = self._run(sql, params)
        if cursor.description is None:
            return _Done([], cursor.rowcount)
        rows = cursor.fetchall()
        return _Done(rows, len(rows))

    def fence(self, lease: Lease) -> None:
        row = self.conn.execute(
            "SELECT status, lease_owner, lease_epoch, lease_expires_at FROM agent_runs WHERE id = ?",
            (lease.run_id,),
        ).fetchone()
        judge_lease(lease, row, self._now)

    def lock_run(self, run_id: str, columns: str) -> Any:
        return self.conn.execute(f"SELECT {columns} FROM agent_runs WHERE id = ?", (run_id,)).fetchone()

    def _log(
        self, run_id: str, type: EventType, payload: str, key: str | None, sets: str, params: Sequence[Any]
    ) -> _Done:
        seq, parent = self.one(
            f"UPDATE agent_runs SET last_seq = last_seq + 1, updated_at = :now{sets} WHERE id = ?"
            " RETURNING last_seq, parent_run_id",
            (*params, run_id),
        )
        self.conn.execute(
            "INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, seq, type.value, payload, key, self._now),
        )
        return _Done([(seq, parent)], 1)

    def unless_busy(self, end: Callable[..., object], *args: Any) -> bool:
        end(self, *args)  # one writer: no row is ever busy
        return True

    def close(self) -> Wakes | None:
        return self.wakes


def is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _SQLITE_BUSY_CODES


# The writer polls for another process's write lock: first after _POLL_FIRST_S, each wait twice
# the last, never more than _POLL_CAP_S (a try that finds it taken costs a few µs). SQLite's own
# busy handler sleeps 1, 2, 5, 10, 15, 20, 25 ms and on up to 100 ms, so a writer that met a
# short transaction (a prune batch, another process's step) slept well past its end, and could
# sleep through the gap before the next one.
_POLL_FIRST_S: Final = 0.0001
_POLL_CAP_S: Final = 0.00025


def _poll_delays() -> Iterator[float]:
    delay = _POLL_FIRST_S
    while True:
        yield delay
        delay = min(2 * delay, _POLL_CAP_S)


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
        self.payloads = Payloads()
        """How JSON values are stored (open_database's settings; set by open_backend)."""
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
        # Wait out another process's write lock, up to the busy timeout, polling often enough to
        # take it within _POLL_CAP_S of its release. On the writer thread (a begin on the Trio
        # thread only tries: try_begin). "now" is read after the lock is taken, so a lease is
        # judged at the moment of the write however long this waited.
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        for delay in _poll_delays():
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
            if is_busy(exc):
                return False
            raise
        return True

    def commit(self, wakes: Wakes | None = None) -> None:
        self._conn.execute("COMMIT")  # wakes: nothing to tell other processes (see _watcher)
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

    def share(self) -> None:
        pass  # BEGIN IMMEDIATE made it one transaction already

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
        tx = Tx(self._conn, self._clock())
        tx.payloads = self.payloads
        return tx

    def translate(self, exc: Exception) -> Exception:
        return storage_error(exc, self._path) if isinstance(exc, sqlite3.Error) else exc

    def end_operation(self) -> None:
        pass  # every statement has run when it returns

    def may_run_again(self) -> bool:
        return False  # a local file: a failure is the answer

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


def connect(path: str, synchronous: str) -> sqlite3.Connection:
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
    writer = connect(path, synchronous)
    try:
        try:
            if _migrations.applied_version(writer, path) == 0:
                # A new file: pages freed by a prune go back to the file system (docs/retention.md).
                # SQLite takes this only before the file's first table.
                writer.execute("PRAGMA auto_vacuum = INCREMENTAL")
            _enable_wal(writer, path)
            _migrations.migrate(writer, path, now_ms)
        except sqlite3.Error as exc:
            raise storage_error(exc, path) from exc
        reader = connect(path, synchronous)
        reader.execute("PRAGMA query_only = ON")
    except BaseException:
        writer.close()
        raise
    return writer, reader
