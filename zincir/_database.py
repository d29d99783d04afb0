"""The database: a backend's store and threads behind one backend-free object.

:func:`open_database` picks the backend from what it is given: a path (or ``sqlite:///path``)
opens the embedded SQLite backend, a ``postgresql://`` URL the PostgreSQL one. Both give the same
:class:`Database`, and :class:`~zincir.Run` and :class:`~zincir.ResumeWorker` never know which.
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar, final

import trio

from . import _sqlite
from ._backend import Backend, Clock, wall_clock_ms
from ._crypto import KeyProvider, Sealer, key_provider
from ._errors import DatabaseClosed, EncryptionKeyMissing, InvalidArgument
from ._lease_watch import LeaseWatch
from ._owner import mark_this_process
from ._payloads import DEFAULT_THRESHOLD, Payloads, check_threshold
from ._store import Store
from ._target import parse_target
from ._threads import DatabaseThread, submit
from ._tracing import Tracing
from ._types import DurableState, Event, RunRecord, RunStatus
from ._validation import canonical_run_id, check_int, check_text
from ._wakes import WakeHub

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["Clock", "Database", "Storage", "open_database", "storage", "wall_clock_ms"]

T = TypeVar("T")

DEFAULT_MAX_PAYLOAD_BYTES: Final = 16 * 1024 * 1024


@final
class Storage:
    """What the core (runs, workers, outsiders' writes, ``wait_for_end``) uses of an open
    database: its operations, a way to run each in a transaction, and its wake-ups. Get it
    with :func:`storage`; :class:`Database` is its public face."""

    store: Store
    """Every storage operation (``fn(tx, ...)``), to hand to :meth:`write` or :meth:`read`."""
    wakes: WakeHub
    """Who waits here for what: a run's waits, its owner, workers, ``wait_for_end``."""
    lease_watch: LeaseWatch
    """The one timer of every lease held through this database (its deadlines, its renewals)."""
    writers: Sequence[DatabaseThread]
    reader: DatabaseThread

    sealer: Sealer | None
    """The database's encryption at rest (None: payloads are stored in clear)."""

    def __init__(self, backend: Backend) -> None:
        self.store = backend.store
        self.sealer = None
        self.wakes = WakeHub(backend.listen)
        self.lease_watch = LeaseWatch()
        self._target = backend.target
        self.writers = backend.writers
        self.reader = backend.reader
        self._open_bulk = backend.open_bulk
        self._closed = False
        for thread in (*self.writers, self.reader):
            thread.deliver = self.wakes.deliver  # what a commit woke, before its callers resume
            thread.batch_forms = self.store.batch_forms

    async def use_keys(self, provider: KeyProvider | None) -> None:
        """Encrypt with ``provider``'s keys from now on, once they check out against the
        database (before anything else is submitted); None: the database must have no
        encrypted data. EncryptionKeyMissing, EncryptionKeyInvalid."""
        if provider is None:
            if await self.read(self.store.is_encrypted):
                raise EncryptionKeyMissing(
                    f"database {self._target!r} is encrypted: open it with encryption_key=... or keys=..."
                    " (the CLI and the inspector: ZINCIR_ENCRYPTION_KEY or ZINCIR_ENCRYPTION_KEY_FILE)"
                )
            return
        sealer = Sealer(provider)
        await self.write(self.store.prepare_keys, sealer, route=None)
        self.sealer = sealer
        for thread in (*self.writers, self.reader):
            thread.sealer = sealer

    async def write(self, fn: Callable[..., T], *args: Any, route: str | None = "") -> T:
        """Run ``fn(tx, *args)`` in the next group-commit transaction; return after COMMIT.

        Operations with the same ``route`` (a run id) go to the same writer thread, in order.
        ``route=None``: an operation with no order to keep (a worker's claim) goes to the least
        busy writer, so that it does not hold up a run's writes queued behind it elsewhere.
        """
        result: T = await self._submit(self._writer_for(route), fn, args)
        return result

    def writes_for(self, route: str) -> Callable[..., Awaitable[Any]]:
        """:meth:`write` for the operations of one route (a run's every write): its writer is
        chosen once, and each write goes straight to it."""
        writer = self._writer_for(route)

        async def write(fn: Callable[..., Any], *args: Any) -> Any:
            if self._closed:  # _submit's check, one coroutine fewer on every write of a run
                raise self._closed_error()
            return await submit(writer, fn, args)

        return write

    def _writer_for(self, route: str | None) -> DatabaseThread:
        writers = self.writers
        if len(writers) == 1:  # SQLite's one writer: no choice to make
            return writers[0]
        if route is None:
            return min(writers, key=lambda w: (w.backlog, random.random()))
        return writers[hash(route) % len(writers)]

    @asynccontextmanager
    async def bulk_writes(self) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
        """``write``, for a long series of maintenance writes (a prune's batches and sweep):
        ``await write(fn, *args)`` runs ``fn(tx, *args)`` in a transaction of its own. On
        SQLite they go through a connection of their own that stands aside for the live
        writers (zincir/_sqlite/_bulk.py)."""
        if self._open_bulk is None:

            async def write(fn: Callable[..., Any], *args: Any) -> Any:
                return await self.write(fn, *args, route=None)

            yield write
            return
        if self._closed:
            raise self._closed_error()
        session = await trio.to_thread.run_sync(self._open_bulk, self.sealer)

        async def write_bulk(fn: Callable[..., Any], *args: Any) -> Any:
            if self._closed:
                raise self._closed_error()
            return await trio.to_thread.run_sync(session.write, fn, *args)

        try:
            yield write_bulk
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(session.close)

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(tx, *args)`` in a read transaction: one consistent snapshot."""
        result: T = await self._submit(self.reader, fn, args)
        return result

    async def _submit(self, thread: DatabaseThread, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        if self._closed:
            raise self._closed_error()
        return await submit(thread, fn, args)

    @property
    def closed(self) -> bool:
        return self._closed

    def _closed_error(self) -> DatabaseClosed:
        return DatabaseClosed(f"database {self._target!r} is closed")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        listening = self.wakes.close()
        with trio.CancelScope(shield=True):
            if listening is not None:
                await trio.to_thread.run_sync(listening.stop)
            for thread in (*self.writers, self.reader):
                await submit(thread, None, ())
                # The thread's last act was that reply; joining it takes a moment, off the loop.
                await trio.to_thread.run_sync(thread.join)


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
    _storage: Storage
    _tracing: Tracing

    def __init__(self, *_: object, **__: object) -> None:
        raise TypeError("use zincir.open_database() to open a Database")

    @classmethod
    def _create(cls, backend: Backend, max_payload_bytes: int, tracing: Tracing | None = None) -> Database:
        self = object.__new__(cls)
        self._tracing = Tracing() if tracing is None else tracing
        self.backend = backend.name
        self.path = backend.target
        self.clock = backend.clock
        self.max_payload_bytes = max_payload_bytes
        self._storage = Storage(backend)
        return self

    def __repr__(self) -> str:
        closed = " closed" if self._storage.closed else ""
        return f"<zincir.Database {self.backend} {self.path!r}{closed}>"

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

    # The storage's own, under the names the test suite and the benchmarks reach for; the core
    # (runs, workers, outsiders) goes through storage(db).

    @property
    def _store(self) -> Store:
        return self._storage.store

    async def _write(self, fn: Callable[..., T], *args: Any, route: str | None = "") -> T:
        return await self._storage.write(fn, *args, route=route)

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._storage.read(fn, *args)

    @property
    def _writers(self) -> Sequence[DatabaseThread]:
        return self._storage.writers

    @property
    def _reader(self) -> DatabaseThread:
        return self._storage.reader


def storage(db: Database) -> Storage:
    """The storage behind ``db``: the core's way to its operations and wake-ups."""
    return db._storage


@asynccontextmanager
async def open_database(
    target: str | os.PathLike[str] = "zincir.db",
    *,
    synchronous: Literal["full", "normal"] = "full",
    clock: Clock | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    writers: int | None = None,
    tracing: bool | TracerProvider | None = None,
    trace_content: bool = False,
    content_threshold: int | None = DEFAULT_THRESHOLD,
    encryption_key: bytes | None = None,
    keys: KeyProvider | None = None,
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

    ``tracing`` (OpenTelemetry, ``pip install 'zincir[otel]'``; docs/tracing.md): None (the
    default) traces runs when a global tracer provider is set; True through the global
    provider whatever it is; False never; or a ``TracerProvider`` to trace through.
    ``trace_content=True`` puts content (responses, tool arguments and results, step results,
    signal payloads, checkpoint states, error messages) on the spans; by default they carry
    names, ids, counts and times only.

    ``content_threshold`` (docs/payloads.md): a JSON value of this many characters or more (a
    large tool result, step result, config) is stored once by its SHA-256 and referenced, however
    many events, steps and runs record it; smaller values are stored inline. None or 0: every
    value inline. The setting applies to what this process writes: a database holds both kinds.

    ``encryption_key`` (32 bytes; ``pip install 'zincir[crypto]'``) encrypts payloads, configs,
    results and stream chunks at rest, each run under a key of its own that
    :func:`zincir.erase_run` can delete; ``keys`` (a :class:`zincir.KeyRing`, or any
    :class:`zincir.KeyProvider`) does the same with several master keys, for rotation
    (docs/payloads.md#encryption-and-erasure). A database that has encrypted data must be opened
    with its key: without one :class:`EncryptionKeyMissing`, with another
    :class:`EncryptionKeyInvalid`, and nothing is written.

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
    payloads = Payloads(threshold=check_threshold(content_threshold))
    traced = Tracing(tracing, trace_content)
    provider = key_provider(encryption_key, keys)
    # Before this process can own a lease: every process it starts from now on carries its mark,
    # so that a takeover after its death can see whether one still runs (docs/crashes.md).
    mark_this_process()
    token = trio.lowlevel.current_trio_token()
    where = parse_target(text)
    if where.backend == "postgresql":
        from . import _postgres  # psycopg is an optional extra: imported only when it is needed

        backend = await _postgres.open_backend(
            where.location, token=token, clock=clock, writers=writers or 2, payloads=payloads
        )
    else:
        if writers not in (None, 1):
            raise InvalidArgument(f"SQLite has exactly one writer, not writers={writers!r}")
        backend = await _sqlite.open_backend(
            where.location, token=token, clock=clock, synchronous=synchronous, payloads=payloads
        )
    db = Database._create(backend, max_payload_bytes, traced)
    try:
        await db._storage.use_keys(provider)
        yield db
    finally:
        await db._storage.close()
