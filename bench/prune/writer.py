"""The live writer of ``python -m bench.prune``: durable steps of one run, timed one by one.

A served side (``bench/harness/child.py``): ``start()`` begins a loop of ``run.step(...)`` calls
on a run it owns (each a durable write that returns after its COMMIT), ``stop()`` ends it and
answers with each step's latency in ms. The loop paces itself at ``interval`` seconds between
steps, as an agent's steps come, so that it measures the wait for the database rather than
competing with the prune for the CPU.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import trio

import zincir

from ..harness.child import Channel, serve


async def _nothing() -> int:
    return 1


class Writer:
    is_async = True

    def __init__(self, target: str, interval: float) -> None:
        self._target = target
        self._interval = interval
        self._latencies: list[float] = []
        self._stop = trio.Event()
        self._done = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._run: zincir.Run | None = None
        self._count = 0

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[None]:
        async with zincir.open_database(self._target) as db, zincir.open_run(db, role="writer") as run:
            self._run = run
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                yield
                nursery.cancel_scope.cancel()
            await run.complete()

    async def start(self) -> str:
        assert self._nursery is not None
        self._latencies, self._stop, self._done = [], trio.Event(), trio.Event()
        self._nursery.start_soon(self._loop)
        return "started"

    async def _loop(self) -> None:
        assert self._run is not None
        try:
            while not self._stop.is_set():
                self._count += 1
                started = time.perf_counter()
                await self._run.step(f"s{self._count}", _nothing)
                self._latencies.append(round((time.perf_counter() - started) * 1000, 3))
                with trio.move_on_after(self._interval):
                    await self._stop.wait()
        finally:
            self._done.set()

    async def stop(self) -> list[float]:
        self._stop.set()
        await self._done.wait()
        return self._latencies


def child(channel: Channel, args: dict[str, Any]) -> None:
    serve(Writer(args["target"], args["interval"]), channel)
