"""Outsiders' writes: they need no lease and only ever write a run's inbox.

Only the lease holder writes a run's log: a signal sent here lands in the ``signals`` table and
enters the log (``signal_received``) when the run's owner consumes it, in the owner's own fenced
transaction. So nothing an outsider does can interleave with the owner's sequence. The few
writes that log an event themselves (a cancellation ending a run, a move to another version) do
so only while nobody holds the run, with its row held against the next owner's claim.

Every write here also leaves a row in the audit trail (``outsider_actions``), in the same
transaction: what was done, to which run, when, and by whom (``by``, as the caller names them;
None when it names nobody). A call that changes nothing (a keyed repeat of a signal, the same
decision again, cancelling a cancelled run) leaves no row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

import attrs
import trio

from ._budget import LIMIT_COLUMNS, Budget
from ._database import Database, storage
from ._errors import InvalidArgument, RunTerminal, TransientConflict
from ._json import JSONValue, dump_trusted, encode
from ._store import CancelOutcome, DecideOutcome, SendOutcome
from ._types import Approval
from ._validation import canonical_run_id, check_call_id, check_name, check_text, check_version

__all__ = ["cancel_run", "decide_approval", "raise_budget", "retry_now", "send_signal", "set_version"]

T = TypeVar("T")

# How long an outsider's write keeps trying while the run's owner is writing it.
_BUSY_FOR_S: Final = 30.0


async def send_signal(
    db: Database,
    run_id: str,
    signal: str,
    payload: JSONValue = None,
    *,
    key: str | None = None,
    by: str | None = None,
) -> int:
    """Send ``signal`` (a topic name) with a JSON ``payload`` to a run; returns the signal's id.

    The run need not be owned, or even running yet. The oldest unconsumed signal of a topic goes
    to the next :meth:`Run.wait_for_signal` for that topic, whenever it comes; a run suspended
    on that topic becomes claimable at once, and workers are woken. With ``key``,
    sending is idempotent: a repeat returns the first signal's id and stores nothing. ``by``
    names the sender in the audit trail.
    Raises :class:`RunNotFound`, or :class:`RunTerminal` for a completed, failed or cancelled run.
    """
    if not isinstance(db, Database):
        raise InvalidArgument(f"send_signal() needs a Database, not {db!r}")
    run_id = canonical_run_id(run_id)
    topic = check_name(signal, f"run {run_id}: signal name")
    if key is not None:
        check_text(key, f"run {run_id}: signal key", max_chars=1024)
    by = _check_by(by, run_id)
    payload_json = encode(  # the signal_received event keeps it one level down
        payload,
        what=f"run {run_id}: the payload of signal {topic!r}",
        limit=db.max_payload_bytes,
        nested_in=1,
    )

    def audit(sent: SendOutcome) -> _Entry | None:
        return ("signal", {"key": key, "signal": topic, "signal_id": sent.signal_id}) if sent.stored else None

    write = _audited(db, storage(db).store.send_signal, audit, by)
    sent: SendOutcome = await _as_outsider(db, run_id, write, topic, payload_json, key)
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
    owner enters the decision in the log (``approval_decided``) when its wait sees it; the
    audit trail has it at once (action ``approve`` or ``deny``, by ``by``).
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

    def audit(decided: DecideOutcome) -> _Entry | None:
        if not decided.recorded:
            return None
        detail = {"args_hash": decided.approval.args_hash, "call_id": call_id, "reason": reason}
        return ("approve" if approved else "deny", detail)

    write = _audited(db, storage(db).store.decide_approval, audit, by)
    decided: DecideOutcome = await _as_outsider(db, run_id, write, call_id, approved, by, reason, args_hash)
    return decided.approval


async def cancel_run(db: Database, run_id: str, reason: str, *, by: str | None = None) -> None:
    """Cancel a run and its live descendants. A run nobody holds (pending, suspended, or whose
    owner died) ends ``cancelled`` at once; an owned one gets a request its owner's heartbeat
    acts on at its next renewal (at once in this process, or when another process's worker hears
    of it), stopping the body and ending the run ``cancelled``. Cancelling a cancelled run does
    nothing; a completed or failed one is :class:`RunTerminal`; an unknown one
    :class:`RunNotFound`. ``by`` names who cancelled in the audit trail."""
    if not isinstance(db, Database):
        raise InvalidArgument(f"cancel_run() needs a Database, not {db!r}")
    run_id = canonical_run_id(run_id)
    reason = check_text(reason, f"run {run_id}: the reason", max_chars=4000, allow_empty=True)
    by = _check_by(by, run_id)

    def audit(outcome: CancelOutcome) -> _Entry | None:
        if outcome.already_terminal is not None:
            return None
        detail = {"cancelled": len(outcome.cancelled), "reason": reason, "requested": len(outcome.requested)}
        return ("cancel", detail)

    write = _audited(db, storage(db).store.cancel_run, audit, by)
    outcome: CancelOutcome = await _as_outsider(db, run_id, write, reason)
    if outcome.already_terminal not in (None, "cancelled"):
        raise RunTerminal(f"run {run_id} is already {outcome.already_terminal}; it cannot be cancelled")


async def raise_budget(db: Database, run_id: str, *, by: str | None = None, **limits: Any) -> None:
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
    by = _check_by(by, run_id)
    detail = {"limits": dict(limits)}  # as given, and valid: Budget() checked them
    write = _audited(db, storage(db).store.set_budget, lambda _: ("raise_budget", detail), by)
    await _as_outsider(db, run_id, write, changes)


_LIMIT_NAMES: Final = tuple(f.name for f in attrs.fields(Budget))


async def retry_now(db: Database, run_id: str, *, by: str | None = None) -> bool:
    """Retry a backing-off run now: a live run nobody holds whose next attempt lies in the
    future (a worker released it after a failure, or after its handler returned without ending
    it) becomes due at once, and workers are woken. Returns True; False if the run was due
    already (nothing is written). The attempt count is kept, so ``max_attempts`` still holds.
    ``by`` names who asked in the audit trail. :class:`RunNotFound`; :class:`RunTerminal` for
    an ended run; :class:`RunLeased` for one an owner holds (it is running); :class:`RunWaiting`
    for one suspended on a wait (what it awaits makes it due, not this)."""
    if not isinstance(db, Database):
        raise InvalidArgument(f"retry_now() needs a Database, not {db!r}")
    run_id = canonical_run_id(run_id)
    by = _check_by(by, run_id)

    def audit(was_due_at: int | None) -> _Entry | None:
        return None if was_due_at is None else ("retry_now", {"was_due_at": was_due_at})

    write = _audited(db, storage(db).store.retry_now, audit, by)
    was_due_at: int | None = await _as_outsider(db, run_id, write)
    return was_due_at is not None


async def set_version(db: Database, run_id: str, version: str | None, *, by: str | None = None) -> bool:
    """Move a run to another version of the agent on purpose (None: to no version): from now on
    only workers serving ``version`` claim it, and ``open_run(db, run_id, version=...)`` resumes
    it under that version alone. Logs ``version_changed`` (from, to, by) and leaves a row in the
    audit trail (action ``set_version``). Returns True; False if the run is of that version
    already (nothing is written). A run an owner holds is :class:`RunLeased`: its owner runs the
    old version's code until it lets the run go (it ends, suspends or backs off), so move it
    then (docs/versions.md). :class:`RunNotFound`; :class:`RunTerminal` for an ended run."""
    if not isinstance(db, Database):
        raise InvalidArgument(f"set_version() needs a Database, not {db!r}")
    run_id = canonical_run_id(run_id)
    version = check_version(version, f"run {run_id}: version")
    by = _check_by(by, run_id)

    def audit(moved: tuple[str | None, str | None] | None) -> _Entry | None:
        return None if moved is None else ("set_version", {"from": moved[0], "to": moved[1]})

    write = _audited(db, storage(db).store.set_version, audit, by)
    moved: tuple[str | None, str | None] | None = await _as_outsider(db, run_id, write, version, by)
    return moved is not None


_Entry = tuple[str, dict[str, Any]]
"""An audit row to write: the action and its detail."""


def _check_by(by: object, run_id: str) -> str | None:
    return None if by is None else check_text(by, f"run {run_id}: who acts (by)")


def _audited(
    db: Database, write: Callable[..., T], entry_of: Callable[[T], _Entry | None], by: str | None
) -> Callable[..., T]:
    """``write``, then (in its transaction, on the database thread) the audit row ``entry_of``
    makes of its outcome, if any; a write that raises leaves neither."""
    record = storage(db).store.record_action

    def audited(tx: Any, run_id: str, *args: Any) -> T:
        outcome = write(tx, run_id, *args)
        entry = entry_of(outcome)
        if entry is not None:
            action, detail = entry
            record(tx, run_id, action, by, dump_trusted(detail))
        return outcome

    return audited


async def _as_outsider(db: Database, run_id: str, fn: Callable[..., T], *args: Any) -> T:
    """Write ``run_id``'s inbox; while its owner's write holds the run (PostgreSQL refuses to
    wait for it: see zincir/_store/_tx.py), try again shortly. Nothing was written by a busy attempt."""
    delay, give_up_at = 0.001, trio.current_time() + _BUSY_FOR_S
    while True:
        try:
            return await storage(db).write(fn, run_id, *args, route=run_id)
        except TransientConflict:
            if trio.current_time() + delay > give_up_at:
                raise
        await trio.sleep(delay)
        delay = min(2 * delay, 0.05)
