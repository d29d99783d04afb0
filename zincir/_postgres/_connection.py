"""PostgreSQL connections (psycopg 3, sync API): one per database thread, reconnected on loss.

psycopg's async API needs asyncio; zincir runs on Trio, so every connection belongs to one
dedicated thread (a psycopg connection is only safe when one thread uses it) and is driven in
autocommit mode with explicit transaction statements, as the group commit needs.
"""

from __future__ import annotations

import contextlib
import logging
import select
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import ConnStatus, TransactionStatus

from .._errors import DatabaseBusy, DatabaseUnavailable, StorageError, TransientConflict
from .._payloads import Payloads
from .._wakes import Wakes
from ._pipe import Pending, Pipe
from ._tx import Tx

__all__ = ["Echo", "PostgresSession", "connect", "redact", "storage_error"]

logger = logging.getLogger("zincir")

# Per connection: a statement or a lock wait that takes this long is a fault, not a wait; an
# idle transaction (a stuck thread) must not hold row locks for ever.
_SESSION_SETTINGS: Final = (
    "SET statement_timeout = '30s'",
    "SET lock_timeout = '10s'",
    "SET idle_in_transaction_session_timeout = '60s'",
)
# A writer never waits for a row: its operations lock rows NOWAIT (see zincir/_store/_tx.py), and this bounds
# any other lock wait, which would hold up the whole group-commit batch, the renewals of other
# runs' leases included. An operation that times out fails alone and is tried again.
_WRITER_LOCK_TIMEOUT: Final = "SET lock_timeout = '100ms'"
_CONNECT_TIMEOUT_S: Final = 10
# libpq's TCP settings, so that a dead peer (a crashed host, a cut network) is noticed at all: a
# connection silent for 10 s is probed every 5 s, and data the server has not acknowledged for
# 30 s (a probe, or a statement sent) ends it. Nothing user-facing depends on them: a lease
# holder stops by its own deadline long before (docs/leases.md); these only free the thread that
# waits on the connection, so that it reconnects. A server that is merely slow (a long
# statement, a lock wait) still acknowledges: the kernel answers for it. A URL that sets any of
# these keeps its own value.
_TCP_SETTINGS: Final = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}
# The reader's transactions: every read runs in one snapshot, and writes nothing. Set once for
# the session, this makes a read's statements, all of them sent before the pipeline's next sync,
# one implicit transaction of that kind, without BEGIN and COMMIT: two statements fewer per read.
_READER_TRANSACTIONS: Final = (
    "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
)
CLAIMABLE_CHANNEL: Final = "zincir_claimable"
INBOX_CHANNEL: Final = "zincir_inbox"
# A run's child ended: news for the run's waits (a join), not for its owner's heartbeat.
CHILD_ENDED_CHANNEL: Final = "zincir_child_ended"
# A run somebody waits for (zincir.wait_for_end: a row of run_waiters) ended; payload: its id.
RUN_ENDED_CHANNEL: Final = "zincir_run_ended"
# A run's stream has new chunks (docs/streams.md); payload: the run's id.
STREAM_CHANNEL: Final = "zincir_stream"

Clock = Callable[[], int]


class Echo:
    """The backend pids of this database's writer connections, whose notifications the listener
    skips: this process heard of its own writes already, when they committed (see _wakes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pids: frozenset[int] = frozenset()

    def own(self, pid: int) -> None:
        with self._lock:
            self._pids = self._pids | {pid}

    def disown(self, pid: int) -> None:
        with self._lock:
            self._pids = self._pids - {pid}

    def sent_here(self, pid: int) -> bool:
        return pid in self._pids


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


def _unusable(conn: psycopg.Connection[Any] | None) -> bool:
    return conn is None or conn.broken or conn.closed or conn.pgconn.status == ConnStatus.BAD


def _connection_lost(exc: psycopg.Error, conn: psycopg.Connection[Any] | None) -> bool:
    """Whether the error took the connection with it. A deadlock, lock or statement timeout
    is an OperationalError too, but the connection stays usable (roll back to the savepoint)."""
    if _unusable(conn):
        return True
    if isinstance(exc, pg_errors.PipelineAborted):
        return False  # a statement skipped behind one that failed: that failure is the story
    state = exc.sqlstate or ""
    return (
        state.startswith("08")
        or state in _SESSION_ENDING_STATES
        or (not state and isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError))
    )


def connect(url: str, *, application_name: str) -> psycopg.Connection[Any]:
    given = psycopg.conninfo.conninfo_to_dict(url)
    tcp = {name: value for name, value in _TCP_SETTINGS.items() if name not in given}
    conn = psycopg.connect(
        psycopg.conninfo.make_conninfo(url, **tcp),
        autocommit=True,
        connect_timeout=_CONNECT_TIMEOUT_S,
        application_name=application_name,
    )
    for statement in _SESSION_SETTINGS:
        conn.execute(statement)
    return conn


class PostgresSession:
    """One psycopg connection driven by one database thread; reconnects after a loss.

    The connection stays in pipeline mode, so that BEGIN, the SAVEPOINTs of a group commit and
    every statement whose answer nobody reads travel with the next one that is read: the
    round trips of a transaction are its reads plus one for the commit (with the NOTIFYs just
    before it). A transaction of one operation sends no BEGIN and no COMMIT at all: it is the
    implicit transaction of the statements before a sync, which the sync commits."""

    def __init__(
        self, url: str, name: str, *, read_only: bool, clock: Clock | None, echo: Echo | None = None
    ) -> None:
        self._url = url
        self._echo = echo
        self._pid: int | None = None  # the backend's, while connected
        self._name = name
        self._where = f"{redact(url)} ({name})"
        self._read_only = read_only
        self.payloads = Payloads()
        """How JSON values are stored (open_database's settings; set by open_backend)."""
        self._clock = clock
        self._conn: psycopg.Connection[Any] | None = None
        self._pipe: Pipe | None = None
        # Statements sent on this connection, and how many of them (the first ones) have been
        # answered: a read waits for every statement sent before it.
        self._sent = self._answered = 0
        self._in_transaction = False  # begun, and neither committed nor rolled back yet
        # Whether BEGIN was sent: until then the transaction is implicit (see begin()).
        self._block = False
        self._commit_sent = False
        self._began_on_idle = False  # the transaction began on a connection left idle before
        self._lost_before_commit = False

    def _connection(self) -> psycopg.Connection[Any]:
        if _unusable(self._conn):
            self._discard()
            conn = connect(self._url, application_name=f"zincir {self._name}")
            conn.execute(_READER_TRANSACTIONS if self._read_only else _WRITER_LOCK_TIMEOUT)
            self._pipe = Pipe(conn)
            self._conn = conn
            if self._echo is not None:
                self._pid = conn.info.backend_pid
                self._echo.own(self._pid)
        assert self._conn is not None
        return self._conn

    def _discard(self) -> None:
        if self._in_transaction and not self._commit_sent:
            self._lost_before_commit = True  # so the server rolled it back: nothing happened
        self._in_transaction = False
        if self._echo is not None and self._pid is not None:
            self._echo.disown(self._pid)
            self._pid = None
        self._pipe = None
        self._sent = self._answered = 0
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None

    def _live_pipe(self) -> Pipe:
        """The open transaction's pipe. Never a new connection: statements sent on one would
        run outside the transaction (a COMMIT there answers COMMIT, having committed nothing)."""
        if self._pipe is None or _unusable(self._conn):
            raise psycopg.OperationalError(f"{self._where}: the connection was lost during the transaction")
        return self._pipe

    def send(self, sql: Any, params: Any = (), *, prepare: bool = True) -> Pending:
        """Send a statement on the connection's pipeline (counted: see :attr:`unanswered`)."""
        pending = self._live_pipe().send(sql, params, prepare=prepare)
        self._sent += 1
        return pending

    @property
    def sent(self) -> int:
        """How many statements were sent on this connection (the last one's number)."""
        return self._sent

    def answered(self, number: int) -> None:
        self._answered = max(self._answered, number)

    @property
    def unanswered(self) -> bool:
        """Whether statements were sent whose outcome has not arrived yet."""
        return self._sent > self._answered

    def settle(self, *, always: bool = False) -> None:
        """Wait for the outcome of every statement sent; raise the error of one that failed.
        ``always`` syncs even if nothing is outstanding: in pipeline mode the connection learns
        the transaction's status only from a sync."""
        pipe = self._pipe
        if pipe is not None and (always or self.unanswered or pipe.aborted):
            self._answered = self._sent
            pipe.sync()

    def settle_quietly(self, *, always: bool = False) -> None:
        """Settle after a failure was reported already: only a lost connection matters now."""
        try:
            self.settle(always=always)
        except psycopg.Error as exc:
            if _connection_lost(exc, self._conn):
                self._discard()

    def maintenance_due(self) -> bool:
        return False

    def maintain(self) -> None:
        pass

    def try_begin(self) -> bool:
        # BEGIN takes no lock on PostgreSQL; its writers are never run inline (a round trip
        # to a server is no work for the Trio thread), so this is only the Protocol's.
        self.begin()
        return True

    def begin(self) -> None:
        self._commit_sent = self._lost_before_commit = False
        if self._conn is not None and _hung_up(self._conn):
            # An idle connection has nothing to say unless the server ended it (a restart,
            # pg_terminate_backend): start on a fresh one rather than fail the first read.
            self._discard()
        self._began_on_idle = self._conn is not None
        # Connect first: connecting discards the old connection and with it the transaction
        # flag, and a transaction marked as not begun is never rolled back (it kept its locks).
        self._connection()
        self._in_transaction = True  # from here, a lost connection is a transaction lost
        # No BEGIN yet: in pipeline mode every statement sent before the next sync belongs to one
        # implicit transaction, which that sync commits (reads wait for their rows, never for a
        # sync). A lone operation then costs its own statements and one sync, two statements
        # fewer than BEGIN ... COMMIT; a savepoint (a group commit's) opens the block first.
        self._block = False

    def open_block(self) -> None:
        """Make the open transaction an explicit block, if it is not one yet (savepoints need
        it). BEGIN inside an implicit transaction keeps what it did so far."""
        if self._block or self._read_only:
            return
        self.send("BEGIN")
        self._block = True

    def may_run_again(self) -> bool:
        """Whether the transaction that just failed may run again from its start: its
        connection, idle before it began, was lost before COMMIT was sent, so the server rolled
        it back (the server may have ended the idle connection just before; a fresh connection
        failing as well says the server is gone, and trying again would not help)."""
        again = self._lost_before_commit and self._began_on_idle
        self._lost_before_commit = False
        return again

    def commit(self, wakes: Wakes | None = None) -> None:
        """The NOTIFYs for what the transaction wakes, then its COMMIT, in one round trip."""
        conn = self._conn
        if conn is None:  # lost (and discarded) during the transaction: never a silent success
            lost = psycopg.OperationalError("the connection was lost during the transaction")
            raise self._outcome_unknown(lost, "before COMMIT")
        if self._read_only:  # the sync ends the read's implicit transaction
            self.settle(always=True)
            self._in_transaction = False
            return
        if not self._block:
            self._commit_implicit(conn, wakes)
            return
        # In a transaction that failed, COMMIT answers ROLLBACK without an error: its status
        # message, not the absence of an error, says whether it committed. In pipeline mode
        # sending may raise too (it reads the answers that came meanwhile), so it is all inside.
        try:
            self._send_notifications(wakes)
            self._commit_sent = True
            committing = self.send("COMMIT")
            self.settle()
        except psycopg.Error as exc:
            if _connection_lost(exc, conn):
                raise self._outcome_unknown(exc, "during COMMIT") from exc
            raise  # the server answered: nothing was committed (COMMIT is the last statement)
        if committing.status != "COMMIT":
            raise RuntimeError(f"COMMIT answered {committing.status!r}: nothing was committed")
        self._in_transaction = False

    def _commit_implicit(self, conn: psycopg.Connection[Any], wakes: Wakes | None) -> None:
        """Commit a transaction that never sent BEGIN: the sync commits it, unless a statement
        of it failed, and then the server rolled all of it back and the sync raises that error."""
        try:
            self._send_notifications(wakes)
            self._commit_sent = True
            self.settle(always=True)
        except psycopg.Error as exc:
            if _connection_lost(exc, conn):
                raise self._outcome_unknown(exc, "while the transaction committed") from exc
            self._in_transaction = False  # ended by the server, rolled back
            raise
        self._in_transaction = False

    def _outcome_unknown(self, exc: psycopg.Error, when: str) -> DatabaseUnavailable:
        """The connection died as a transaction committed: the server may or may not have
        committed it, so never report a success that cannot be known."""
        self._discard()
        return DatabaseUnavailable(
            f"{self._where}: the connection failed {when}, so whether it committed is unknown ({exc})"
        )

    def _send_notifications(self, wakes: Wakes | None) -> None:
        # Inside the write transaction, right before it commits. Sent after COMMIT, each NOTIFY
        # was a transaction of its own, with an XID and a WAL flush of its own: a second durable
        # commit per write that wakes anyone. Inside, the commits of notifying transactions
        # take PostgreSQL's notification lock in turn, as those extra commits did. A hint only;
        # workers poll as well, and a transaction rolled back sends none.
        if not wakes:
            return
        if wakes.claimable:
            self.send(f"NOTIFY {CLAIMABLE_CHANNEL}")
        told = [(INBOX_CHANNEL, run_id) for run_id in sorted(wakes.inbox)]
        # A run told of all news already needs no word for its waits alone.
        told += [(CHILD_ENDED_CHANNEL, run_id) for run_id in sorted(wakes.waits - wakes.inbox)]
        told += [(RUN_ENDED_CHANNEL, run_id) for run_id in sorted(wakes.ended)]
        told += [(STREAM_CHANNEL, run_id) for run_id in sorted(wakes.streams)]
        for channel, payload in told:
            self.send("SELECT pg_notify(%s, %s)", (channel, payload))

    def rollback(self) -> None:
        if not self._in_transaction:
            return
        self._in_transaction = False
        conn = self._conn
        if not self._read_only and not self._block:
            self._rollback_implicit(conn)
            return
        self.settle_quietly(always=self._read_only)  # a read's sync ends its transaction
        if self._read_only or _unusable(conn):
            return  # the server ended the transaction with the connection
        try:
            self.send("ROLLBACK")
            self.settle()
        except psycopg.Error:
            logger.exception("rollback on %s failed", self._where)
            self._discard()

    def _rollback_implicit(self, conn: psycopg.Connection[Any] | None) -> None:
        """Roll back a transaction that never sent BEGIN. ROLLBACK must go before the sync, which
        would commit whatever succeeded so far (an operation that raised after its writes, a
        lease it found lost, say). If it cannot be sent, a statement failed already (the server
        skips everything up to the sync, and the sync ends the transaction rolled back) or the
        connection is gone (and the server rolled back with it)."""
        if _unusable(conn):
            return
        pipe = self._pipe
        if pipe is not None and not pipe.aborted:
            with contextlib.suppress(psycopg.Error):
                self.send("ROLLBACK")
        self.settle_quietly(always=True)  # a connection found lost here is discarded

    def share(self) -> None:
        self.open_block()

    def savepoint(self) -> None:
        self.open_block()
        self.send("SAVEPOINT operation")

    def rollback_to_savepoint(self) -> None:
        self.settle_quietly()
        self.send("ROLLBACK TO SAVEPOINT operation")
        self.settle()

    def release_savepoint(self) -> None:
        self.send("RELEASE SAVEPOINT operation")

    def end_operation(self) -> None:
        """Before the next operation of a group commit: this one's statements must have
        succeeded, so that a failure is reported to the operation that caused it."""
        self.settle()

    def transaction_lost(self) -> bool:
        self.settle_quietly(always=True)
        conn = self._conn
        if conn is None or _unusable(conn):
            return True
        return conn.info.transaction_status == TransactionStatus.IDLE

    def tx(self) -> Tx:
        self._live_pipe()
        if self._clock is not None:  # a test's fake server clock, read by zincir_now_ms()
            self.send("SELECT set_config('zincir.now_ms', %s, true)", (str(self._clock()),))
        tx = Tx(self, read_only=self._read_only)
        tx.payloads = self.payloads
        return tx

    def translate(self, exc: Exception) -> Exception:
        if isinstance(exc, psycopg.Error):
            if _connection_lost(exc, self._conn):
                self._discard()
            return storage_error(exc, self._where)
        return exc

    def close(self) -> None:
        self._discard()


def _hung_up(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server sent anything to an idle connection: it only does so to end it."""
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, psycopg.Error):
        return True


def server_clock_offset(conn: psycopg.Connection[Any]) -> int:
    """How far the server's clock is ahead of this machine's, in ms (the midpoint estimate)."""
    before = time.time_ns() // 1_000_000
    (server,) = conn.execute("SELECT zincir_now_ms()").fetchone() or (before,)
    after = time.time_ns() // 1_000_000
    return int(server) - (before + after) // 2
