"""zincir under test: ``open_run`` + ``run.step`` on one ``Database`` (WAL, synchronous=FULL)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import trio

import zincir

from ..harness.child import Channel
from .common import Ledger, System, host, is_ledger_step, multi_outcome, pragmas


async def noop(i: int) -> int:
    return i


async def steps_body(run: zincir.Run, n: int) -> None:
    for i in range(n):
        await run.step(f"step-{i}", noop, i)
    await run.complete()


class ZincirSystem(System):
    name = "zincir"
    is_async = True

    db: zincir.Database

    def prepare(self, options: dict[str, Any]) -> None:
        self.writers: int | None = options.get("writers")
        self._stack = AsyncExitStack()
        logging.getLogger().addHandler(self.locked_logs)

    async def open(self) -> dict[str, Any]:
        if self.path.startswith(("postgresql://", "postgres://")):
            return await self._open_postgres()
        self.db = await self._stack.enter_async_context(zincir.open_database(self.path, synchronous="full"))
        # The writer thread's own connection: every durable write goes through it.
        settings = await self.db._write(lambda tx: pragmas(lambda sql: tx.one(sql)[0]))
        # The connection itself never waits (an inline BEGIN must not block the loop); its BEGIN
        # waits out another writer's lock in Python, this long.
        settings["busy_timeout_ms"] = self.db._writers[0]._session.busy_timeout_ms  # type: ignore[attr-defined]
        settings["version"] = zincir.__version__
        settings["notes"] = (
            "one writer connection, group commit (BEGIN IMMEDIATE); run inline on the Trio thread"
            " while its writer thread is idle"
        )
        return settings

    async def _open_postgres(self) -> dict[str, Any]:
        # bench.postgres: the same workloads on a PostgreSQL server; ``writers`` is the size of
        # zincir's writer pool (one connection and one group commit each).
        from ..harness.server import server_settings

        self.db = await self._stack.enter_async_context(zincir.open_database(self.path, writers=self.writers))
        settings = await trio.to_thread.run_sync(server_settings, self.path)
        settings["version"] = zincir.__version__
        settings["notes"] = (
            f"{self.writers or 2} writer connection(s), each with its own group commit; a run's"
            " writes go to one of them (by run id)"
        )
        return settings

    async def close(self) -> None:
        await self._stack.aclose()

    @asynccontextmanager
    async def opened(self) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await self.close()

    # -- 1 and 2 --------------------------------------------------------------------------

    async def per_step(self, n: int) -> float:
        start = time.perf_counter()
        async with zincir.open_run(self.db, role="bench-steps") as run:
            await steps_body(run, n)
        return time.perf_counter() - start

    async def concurrent(self, runs: int, steps: int) -> float:
        async def one() -> None:
            async with zincir.open_run(self.db, role="bench-concurrent") as run:
                await steps_body(run, steps)

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(runs):
                nursery.start_soon(one)
        return time.perf_counter() - start

    # -- 3: crash duplicates --------------------------------------------------------------

    async def _crash_body(self, run: zincir.Run, trial: str, steps: int, ledger: Ledger) -> None:
        async def append(i: int, name: str) -> int:
            # The idempotency key: the run id and the step name, stable across owners.
            ledger.append(f"{run.id}:{name}", trial, i)
            return i

        for i in range(steps):
            name = f"step-{i}"
            if is_ledger_step(i):
                await run.step(name, append, i, name)
            else:
                await run.step(name, noop, i)
        await run.complete()

    async def crash_run(self, trial: str, steps: int, ledger_path: str) -> None:
        ledger = Ledger(ledger_path)
        self.started()
        async with zincir.open_run(self.db, role=f"bench-crash-{trial}") as run:
            await self._crash_body(run, trial, steps, ledger)

    async def crash_resume(self, trial: str, steps: int, ledger_path: str) -> dict[str, Any]:
        ledger = Ledger(ledger_path)
        role = f"bench-crash-{trial}"
        found = await self.db.runs(role=role)
        if not found:  # killed before the run was created: the restarted job starts it
            async with zincir.open_run(self.db, role=role) as run:
                await self._crash_body(run, trial, steps, ledger)
            how = "started anew"
        elif found[0].status == zincir.RunStatus.COMPLETED:
            how = "already complete"
        else:
            async with zincir.open_run(self.db, found[0].id, force=True) as run:
                await self._crash_body(run, trial, steps, ledger)
            how = "resumed"
        found = await self.db.runs(role=role)
        return {"completed": len(found) == 1 and found[0].status == zincir.RunStatus.COMPLETED, "how": how}

    # -- 4: two processes -----------------------------------------------------------------

    async def multi(self, runs: int, steps: int) -> dict[str, Any]:
        before = self.locked_logs.count
        errors: list[BaseException] = []
        completed = 0

        async def one() -> None:
            nonlocal completed
            try:
                async with zincir.open_run(self.db, role="bench-multi") as run:
                    await steps_body(run, steps)
                completed += 1
            except Exception as exc:
                errors.append(exc)

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(runs):
                nursery.start_soon(one)
        # lock_errors_logged: e.g. a heartbeat that met a busy database and retried (a warning)
        return multi_outcome(time.perf_counter() - start, completed, errors, self.locked_logs, before)


def child(channel: Channel, args: dict[str, Any]) -> None:
    """The child process hosting zincir (``bench/harness/child.py``)."""
    host(ZincirSystem, channel, args)
