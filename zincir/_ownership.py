"""Owning a run: :func:`open_run` and :func:`owned_run` take a run's lease, keep it while the
body runs (the database's lease watch and, once due, the heartbeat of :class:`~zincir._run.Run`)
and give it back when the block ends, with what the body raised surfacing unchanged.

Apart from :mod:`zincir._run`, which holds what the body calls; :mod:`zincir._owner` is
something else (who holds a lease as this host sees it).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final

import trio

from ._budget import Budget
from ._database import Database, open_database, storage
from ._errors import LeaseLost, RunCancelled, TransientConflict, ZincirError
from ._json import JSONValue, encode
from ._requests import flying
from ._run import Run
from ._run_support import _budget_row, _check_provider
from ._store import Lease
from ._tracing import RunTrace, creating_run
from ._types import RunStatus
from ._validation import canonical_run_id, check_fingerprints, check_name, check_version, lease_ttl_ms

__all__ = ["open_run", "owned_run"]

logger = logging.getLogger("zincir")

# How long taking a lease tries again while another transaction holds the run's row for a moment
# (PostgreSQL does not wait for the row: see zincir/_store/_tx.py).
_BUSY_FOR_S: Final = 10.0


@asynccontextmanager
async def owned_run(
    db: Database,
    lease: Lease,
    *,
    submitted_at: float,
    suspend_after: float | None = None,
    in_worker: bool = False,
    attempt: int | None = None,
) -> AsyncIterator[Run]:
    """Run the body beside a heartbeat; release the lease on the way out.

    ``submitted_at``: when (Trio time) the write that took ``lease`` was submitted; the owner
    stops before the lease could have expired, counted from then (see :meth:`Run._stop_at`).
    With ``suspend_after`` (a worker's), a wait or sleep longer than that suspends the run: the
    body is cancelled and the block ends quietly, the run left ``waiting`` in the database.

    What the body raised leaves unchanged: never wrapped in an ExceptionGroup, never replaced by
    a cancellation of an outer scope. A body stopped by lease loss, or one whose lease was gone
    by the time it left, ends in :class:`LeaseLost`; so does one whose own nurseries raised a
    group of nothing but LeaseLost and cancellations then (a group with any other error is
    raised as it is).

    With tracing on, the block is the attempt's span (``attempt``: the worker's count of it).
    """
    run = Run._create(db, lease, submitted_at)
    run._suspend_after = suspend_after
    run._in_worker = in_worker
    tracer = db._tracing.tracer()
    if tracer is None:
        async with _owned(run) as owned:
            yield owned
        return
    run._trace = trace = RunTrace(tracer, db._tracing.content, lease, attempt)
    trace.start_attempt()
    error: BaseException | None = None
    try:
        async with _owned(run) as owned:
            yield owned
    except BaseException as exc:
        error = exc
        raise
    finally:
        trace.end_attempt(_outcome_of(run, error), error)


def _outcome_of(run: Run, error: BaseException | None) -> str:
    """How an attempt ended, for its span."""
    if (finished := run._lifecycle.finished) is not None:
        return finished.value
    if run._lifecycle.suspended:
        return "suspended"
    if run._lifecycle.lost is not None or isinstance(error, LeaseLost):
        return "lease_lost"
    if error is not None:
        return "raised"
    return "released"


@asynccontextmanager
async def _owned(run: Run) -> AsyncIterator[Run]:
    """:func:`owned_run`'s block for a Run made: the body, its lease watched and kept."""
    body_error: BaseException | None = None
    # The lease's watch and heartbeat are not tasks of this block (zincir/_lease_watch.py): an
    # outer cancellation reaches the body alone.
    with flying(run._flight):
        run._start_watch()
        try:
            try:
                with run._body_scope:
                    yield run
            except BaseException as exc:
                body_error = exc
            finally:
                if run._cancel_reason is not None:
                    await run._end_cancelled()
                elif run._budget_stop is not None and run._in_worker:
                    with trio.CancelScope(shield=True):
                        await _quietly(run._suspend_for_budget(run._budget_stop))
        finally:
            run._stop_heartbeat()  # (here, so that nothing raised above can skip it)
            try:
                released = await run._release()  # still watched: it may wait for the deadline
            finally:
                run._stop_watch()
                await run._heartbeat_stopped()
    lost, finished = run._lifecycle.lost, run._lifecycle.finished
    if body_error is not None:
        if lost is not None and _lease_loss_only(body_error):
            # The body's own nurseries gathered the loss into a group: it means no more than that.
            raise LeaseLost(lost) from body_error
        if lost is not None and not isinstance(body_error, LeaseLost):
            logger.warning("%s (the block raised %r instead)", lost, body_error)
        raise body_error
    if run._cancel_reason is not None and finished in (None, RunStatus.CANCELLED):
        # Its body was stopped; if ending it failed, its next owner (or claim) ends it.
        raise RunCancelled(f"run {run.id} was cancelled: {run._cancel_reason}")
    if run._budget_stop is not None and not run._lifecycle.suspended and finished is None:
        raise run._budget_stop
    if lost is not None:
        raise LeaseLost(lost)
    if not released:
        raise LeaseLost(f"run {run.id}: the lease of epoch {run.epoch} was gone when the block ended")


def _lease_loss_only(error: BaseException) -> bool:
    """Whether ``error`` is a group (a nursery's, nested or not) holding LeaseLost and nothing
    but LeaseLost and cancellations: what a body with nurseries of its own ends in when the lease
    is lost. A group with any other error is not: that error must surface."""
    if not isinstance(error, BaseExceptionGroup):
        return False
    _, other = error.split((LeaseLost, trio.Cancelled))
    return other is None and error.subgroup(LeaseLost) is not None


@asynccontextmanager
async def open_run(
    db: Database | str | os.PathLike[str],
    run_id: str | None = None,
    *,
    role: str = "agent",
    provider: str = "",
    config: JSONValue = None,
    parent_run_id: str | None = None,
    lease_ttl: float = 30.0,
    force: bool = False,
    budget: Budget | None = None,
    version: str | None = None,
    fingerprints: Mapping[str, str] | None = None,
) -> AsyncIterator[Run]:
    """Own a run for the duration of the block: a new one (``run_id=None``) or an existing one.

    A new run is created, leased and started in one transaction (``role``, ``provider``,
    ``config``, ``parent_run_id``, ``budget``, ``version`` and ``fingerprints`` describe it;
    a child takes its parent's version and fingerprints unless given its own).
    An existing run's lease is taken if it is free or expired; an active one raises
    :class:`RunLeased` unless ``force=True``, which fences the owner (only do that once the
    owner is known to be dead). With ``version``, an existing run of another version raises
    :class:`VersionMismatch` and nothing is written (docs/versions.md). Leaving the block
    without :meth:`Run.complete` or :meth:`Run.fail` releases the lease at once; the run stays
    claimable.
    """
    if not isinstance(db, Database):
        async with open_database(db) as opened, open_run(
            opened, run_id, role=role, provider=provider, config=config,
            parent_run_id=parent_run_id, lease_ttl=lease_ttl, force=force, budget=budget,
            version=version, fingerprints=fingerprints,
        ) as run:  # fmt: skip
            yield run
        return
    ttl_ms = lease_ttl_ms(lease_ttl)
    owner = str(uuid.uuid4())
    version = check_version(version, "version")
    if run_id is None:
        config_json = encode({} if config is None else config, what="run config", limit=db.max_payload_bytes)
        marks = check_fingerprints(fingerprints, "fingerprints")
        marks_json = None if marks is None else encode(marks, what="fingerprints", limit=db.max_payload_bytes)
        parent = None if parent_run_id is None else canonical_run_id(parent_run_id, "parent_run_id")
        new_id = str(uuid.uuid4())
        description = (check_name(role, "role"), _check_provider(provider), config_json)
        limits = _budget_row(budget)
        with creating_run(db._tracing, new_id, role, provider) as traceparent:
            lease, submitted_at = await _take_lease(
                db, storage(db).store.create_run, new_id, parent, *description, owner, ttl_ms, limits,
                version, marks_json, traceparent,
            )  # fmt: skip
    else:
        run_id = canonical_run_id(run_id)
        lease, submitted_at = await _take_lease(
            db, storage(db).store.acquire_run, run_id, owner, ttl_ms, bool(force), version
        )
    if lease is None:
        raise RunCancelled(f"run {run_id} was cancelled (its cancellation was requested before)")
    async with owned_run(db, lease, submitted_at=submitted_at) as run:
        yield run


async def _take_lease(db: Database, fn: Any, run_id: str, *args: Any) -> tuple[Lease | None, float]:
    """Create or acquire ``run_id`` (``fn(tx, run_id, *args)``); the lease, and when (Trio time)
    the write that took it was submitted. While another transaction holds the run's row for a
    moment (PostgreSQL refuses to wait for it), try again shortly; nothing was written then."""
    delay, give_up_at = 0.001, trio.current_time() + _BUSY_FOR_S
    while True:
        submitted_at = trio.current_time()
        try:
            lease: Lease | None = await storage(db).write(fn, run_id, *args, route=run_id)
            return lease, submitted_at
        except TransientConflict:
            if trio.current_time() + delay > give_up_at:
                raise
        await trio.sleep(delay)
        delay = min(2 * delay, 0.05)


async def _quietly(write: Awaitable[object]) -> None:
    try:
        await write
    except ZincirError as exc:
        logger.warning("%s", exc)
