"""The database: one SQLite file, one writer thread with group commit, one reader thread.

Trio tasks never touch ``sqlite3`` themselves. They hand an *operation* (a plain function of a
:class:`Tx`) to a long-lived thread through a queue and sleep until the thread reschedules them
with the outcome. The writer thread drains its queue and runs everything it found in ONE
``BEGIN IMMEDIATE`` transaction, each operation inside its own SAVEPOINT, so a failing operation
gets its own error while its neighbours still commit, and a whole batch pays for one fsync.
A caller's ``await`` returns only after the COMMIT that holds its operation.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Final, Literal, TypeVar, final

import attrs
import outcome
import trio

from . import _migrations, _store
from ._errors import DatabaseBusy, DatabaseClosed, InvalidArgument, StorageError
from ._types import DurableState, Event, RunRecord, RunStatus
from ._validation import canonical_run_id, check_int, check_text

__all__ = ["Clock", "Database", "Tx", "open_database", "wall_clock_ms"]

logger = logging.getLogger("zincir")

T = TypeVar("T")
Clock = Callable[[], int]
"""A clock returns the current time in integer Unix milliseconds; it must be thread-safe."""

DEFAULT_MAX_PAYLOAD_BYTES: Final = 16 * 1024 * 1024
_BUSY_TIMEOUT_MS: Final = 5000
# Bounds one transaction, so a flood of writers cannot make a single commit arbitrarily large.
_MAX_BATCH: Final = 512
_SQLITE_BUSY_CODES: Final = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}


def wall_clock_ms() -> int:
    """The default clock: wall-clock time, shared by every process that opens the file."""
    return time.time_ns() // 1_000_000


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


Operation = Callable[..., Any]


@attrs.define(eq=False)
class _Request:
    fn: Operation | None  # None asks the thread to finish its queue and close
    args: tuple[Any, ...]
    task: trio.lowlevel.Task
    result: outcome.Outcome[Any] | None = None


def storage_error(exc: sqlite3.Error, path: str) -> StorageError:
    """Translate a sqlite3 error into the zincir error tree."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _SQLITE_BUSY_CODES:
        return DatabaseBusy(f"{path}: the database stayed locked by another writer ({exc})")
    if code is not None and code & 0xFF == sqlite3.SQLITE_FULL:
        return StorageError(f"{path}: the database or disk is full ({exc}); nothing was written")
    return StorageError(f"{path}: {exc}")


class _Worker:
    """A thread that owns one connection and runs submitted operations in transactions."""

    def __init__(
        self,
        *,
        name: str,
        conn: sqlite3.Connection,
        path: str,
        clock: Clock,
        token: trio.lowlevel.TrioToken,
        group_commit: bool,
    ) -> None:
        self._conn = conn
        self._path = path
        self._clock = clock
        self._token = token
        self._group_commit = group_commit
        self._queue: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        # Set once if the thread dies; from then on every request fails at once (under the lock,
        # so that none can slip into the queue after the thread emptied it for the last time).
        self._death: str | None = None
        self._lock = threading.Lock()
        self._batch: list[_Request] = []  # taken from the queue and not answered yet
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, request: _Request) -> None:
        with self._lock:
            if self._death is not None:
                raise StorageError(self._death)
            self._queue.put(request)

    def join(self) -> None:
        self._thread.join()

    # -- on the thread --------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            self._serve_until_closed()
        except BaseException as exc:
            self._die(exc)

    def _die(self, exc: BaseException) -> None:
        """Whatever killed the thread: fail every request it holds or will ever get."""
        logger.critical("the database thread for %s stopped unexpectedly", self._path, exc_info=exc)
        death = (
            f"{self._path}: the database thread stopped unexpectedly ({exc!r}); nothing in flight"
            " was committed, and the database must be reopened"
        )
        with self._lock:
            self._death = death
            stranded = self._batch
            while True:
                try:
                    stranded.append(self._queue.get_nowait())
                except queue.Empty:
                    break
        self._conn.close()  # rolls back the transaction it died in, if any
        for request in stranded:
            request.result = outcome.Value(None) if request.fn is None else outcome.Error(StorageError(death))
        if stranded:
            with contextlib.suppress(trio.RunFinishedError):  # nobody is left to tell
                self._reply(stranded)

    def _serve_until_closed(self) -> None:
        closing = False
        while not closing:
            batch = self._batch = [self._queue.get()]
            while len(batch) < _MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            work = [r for r in batch if r.fn is not None]
            closing = len(work) < len(batch)
            if work:
                self._run_batch(work)
            if closing:
                self._close()
                for request in batch:
                    if request.fn is None:
                        request.result = outcome.Value(None)
            self._batch = []
            self._reply(batch)

    def _close(self) -> None:
        try:
            self._conn.close()
        except sqlite3.Error:  # pragma: no cover - closing a healthy connection does not fail
            logger.exception("closing %s failed", self._path)

    def _reply(self, batch: list[_Request]) -> None:
        def wake() -> None:
            for request in batch:
                assert request.result is not None
                trio.lowlevel.reschedule(request.task, request.result)

        # close() waits for this thread's last reply and joins it: the Trio run is still there.
        self._token.run_sync_soon(wake)

    def _run_batch(self, batch: list[_Request]) -> None:
        if len(batch) == 1 or not self._group_commit:
            for request in batch:
                self._run_alone(request)
        elif not self._run_together(batch):
            # The shared transaction itself failed (commit error, or SQLite rolled it back):
            # give every operation its own transaction so each gets its own outcome.
            for request in batch:
                self._run_alone(request)

    def _begin(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE" if self._group_commit else "BEGIN")

    def _call(self, request: _Request) -> outcome.Outcome[Any]:
        assert request.fn is not None
        try:
            return outcome.Value(request.fn(Tx(self._conn, self._clock()), *request.args))
        except sqlite3.Error as exc:
            return outcome.Error(storage_error(exc, self._path))
        except Exception as exc:
            return outcome.Error(exc)

    def _run_alone(self, request: _Request) -> None:
        try:
            self._begin()
        except sqlite3.Error as exc:
            request.result = outcome.Error(storage_error(exc, self._path))
            return
        result = self._call(request)
        if isinstance(result, outcome.Value):
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                result = outcome.Error(storage_error(exc, self._path))
        # After some errors (SQLITE_FULL among them) SQLite has already rolled back; the
        # operation's own error is the one to report either way.
        self._rollback_quietly()
        request.result = result

    def _run_together(self, batch: list[_Request]) -> bool:
        try:
            self._begin()
        except sqlite3.Error as exc:
            for request in batch:
                request.result = outcome.Error(storage_error(exc, self._path))
            return True
        try:
            for request in batch:
                self._conn.execute("SAVEPOINT operation")
                request.result = self._call(request)
                if isinstance(request.result, outcome.Error):
                    if not self._conn.in_transaction:
                        return False
                    self._conn.execute("ROLLBACK TO operation")
                self._conn.execute("RELEASE operation")
            self._conn.execute("COMMIT")
            return True
        except sqlite3.Error:
            self._rollback_quietly()
            return False

    def _rollback_quietly(self) -> None:
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error:
                logger.exception("rollback on %s failed", self._path)


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
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
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
    deadline = time.monotonic() + _BUSY_TIMEOUT_MS / 1000
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


def _open_connections(path: str, synchronous: str, clock: Clock) -> tuple[sqlite3.Connection, ...]:
    writer = _connect(path, synchronous)
    try:
        try:
            _enable_wal(writer, path)
            _migrations.migrate(writer, path, clock())
        except sqlite3.Error as exc:
            raise storage_error(exc, path) from exc
        reader = _connect(path, synchronous)
        reader.execute("PRAGMA query_only = ON")
    except BaseException:
        writer.close()
        raise
    return writer, reader


@final
class Database:
    """An open zincir database. Get one from :func:`open_database`; it has no public constructor.

    It belongs to the Trio run that opened it.
    """

    path: str
    """The file's path, as given."""
    clock: Clock
    """The clock every lease and timer of this database is measured with (integer ms)."""
    max_payload_bytes: int
    """The largest JSON payload, in bytes of UTF-8, that one value may take."""
    _writer: _Worker
    _reader: _Worker
    _closed: bool
    _claim_listeners: set[Callable[[], None]]

    def __init__(self, *_: object, **__: object) -> None:
        raise TypeError("use zincir.open_database() to open a Database")

    @classmethod
    def _create(
        cls,
        path: str,
        writer: _Worker,
        reader: _Worker,
        clock: Clock,
        max_payload_bytes: int,
    ) -> Database:
        self = object.__new__(cls)
        self.path = path
        self.clock = clock
        self.max_payload_bytes = max_payload_bytes
        self._writer = writer
        self._reader = reader
        self._closed = False
        self._claim_listeners = set()
        return self

    def __repr__(self) -> str:
        return f"<zincir.Database {self.path!r}{' closed' if self._closed else ''}>"

    async def state(self, run_id: str) -> DurableState:
        """Any run's durable state (as :meth:`Run.state`), read without owning the run."""
        run, checkpoint, events = await self._read(_store.durable_state, canonical_run_id(run_id))
        return DurableState(run, checkpoint, events)

    async def events(self, run_id: str, *, after: int = -1, limit: int | None = None) -> list[Event]:
        """A run's events with seq > ``after``, in order (at most ``limit`` of them)."""
        check_int(after, "after (a seq)", minimum=-1)
        if limit is not None:
            check_int(limit, "limit (or None)", minimum=1)
        run_id = canonical_run_id(run_id)
        return await self._read(_store.events_page, run_id, after, limit)

    async def runs(
        self, *, status: RunStatus | str | None = None, role: str | None = None, limit: int = 100
    ) -> list[RunRecord]:
        """Runs, oldest first, optionally only those with ``status`` and/or ``role``."""
        if status is not None:
            try:
                status = RunStatus(status)
            except ValueError:
                raise InvalidArgument(f"unknown run status {status!r}") from None
        if role is not None:
            check_text(role, "role")
        check_int(limit, "limit", minimum=1)
        return await self._read(_store.list_runs, status, role, limit)

    def _announce_claimable(self) -> None:
        """A run became claimable: wake the resume workers of this process at once."""
        for listener in list(self._claim_listeners):
            listener()

    async def _write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(tx, *args)`` in the next group-commit transaction; return after COMMIT."""
        result: T = await self._submit(self._writer, fn, args)
        return result

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(tx, *args)`` in a read transaction: one consistent snapshot."""
        result: T = await self._submit(self._reader, fn, args)
        return result

    async def _submit(self, worker: _Worker, fn: Operation | None, args: tuple[Any, ...]) -> Any:
        # A caller cancelled before submitting writes nothing; once submitted, the operation is
        # never abandoned: the caller waits for its outcome, and Trio delivers the cancellation
        # at the caller's next checkpoint.
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._closed:
            raise DatabaseClosed(f"database {self.path!r} is closed")
        worker.submit(_Request(fn, args, trio.lowlevel.current_task()))
        return await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    async def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            for worker in (self._writer, self._reader):
                try:
                    worker.submit(_Request(None, (), trio.lowlevel.current_task()))
                except StorageError:
                    pass  # the thread died and closed its connection already
                else:
                    await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
                # The thread's last act was that reply; joining it takes a moment, off the loop.
                await trio.to_thread.run_sync(worker.join)


_SYNCHRONOUS_LEVELS: Final = {"full": "FULL", "normal": "NORMAL"}


@asynccontextmanager
async def open_database(
    path: str | os.PathLike[str] = "zincir.db",
    *,
    synchronous: Literal["full", "normal"] = "full",
    clock: Clock | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> AsyncIterator[Database]:
    """Open (creating if needed) a zincir database file and apply its migrations.

    ``synchronous="full"`` (the default) makes every acknowledged write survive power loss;
    ``"normal"`` survives a crash of the process but may lose the last commits on power loss.
    ``clock`` replaces the wall clock (integer ms) that leases and timers are measured with.
    Raises :class:`SchemaError` for a file that is not a zincir database or is newer than this
    code (the file is left unchanged), and :class:`StorageError` when it cannot be opened.
    Leaving the block waits for every submitted operation, commits, and closes the file.
    """
    level = _SYNCHRONOUS_LEVELS.get(synchronous)
    if level is None:
        raise InvalidArgument(f"synchronous must be 'full' or 'normal', not {synchronous!r}")
    check_int(max_payload_bytes, "max_payload_bytes", minimum=1)
    if not isinstance(path, str | os.PathLike):
        raise InvalidArgument(f"open_database() takes a path or a database URL, not {path!r}")
    path_str = os.fspath(path)
    if not isinstance(path_str, str):
        raise InvalidArgument(f"the database path must be text, not {path_str!r}")
    clock = clock or wall_clock_ms
    writer_conn, reader_conn = await trio.to_thread.run_sync(_open_connections, path_str, level, clock)
    token = trio.lowlevel.current_trio_token()

    def worker(role: str, conn: sqlite3.Connection) -> _Worker:
        return _Worker(
            name=f"zincir-{role}:{path_str}",
            conn=conn,
            path=path_str,
            clock=clock,
            token=token,
            group_commit=role == "writer",
        )

    db = Database._create(
        path_str, worker("writer", writer_conn), worker("reader", reader_conn), clock, max_payload_bytes
    )
    try:
        yield db
    finally:
        await db._close()
