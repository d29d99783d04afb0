"""The values storage operations take and return, shared by the operations and the core.

Runs, workers and outsiders' writes (:mod:`zincir._run`, :mod:`zincir._worker`,
:mod:`zincir._inbox`) hand these to the operations of :mod:`zincir._store` and get these back;
they know no SQL.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any, Literal, NamedTuple

import attrs

from .._errors import InvalidArgument
from .._json import decode, dump_trusted
from .._owner import Owner, judge, this_process
from .._types import Approval, RunRecord, RunStatus

__all__ = [
    "SUBMIT_CHECKPOINT",
    "ApprovalOutcome",
    "Awaited",
    "CancelOutcome",
    "Claims",
    "DecideOutcome",
    "IntentRow",
    "JoinOutcome",
    "Lease",
    "LostAttempt",
    "NewChild",
    "OpenWait",
    "SendOutcome",
    "SweptContent",
    "WaitKind",
    "WaitOutcome",
    "approval_of",
    "args_hash",
    "check_wait_topic",
    "earliest",
    "exhausted_reason",
    "lost_attempt",
    "signal_received_payload",
    "suspension_payload",
]

SUBMIT_CHECKPOINT = "submit_checkpoint"
"""The tool name whose intents are answered by :meth:`Run.checkpoint`, not by a tool."""

WaitKind = Literal["signal", "approval", "sleep", "child", "budget"]
"""What a suspended run waits for: a named signal wait, an approval (by call id), a sleep, or
a child run to end (by its id), or a budget raised (target "")."""

OpenWait = tuple[WaitKind, str]
"""One wait a run's body is in: its kind and its name (the signal wait's name, the call id, the
child's id, the sleep's name, the budget limit reached)."""


@attrs.frozen
class Awaited:
    """What one open wait still awaits, as a suspension records it (see :func:`~zincir._store.suspend`)."""

    kind: WaitKind
    name: str
    wake_key: str
    """What an outsider's write that satisfies it matches: the signal's topic, the call id,
    the child's id, the sleep's name ('' for a budget)."""
    deadline: int | None
    """Its deadline or wake time, on the database's clock (None: none)."""

    def due(self, now: int) -> bool:
        return self.deadline is not None and self.deadline <= now

    def describe(self) -> dict[str, Any]:
        """The wait as a suspension's event shows it."""
        if self.kind == "signal":
            return {"kind": "signal", "name": self.name, "signal": self.wake_key}
        if self.kind == "approval":
            return {"call_id": self.name, "kind": "approval"}
        if self.kind == "child":
            return {"child_id": self.name, "kind": "child"}
        if self.kind == "budget":
            return {"kind": "budget", "limit": self.name}
        return {"kind": "sleep", "name": self.name}


def earliest(deadlines: Iterable[int | None]) -> int | None:
    """The earliest of some deadlines (None: none of them has one)."""
    return min((d for d in deadlines if d is not None), default=None)


def suspension_payload(waits: Sequence[Awaited], until: int | None) -> str:
    """The ``state_transition`` of a suspension: ``waiting_for`` the wait that began it (the
    first), ``waits`` all of them (any wakes the run), ``until`` the earliest deadline."""
    return dump_trusted(
        {
            "from": "running",
            "to": "waiting",
            "until": until,
            "waiting_for": waits[0].describe(),
            "waits": [{**wait.describe(), "until": wait.deadline} for wait in waits],
        }
    )


@attrs.frozen
class Lease:
    """One owner's hold on a run: valid while (owner, epoch) match and it has not expired."""

    run_id: str
    owner: str
    epoch: int
    ttl_ms: int
    expires_at: int
    """On the database's clock."""
    wall_time_ends_at: int | None = None
    """When the run's budget of wall time runs out, on the database's clock (None: no limit)."""
    config_json: str = attrs.field(default="{}", kw_only=True)
    """The run's config as stored, read by the acquisition that made the lease (it never
    changes): :attr:`Run.config` without a read of its own."""
    version: str | None = attrs.field(default=None, kw_only=True)
    """The run's version when the lease was taken: while the lease holds, nobody moves the run
    to another (:func:`~zincir._store._versions.set_version` refuses a leased run)."""
    role: str = attrs.field(default="agent", kw_only=True)
    provider: str = attrs.field(default="", kw_only=True)
    traceparent: str | None = attrs.field(default=None, kw_only=True)
    """The W3C trace context the run's spans continue (docs/tracing.md); read, like the role
    and provider, by the acquisition that made the lease."""

    @property
    def fencing_token(self) -> str:
        return f"{self.run_id}:{self.epoch}"


KnownBy = Literal["process_gone", "lease_expired", "forced"]
"""How a lost attempt's owner is known to be gone (docs/crashes.md)."""


@attrs.frozen
class LostAttempt:
    """An attempt that ended without a record: its owner never released its lease, and a new
    owner takes the run (or ends it) now. docs/crashes.md tells how it is known and counted."""

    owner: str
    epoch: int
    lease_expires_at: int
    known_by: KnownBy
    reason: str
    """Why the owner is known to be gone, in words (the takeover's reason too)."""
    attempts: int
    """The attempts counted against ``max_attempts`` so far (this one, if a worker claimed it)."""
    max_attempts: int | None = None
    """The claiming worker's limit (None: open_run, or no limit)."""

    @property
    def at_once(self) -> bool:
        """Whether its lease is taken before it expired."""
        return self.known_by != "lease_expired"

    def payload(self) -> dict[str, Any]:
        """The ``attempt_lost`` event's payload."""
        return {
            "attempts": self.attempts,
            "epoch": self.epoch,
            "known_by": self.known_by,
            "lease_expires_at": self.lease_expires_at,
            "max_attempts": self.max_attempts,
            "owner": self.owner,
            "reason": self.reason,
        }

    def takeover_payload(self) -> dict[str, Any]:
        """The ``lease_taken_over`` event's payload: at once, or after the lease expired."""
        return {"at_once": self.at_once, "from_epoch": self.epoch, "reason": self.reason}

    def summary(self) -> str:
        """``lost to ...``, for a failure reason and a log line."""
        return f"lost to {_LOST_TO[self.known_by]} (owner {self.owner}, epoch {self.epoch}): {self.reason}"


_LOST_TO: dict[KnownBy, str] = {
    "process_gone": "the death of its process",
    "lease_expired": "an expired lease",
    "forced": "a forced takeover",
}


def lost_attempt(
    now: int,
    row: Sequence[Any],
    attempts: int,
    max_attempts: int | None = None,
    *,
    forced: bool = False,
) -> LostAttempt | None:
    """What a lease row (lease_owner, lease_epoch, lease_expires_at, lease_host, lease_pid,
    lease_process_start) says of the attempt that held it, for a new owner about to take it;
    None when nobody held it (it was released: the attempt ended on the record).

    Not for an unexpired lease of an owner that may live (the caller refuses that one first):
    an unexpired lease here was forced, or its owner is provably gone with all it started."""
    owner, epoch, expires_at, host, pid, started = row
    if owner is None:
        return None
    holder = Owner(host, pid, started)
    known_by: KnownBy
    if forced and expires_at > now:
        known_by, reason = "forced", "open_run(force=True): the caller vouched that its owner is dead"
    elif expires_at > now:
        known_by, reason = "process_gone", judge(holder).reason
    else:
        known_by, reason = "lease_expired", f"its lease expired {now - expires_at} ms ago"
        if host == this_process().host:  # what this host knows of it, for the new owner
            reason += f"; {judge(holder).reason}"
    return LostAttempt(owner, epoch, expires_at, known_by, reason, attempts, max_attempts)


def exhausted_reason(attempts: int, max_attempts: int, how_the_last_ended: str) -> str:
    """The failure reason of a run whose attempts are spent."""
    return f"attempts exhausted: {attempts} of {max_attempts}, the last {how_the_last_ended}"


@attrs.frozen
class Claims:
    """What one claim did: the runs it leased, as (lease, attempt) most overdue first; why the
    attempt before each was lost, by run id; and the runs it ended instead, as (run id, status,
    reason): out of attempts (failed), or cancelled while nobody held them."""

    leased: list[tuple[Lease, int]] = attrs.Factory(list)
    lost: dict[str, LostAttempt] = attrs.Factory(dict)
    ended: list[tuple[str, RunStatus, str]] = attrs.Factory(list)


@attrs.frozen
class IntentRow:
    """A tool intent of a model response, encoded and ready to store."""

    call_id: str
    name: str
    payload_json: str


@attrs.frozen
class WaitOutcome:
    """What deciding a named wait found: a signal's payload, a timeout, or nothing yet."""

    state: Literal["received", "timed_out", "pending"]
    payload_json: str | None = None
    deadline: int | None = None
    """Timed out: the stored deadline. Pending: ms left until it (None: no deadline)."""

    @classmethod
    def received(cls, payload_json: str) -> WaitOutcome:
        return cls("received", payload_json)

    @classmethod
    def timed_out(cls, deadline: int) -> WaitOutcome:
        return cls("timed_out", deadline=deadline)

    @classmethod
    def pending(cls, remaining_ms: int | None) -> WaitOutcome:
        return cls("pending", deadline=remaining_ms)


@attrs.frozen
class SendOutcome:
    """What sending a signal did: its id, and whether it was stored now (not a keyed repeat)."""

    signal_id: int
    stored: bool


def check_wait_topic(run_id: str, name: str, stored: str, asked: str) -> None:
    if stored != asked:
        raise InvalidArgument(
            f"run {run_id}: wait {name!r} waits for signal {stored!r}, not {asked!r}; a wait's name"
            " is bound to its first call"
        )


def args_hash(name: str, args: Any) -> str:
    """SHA-256 of the canonical JSON (sorted keys, compact) of a tool intent's name and args."""
    return hashlib.sha256(dump_trusted({"args": args, "name": name}).encode()).hexdigest()


@attrs.frozen
class ApprovalOutcome:
    """What looking at an approval found: its decision, a timeout, or nothing yet."""

    state: Literal["decided", "timed_out", "pending"]
    approval: Approval
    remaining_ms: int | None = None


class NewChild(NamedTuple):
    """A child run to create: what ``spawn_children`` takes for each (a tuple, so
    that a database thread sees the size of its strings: see ``_threads._for_the_loop``)."""

    name: str
    child_id: str  # used if the child is new
    role: str
    provider: str
    config_json: str
    budget: tuple[Any, ...] | None = None
    version: str | None = None  # None: the parent's
    fingerprints_json: str | None = None  # None: the parent's
    traceparent: str | None = None
    """The trace context the child's spans continue: the span that spawned it (docs/tracing.md)."""


@attrs.frozen
class JoinOutcome:
    """What looking at a join found: the ended child, a timeout, or nothing yet."""

    state: Literal["ended", "timed_out", "pending"]
    child: RunRecord | None = None
    remaining_ms: int | None = None


@attrs.frozen
class CancelOutcome:
    """What a cancellation did: the runs it ended now (the run itself, unowned descendants),
    and those whose owners were asked to stop."""

    cancelled: tuple[str, ...]
    requested: tuple[str, ...]
    already_terminal: str | None = None
    """The run's status if it had ended before (then nothing was done)."""


@attrs.frozen
class DecideOutcome:
    """The decision as recorded."""

    approval: Approval
    recorded: bool = True
    """False when the same decision was there already (nothing was written)."""


def approval_of(row: Any) -> Approval:
    """An Approval from (call_id, approved, decided_by, reason, args_hash, requested_at, decided_at)."""
    call_id, approved, by, reason, hash_, requested_at, decided_at = row
    return Approval(
        call_id, None if approved is None else bool(approved), by, reason, hash_, requested_at, decided_at
    )


def signal_received_payload(name: str, topic: str, signal_id: int, payload_json: str) -> str:
    return dump_trusted(
        {"name": name, "payload": decode(payload_json), "signal": topic, "signal_id": signal_id}
    )


@attrs.frozen
class SweptContent:
    """What one sweep of the content store deleted (``Store.sweep_content``)."""

    parts: int
    """Stored parts deleted (the batch was full when this is its limit: sweep again)."""
    chars: int
    """Their size, in characters of JSON (ASCII: bytes)."""
