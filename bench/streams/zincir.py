"""zincir's processes for ``python -m bench.streams``.

Roles (``args["role"]`` of :func:`child`), each opening the database before anything is timed:

* ``writer``: ``throughput(streams, chunks, ...)`` owns ``streams`` runs at once, each sending
  ``chunks`` chunks through ``run.stream("tokens")`` as fast as it can; the clock runs from the
  first send until every stream's block has ended (its last chunk stored) and the answer says
  how many flushes (``flush_stream`` operations) and commits (of the database's writer
  threads, both counted by wrapping them: measurement only, private attributes) it took.
  ``paced(streams, rate, seconds, ...)`` does the same at ``rate`` chunks per second per
  stream. ``create()`` makes a run (released: nobody owns it), ``write(run_id, gaps, ...)``
  takes it and sends one chunk per gap (seconds to sleep before it), each chunk carrying
  ``time.monotonic()`` taken just before its ``send``, then ends the stream and completes the
  run.
* ``follower``: ``follow(run_id)`` starts following the run's ``tokens`` stream with
  ``zincir.read_stream(..., follow=True)`` (after a plain read, so that its connections are
  open); as each
  chunk arrives it notes ``time.monotonic()`` minus the chunk's own send time; when the
  iteration ends (the run has ended) it emits ``{"event": "followed", "latencies_ms": [...]}``.

CLOCK_MONOTONIC is one clock for every process of a Linux machine, so a writer's instant and a
follower's can be subtracted.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import trio

import zincir
from zincir._database import storage

from ..harness.child import Channel, serve

if TYPE_CHECKING:
    from ..harness.child import Emit

STREAM = "tokens"


def describe(db: zincir.Database) -> dict[str, Any]:
    from zincir import _streams

    return {
        "version": f"zincir {version('zincir')}",
        "backend": db.backend,
        "flush_interval_s": _streams.DEFAULT_FLUSH_INTERVAL,
        "flush_bytes": _streams.DEFAULT_FLUSH_BYTES,
        "follower_poll_s": _streams._POLL_S,
    }


class Counts:
    """The flushes and the commits of one database, counted by wrapping its store's
    ``flush_stream`` and each writer thread's session commit (on whichever thread runs them)."""

    def __init__(self, db: zincir.Database) -> None:
        self.flushes = 0
        self.commits = 0
        self._lock = threading.Lock()
        core = storage(db)
        flush = core.store.flush_stream

        def counted_flush(*args: Any) -> Any:
            result = flush(*args)
            with self._lock:
                self.flushes += 1
            return result

        core.store.flush_stream = counted_flush  # type: ignore[method-assign]
        for thread in core.writers:
            session = thread._session
            commit = session.commit

            def counted_commit(*args: Any, _commit: Any = commit) -> Any:
                result = _commit(*args)
                with self._lock:
                    self.commits += 1
                return result

            session.commit = counted_commit  # type: ignore[method-assign]

    def now(self) -> tuple[int, int]:
        with self._lock:
            return self.flushes, self.commits


class _Side:
    is_async = True

    def __init__(self, target: str, options: dict[str, Any], emit: Emit) -> None:
        self.target = target
        self.options = options
        self.emit = emit
        self.db: zincir.Database
        self.nursery: trio.Nursery

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[None]:
        writers = self.options.get("writers")
        extra = {"writers": int(writers)} if writers and self.target.startswith("postgresql") else {}
        async with zincir.open_database(self.target, **extra) as db, trio.open_nursery() as nursery:
            self.db, self.nursery = db, nursery
            self.counts = Counts(db)
            yield
            nursery.cancel_scope.cancel()

    async def open(self) -> dict[str, Any]:
        return describe(self.db)


class Writer(_Side):
    async def create(self) -> str:
        async with zincir.open_run(self.db, role="streams-latency") as run:
            return run.id  # left without an end: released

    async def write(self, run_id: str, gaps: list[float], flush_interval: float) -> dict[str, Any]:
        async with zincir.open_run(self.db, run_id) as run:
            async with run.stream(STREAM, flush_interval=flush_interval) as out:
                for i, gap in enumerate(gaps):
                    await trio.sleep(gap)
                    await out.send({"i": i, "t": time.monotonic()})
            await run.complete()
        return {"chunks": len(gaps)}

    async def throughput(
        self, streams: int, chunks: int, flush_interval: float, chunk_text: str
    ) -> dict[str, Any]:
        """``streams`` runs at once, each sending ``chunks`` chunks as fast as it can."""

        async def one(ready: trio.Event, go: trio.Event, done: list[float]) -> None:
            async with zincir.open_run(self.db, role="streams-throughput") as run:
                ready.set()
                await go.wait()
                async with run.stream(STREAM, flush_interval=flush_interval) as out:
                    for _ in range(chunks):
                        await out.send(chunk_text)
                done.append(time.monotonic())
                await run.complete()

        return await self._timed(streams, chunks, one)

    async def paced(
        self, streams: int, rate: float, seconds: float, flush_interval: float, chunk_text: str
    ) -> dict[str, Any]:
        """``streams`` runs at once, each sending ``rate`` chunks per second for ``seconds``."""
        chunks = round(rate * seconds)

        async def one(ready: trio.Event, go: trio.Event, done: list[float]) -> None:
            async with zincir.open_run(self.db, role="streams-paced") as run:
                ready.set()
                await go.wait()
                async with run.stream(STREAM, flush_interval=flush_interval) as out:
                    start = trio.current_time()
                    for i in range(chunks):
                        await trio.sleep_until(start + i / rate)
                        await out.send(chunk_text)
                done.append(time.monotonic())
                await run.complete()

        return await self._timed(streams, chunks, one)

    async def _timed(self, streams: int, chunks: int, one: Any) -> dict[str, Any]:
        go, done = trio.Event(), []
        async with trio.open_nursery() as nursery:
            for _ in range(streams):
                ready = trio.Event()
                nursery.start_soon(one, ready, go, done)
                await ready.wait()
            flushes_before, commits_before = self.counts.now()
            started = time.monotonic()
            go.set()
        flushes, commits = self.counts.now()
        # The streams' last chunks were stored when each block ended; the runs' ends are not timed.
        seconds = max(done) - started
        return {
            "streams": streams,
            "chunks": streams * chunks,
            "seconds": seconds,
            "flushes": flushes - flushes_before,
            # Commits include the runs' ends, after the clock stopped: one per run at most.
            "commits": commits - commits_before,
            "chunks_per_s": streams * chunks / seconds,
        }


class Follower(_Side):
    async def follow(self, run_id: str) -> str:
        """Start following; answer once a first plain read found the run (connections open)."""
        assert [chunk async for chunk in zincir.read_stream(self.db, run_id, STREAM)] == []
        self.nursery.start_soon(self._follow, run_id)
        return run_id

    async def _follow(self, run_id: str) -> None:
        latencies: list[float] = []
        async for chunk in zincir.read_stream(self.db, run_id, STREAM, follow=True):
            latencies.append((time.monotonic() - chunk.data["t"]) * 1e3)
        self.emit({"event": "followed", "id": run_id, "latencies_ms": latencies})


def make(role: str, target: str, options: dict[str, Any], emit: Emit) -> Any:
    if role == "writer":
        return Writer(target, options, emit)
    if role == "follower":
        return Follower(target, options, emit)
    raise SystemExit(f"unknown zincir role {role!r}")


def child(channel: Channel, args: dict[str, Any]) -> None:
    """The child process of one of zincir's roles (``bench/harness/child.py``)."""
    serve(make(args["role"], args["target"], args["options"], channel.send), channel)
