"""PostgreSQL connections (psycopg 3, sync API): one per database thread, reconnected on loss.

psycopg's async API needs asyncio; zincir runs on Trio, so every connection belongs to one
dedicated thread (a psycopg connection is only safe when one thread uses it) and is driven in
autocommit mode with explicit transaction statements, as the group commit needs.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Final

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus

from .._errors import DatabaseBusy, DatabaseUnavailable, StorageError, TransientConflict

__all__ = ["PostgresSession", "Tx", "connect", "redact", "storage_error"]

logger = logging.getLogger("zincir")

# Per connection: a statement or a lock wait that takes this long is a fault, not a wait; an
# idle transaction (a stuck thread) must not hold row locks for ever.
_SESSION_SETTINGS: Final = (
    "SET statement_timeout = '30s'",
    "SET lock_timeout = '10s'",
    "SET idle_in_transaction_session_timeout = '60s'",
)
_CONNECT_TIMEOUT_S: Final = 10
CLAIMABLE_CHANNEL: Final = "zincir_claimable"
INBOX_CHANNEL: Final = "zincir_inbox"

Clock = Callable[[], int]


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparsable PostgreSQL URL>"
    host, port, dbname, user = (str(info.get(k) or "") for k in ("host", "port", "dbname", "user"))
    return f"postgresql://{user + '@' if user else ''}{host}{':' + port if port else ''}/{dbname}"


def storage_error(exc: psycopg.Error, where: str) -> StorageError:
    """Translate a psycopg error into the zincir error tree."""
    if isinstance(
        exc, pg_errors.SerializationFailure | pg_errors.DeadlockDetected | pg_errors.LockNotAvailable
    ):
        return TransientConflict(f"{where}: {exc}; retrying may succeed")
    if isinstance(exc, pg_errors.QueryCanceled):
        return DatabaseBusy(f"{where}: the statement took too long ({exc})")
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return DatabaseUnavailable(f"{where}: the connection to the server failed ({exc})")
    return StorageError(f"{where}: {exc}")


# SQLSTATEs that end the session, not just the statement: connection exceptions (class 08),
# and the server shutting down or restarting (57P01 to 57P03).
_SESSION_ENDING_STATES: Final = frozenset({"57P01", "57P02", "57P03"})


def _connection_lost(exc: psycopg.Error, conn: psycopg.Connection[Any] | None) -> bool:
    """Whether the error took the connection with it. A deadlock, lock or statement timeout
    is an OperationalError too, but the connection stays usable (roll back to the savepoint)."""
    if conn is None or conn.broken or conn.closed:
        return True
    state = exc.sqlstate or ""
    return (
        state.startswith("08")
        or state in _SESSION_ENDING_STATES
        or (not state and isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError))
    )


def connect(url: str, *, application_name: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(
        url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S, application_name=application_name
    )
    for statement in _SESSION_SETTINGS:
        conn.execute(statement)
    return conn


class Tx:
    """What an operation sees: statements on the connection, and the server's "now"."""

    def __init__(self, conn: psycopg.Connection[Any], session: PostgresSession) -> None:
        self._conn = conn
        self._session = session
        self._now: int | None = None

    @property
    def now(self) -> int:
        """The server clock in integer ms, read once per operation (or set by the statement
        that locked the run's row)."""
        if self._now is None:
            (self._now,) = self.one("SELECT zincir_now_ms()")
        assert self._now is not None
        return self._now

    def set_now(self, now: int) -> None:
        if self._now is None:
            self._now = now

    def one(self, sql: str, params: Any = ()) -> Any:
        return self._conn.execute(sql, params).fetchone()

    def all(self, sql: str, params: Any = ()) -> list[Any]:
        return self._conn.execute(sql, params).fetchall()

    def execute(self, sql: str, params: Any = ()) -> None:
        self._conn.execute(sql, params)

    def notify_claimable(self) -> None:
        """After this transaction commits, tell listening workers that a run became claimable."""
        self._session.notify_pending = True

    def notify_inbox(self, run_id: str) -> None:
        """After this transaction commits, tell a waiting owner anywhere that it has a signal."""
        self._session.signalled.add(run_id)


class PostgresSession:
    """One psycopg connection driven by one database thread; reconnects after a loss."""

    def __init__(self, url: str, name: str, *, read_only: bool, clock: Clock | None) -> None:
        self._url = url
        self._name = name
        self._where = f"{redact(url)} ({name})"
        self._begin = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if read_only else "BEGIN"
        self._clock = clock
        self._conn: psycopg.Connection[Any] | None = None
        self.notify_pending = False
        self.signalled: set[str] = set()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.broken or self._conn.closed:
            self._discard()
            self._conn = connect(self._url, application_name=f"zincir {self._name}")
        return self._conn

    def _discard(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None

    def begin(self) -> None:
        self.notify_pending = False
        self.signalled.clear()
        reused = self._conn is not None
        try:
            self._connection().execute(self._begin)
        except (psycopg.OperationalError, psycopg.InterfaceError):
            if not reused:
                raise
            # The server dropped the idle connection (a restart, pg_terminate_backend): nothing
            # was sent but BEGIN, so a fresh connection is safe to try once.
            self._discard()
            self._connection().execute(self._begin)

    def commit(self) -> None:
        assert self._conn is not None
        if self._conn.info.transaction_status == TransactionStatus.INERROR:
            # COMMIT would answer ROLLBACK without an error: never let that pass as a commit.
            raise RuntimeError("the transaction failed before COMMIT")
        try:
            self._conn.execute("COMMIT")
        except psycopg.Error as exc:
            if not _connection_lost(exc, self._conn):
                raise  # the server answered: it rolled back (a deadlock, a serialization failure)
            self._discard()
            # The server may or may not have committed: never report a success we cannot know.
            raise DatabaseUnavailable(
                f"{self._where}: the connection failed during COMMIT, so whether it committed is"
                f" unknown ({exc})"
            ) from exc

    def rollback(self) -> None:
        conn = self._conn
        if conn is None or conn.broken or conn.closed:
            return
        if conn.info.transaction_status != TransactionStatus.IDLE:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                logger.exception("rollback on %s failed", self._where)
                self._discard()

    def savepoint(self) -> None:
        self._connection().execute("SAVEPOINT operation")

    def rollback_to_savepoint(self) -> None:
        self._connection().execute("ROLLBACK TO SAVEPOINT operation")

    def release_savepoint(self) -> None:
        self._connection().execute("RELEASE SAVEPOINT operation")

    def transaction_lost(self) -> bool:
        conn = self._conn
        return conn is None or conn.broken or conn.info.transaction_status == TransactionStatus.IDLE

    def tx(self) -> Tx:
        conn = self._connection()
        if self._clock is not None:  # a test's fake server clock, read by zincir_now_ms()
            conn.execute("SELECT set_config('zincir.now_ms', %s, true)", (str(self._clock()),))
        return Tx(conn, self)

    def translate(self, exc: Exception) -> Exception:
        if isinstance(exc, psycopg.Error):
            if _connection_lost(exc, self._conn):
                self._discard()
            return storage_error(exc, self._where)
        return exc

    def after_commit(self) -> None:
        # NOTIFY outside the write transaction: inside it, every commit would take the global
        # notification lock. A hint only; workers poll as well.
        if self.notify_pending:
            self.notify_pending = False
            self._connection().execute(f"NOTIFY {CLAIMABLE_CHANNEL}")
        for run_id in sorted(self.signalled):
            self._connection().execute("SELECT pg_notify(%s, %s)", (INBOX_CHANNEL, run_id))
        self.signalled.clear()

    def close(self) -> None:
        self._discard()


def server_clock_offset(conn: psycopg.Connection[Any]) -> int:
    """How far the server's clock is ahead of this machine's, in ms (the midpoint estimate)."""
    before = time.time_ns() // 1_000_000
    (server,) = conn.execute("SELECT zincir_now_ms()").fetchone() or (before,)
    after = time.time_ns() // 1_000_000
    return int(server) - (before + after) // 2
