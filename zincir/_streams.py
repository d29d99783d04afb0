"""Durable streams: a run's named output (tokens, progress), written in flushes by its lease
holder and read live by anyone, in this process or another (docs/streams.md).

:meth:`Run.stream` gives a :class:`Stream`, whose :meth:`~Stream.send` buffers JSON chunks; a
task of the stream's own stores them, every ``flush_interval`` at most, as one fenced write, so
the commits a stream costs are bounded by its interval, not by its chunks. :func:`read_stream`
reads a stream from any offset and, with ``follow=True``, waits for more until the run ends.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final, final

import attrs
import trio

from ._database import Database, Storage, storage
from ._errors import DatabaseBusy, DatabaseUnavailable, InvalidArgument, ZincirError
from ._json import JSONValue, encode
from ._rows import decode_value
from ._store._streams import StreamPage
from ._types import RunStatus
from ._validation import canonical_run_id, check_int, check_name, check_seconds

if TYPE_CHECKING:
    from ._run import Run

__all__ = [
    "DEFAULT_FLUSH_BYTES",
    "DEFAULT_FLUSH_INTERVAL",
    "Stream",
    "StreamChunk",
    "open_stream",
    "read_stream",
]

logger = logging.getLogger("zincir")

DEFAULT_FLUSH_INTERVAL: Final = 0.05
"""Seconds: a stream stores what was sent at most this often (and at once past flush_bytes)."""
DEFAULT_FLUSH_BYTES: Final = 64 * 1024
"""Bytes of buffered JSON that make a stream store its chunks at once, without waiting."""
MAX_FLUSH_INTERVAL: Final = 60.0

# Chunks per read: large enough that a reader catching up costs few reads.
_PAGE: Final = 500
# How often a follower reads when nothing woke it: the fallback for a notification that was
# lost (a listener reconnecting); a flush in this process, a PostgreSQL notification or the
# SQLite watcher wakes it at once.
_POLL_S: Final = 1.0
# A flush that failed for an outage is tried again after this long, while the lease lasts.
_RETRY_S: Final = 0.1


@attrs.frozen
class StreamChunk:
    """One chunk of a stream, as :func:`read_stream` gives it."""

    offset: int
    """Its place in the stream: 0, 1, 2, ... with no gap, across the stream's attempts."""
    attempt: int
    """Which attempt of the stream wrote it: 1, then one more each time a new lease holder of
    the run (after a crash, a lost lease, a suspension) wrote the stream again."""
    data: JSONValue
    """The JSON value sent."""
    restarted: bool
    """The first chunk of an attempt after the first: what came before it belongs to an earlier
    attempt, which this one starts over (show it afresh, do not append to it)."""


@final
class Stream:
    """The writer of one named stream of a run, inside ``async with run.stream(name) as
    out:``. No public constructor."""

    name: str
    """The stream's name."""
    _run: Run
    _interval: float
    _flush_bytes: int
    _buffer: list[str]
    _buffered: int  # bytes of JSON in _buffer
    _pending: trio.Event  # set when _buffer has chunks the background task has not taken
    _lock: trio.Lock  # one flush at a time, in the order they were asked for
    _flushed_at: float  # Trio time the last flush began
    _writer: str  # names this writer's flushes: a retried one is stored once
    _flushes: itertools.count[int]
    _stored: bool  # whether a flush stored chunks: the end must then close the attempt
    _unsure: tuple[str, list[str]] | None  # a flush stopped by Trio before its outcome was known
    _error: Exception | None  # what a flush raised: every later call raises it
    _flusher: trio.CancelScope  # the background task's: cancelled when the block ends

    def __init__(self, *_: object, **__: object) -> None:
        raise TypeError("streams come from run.stream()")

    @classmethod
    def _create(cls, run: Run, name: str, interval: float, flush_bytes: int) -> Stream:
        self = object.__new__(cls)
        self.name = name
        self._run = run
        self._interval = interval
        self._flush_bytes = flush_bytes
        self._buffer = []
        self._buffered = 0
        self._pending = trio.Event()
        self._lock = trio.Lock()
        self._flushed_at = -math.inf
        self._writer = uuid.uuid4().hex
        self._flushes = itertools.count()
        self._stored = False
        self._unsure = None
        self._error = None
        self._flusher = trio.CancelScope()
        return self

    def __repr__(self) -> str:
        return f"<zincir.Stream {self.name!r} of run {self._run.id}>"

    async def send(self, chunk: JSONValue) -> None:
        """Add ``chunk`` (a JSON value) to the stream. It is stored with the others sent within
        the flush interval, or at once when they reach ``flush_bytes``, or when the block ends.
        A value that is not JSON, or is larger than the database's ``max_payload_bytes``, raises
        :class:`InvalidArgument` and is not sent. Raises what storing an earlier chunk raised
        (:class:`LeaseLost`: that flush stored nothing, and nothing more will be)."""
        run = self._run
        run._check_usable()
        if self._error is not None:
            raise self._error
        text = encode(
            chunk, what=f"run {run.id}: a chunk of stream {self.name!r}", limit=run.database.max_payload_bytes
        )
        self._buffer.append(text)
        self._buffered += len(text)
        if self._buffered >= self._flush_bytes:
            await self._flush()
            return
        self._pending.set()
        await trio.lowlevel.checkpoint()

    async def flush(self) -> None:
        """Store what was sent so far now (one write), without waiting for the interval."""
        self._run._check_usable()
        await self._flush()

    async def _flush(self, *, close: bool = False) -> None:
        async with self._lock:
            if self._error is not None:
                raise self._error
            if self._unsure is not None:  # first the flush a cancellation stopped, as it was
                await self._store(*self._unsure, close=False)
            chunks, self._buffer, self._buffered = self._buffer, [], 0
            self._pending = trio.Event()
            if not chunks and not (close and self._stored):
                return
            self._flushed_at = trio.current_time()
            await self._store(f"{self._writer}:{next(self._flushes)}", chunks, close=close)

    async def _store(self, token: str, chunks: list[str], *, close: bool) -> None:
        """Store one flush; until that is known to have happened or not, it stays
        :attr:`_unsure` (a Trio cancellation may stop this before)."""
        self._unsure = (token, chunks)
        try:
            await self._write(token, chunks, close)
        except Exception as exc:
            self._unsure = None
            self._error = exc
            raise
        self._unsure = None
        self._stored = self._stored or bool(chunks)

    async def _write(self, token: str, chunks: list[str], close: bool) -> None:
        """One flush, tried again through an outage while the lease lasts: ``token`` makes a
        flush whose commit's outcome was unknown stored once, however often it is sent."""
        run = self._run
        while True:
            try:
                await run._write_unnumbered(run._store.flush_stream, self.name, token, chunks, close)
                return
            except (DatabaseBusy, DatabaseUnavailable) as exc:
                logger.warning("run %s: storing stream %r failed, retrying: %s", run.id, self.name, exc)
            await trio.sleep(_RETRY_S)

    async def _flush_in_background(self) -> None:
        """Store what is sent, at most once per interval: a chunk sent after a quiet interval
        is stored at once, chunks sent in a burst every interval."""
        with self._flusher:
            while True:
                await self._pending.wait()
                due = self._flushed_at + self._interval
                if trio.current_time() < due:
                    await trio.sleep_until(due)
                try:
                    await self._flush()
                except Exception:
                    return  # kept in _error: the next send and the block's end raise it

    async def _end(self, body_error: BaseException | None) -> None:
        """The block ended (``body_error``: what it raised): store what is left and close the
        attempt. A body stopped by Trio (a cancelled scope) stores it too, shielded, if this
        owner still holds the lease; after a lost lease or a suspension the attempt is left as
        it is, and the run's next writer of the stream marks it interrupted."""
        run = self._run
        if run._lifecycle.finished is not None:
            return  # complete() or fail() stored and closed it; no write could follow
        if body_error is None:
            await self._flush(close=True)
            return
        if run._past_deadline():  # the lease is gone, or given up (the run suspended)
            return
        try:
            with trio.CancelScope(shield=not isinstance(body_error, Exception)):
                await self._flush(close=True)
        except ZincirError as exc:
            logger.warning("run %s: stream %r could not be closed: %s", run.id, self.name, exc)


@asynccontextmanager
async def open_stream(run: Run, name: str, flush_interval: float, flush_bytes: int) -> AsyncIterator[Stream]:
    """:meth:`Run.stream`'s block: the stream, and the task that flushes it."""
    name = check_name(name, f"run {run.id}: the stream name")
    interval = check_seconds(flush_interval, f"run {run.id}: flush_interval", minimum=0.0)
    if interval > MAX_FLUSH_INTERVAL:
        raise InvalidArgument(f"run {run.id}: flush_interval must be at most {MAX_FLUSH_INTERVAL:g} s")
    check_int(flush_bytes, f"run {run.id}: flush_bytes", minimum=1)
    run._check_usable()
    if name in run._streams:
        raise InvalidArgument(f"run {run.id}: stream {name!r} is already open (one writer per stream)")
    stream = Stream._create(run, name, interval, flush_bytes)
    run._streams[name] = stream
    body_error = end_error = None
    try:
        async with trio.open_nursery() as background:
            background.start_soon(stream._flush_in_background)
            try:
                yield stream
            except BaseException as exc:  # raised below: never wrapped in an ExceptionGroup
                body_error = exc
            stream._flusher.cancel()
            # Inside the nursery: once a cancelled scope stopped the block, the nursery's own
            # exit raises that cancellation, and nothing after it would run.
            try:
                await stream._end(body_error)
            except BaseException as exc:
                end_error = exc
    finally:
        del run._streams[name]
    if body_error is not None:
        raise body_error
    if end_error is not None:
        raise end_error


def read_stream(
    db: Database, run_id: str, name: str, *, after: int = -1, follow: bool = False
) -> AsyncIterator[StreamChunk]:
    """The chunks of stream ``name`` of run ``run_id`` with offsets past ``after``, in order.

    ``follow=False``: those stored now. ``follow=True``: then each chunk as it is stored, woken
    at once by a flush in this process, a PostgreSQL notification or the SQLite watcher,
    until the run has ended and every chunk has been given (a run's streams can grow until it
    ends: a later attempt may write the stream again). Resume after a disconnect with
    ``after=`` the last offset seen: nothing is missed or given twice. An unknown run raises
    :class:`RunNotFound` (from the iteration); a stream never written has no chunks.
    """
    if not isinstance(db, Database):
        raise InvalidArgument(f"read_stream() needs a Database, not {db!r}")
    run_id = canonical_run_id(run_id)
    name = check_name(name, f"run {run_id}: the stream name")
    check_int(after, f"run {run_id}: after (an offset)", minimum=-1)
    if not isinstance(follow, bool):
        raise InvalidArgument(f"follow must be True or False, not {follow!r}")
    return _Reader(storage(db), run_id, name, after, follow)


@final
class _Reader:
    """:func:`read_stream`'s iterator. It keeps nothing registered between two chunks, so a
    reader that stops early (``break``) leaves nothing behind to clean up."""

    def __init__(self, core: Storage, run_id: str, name: str, after: int, follow: bool) -> None:
        self._core = core
        self._run_id = run_id
        self._name = name
        self._after = after
        self._follow = follow
        self._ready: collections.deque[StreamChunk] = collections.deque()
        self._done = False

    def __aiter__(self) -> _Reader:
        return self

    async def __anext__(self) -> StreamChunk:
        while not self._ready:
            if self._done:
                raise StopAsyncIteration
            if self._follow:
                await self._follow_once()
            else:
                self._take(await self._page())
                self._done = self._done or not self._ready
        chunk = self._ready.popleft()
        self._after = chunk.offset
        return chunk

    async def _page(self) -> StreamPage:
        page: StreamPage = await self._core.read(
            self._core.store.stream_page, self._run_id, self._name, self._after, _PAGE
        )
        return page

    def _take(self, page: StreamPage) -> None:
        self._ready.extend(_chunks_of(page))
        if len(page.chunks) < _PAGE and not self._follow:
            self._done = True

    async def _follow_once(self) -> None:
        """Read what is there; if nothing is, wait for a flush or the run's end (a read every
        :data:`_POLL_S` is the fallback), or stop once the run has ended."""
        wakes = self._core.wakes
        # Registered before the read: a flush or an end committed after it wakes this one.
        woken = wakes.stream_event(self._run_id)
        try:
            page = await self._page()
            self._take(page)
            if self._ready:
                return
            if RunStatus(page.status).is_terminal:  # read in the same snapshot: nothing can follow
                self._done = True
                return
            with trio.move_on_after(_POLL_S):
                await woken.wait()
        finally:
            wakes.forget_stream_event(self._run_id, woken)


def _chunks_of(page: StreamPage) -> list[StreamChunk]:
    return [
        StreamChunk(at, attempt, decode_value(data), attempt > 1 and page.first_offsets.get(attempt) == at)
        for at, attempt, data in page.chunks
    ]
