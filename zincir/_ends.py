"""Waiting, from outside a run, for the run to end: :func:`wait_for_end`, for scripts that
start runs and hand them to workers (in this process or others)."""

from __future__ import annotations

import contextlib
import math
import uuid
from typing import Final

import trio

from ._database import Database, storage
from ._errors import InvalidArgument, StorageError, WaitTimeout
from ._types import RunRecord
from ._validation import canonical_run_id, check_seconds

__all__ = ["wait_for_end"]

# How often a waiter reads the run's status when nothing woke it: the fallback for a
# notification that was lost (a listener reconnecting) or never sent (see watch_end).
_POLL_S: Final = 1.0


async def wait_for_end(
    db: Database,
    run_id: str,
    timeout: float | None = None,  # noqa: ASYNC109 - a bound on the wait, reported as WaitTimeout
) -> RunRecord:
    """Wait until run ``run_id`` has ended, and return its record: completed (with its
    ``result``), failed or cancelled. A run that is ``waiting`` (suspended, for a signal, an
    approval, a child or its budget) has not ended: this goes on waiting for it.

    Whoever ends it, this process or another, wakes the wait at once (PostgreSQL notifies the
    waiters of a run when it ends; on SQLite a watcher thread sees every commit to the file);
    a read every second is the fallback. ``timeout`` (seconds): :class:`WaitTimeout` if the run
    has not ended by then. An unknown run raises :class:`RunNotFound`.
    """
    if not isinstance(db, Database):
        raise InvalidArgument(f"wait_for_end() needs a Database, not {db!r}")
    run_id = canonical_run_id(run_id)
    limit = None if timeout is None else check_seconds(timeout, f"run {run_id}: the timeout of wait_for_end")
    deadline = math.inf if limit is None else trio.current_time() + limit
    waiter = str(uuid.uuid4())
    core = storage(db)
    woken = core.wakes.end_event(run_id)  # before the first read: an end after it wakes this one
    noted = ended = False
    try:
        run: RunRecord = await core.write(core.store.watch_end, run_id, waiter, route=run_id)
        noted = True
        while not run.status.is_terminal:
            if trio.current_time() >= deadline:
                raise WaitTimeout(f"run {run_id} did not end within {limit:g} s: it is {run.status.value}")
            with trio.move_on_at(min(deadline, trio.current_time() + _POLL_S)):
                await woken.wait()
            if woken.is_set():  # a new event before the next read, so no wake-up falls between
                core.wakes.forget_end_event(run_id, woken)
                woken = core.wakes.end_event(run_id)
            run = await core.read(core.store.get_run, run_id)
        ended = True
        return run
    finally:
        core.wakes.forget_end_event(run_id, woken)
        if noted and not ended:  # an end takes its waiters' notes with it; else this one goes now
            # A note left behind (the database failing now) costs one notification at the end.
            with trio.CancelScope(shield=True), contextlib.suppress(StorageError):
                await core.write(core.store.unwatch_end, run_id, waiter, route=run_id)
