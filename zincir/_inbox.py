"""Outsiders' writes: they need no lease and only ever write a run's inbox.

Only the lease holder writes a run's log: a signal sent here lands in the ``signals`` table and
enters the log (``signal_received``) when the run's owner consumes it, in the owner's own fenced
transaction. So nothing an outsider does can interleave with the owner's sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

import attrs
import trio

from ._backend import CancelOutcome, DecideOutcome, SendOutcome
from ._budget import LIMIT_COLUMNS, Budget
from ._database import Database
from ._errors import InvalidArgument, RunTerminal, TransientConflict
from ._json import JSONValue, encode
from ._run import announce_cancellation
from ._types import Approval
from ._validation import canonical_run_id, check_call_id, check_name, check_text

__all__ = ["cancel_run", "decide_approval", "raise_budget", "send_signal"]

T = TypeVar("T")

# How long an outsider's write keeps trying while the run's owner is writing it.
_BUSY_FOR_S: Final = 30.0


async def send_signal(
    db: Database, run_id: str, signal: str, payload: JSONValue = None, *, key: str | None = None
) -> int:
    """Send ``signal`` (a topic name) with a JSON ``payload`` to a run; returns the signal's id.

    The run need not be owned, or even running yet. The oldest unconsumed signal of a topic goes
    to the next :meth:`Run.wait_for_signal` for that topic, whenever it comes; a run suspended
    on that topic becomes claimable at once, and workers are woken. With ``key``,
    sending is idempotent: a repeat returns the first signal's id and stores nothing.
    Raises :class:`RunNotFound`, or :class:`RunTerminal` for a completed, failed or cancelled run.
    """
    if not isinstance(db, Database):
        raise InvalidArgument(f"send_signal() needs a Database, not {db!r}")
    run_id = canonical_run_id(run_id)
    topic = check_name(signal, f"run {run_id}: signal name")
    if key is not None:
        check_text(key, f"run {run_id}: signal key", max_chars=1024)
    payload_json = encode(
        payload, what=f"run {run_id}: the payload of signal {topic!r}", limit=db.max_payload_bytes
    )
    sent: SendOutcome = await _as_outsider(db, run_id, db._store.send_signal, topic, payload_json, key)
    if sent.stored:
        db._announce_inbox(run_id)
    if sent.woke:
        db._announce_claimable()
    return sent.signal_id


async def decide_approval(
    db: Database,
    run_id: str,
    call_id: str,
    *,
    approved: bool,
    by: str,
    reason: str = "",
    args_hash: str | None = None,
) -> Approval:
    """Approve or deny the requested approval of tool call ``call_id`` of a run, as ``by``.

    With ``args_hash``, the decision is refused (:class:`ApprovalHashMismatch`) unless it is the
    intent's hash: the approver saw exactly these arguments. Deciding the same way again returns
    the recorded decision; the other way, :class:`ApprovalConflict`. An unknown intent is
    :class:`NoDurableIntent`, one without a request :class:`ApprovalNotRequested`. The run's
    owner enters the decision in the log (``approval_decided``) when its wait sees it.
    """
    if not isinstance(db, Database):
        raise InvalidArgument(f"decide_approval() needs a Database, not {db!r}")
    run_id = canonical_run_id(run_id)
    check_call_id(call_id, f"run {run_id}: call_id")
    if not isinstance(approved, bool):
        raise InvalidArgument(f"run {run_id}: approved must be True or False, not {approved!r}")
    check_text(by, f"run {run_id}: the approver (by)")
    check_text(reason, f"run {run_id}: the reason", max_chars=4000, allow_empty=True)
    if args_hash is not None:
        check_text(args_hash, f"run {run_id}: args_hash", max_chars=64)
    decided: DecideOutcome = await _as_outsider(
        db, run_id, db._store.decide_approval, call_id, approved, by, reason, args_hash
    )
    db._announce_inbox(run_id)
    if decided.woke:
        db._announce_claimable()
    return decided.approval


async def cancel_run(db: Database, run_id: str, reason: str) -> None:
    """Cancel a run and its live descendants. A run nobody holds (pending, suspended, or whose
    owner died) ends ``cancelled`` at once; an owned one gets a request its owner's heartbeat
    acts on at its next renewal (at once in this process, or when another process's worker hears
    of it), stopping the body and ending the run ``cancelled``. Cancelling a cancelled run does
    nothing; a completed or failed one is :class:`RunTerminal`; an unknown one
    :class:`RunNotFound`."""
    if not isinstance(db, Database):
        raise InvalidArgument(f"cancel_run() needs a Database, not {db!r}")
    run_id = canonical_run_id(run_id)
    reason = check_text(reason, f"run {run_id}: the reason", max_chars=4000, allow_empty=True)
    outcome: CancelOutcome = await _as_outsider(db, run_id, db._store.cancel_run, reason)
    if outcome.already_terminal not in (None, "cancelled"):
        raise RunTerminal(f"run {run_id} is already {outcome.already_terminal}; it cannot be cancelled")
    announce_cancellation(db, outcome)


async def raise_budget(db: Database, run_id: str, **limits: Any) -> None:
    """Set some of a run's :class:`~zincir.Budget` limits (keywords as Budget's; None removes
    one). A run without a budget gets one: its spend is counted from now on (its wall time, as
    always, from its creation). A run suspended for
    its budget resumes at once if it is within every limit again. :class:`RunNotFound`,
    :class:`RunTerminal`; a bad limit is :class:`InvalidArgument` and changes nothing."""
    if not isinstance(db, Database):
        raise InvalidArgument(f"raise_budget() needs a Database, not {db!r}")
    run_id = canonical_run_id(run_id)
    unknown = sorted(set(limits) - {f.name for f in attrs.fields(Budget)})
    if unknown or not limits:
        raise InvalidArgument(f"raise_budget() takes Budget's limits as keywords, not {unknown or 'none'}")
    columns = zip(_LIMIT_NAMES, LIMIT_COLUMNS, Budget(**limits).to_row(), strict=True)  # validates
    changes = {column: value for name, column, value in columns if name in limits}
    woke: bool = await _as_outsider(db, run_id, db._store.set_budget, changes)
    db._announce_inbox(run_id)
    if woke:
        db._announce_claimable()


_LIMIT_NAMES: Final = tuple(f.name for f in attrs.fields(Budget))


async def _as_outsider(db: Database, run_id: str, fn: Callable[..., T], *args: Any) -> T:
    """Write ``run_id``'s inbox; while its owner's write holds the run (PostgreSQL refuses to
    wait for it: see the store), try again shortly. Nothing was written by a busy attempt."""
    delay, give_up_at = 0.001, trio.current_time() + _BUSY_FOR_S
    while True:
        try:
            return await db._write(fn, run_id, *args, route=run_id)
        except TransientConflict:
            if trio.current_time() + delay > give_up_at:
                raise
        await trio.sleep(delay)
        delay = min(2 * delay, 0.05)
