"""The transaction an operation runs in: the small interface each backend implements.

Every storage operation is written once, as a function of a :class:`Tx`. Its SQL is the
subset both backends run, with ``?`` placeholders and ``:now`` for the operation's "now" (the
database's clock, read inside the transaction); where the two differ (a row lock, an index
hint, a function's name) the SQL takes the fragment from :attr:`Tx.dialect`. Each backend's
``Tx`` renders that SQL for its driver (``zincir._sqlite._tx``, ``zincir._postgres._tx``).

SQLite runs each statement as it is sent. PostgreSQL sends statements ahead on a pipeline and
waits only when an answer is read, so an operation sends what it can before it reads: a write
it does not read costs no round trip, and reads sent one after another share one. A check
that must come before a write (one whose failure would hide the check's error, say) is read
before the write is sent.

No operation waits for a row another transaction holds (PostgreSQL, whose writers run side by
side): every row lock is taken NOWAIT (``Dialect.lock_nowait``), or SKIP LOCKED for claims, and
the writers' lock_timeout is short for whatever else might wait. An operation that finds its
row held fails alone (TransientConflict: its batch's other operations still commit) and its
caller tries again in a later batch, so a row held elsewhere, for however long, never holds
up a writer's group commit, and with it the renewals of unrelated runs (docs/leases.md).

See docs/architecture.md for the data path these fit into.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import LeaseLost, RunNotFound, RunTerminal
from .._payloads import Payloads, stored
from .._sql import Dialect
from .._types import EventType, RunStatus
from .._wakes import Wakes
from ._types import Lease

if TYPE_CHECKING:
    from .._crypto import Sealer

__all__ = [
    "LIVE",
    "PLACEHOLDERS",
    "BatchRefused",
    "Reply",
    "Tx",
    "judge_lease",
    "lease_held",
    "lock_live_run",
]

PLACEHOLDERS = re.compile(r"\?|(?<![:\w]):now\b")
"""What a backend renders in the operations' SQL: ``?``, and ``:now`` (never part of a ``::`` cast)."""

LIVE = (RunStatus.PENDING.value, RunStatus.RUNNING.value, RunStatus.WAITING.value)
"""The statuses of a run that has not ended."""


class Reply(Protocol):
    """A statement's answer. SQLite: there already. PostgreSQL: on its way; reading it waits
    for it (and for everything sent before it)."""

    def one(self) -> Any:
        """The first row, or None."""

    def all(self) -> list[Any]: ...

    def count(self) -> int:
        """The rows a write changed (or a read returned)."""


class Tx(Protocol):
    """One operation's view of its transaction (or of its SAVEPOINT in a group commit). Each
    backend's Tx subclasses this: ``log`` and ``wake`` are written here, once."""

    dialect: Dialect
    sealer: Sealer | None = None
    """The database's encryption (its thread sets it on each operation's Tx), None without: see
    ``zincir/_crypto.py`` and :mod:`zincir._payloads`, which uses it."""
    payloads: Payloads = Payloads()
    """How this database stores JSON values (the session sets the one open_database was given);
    every JSON value column is written with :func:`zincir._payloads.stored`."""
    wakes: Wakes | None = None
    """What the operation's writes woke so far (see :meth:`wake`)."""

    @property
    def now(self) -> int:
        """The operation's now, in integer ms: SQLite's clock, read after the write lock was
        taken; PostgreSQL's server clock, as a fence or a lock read it (else read here: one
        round trip). In SQL, write ``:now``: it costs nothing."""

    def fence(self, lease: Lease) -> None:
        """The lease must hold on a live run, now, or the operation raises LeaseLost,
        RunTerminal or RunNotFound (:func:`judge_lease`). SQLite judges at once. PostgreSQL
        sends the run's row lock and judges when its answer comes back: at the operation's
        next read, or its end. What is sent meanwhile runs with the lock held and goes with
        the operation if the fence fails (its own error hidden by the fence's)."""

    def lock_run(self, run_id: str, columns: str) -> Any:
        """``columns`` of a run's row, held against its owner's writes until the transaction
        ends (PostgreSQL: NOWAIT, so a busy row is TransientConflict and the caller retries);
        the operation's now is read with it. None: no such run."""

    def send(self, sql: str, params: Sequence[Any] = ()) -> Reply:
        """Send a statement; read its answer later (or never, for a write that only counts
        when the operation ends)."""

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any: ...
    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...
    def count(self, sql: str, params: Sequence[Any] = ()) -> int: ...

    def execute(self, sql: str, params: Sequence[Any] = ()) -> object:
        """Send a statement whose answer nobody reads."""

    def log(
        self,
        run_id: str,
        type: EventType,
        payload_json: str,
        key: str | None = None,
        *,
        run_set: str = "",
        run_params: Sequence[Any] = (),
    ) -> Reply:
        """Append one event at the run's next seq. ``run_set`` (``, column = ?`` assignments
        with ``run_params``) changes more of the run's row in the same UPDATE. The reply's row
        is (seq, parent_run_id). The payload goes through :func:`zincir._payloads.stored`."""
        return self._log(run_id, type, stored(self, run_id, payload_json), key, run_set, run_params)

    def _log(
        self, run_id: str, type: EventType, payload: str, key: str | None, sets: str, params: Sequence[Any]
    ) -> Reply:
        """:meth:`log`, as the backend does it (``sets`` is ``run_set``, ``params`` its values)."""

    def unless_busy(self, end: Callable[..., object], *args: Any) -> bool:
        """``end(tx, *args)`` in a savepoint of its own; False, with nothing done or woken, if
        a row it needs is being written elsewhere right now (SQLite: never)."""

    def wake(
        self,
        *,
        claimable: bool = False,
        inbox: str | None = None,
        waits: str | None = None,
        ended: str | None = None,
        streams: str | None = None,
    ) -> None:
        """Note what this operation's writes may wake (see :class:`~zincir._wakes.Wakes`);
        delivered once the transaction commits, forgotten if the operation raises."""
        wakes = self.wakes
        if wakes is None:
            wakes = self.wakes = Wakes()
        wakes.claimable = wakes.claimable or claimable
        noted = ((inbox, wakes.inbox), (waits, wakes.waits), (ended, wakes.ended), (streams, wakes.streams))
        for run_id, woken in noted:
            if run_id is not None:
                woken.add(run_id)

    def close(self) -> Wakes | None:
        """After the operation returned: judge a fence not read yet (this raises as the fence
        would), and what the operation woke."""


class BatchRefused(Exception):
    """A batch form (:attr:`zincir._store.Store.batch_forms`) found a call that is not its common
    case; the database thread runs each call on its own instead, for its own answer."""


def lease_held(owner: str | None, expires_at: int | None, now: int) -> bool:
    """Whether a run's row shows a lease someone holds at ``now`` (an owner whose lease has
    not expired yet)."""
    return owner is not None and expires_at is not None and expires_at > now


def judge_lease(lease: Lease, row: Sequence[Any] | None, now: int) -> None:
    """Raise unless ``row`` (status, lease_owner, lease_epoch, lease_expires_at) shows the
    lease holding on a live run at ``now``: :class:`LeaseLost` when another owner took over,
    the lease expired or was released; :class:`RunTerminal` when this owner's epoch ended the
    run (only the lease holder ends a run without a new epoch)."""
    if row is None:
        raise RunNotFound(f"run {lease.run_id} does not exist")
    status, owner, epoch, expires_at = row
    held = owner == lease.owner and expires_at is not None and expires_at > now
    if held and epoch == lease.epoch and status in LIVE:
        return  # every fenced write's path: no message to build
    where = f"run {lease.run_id}: the lease of epoch {lease.epoch}"
    if epoch != lease.epoch:
        raise LeaseLost(f"{where} was fenced by a newer owner (epoch {epoch})")
    if status not in LIVE:
        raise RunTerminal(f"run {lease.run_id} is already {status}")
    if owner != lease.owner or expires_at is None:
        raise LeaseLost(f"{where} was released")
    raise LeaseLost(f"{where} expired {now - expires_at} ms ago")


def lock_live_run(tx: Tx, run_id: str, columns: str, ended: str) -> Any:
    """``columns`` of a run that has not ended, locked (:meth:`Tx.lock_run`); ``columns`` starts
    with ``status``. RunNotFound; RunTerminal for an ended run, its message ending with
    ``ended`` (why that run is left alone)."""
    row = tx.lock_run(run_id, columns)
    if row is None:
        raise RunNotFound(f"run {run_id} does not exist")
    if row[0] not in LIVE:
        raise RunTerminal(f"run {run_id} is {row[0]}; {ended}")
    return row
