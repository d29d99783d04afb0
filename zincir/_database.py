"""The database: a backend's store and threads behind one backend-free object.

:func:`open_database` picks the backend from what it is given: a path (or ``sqlite:///path``)
opens the embedded SQLite backend, a ``postgresql://`` URL the PostgreSQL one. Both give the same
:class:`Database`, and :class:`~zincir.Run` and :class:`~zincir.ResumeWorker` never know which.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, Literal, Protocol, TypeVar, final

import attrs
import trio

from ._backend import Store
from ._errors import DatabaseClosed, InvalidArgument
from ._owner import mark_this_process
from ._target import parse_target
from ._threads import DatabaseThread, submit
from ._types import DurableState, Event, RunRecord, RunStatus
from ._validation import canonical_run_id, check_int, check_text

__all__ = ["Backend", "Clock", "Database", "open_database", "wall_clock_ms"]

T = TypeVar("T")
Clock = Callable[[], int]
"""A clock returns the current time in integer Unix milliseconds; it must be thread-safe."""

DEFAULT_MAX_PAYLOAD_BYTES: Final = 16 * 1024 * 1024


def wall_clock_ms() -> int:
    """The default clock: wall-clock time, shared by every process that opens the file."""
    return time.time_ns() // 1_000_000


@attrs.define(eq=False)
class Backend:
    """What a backend package's ``open_backend`` returns: its store and its threads."""

    name: Literal["sqlite", "postgresql"]
    target: str
    """The path or URL (without a password) it was opened with."""
    store: Store
    writers: Sequence[DatabaseThread]
    """One or more; the operations of one run always go to the same one."""
    reader: DatabaseThread
    clock: Clock
    """The clock operations use (SQLite, or a test's fake server clock), or an estimate of the
    server's (PostgreSQL)."""
    listen: Callable[[Callable[[str | None, str | None], None], Callable[[], frozenset[str]]], Listening]
    """Start hearing other processes' writes (a thread): the first argument is called with
    ("claimable", None), ("inbox", run id), ("run_ended", run id), or (None, None) when anything
    may have been missed; the second says which runs this process waits to see end."""


class Listening(Protocol):
    def stop(self) -> None:
        """Stop listening; may block briefly (it runs in a thread)."""


@final
class Database:
    """An open zincir database. Get one from :func:`open_database`; it has no public constructor.

    It belongs to the Trio run that opened it.
    """

    backend: Literal["sqlite", "postgresql"]
    """Which backend stores it."""
    path: str
    """The file's path, or the server's URL without its password, as given."""
    clock: Clock
    """The clock leases and timers are measured with: on SQLite the one given (the wall clock by
    default); on PostgreSQL the server's clock decides, and this is the local wall clock."""
    max_payload_bytes: int
    """The largest JSON payload, in bytes of UTF-8, that one value may take."""
    _store: Store
    _writers: Sequence[DatabaseThread]
    _reader: DatabaseThread
    _closed: bool
    _claim_listeners: set[Callable[[], None]]
    _listen: Callable[[Callable[[str | None, str | None], None], Callable[[], frozenset[str]]], Listening]
    _listening: Listening | None
    _inbox_waiters: dict[str, set[trio.Event]]
    _owner_waiters: dict[str, set[trio.Event]]
    _end_waiters: dict[str, set[trio.Event]]
    _awaited_ends: frozenset[str]

    def __init__(self, *_: object, **__: object) -> None:
        raise TypeError("use zincir.open_database() to open a Database")

    @classmethod
    def _create(cls, backend: Backend, max_payload_bytes: int) -> Database:
        self = object.__new__(cls)
        self.backend = backend.name
        self.path = backend.target
        self.clock = backend.clock
        self.max_payload_bytes = max_payload_bytes
        self._store = backend.store
        self._writers = backend.writers
        self._reader = backend.reader
        self._closed = False
        self._claim_listeners = set()
        self._inbox_waiters = {}  # a run's waits (signals, decisions, children)
        self._owner_waiters = {}  # a run's owner's heartbeat (a cancellation, a budget)
        self._end_waiters = {}  # wait_for_end's, by the run they wait for
        # Their keys, for the listener's thread to read (replaced whole, never changed in place).
        self._awaited_ends = frozenset()
        # Started by the first wait or worker: a process that only sends or reads never needs it.
        self._listen = backend.listen
        self._listening = None
        return self

    def __repr__(self) -> str:
        return f"<zincir.Database {self.backend} {self.path!r}{' closed' if self._closed else ''}>"

    async def state(self, run_id: str) -> DurableState:
        """Any run's durable state (as :meth:`Run.state`), read without owning the run."""
        run, checkpoint, events = await self._read(self._store.durable_state, canonical_run_id(run_id))
        return DurableState(run, checkpoint, events)

    async def events(self, run_id: str, *, after: int = -1, limit: int | None = None) -> list[Event]:
        """A run's events with seq > ``after``, in order (at most ``limit`` of them)."""
        check_int(after, "after (a seq)", minimum=-1)
        if limit is not None:
            check_int(limit, "limit (or None)", minimum=1)
        run_id = canonical_run_id(run_id)
        return await self._read(self._store.events_page, run_id, after, limit)

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
        return await self._read(self._store.list_runs, status, role, limit)

    def _hear_others(self) -> None:
        """Make sure other processes' writes wake this one (workers and waits call this)."""
        if self._listening is None and not self._closed:
            self._listening = self._listen(self._hear, lambda: self._awaited_ends)

    def _add_claim_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever a run may have become claimable (here or elsewhere)."""
        self._hear_others()
        self._claim_listeners.add(listener)

    def _announce_claimable(self) -> None:
        """A run became claimable: wake the resume workers of this process at once."""
        for listener in list(self._claim_listeners):
            listener()

    def _announce_inbox(self, run_id: str, *, owner: bool = True) -> None:
        """Something reached the inbox of ``run_id`` (a signal, a decision, a cancellation): wake
        its waits here, and its owner's heartbeat. ``owner=False``: news for its waits only (a
        child of it ended), nothing the heartbeat would find in the database."""
        for event in self._inbox_waiters.get(run_id, ()):
            event.set()
        if owner:
            for event in self._owner_waiters.get(run_id, ()):
                event.set()

    def _hear(self, channel: str | None, payload: str | None) -> None:
        """Word of another process's write (a PostgreSQL notification, a SQLite commit seen)."""
        if channel is None or channel.endswith("claimable"):
            self._announce_claimable()
        if channel is None:
            for waiters in (self._inbox_waiters, self._owner_waiters, self._end_waiters):
                for events in waiters.values():
                    for event in events:
                        event.set()
        elif channel.endswith("run_ended") and payload is not None:
            for event in self._end_waiters.get(payload, ()):
                event.set()
        elif channel.endswith("inbox") and payload is not None:
            self._announce_inbox(payload)
        elif channel.endswith("child_ended") and payload is not None:
            self._announce_inbox(payload, owner=False)

    def _inbox_event(self, run_id: str, *, hear_others: bool = True, owner: bool = False) -> trio.Event:
        """An event set when the inbox of ``run_id`` may hold news (a signal, a decision, an
        ended child, a cancellation); forget it with _forget_inbox_event. ``hear_others`` starts
        listening to other processes' writes, if nothing has yet. ``owner``: the heartbeat's,
        which an ended child does not set (see _announce_inbox)."""
        if hear_others:
            self._hear_others()
        event = trio.Event()
        waiters = self._owner_waiters if owner else self._inbox_waiters
        waiters.setdefault(run_id, set()).add(event)
        return event

    def _end_event(self, run_id: str) -> trio.Event:
        """An event set when run ``run_id`` may have ended (here or in another process); forget
        it with _forget_end_event. Starts listening to other processes' writes."""
        event = trio.Event()
        self._end_waiters.setdefault(run_id, set()).add(event)
        self._awaited_ends = frozenset(self._end_waiters)
        self._hear_others()
        return event

    def _forget_end_event(self, run_id: str, event: trio.Event) -> None:
        events = self._end_waiters.get(run_id)
        if events is not None:
            events.discard(event)
            if not events:
                del self._end_waiters[run_id]
                self._awaited_ends = frozenset(self._end_waiters)

    def _forget_inbox_event(self, run_id: str, event: trio.Event) -> None:
        for waiters in (self._inbox_waiters, self._owner_waiters):
            events = waiters.get(run_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del waiters[run_id]

    async def _write(self, fn: Callable[..., T], *args: Any, route: str | None = "") -> T:
        """Run ``fn(tx, *args)`` in the next group-commit transaction; return after COMMIT.

        Operations with the same ``route`` (a run id) go to the same writer thread, in order.
        ``route=None``: an operation with no order to keep (a worker's claim) goes to the least
        busy writer, so that it does not hold up a run's writes queued behind it elsewhere.
        """
        if route is None:
            writer = min(self._writers, key=lambda w: (w.backlog, random.random()))
        else:
            writer = self._writers[hash(route) % len(self._writers)]
        result: T = await self._submit(writer, fn, args)
        return result

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(tx, *args)`` in a read transaction: one consistent snapshot."""
        result: T = await self._submit(self._reader, fn, args)
        return result

    async def _submit(self, thread: DatabaseThread, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        if self._closed:
            raise DatabaseClosed(f"database {self.path!r} is closed")
        return await submit(thread, fn, args)

    async def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            if self._listening is not None:
                await trio.to_thread.run_sync(self._listening.stop)
            for thread in (*self._writers, self._reader):
                await submit(thread, None, ())
                # The thread's last act was that reply; joining it takes a moment, off the loop.
                await trio.to_thread.run_sync(thread.join)


@asynccontextmanager
async def open_database(
    target: str | os.PathLike[str] = "zincir.db",
    *,
    synchronous: Literal["full", "normal"] = "full",
    clock: Clock | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    writers: int | None = None,
) -> AsyncIterator[Database]:
    """Open (creating if needed) a zincir database and apply its migrations.

    ``target`` is a path or ``sqlite:///path`` (SQLite: an embedded file, no server), or a
    ``postgresql://user@host:port/dbname`` URL (PostgreSQL: ``pip install 'zincir[postgres]'``).

    ``synchronous`` (SQLite): ``"full"`` (the default) makes every acknowledged write survive
    power loss; ``"normal"`` survives a crash of the process but may lose the last commits on
    power loss. ``clock`` replaces the wall clock (integer ms) that SQLite measures leases and
    timers with; on PostgreSQL the server's clock decides, and ``clock`` fakes it (for tests).
    ``writers`` (PostgreSQL): how many writer connections, each with its own group commit
    (default 2; SQLite always has one writer).

    Raises :class:`SchemaError` for a database that is not zincir's or is newer than this code
    (it is left unchanged), and :class:`StorageError` when it cannot be opened.
    Leaving the block waits for every submitted operation, commits, and closes the database.
    """
    check_int(max_payload_bytes, "max_payload_bytes", minimum=1)
    if not isinstance(target, str | os.PathLike):
        raise InvalidArgument(f"open_database() takes a path or a database URL, not {target!r}")
    text = os.fspath(target)
    if not isinstance(text, str) or "\x00" in text:
        raise InvalidArgument(f"the database path must be text without NUL, not {text!r}")
    if clock is not None and not callable(clock):
        raise InvalidArgument(f"clock must be a function returning integer ms, not {clock!r}")
    if writers is not None:
        check_int(writers, "writers", minimum=1, maximum=64)
    if synchronous not in ("full", "normal"):
        raise InvalidArgument(f"synchronous must be 'full' or 'normal', not {synchronous!r}")
    # Before this process can own a lease: every process it starts from now on carries its mark,
    # so that a takeover after its death can see whether one still runs (docs/crashes.md).
    mark_this_process()
    token = trio.lowlevel.current_trio_token()
    where = parse_target(text)
    if where.backend == "postgresql":
        from . import _postgres

        backend = await _postgres.open_backend(where.location, token=token, clock=clock, writers=writers or 2)
    else:
        from . import _sqlite

        if writers not in (None, 1):
            raise InvalidArgument(f"SQLite has exactly one writer, not writers={writers!r}")
        backend = await _sqlite.open_backend(
            where.location, token=token, clock=clock, synchronous=synchronous
        )
    db = Database._create(backend, max_payload_bytes)
    try:
        yield db
    finally:
        await db._close()
