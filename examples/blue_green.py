"""A blue/green deploy of an agent: version 1's runs drain on its worker while version 2 takes
the new ones (docs/versions.md).

    .venv/bin/python examples/blue_green.py      # ZINCIR_DATABASE_PATH: the database (blue_green.db)

In one process for the demonstration; in production each worker is a process of its own, started
with its version's code: `zincir worker mypackage.agent:handler --version 2026-12-08`.

1. Version 2026-12-01 is live. A run of it waits for an approval signal, suspended.
2. Version 2026-12-08 is deployed: new runs start under it, and its worker claims them. The old
   worker keeps serving the old runs, the suspended one included, which a new worker never takes.
3. The old run's signal arrives; the old worker finishes it, and stops once nothing of its version
   is left (`zincir versions` shows the same).
"""

from __future__ import annotations

import os

import trio

import zincir

OLD, NEW = "2026-12-01", "2026-12-08"
LIVE = (zincir.RunStatus.PENDING, zincir.RunStatus.RUNNING, zincir.RunStatus.WAITING)


async def handle_old(run: zincir.Run) -> None:
    """Version 2026-12-01's code: it asks for approval first."""
    if run.config == {"needs": "approval"}:
        await run.wait_for_signal("approval", "approve")
    await run.complete({"handled_by": OLD})


async def handle_new(run: zincir.Run) -> None:
    """Version 2026-12-08's code."""
    await run.complete({"handled_by": NEW})


async def start(db: zincir.Database, version: str, config: dict[str, str] | None = None) -> str:
    """A new run of ``version``, left for the workers."""
    async with zincir.open_run(db, version=version, config=config, fingerprints={"prompt": version}) as run:
        return run.id


async def live_runs_of(db: zincir.Database, version: str) -> int:
    return sum(1 for r in await db.runs(limit=10_000) if r.version == version and r.status in LIVE)


async def main() -> None:
    async with zincir.open_database(os.environ.get("ZINCIR_DATABASE_PATH", "blue_green.db")) as db:
        # suspend_after=0: a run waiting for its signal gives its worker's slot up at once.
        old_worker = zincir.ResumeWorker(db, handle_old, versions={OLD}, poll_interval=0.05, suspend_after=0)
        new_worker = zincir.ResumeWorker(db, handle_new, versions={NEW}, poll_interval=0.05, suspend_after=0)
        async with trio.open_nursery() as nursery:
            await nursery.start(old_worker.run)  # 1. the old version is live
            waiting = await start(db, OLD, {"needs": "approval"})
            print("old run", (await zincir.wait_for_end(db, await start(db, OLD))).result)

            await nursery.start(new_worker.run)  # 2. the new version is deployed beside it
            print("new run", (await zincir.wait_for_end(db, await start(db, NEW))).result)
            print(f"{OLD} still draining: {await live_runs_of(db, OLD)} live run(s)")

            await zincir.send_signal(db, waiting, "approve", "yes")  # 3. the old run finishes
            print("old run that waited", (await zincir.wait_for_end(db, waiting)).result)
            print(f"{OLD} drained: {await live_runs_of(db, OLD)} live run(s); stopping its worker")
            old_worker.stop()
            new_worker.stop()


if __name__ == "__main__":
    trio.run(main)
