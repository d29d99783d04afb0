"""How runs end: completed, failed or cancelled by their owner, failed after a lost attempt,
cancelled by an outsider or with an ancestor; and who is woken when they do.

A run's end is logged (its final ``state_transition``), leaves it terminal and ownerless,
makes a parent suspended on it due (the parent's waits and, if it became due, workers are
woken), and tells whoever waits for its end (``wait_for_end``). A failed or cancelled run
takes its live descendants with it: those nobody holds end at once, the owned ones get a
cancellation request their owners act on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._errors import InvalidArgument, RunNotFound, UnfinishedWork
from .._json import dump_trusted as _dump
from .._payloads import stored
from .._types import EventType, RunRecord, RunStatus
from ._budgets import WALL_END
from ._reads import get_run
from ._tx import LIVE, Reply, Tx, lease_held
from ._types import CancelOutcome, Lease, LostAttempt

# -- the end of a run -------------------------------------------------------------------------


def finish(tx: Tx, lease: Lease, status: RunStatus, payload_json: str, result_json: str | None) -> None:
    """End the run with its ``state_transition`` (and ``result``, completing); a failed or
    cancelled run's live descendants are cancelled with it. Fenced; UnfinishedWork
    (completing with open work or a live child)."""
    tx.fence(lease)
    completing = status is RunStatus.COMPLETED
    open_work = [tx.send(sql, (lease.run_id,)) for sql in OPEN_WORK] if completing else None
    # Sent before the checks are read (on PostgreSQL in the same round trip as the fence and
    # the checks): if the lease or the open work refuses, the raise rolls the end back.
    closing = _send_close(tx, lease.run_id, payload_json, status, result_json)
    if open_work is not None:
        candidate, open_calls, live = open_work
        require_no_open_work(
            lease.run_id,
            candidate.one() is not None,
            [row[0] for row in open_calls.all()],
            [row[0] for row in live.all()],
        )
    _closed(tx, lease.run_id, closing)
    if not completing:
        cancel_descendants(tx, lease.run_id, f"its ancestor {lease.run_id} ended {status.value}")


def end_run(
    tx: Tx,
    run_id: str,
    transition_json: str,
    status: RunStatus,
    *,
    new_epoch: bool = False,
) -> None:
    """End a run (see the module's docstring). ``new_epoch``: fence an owner whose lease
    expired, so that it sees a takeover (LeaseLost), not an end its own epoch made."""
    _closed(tx, run_id, _send_close(tx, run_id, transition_json, status, None, new_epoch=new_epoch))
    if status is not RunStatus.COMPLETED:
        cancel_descendants(tx, run_id, f"its ancestor {run_id} ended {status.value}")


# A parent suspended on this run becomes due. It is found by key (the closing run's parent, a
# subquery searched once by the primary key) and locked NOWAIT before it is made due: held
# elsewhere, it fails this end (retried) rather than wait for it. Its wait set is the one this
# statement sees: a suspension of the parent that commits later must have locked this run's
# row (_awaited reads it FOR SHARE), which whoever ends the run holds already, so it either
# committed before and is seen here, or waits for this end and finds the run ended.
MAKE_PARENT_DUE = (
    "UPDATE agent_runs SET next_attempt_at = :now WHERE id = (SELECT p.id FROM agent_runs AS p"
    " WHERE p.id = (SELECT parent_run_id FROM agent_runs WHERE id = ?) AND p.status = 'waiting'"
    " AND (p.next_attempt_at IS NULL OR p.next_attempt_at > :now) AND EXISTS (SELECT 1 FROM run_waits"
    " AS w WHERE w.run_id = p.id AND w.kind = 'child' AND w.wake_key = ?){lock})"
)


def ending(status: str = "?", result: str = "?") -> str:
    """What a run's row becomes when it ends (``, column = ...`` assignments), with its status
    and its result from ``status`` and ``result`` (SQL expressions; parameters by default)."""
    return (
        f", status = {status}, lease_owner = NULL, lease_expires_at = NULL, wait_kind = NULL,"
        f" wait_target = NULL, result = {result}, cancel_requested_at = NULL"
    )


ENDING = ending()
"""What a run's row becomes when it ends, its status and result as parameters."""

# A fork that shares the closing run with its source (docs/forks.md) and is suspended on it
# becomes due, as its parent does (above).
MAKE_SHARER_DUE = (
    "UPDATE agent_runs SET next_attempt_at = :now WHERE id = (SELECT p.id FROM agent_runs AS p"
    " WHERE p.id = ? AND p.status = 'waiting' AND (p.next_attempt_at IS NULL OR p.next_attempt_at > :now)"
    " AND EXISTS (SELECT 1 FROM run_waits AS w WHERE w.run_id = p.id AND w.kind = 'child'"
    " AND w.wake_key = ?){lock})"
)


def sharers(run: str = "?") -> str:
    """The forks that share a run with its source, the run's id ``run`` (an SQL expression; a
    parameter by default)."""
    return f"SELECT run_id FROM shared_children WHERE child_id = {run}"


def streamed(run: str = "?") -> str:
    """Whether a run (its id ``run``, as for :func:`sharers`) has streams: their followers stop
    once it ends (docs/streams.md)."""
    return f"SELECT 1 FROM streams WHERE run_id = {run} LIMIT 1"


SHARERS, STREAMED = sharers(), streamed()

_Closing = tuple[Reply, Reply, Reply | None, Reply, Reply]


def _send_close(
    tx: Tx,
    run_id: str,
    transition_json: str,
    status: RunStatus,
    result_json: str | None,
    *,
    new_epoch: bool = False,
) -> _Closing:
    """Send a run's end without reading it (see :func:`_closed`): its final transition, the row
    terminal and ownerless, a parent suspended on it made due, its end's waiters' rows gone,
    the forks that share it, and whether it has streams."""
    closed = tx.log(
        run_id,
        EventType.STATE_TRANSITION,
        transition_json,
        run_set=ENDING + (", lease_epoch = lease_epoch + 1" if new_epoch else ""),
        run_params=(status.value, stored_result(tx, run_id, result_json)),
    )
    parent_due = tx.send(MAKE_PARENT_DUE.format(lock=tx.dialect.lock_nowait), (run_id, run_id))
    waited = None
    if tx.dialect.end_waiters:  # somebody waits for this end (wait_for_end): they are told
        waited = tx.send("DELETE FROM run_waiters WHERE run_id = ?", (run_id,))
    sharers = tx.send(SHARERS, (run_id,))
    streamed = tx.send(STREAMED, (run_id,))
    return closed, parent_due, waited, sharers, streamed


def stored_result(tx: Tx, run_id: str, result_json: str | None) -> str | None:
    """What a run's ``result`` column stores for its result (:func:`zincir._payloads.stored`)."""
    return None if result_json is None else stored(tx, run_id, result_json, whole=True)


def _closed(tx: Tx, run_id: str, closing: _Closing) -> None:
    """Read what :func:`_send_close` did, and note whom it wakes."""
    closed, parent_due, waited, sharers, streamed = closing
    (_, parent) = closed.one()
    made_due = parent is not None and parent_due.count() > 0
    note_end(tx, run_id, parent, made_due=made_due, told=waited is not None and waited.count() > 0)
    wake_sharers_and_followers(tx, run_id, [row[0] for row in sharers.all()], streamed.one() is not None)


def note_end(tx: Tx, run_id: str, parent: str | None, *, made_due: bool, told: bool) -> None:
    """Note whom a run's end wakes: its parent (it may be joining this run; ``made_due``: it was
    suspended on it), and, ``told``, whoever waits for the end (``wait_for_end``)."""
    if parent is not None:
        tx.wake(waits=parent, claimable=made_due)
    if told:
        tx.wake(ended=run_id)


def wake_sharers_and_followers(tx: Tx, run_id: str, sharers: Sequence[str], streamed: bool) -> None:
    """Make the forks suspended on a run they share with its source due, and wake them; wake
    the followers of its streams (``streamed``)."""
    for fork in sharers:  # rare: a statement more only then
        made_due = tx.count(MAKE_SHARER_DUE.format(lock=tx.dialect.lock_nowait), (fork, run_id))
        tx.wake(waits=fork, claimable=made_due > 0)
    if streamed:
        tx.wake(streams=run_id)


def open_work(run: str = "?") -> tuple[str, str, str]:
    """What a run must not leave open when it completes, each a read of the run's id ``run`` (as
    for :func:`sharers`): an undecided checkpoint candidate, tool calls without a result, live
    children (see :func:`require_no_open_work`)."""
    return (
        f"SELECT 1 FROM checkpoints WHERE run_id = {run} AND status = 'candidate'",
        f"SELECT call_id FROM tool_intents WHERE run_id = {run} AND result_seq IS NULL"
        " ORDER BY intent_seq LIMIT 5",
        f"SELECT id FROM agent_runs WHERE parent_run_id = {run}"
        " AND status IN ('pending', 'running', 'waiting') LIMIT 5",
    )


OPEN_WORK = open_work()


def require_no_open_work(
    run_id: str, candidate: bool, open_calls: Sequence[str], live: Sequence[str]
) -> None:
    """UnfinishedWork unless the :data:`OPEN_WORK` reads found nothing."""
    if candidate:
        raise UnfinishedWork(f"run {run_id} cannot complete: a checkpoint candidate is undecided")
    if open_calls:
        ids = ", ".join(repr(call_id) for call_id in open_calls)
        raise UnfinishedWork(f"run {run_id} cannot complete: tool calls {ids} have no result yet")
    if live:
        ids = ", ".join(live)
        raise UnfinishedWork(
            f"run {run_id} cannot complete: child runs {ids} have not ended (join or cancel them)"
        )


def record_attempt_failure(
    tx: Tx, lease: Lease, failure: dict[str, Any], retry_delay_ms: int | None, reason: str
) -> None:
    """Log ``attempt_failed`` (``failure`` plus its ``next_attempt_at``), then release the run
    for a retry after the delay or, with None, fail it for ``reason``. Fenced."""
    tx.fence(lease)
    retry_at = None if retry_delay_ms is None else tx.now + retry_delay_ms
    tx.log(lease.run_id, EventType.ATTEMPT_FAILED, _dump({**failure, "next_attempt_at": retry_at}))
    if retry_delay_ms is None:
        transition = {"from": "running", "reason": reason, "to": "failed"}
        end_run(tx, lease.run_id, _dump(transition), RunStatus.FAILED)
    else:
        release(tx, lease, retry_delay_ms)


def release(tx: Tx, lease: Lease, delay_ms: int = 0, refund_attempt: bool = False) -> bool:
    """Give the lease up; the run stays as it is, claimable after ``delay_ms``.
    ``refund_attempt`` takes back the attempt its claim counted (the owner was stopped).
    False if it was not this owner's any more."""
    # The row is found and locked NOWAIT by the subquery: the UPDATE alone would wait for a row
    # held elsewhere.
    released = tx.count(
        "UPDATE agent_runs SET lease_owner = NULL, lease_expires_at = NULL, next_attempt_at = :now + ?,"
        " attempts = attempts - ? WHERE id = (SELECT id FROM agent_runs WHERE id = ? AND lease_owner = ?"
        f" AND lease_epoch = ?{tx.dialect.lock_nowait})",
        (delay_ms, int(refund_attempt), lease.run_id, lease.owner, lease.epoch),
    )
    if released and delay_ms == 0:
        tx.wake(claimable=True)
    return bool(released)


def watch_end(tx: Tx, run_id: str, waiter: str) -> RunRecord:
    """Note that ``waiter`` waits for the run to end, where its end must be told (a row of
    ``run_waiters`` makes the end send a notification; SQLite's watcher looks at the file
    instead), and return the run as it is now. RunNotFound. An ended run gets no note.

    An end that commits after the note is read sends the notification; one whose statement
    ran just before the note was committed, but which commits after the run is read here,
    sends none: the waiter's poll finds that one."""
    if tx.dialect.end_waiters:  # sent with the read below: one round trip
        tx.execute(
            "INSERT INTO run_waiters (run_id, waiter, created_at) SELECT id, ?, :now FROM agent_runs"
            " WHERE id = ? AND status IN ('pending', 'running', 'waiting') ON CONFLICT DO NOTHING",
            (waiter, run_id),
        )
    return get_run(tx, run_id)


def unwatch_end(tx: Tx, run_id: str, waiter: str) -> None:
    """Drop ``waiter``'s note (nothing if the run's end took it already)."""
    if tx.dialect.end_waiters:
        tx.execute("DELETE FROM run_waiters WHERE run_id = ? AND waiter = ?", (run_id, waiter))


# -- runs ended by others -----------------------------------------------------------------------


def cancel_unowned(tx: Tx, run_id: str, status: str, reason: str, lost: LostAttempt | None = None) -> None:
    """End a run nobody holds as cancelled, logging the loss of the attempt that held it last
    (if any)."""
    if lost is not None:
        tx.log(run_id, EventType.ATTEMPT_LOST, _dump(lost.payload()))
    transition = _dump({"from": status, "reason": reason, "to": "cancelled"})
    end_run(tx, run_id, transition, RunStatus.CANCELLED, new_epoch=True)


def fail_exhausted(tx: Tx, run_id: str, status: str, reason: str, lost: LostAttempt | None) -> None:
    """Fail a run whose attempts are spent, logging the last one's loss if it was lost."""
    if lost is not None:
        tx.log(run_id, EventType.ATTEMPT_LOST, _dump(lost.payload()))
    transition = _dump({"from": status, "reason": reason, "to": "failed"})
    end_run(tx, run_id, transition, RunStatus.FAILED, new_epoch=True)


def cancel_descendants(tx: Tx, root: str, reason: str) -> tuple[list[str], list[str]]:
    """Cancel the live runs below ``root``, level by level: unowned ones at once, owned ones by
    a request their owners act on. (cancelled, requested) ids.

    Rows are locked NOWAIT: a descendant its owner is writing right now makes the whole
    operation busy (the caller tries again), so that this transaction never waits for a run while
    holding others, which could close a deadlock with an owner's group commit.
    """
    cancelled: list[str] = []
    requested: list[str] = []
    level = [root]
    while level:
        below: list[str] = []
        closings: list[tuple[str, _Closing]] = []
        for chunk in tx.dialect.chunks(level):
            parents, params = tx.dialect.any_of("parent_run_id", chunk)
            rows = tx.all(
                f"SELECT id, status, lease_owner, lease_expires_at FROM agent_runs WHERE {parents}"
                f" AND status IN ('pending', 'running', 'waiting'){tx.dialect.lock_nowait}",
                params,
            )
            for run_id, status, owner, expires_at in rows:
                below.append(run_id)
                if lease_held(owner, expires_at, tx.now):
                    request_cancel(tx, run_id, reason)
                    requested.append(run_id)
                else:
                    # Its own descendants are this loop's next level: nothing to cascade twice.
                    transition = _dump({"from": status, "reason": reason, "to": "cancelled"})
                    closing = _send_close(tx, run_id, transition, RunStatus.CANCELLED, None, new_epoch=True)
                    closings.append((run_id, closing))
                    cancelled.append(run_id)
        for run_id, closing in closings:  # read once the level's ends are all sent
            _closed(tx, run_id, closing)
        level = below
    return cancelled, requested


def request_cancel(tx: Tx, run_id: str, reason: str) -> None:
    """Ask the owner of a run to stop (the first request's reason stays)."""
    tx.execute(
        "UPDATE agent_runs SET cancel_requested_at = coalesce(cancel_requested_at, :now),"
        " cancel_reason = coalesce(cancel_reason, ?) WHERE id = ?",
        (reason, run_id),
    )
    tx.wake(inbox=run_id)


def cancel_run(tx: Tx, run_id: str, reason: str) -> CancelOutcome:
    """An outsider's cancellation, no lease needed: an unowned run (and its unowned live
    descendants) ends ``cancelled`` at once, under a new epoch that fences any stale owner; an
    owned one gets a request its owner acts on. RunNotFound."""
    row = tx.lock_run(run_id, "status, lease_owner, lease_expires_at")
    if row is None:
        raise RunNotFound(f"run {run_id} does not exist")
    status, owner, expires_at = row
    if status not in LIVE:
        return CancelOutcome((), (), already_terminal=status)
    if lease_held(owner, expires_at, tx.now):
        request_cancel(tx, run_id, reason)
        cancelled, requested = cancel_descendants(tx, run_id, reason)
        return CancelOutcome(tuple(cancelled), (run_id, *requested))
    cancel_unowned(tx, run_id, status, reason)
    return CancelOutcome((run_id,), ())


def cancel_child(tx: Tx, lease: Lease, child_id: str, reason: str) -> CancelOutcome:
    """cancel_run of one of this run's children. Fenced; InvalidArgument (not a child)."""
    tx.fence(lease)
    parent = tx.one("SELECT parent_run_id FROM agent_runs WHERE id = ?", (child_id,))
    if parent is None or parent[0] != lease.run_id:
        where = f"run {lease.run_id}: {child_id} is not a child of this run"
        if tx.one(
            "SELECT 1 FROM shared_children WHERE run_id = ? AND child_id = ?", (lease.run_id, child_id)
        ):
            raise InvalidArgument(f"{where}: it is its source's, shared with this fork (docs/forks.md)")
        raise InvalidArgument(where)
    return cancel_run(tx, child_id, reason)


def cancel_requested(tx: Tx, run_id: str) -> str | None:
    """The reason of a cancellation requested and not yet acted on."""
    row = tx.one("SELECT cancel_reason, cancel_requested_at FROM agent_runs WHERE id = ?", (run_id,))
    return None if row is None or row[1] is None else str(row[0])


def owner_news(tx: Tx, run_id: str) -> tuple[str | None, int | None]:
    """What an owner looks at when its inbox has news (a read): the reason of a cancellation
    requested and not yet acted on, and when the run's wall time runs out (None: none)."""
    row = tx.one(
        f"SELECT cancel_reason, cancel_requested_at, {WALL_END} FROM agent_runs WHERE id = ?", (run_id,)
    )
    if row is None:
        return None, None
    reason, requested_at, wall_end = row
    return (None if requested_at is None else str(reason)), (None if wall_end is None else int(wall_end))
