"""zincir's side of ``python -m bench.recovery``, one mode per child process.

* ``dup-run`` / ``dup-resume``: the duplicates workflow, killed in ``dup-run`` and finished by a
  fresh ``dup-resume`` process through plain ``open_run(run_id)`` (no ``force``), with or without
  a reconciler. Every ``every``-th step is a tool call: a model response with one tool call is
  recorded, and ``run.execute`` runs the non-idempotent append. The other steps are ``run.step``.
* ``victim``: a run that makes steady progress (one ``run.step`` every ``pace`` seconds) under the
  default ``lease_ttl=30`` until it is SIGKILLed.
* ``worker``: a ``ResumeWorker`` (default ``lease_ttl``) already running in its own process.
* ``reopen``: a process started after the kill that calls plain ``open_run(run_id)``, retrying on
  ``RunLeased``.

The recoverers report when the run made progress again: the first step that had not been recorded
before the kill has run and is durable.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

import zincir

from ..harness.child import Channel
from .ledger import TOOL_AFTER_S, TOOL_BEFORE_S, append_line, is_tool_step, ledger_has


def _open(db: str) -> Any:
    if db.startswith(("postgresql://", "postgres://")):
        return zincir.open_database(db)
    return zincir.open_database(db, synchronous="full")


async def _noop(i: int) -> int:
    return i


# -- duplicates -----------------------------------------------------------------------------


def _tool(ledger: str) -> Callable[[zincir.PendingToolCall], Awaitable[Any]]:
    async def append(pending: zincir.PendingToolCall) -> Any:
        await trio.sleep(TOOL_BEFORE_S)
        append_line(ledger, int(pending.call.args["step"]), pending.call.id)
        await trio.sleep(TOOL_AFTER_S)
        return {"appended": pending.call.args["step"]}

    return append


def _reconciler(ledger: str) -> Callable[[zincir.PendingToolCall], Awaitable[Any]]:
    async def probe(pending: zincir.PendingToolCall) -> Any:
        found = await trio.to_thread.run_sync(ledger_has, ledger, pending.call.id)
        return {"appended": pending.call.args["step"], "reconciled": True} if found else None

    return probe


async def dup_body(run: zincir.Run, args: dict[str, Any]) -> dict[str, int]:
    """Replay-safe: a tool call already recorded is not asked for again; a pending one is executed
    (reconciled first, if it was started before and a reconciler is given)."""
    ledger, steps, every = args["ledger"], args["steps"], args["every"]
    tool = _tool(ledger)
    reconcile = _reconciler(ledger) if args["reconcile"] else None
    state = await run.state()
    asked = {e.payload["call_id"] for e in state.events if e.type is zincir.EventType.TOOL_CALL}
    pending = {p.call.id: p for p in await run.pending_tools()}
    seen = {"pending_found": len(pending), "started_before": sum(p.started > 0 for p in pending.values())}
    for i in range(steps):
        if not is_tool_step(i, every):
            await run.step(f"step-{i}", _noop, i)
            continue
        call_id = f"append-{i}"
        if call_id not in asked:
            call = zincir.ToolCall(call_id, "append_line", {"step": i})
            await run.record_response("", [call], "tool_use")
            pending = {p.call.id: p for p in await run.pending_tools()}
        if call_id in pending:
            await run.execute(pending.pop(call_id), tool, reconcile=reconcile)
    await run.complete()
    return seen


async def _takeovers(db: zincir.Database, run_id: str) -> list[str]:
    return [
        e.payload["reason"] for e in await db.events(run_id) if e.type is zincir.EventType.LEASE_TAKEN_OVER
    ]


@asynccontextmanager
async def reopened(db: zincir.Database, run_id: str, tries: list[int]) -> AsyncIterator[zincir.Run]:
    """Plain ``open_run(db, run_id)``, no ``force``, retried every 50 ms on ``RunLeased`` (for at
    most two minutes); ``tries[0]`` counts the refusals."""
    stop = time.monotonic() + 120.0
    while True:
        cm = zincir.open_run(db, run_id)
        try:
            run = await cm.__aenter__()
            break
        except zincir.RunLeased:
            if time.monotonic() > stop:
                raise
            tries[0] += 1
            await trio.sleep(0.05)
    try:
        yield run
    except BaseException as exc:
        if not await cm.__aexit__(type(exc), exc, exc.__traceback__):
            raise
    else:
        await cm.__aexit__(None, None, None)


async def dup_run(ch: Channel, args: dict[str, Any]) -> None:
    async with _open(args["db"]) as db:
        ch.emit("ready")
        await trio.to_thread.run_sync(ch.next_command)
        ch.emit("started")
        async with zincir.open_run(db, role=f"dup-{args['trial']}") as run:
            await dup_body(run, args)
        ch.emit("done")


async def dup_resume(ch: Channel, args: dict[str, Any]) -> None:
    ch.emit("ready")
    await trio.to_thread.run_sync(ch.next_command)
    role = f"dup-{args['trial']}"
    async with _open(args["db"]) as db:
        found = await db.runs(role=role)
        seen: dict[str, int] = {}
        retries = 0
        if not found:  # killed before the run was created: the restarted job starts it
            async with zincir.open_run(db, role=role) as run:
                seen = await dup_body(run, args)
            how = "started anew"
        elif found[0].status is zincir.RunStatus.COMPLETED:
            how = "already complete"
        else:
            tries = [0]
            async with reopened(db, found[0].id, tries) as run:
                seen = await dup_body(run, args)
            retries = tries[0]
            how = "resumed by open_run(run_id)"
        found = await db.runs(role=role)
        completed = len(found) == 1 and found[0].status is zincir.RunStatus.COMPLETED
        takeovers = await _takeovers(db, found[0].id) if found else []
        ch.emit("result", completed=completed, how=how, retries=retries, takeovers=len(takeovers), **seen)


# -- recovery time --------------------------------------------------------------------------


async def paced_body(
    run: zincir.Run, pace: float, max_steps: int, on_progress: Callable[[int], None] | None
) -> None:
    """Steps ``s0, s1, ...``, one every ``pace`` s. A recoverer (``on_progress`` given) replays the
    recorded ones at once; the first step it really runs, once durable, is the progress it
    reports, and then it ends the run."""
    for i in range(max_steps):
        ran = False

        async def work(i: int) -> int:
            nonlocal ran
            ran = True
            return i

        await run.step(f"s{i}", work, i)
        if on_progress is not None and ran:
            on_progress(i)
            await run.complete()
            return
        if ran:
            await trio.sleep(pace)
    await run.complete()


async def victim(ch: Channel, args: dict[str, Any]) -> None:
    async with _open(args["db"]) as db:
        ch.emit("ready")
        await trio.to_thread.run_sync(ch.next_command)
        async with zincir.open_run(db, role="victim") as run:  # lease_ttl: the default, 30 s
            ch.emit("started", run_id=run.id)
            await paced_body(run, args["pace"], args["max_steps"], None)
        ch.emit("done")


async def worker(ch: Channel, args: dict[str, Any]) -> None:
    async with _open(args["db"]) as db:

        async def handler(run: zincir.Run) -> None:
            ch.emit("claimed", run_id=run.id, epoch=run.epoch)

            def progress(step: int) -> None:
                ch.emit("progress", run_id=run.id, step=step)

            await paced_body(run, 0.0, args["max_steps"], progress)
            reasons = await _takeovers(db, run.id)
            ch.emit("ended", run_id=run.id, takeovers=len(reasons), reason=reasons[-1] if reasons else None)

        w = zincir.ResumeWorker(db, handler, poll_interval=args["poll"])  # lease_ttl: the default
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            ch.emit("ready")
            await trio.to_thread.run_sync(ch.next_command)  # until the parent closes our stdin
            w.stop()


async def reopen(ch: Channel, args: dict[str, Any]) -> None:
    async with _open(args["db"]) as db:
        ch.emit("opened")
        tries = [0]
        async with reopened(db, args["run_id"], tries) as run:
            ch.emit("owned", retries=tries[0], epoch=run.epoch)

            def progress(step: int) -> None:
                ch.emit("progress", run_id=run.id, step=step)

            await paced_body(run, 0.0, args["max_steps"], progress)
        reasons = await _takeovers(db, args["run_id"])
        ch.emit("ended", takeovers=len(reasons), reason=reasons[-1] if reasons else None)


MODES = {
    "dup-run": dup_run,
    "dup-resume": dup_resume,
    "victim": victim,
    "worker": worker,
    "reopen": reopen,
}


def child(channel: Channel, args: dict[str, Any]) -> None:
    """One child process of ``bench.recovery``, in the role ``args["mode"]`` (``bench/harness/child.py``)."""
    trio.run(MODES[args["mode"]], channel, args)
