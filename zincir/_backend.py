"""The storage interface: every operation a backend implements, in one place.

The core (:class:`~zincir.Run`, :class:`~zincir.ResumeWorker`, :class:`~zincir.Database`) knows
no SQL. It hands a backend's operations to the backend's database threads, which run each one
inside a transaction and reply into Trio (see :mod:`zincir._threads`). A backend is a package
(``zincir._sqlite``, ``zincir._postgres``) whose ``_store`` module satisfies :class:`Store` and
whose ``open_backend`` builds the threads.

Rules every operation keeps, on every backend:

- It runs inside one transaction (or one SAVEPOINT of a group commit); if it raises, it leaves
  nothing behind.
- "Now" is the database's clock, read inside the operation (on PostgreSQL the server's), never
  the caller's: callers pass durations, not instants.
- A write on behalf of an owner is *fenced*: inside the same transaction it checks that the
  owner's (owner, epoch) still holds an unexpired lease on a running run, and raises
  :class:`LeaseLost` (fenced, expired, released) or :class:`RunTerminal` otherwise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any, Literal, NamedTuple, Protocol

import attrs

from ._budget import Debit, Exceeded, Usage
from ._errors import InvalidArgument
from ._json import decode, dump_trusted
from ._owner import Owner, judge, this_process
from ._types import Approval, Checkpoint, Event, RunRecord, RunStatus

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
    "OpenWait",
    "SendOutcome",
    "Store",
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
    """What one open wait still awaits, as a suspension records it (see :meth:`Store.suspend`)."""

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
    """What sending a signal did: its id, whether it was stored now (not a keyed repeat), and
    whether it made a suspended run due."""

    signal_id: int
    stored: bool
    woke: bool


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
    """A child run to create: what :meth:`Store.spawn_children` takes for each (a tuple, so
    that a database thread sees the size of its strings: see ``_threads._for_the_loop``)."""

    name: str
    child_id: str  # used if the child is new
    role: str
    provider: str
    config_json: str
    budget: tuple[Any, ...] | None = None


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
    """The decision as recorded, and whether recording it made a suspended run due."""

    approval: Approval
    woke: bool
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


class Store(Protocol):
    """Every storage operation. Each takes the backend's transaction first.

    Raises are listed per operation; every operation may also raise :class:`StorageError`
    (or a subclass) when the database itself fails, and then has written nothing.
    """

    # -- leases ---------------------------------------------------------------------------

    def create_run(
        self,
        tx: Any,
        run_id: str,
        parent_run_id: str | None,
        role: str,
        provider: str,
        config_json: str,
        owner: str,
        ttl_ms: int,
        budget: tuple[Any, ...] | None = None,
    ) -> Lease:
        """Insert a run already leased and running, with its first event and its budget's limits
        (in LIMIT_COLUMNS order). RunNotFound (parent)."""

    def acquire_run(self, tx: Any, run_id: str, owner: str, ttl_ms: int, force: bool) -> Lease | None:
        """Take a free or expired lease (any, with ``force``); start a pending run. None: the run
        had a cancellation request nobody acted on, and it was cancelled now.
        RunNotFound, RunTerminal, RunLeased."""

    def claim_due(self, tx: Any, owner: str, ttl_ms: int, max_attempts: int | None, limit: int) -> Claims:
        """Lease up to ``limit`` due runs, most overdue first, and those of dead owners of this
        host with nothing they started alive; log ``attempt_lost`` for a lease nobody released.
        A run past ``max_attempts`` is failed instead, and one with a cancellation requested is
        cancelled."""

    def next_due_in(self, tx: Any) -> int | None:
        """Milliseconds until the next run becomes due by itself; None if none will (a read)."""

    def work_ahead(self, tx: Any) -> bool:
        """Whether a live run is, or will become, claimable without anyone's write from
        outside: one pending or running (due, backing off, or leased), or one suspended in a
        durable sleep or already woken. A run suspended on a signal, an approval, a child or
        its budget is not, whatever its deadline (a read, for a worker's ``until_idle``)."""

    def renew(self, tx: Any, lease: Lease) -> tuple[Lease, str | None]:
        """Extend an unexpired lease by its TTL; with it, the reason of a cancellation someone
        requested (None: none). LeaseLost, RunTerminal."""

    def release(self, tx: Any, lease: Lease, delay_ms: int, refund_attempt: bool) -> bool:
        """Give the lease up; the run is claimable after ``delay_ms``. False if it was not
        this owner's any more."""

    def suspend(self, tx: Any, lease: Lease, waits: Sequence[OpenWait]) -> bool:
        """Unless one of ``waits`` (the body's open waits, the one that began the suspension
        first) can complete now (what it awaits is there, or its deadline has passed): log
        running -> waiting, record every wait, release the lease, give the claim's attempt back,
        and leave the run due at the earliest deadline (None: when an outsider's write matching
        any of the waits arrives). True if it suspended. Fenced."""

    def record_attempt_failure(
        self, tx: Any, lease: Lease, failure: dict[str, Any], retry_delay_ms: int | None, reason: str
    ) -> None:
        """Log ``attempt_failed`` (``failure`` plus its ``next_attempt_at``), then release the
        run for a retry after the delay or, with None, fail it for ``reason``. Fenced."""

    # -- the log --------------------------------------------------------------------------

    def record_response(
        self, tx: Any, lease: Lease, llm_payload_json: str, intents: list[IntentRow], debit: Debit
    ) -> tuple[int, Exceeded | None]:
        """Append ``llm_call`` and one ``tool_call`` per intent, and debit the run's budget (the
        first time that reaches a limit, logged); the seq of ``llm_call``, and the limit the run
        has reached, if any. Fenced; DuplicateToolCall."""

    def pending_tools(self, tx: Any, lease: Lease) -> list[tuple[str, int, int, int | None]]:
        """(tool_call payload, response_tool_count, starts, last start) of each intent without a
        result."""

    def start_tool(self, tx: Any, lease: Lease, call_id: str) -> int:
        """Count a start of a pending intent's tool and log ``tool_started``; the attempt number.
        Fenced; NoDurableIntent, InvalidArgument (it has a result)."""

    def record_tool_result(self, tx: Any, lease: Lease, call_id: str, payload_json: str) -> int:
        """Append ``tool_result``; an identical repeat is a no-op. Fenced; NoDurableIntent,
        ConflictingResult, InvalidArgument (a checkpoint call)."""

    def finish(
        self, tx: Any, lease: Lease, status: RunStatus, payload_json: str, result_json: str | None
    ) -> str | None:
        """End the run with its ``state_transition`` (and ``result``, completing); a failed or
        cancelled run's live descendants are cancelled with it. Returns the parent's id (it may
        be waiting for this run). Fenced; UnfinishedWork (completing with open work or a live
        child)."""

    # -- checkpoints ----------------------------------------------------------------------

    def propose_checkpoint(self, tx: Any, lease: Lease, call_id: str, state_json: str) -> Checkpoint:
        """Store a candidate for a pending ``submit_checkpoint`` intent. Fenced; CheckpointNotPending."""

    def candidate(self, tx: Any, lease: Lease, checkpoint_id: int | None) -> Checkpoint | None:
        """The run's undecided candidate (only if it has ``checkpoint_id``, when given)."""

    def decide_checkpoint(
        self, tx: Any, lease: Lease, checkpoint_id: int, verification_json: str, passed: bool
    ) -> Checkpoint:
        """Record the decision, its event and the answering tool result. Fenced; CheckpointNotPending."""

    # -- steps and sleeps -----------------------------------------------------------------

    def completed_step_names(self, tx: Any, run_id: str) -> list[str]: ...

    def step_result(self, tx: Any, run_id: str, name: str) -> str | None:
        """The stored JSON result of a completed step, or None."""

    def complete_step(self, tx: Any, lease: Lease, name: str, result_json: str, elapsed_ms: int) -> str:
        """Store a step's result (first one wins) and return the stored one. Fenced."""

    def schedule_timer(self, tx: Any, lease: Lease, name: str, delay_ms: int) -> tuple[int, bool]:
        """Store the wake time on the first call; (ms left until it, completed). Fenced."""

    def complete_timer(self, tx: Any, lease: Lease, name: str) -> None: ...

    # -- signals and named waits ----------------------------------------------------------

    def send_signal(
        self, tx: Any, run_id: str, topic: str, payload_json: str, key: str | None
    ) -> SendOutcome:
        """Put a signal in a run's inbox, no lease needed; a run suspended on its topic becomes
        due. With ``key``, a repeat returns the first signal's id and stores nothing.
        RunNotFound, RunTerminal."""

    def await_signal(
        self, tx: Any, lease: Lease, name: str, topic: str, timeout_ms: int | None
    ) -> WaitOutcome:
        """Record wait ``name`` (its deadline on the first call), then bind the oldest
        unconsumed signal of ``topic`` to it, or time it out; both are logged. Fenced;
        InvalidArgument when the name was first used for another topic."""

    def signal_ready(self, tx: Any, run_id: str, topic: str, name: str) -> bool:
        """Whether await_signal would now decide the wait (a read, for polling)."""

    # -- approvals ------------------------------------------------------------------------

    def await_approval(self, tx: Any, lease: Lease, call_id: str, timeout_ms: int | None) -> ApprovalOutcome:
        """Request approval of a pending intent on the first call (``approval_requested``, with
        its args hash and deadline); log a decision once it is there (``approval_decided``), or
        time the request out. Fenced; NoDurableIntent, InvalidArgument (no longer pending)."""

    def decide_approval(
        self,
        tx: Any,
        run_id: str,
        call_id: str,
        approved: bool,
        by: str,
        reason: str,
        expected_hash: str | None,
    ) -> DecideOutcome:
        """An outsider's decision, no lease needed; deciding the same way again is a no-op. A
        run suspended on the approval becomes due.
        RunNotFound, RunTerminal, NoDurableIntent, ApprovalNotRequested, ApprovalConflict,
        ApprovalHashMismatch."""

    def approval_ready(self, tx: Any, run_id: str, call_id: str) -> bool:
        """Whether await_approval would now decide (a read, for polling)."""

    # -- child runs -----------------------------------------------------------------------

    def spawn_children(self, tx: Any, lease: Lease, children: Sequence[NewChild]) -> list[str]:
        """Create each child, in order, as a pending, unleased run, once per name: a repeat
        (after a restart) returns the first child's id. Logs ``child_spawned`` for each new one.
        One lease check for the lot. Fenced."""

    def await_child(self, tx: Any, lease: Lease, child_id: str, timeout_ms: int | None) -> JoinOutcome:
        """Record the join (its deadline on the first call); once the child has ended, log
        ``child_joined`` and return it; time out past the deadline. Fenced; InvalidArgument
        (not a child of this run)."""

    def join_children(self, tx: Any, lease: Lease, child_ids: Sequence[str]) -> list[RunRecord | None]:
        """:meth:`await_child` with no deadline for each, with one lease check: each child's
        record if it has ended (``child_joined`` logged the first time), else None (still
        running, or a join of it timed out before: :meth:`await_child` says which). Fenced;
        InvalidArgument."""

    def watch_end(self, tx: Any, run_id: str, waiter: str) -> RunRecord:
        """Note that ``waiter`` waits for the run to end (where ending it must be told: on
        PostgreSQL a row that makes the end send a notification), and return the run as it is
        now. RunNotFound. An ended run is returned without a note."""

    def unwatch_end(self, tx: Any, run_id: str, waiter: str) -> None:
        """Drop ``waiter``'s note (nothing if the run's end took it already)."""

    def ended_children(self, tx: Any, child_ids: Sequence[str]) -> set[str]:
        """Those of ``child_ids`` that have ended (a read, for a nursery's joins)."""

    def child_ready(self, tx: Any, run_id: str, child_id: str) -> bool:
        """Whether await_child would now decide (a read, for polling)."""

    def cancel_run(self, tx: Any, run_id: str, reason: str) -> CancelOutcome:
        """An outsider's cancellation, no lease needed: an unowned run (and its unowned live
        descendants) ends ``cancelled`` at once, under a new epoch that fences any stale owner;
        an owned one gets a request its owner acts on. RunNotFound."""

    def owner_news(self, tx: Any, run_id: str) -> tuple[str | None, int | None]:
        """What an owner looks at when its inbox has news (a read): the reason of a cancellation
        requested and not yet acted on, and when the run's wall time runs out (None: none)."""

    def cancel_child(self, tx: Any, lease: Lease, child_id: str, reason: str) -> CancelOutcome:
        """cancel_run of one of this run's children. Fenced; InvalidArgument (not a child)."""

    # -- budgets --------------------------------------------------------------------------

    def budget_usage(self, tx: Any, run_id: str) -> Usage | None:
        """The run's spend against its limits; None if it has no budget. RunNotFound."""

    def set_budget(self, tx: Any, run_id: str, changes: dict[str, Any]) -> bool:
        """An outsider's change of limit columns (a run without a budget gets one); True if that
        made a run suspended for its budget due. RunNotFound, RunTerminal."""

    def note_exceeded(self, tx: Any, lease: Lease, limit: str, message: str) -> None:
        """Log a limit the owner found reached (its wall time). Fenced."""

    # -- outsiders: retry now, and the audit trail -----------------------------------------

    def retry_now(self, tx: Any, run_id: str) -> int | None:
        """An outsider's cut of a backoff: a live run nobody holds, not waiting, whose next
        attempt is in the future becomes due now (workers are told). Returns the due time it
        had; None if it was due already (nothing written). RunNotFound, RunTerminal, RunLeased,
        RunWaiting."""

    def record_action(self, tx: Any, run_id: str, action: str, by: str | None, detail_json: str) -> None:
        """Append a row to the outsiders' audit trail (``outsider_actions``), in the transaction
        of the write it describes."""

    # -- reading --------------------------------------------------------------------------

    def durable_state(self, tx: Any, run_id: str) -> tuple[RunRecord, Checkpoint | None, list[Event]]:
        """The run, its latest accepted checkpoint, and the events after it. RunNotFound."""

    def get_run(self, tx: Any, run_id: str) -> RunRecord:
        """The run as stored. RunNotFound."""

    def events_page(self, tx: Any, run_id: str, after_seq: int, limit: int | None) -> list[Event]:
        """Events with seq > ``after_seq``, in order. RunNotFound."""

    def list_runs(self, tx: Any, status: RunStatus | None, role: str | None, limit: int) -> list[RunRecord]:
        """Runs, oldest first."""
