"""What an operation sees on a PostgreSQL connection: :class:`zincir._store.Tx` on a pipeline.

The connection is in pipeline mode (``_pipe``): a statement is sent without waiting for it,
and its outcome (an error, if it failed) arrives with the next statement whose answer is read,
or with the COMMIT. So a statement costs a round trip only when the operation needs its
answer, and the fence (the run's row lock) travels with the operation's first statements: it
is judged when the first answer is read, before that answer is used.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, final

from psycopg import errors as pg_errors

from .. import _store
from .._sql import Dialect
from .._store._tx import PLACEHOLDERS, judge_lease
from .._store._types import Lease
from .._types import EventType
from .._wakes import Wakes
from ._pipe import Pending

__all__ = ["POSTGRES", "Sent", "Tx"]

# NO KEY UPDATE serializes a run's writers as FOR UPDATE would, but does not block the
# foreign-key checks of rows inserted elsewhere that point at the run (a child's insert).
POSTGRES: Final = Dialect(
    "postgresql",
    table_exists="SELECT 1 WHERE to_regclass(?) IS NOT NULL",
    row_locks=True,
    lock_nowait=" FOR NO KEY UPDATE NOWAIT",
    skip_locked=" FOR NO KEY UPDATE SKIP LOCKED",
    for_update_nowait=" FOR UPDATE NOWAIT",
    delete_skip_locked=" FOR UPDATE SKIP LOCKED",
    wide="::numeric",
    end_waiters=True,
    # One key for the content store's guard: "zincir" and 1.
    content_guard="SELECT pg_advisory_xact_lock_shared(8820702718431723521)",
    sweep_guard="SELECT pg_advisory_xact_lock(8820702718431723521)",
)


class Session(Protocol):
    """What a :class:`Tx` uses of its connection's session (``_connection.PostgresSession``)."""

    @property
    def sent(self) -> int:
        """How many statements were sent (the last one's number)."""

    def send(self, sql: str, params: Any = ()) -> Pending: ...
    def answered(self, number: int) -> None: ...
    def open_block(self) -> None: ...
    def settle(self) -> None: ...
    def settle_quietly(self) -> None: ...


_LEASE_COLUMNS: Final = "status, lease_owner, lease_epoch, lease_expires_at"
_LEASE_WIDTH: Final = 4  # the fence's row: these columns, then its reads (then the clock)
# A statement as psycopg takes it (``%s``), and where the operation's now goes among its
# parameters (None: nowhere, or computed by the statement itself).
_Rendered = tuple[str, tuple[int, ...] | None]
_RENDERED: dict[tuple[str, bool], _Rendered] = {}


def _render(sql: str, now_known: bool) -> _Rendered:
    """``?`` as ``%s``; ``:now`` bound once the operation's now is known, and until then read by
    the statement itself (``zincir_now_ms()``), so that no statement waits for a clock. A
    statement that needs now as an index bound (a claim's) reads :attr:`Tx.now` first."""
    key = (sql, now_known)
    rendered = _RENDERED.get(key)
    if rendered is None:
        order: list[int] = []
        numbers = itertools.count()

        def placeholder(match: re.Match[str]) -> str:
            if match.group() == "?":
                order.append(next(numbers))
                return "%s"
            if not now_known:
                return "zincir_now_ms()"
            order.append(-1)
            return "%s"

        text = PLACEHOLDERS.sub(placeholder, sql)
        rendered = (text, tuple(order) if -1 in order else None)
        if len(_RENDERED) >= 4096:
            _RENDERED.clear()  # statements built on the fly (a budget's columns) must not grow it
        _RENDERED[key] = rendered
    return rendered


@final
class Sent:
    """A statement on its way; reading its answer waits for it and for all sent before it, and
    judges the operation's fence first (unless it is the fence)."""

    __slots__ = ("_fenced", "_number", "_pending", "_tx")

    def __init__(self, pending: Pending, tx: Tx, *, fenced: bool = True) -> None:
        self._pending = pending
        self._tx = tx
        self._number = tx._session.sent
        self._fenced = fenced

    def _arrived(self) -> Pending:
        if self._fenced:
            self._tx._judge()
        self._pending.result()  # waits for it, and raises its error
        self._tx._session.answered(self._number)
        return self._pending

    def one(self) -> Any:
        return self._arrived().one()

    def all(self) -> list[Any]:
        return self._arrived().all()

    def count(self) -> int:
        tag = self._arrived().status or ""
        return int(tag.rsplit(" ", 1)[-1]) if tag[-1:].isdigit() else 0


@final
class Fence:
    """A fence on its way (:meth:`Tx.fence_reading`): what was read with the lease, once the
    fence is judged."""

    __slots__ = ("_tx", "lease", "lock", "reads")

    def __init__(self, tx: Tx, lease: Lease, lock: Sent) -> None:
        self._tx = tx
        self.lease = lease
        self.lock = lock
        self.reads: Sequence[Any] = ()

    def one(self) -> Sequence[Any]:
        """The values of the fence's reads; raises as the fence does unless the lease holds."""
        self._tx._judge()
        return self.reads


class Tx(_store.Tx):
    """An operation's view of its transaction on one pipelined connection."""

    dialect = POSTGRES

    def __init__(self, session: Session, *, read_only: bool) -> None:
        self._session = session
        self._read_only = read_only
        self._now: int | None = None
        self._fence: Fence | None = None

    # -- statements ----------------------------------------------------------------------------

    def _rendered(self, sql: str, params: Sequence[Any]) -> tuple[str, Sequence[Any]]:
        text, order = _render(sql, self._now is not None)
        if order is not None:
            params = tuple(self._now if i < 0 else params[i] for i in order)
        return text, params

    def _send(self, sql: str, params: Sequence[Any]) -> Pending:
        """The one place the operations' statements leave."""
        return self._session.send(*self._rendered(sql, params))

    def send(self, sql: str, params: Sequence[Any] = ()) -> Sent:
        """Send a statement and go on; reads that do not depend on each other, sent one after
        another, share one round trip."""
        return Sent(self._send(sql, params), self)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.send(sql, params).one()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self.send(sql, params).all()

    def count(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.send(sql, params).count()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._send(sql, params)

    # -- the clock and the run's row -----------------------------------------------------------

    @property
    def now(self) -> int:
        """The server clock in integer ms, read once per operation: by its fence or lock, or
        here (a round trip)."""
        self._judge()
        if self._now is None:
            (self._now,) = Sent(self._session.send("SELECT zincir_now_ms()"), self, fenced=False).one()
        assert self._now is not None
        return self._now

    def _send_lock(self, run_id: str, columns: str, reads: str = "", params: Sequence[Any] = ()) -> Sent:
        """The row's ``columns``, then ``reads`` (``, <expressions>``, with ``params``), then the
        clock, all read once the row is locked."""
        # The clock is read after the lock is held: in the lock statement's own target list it
        # would be computed before a wait on a holder that did not change the row.
        if self._read_only:  # the reader locks nothing: the same answer from its snapshot
            sql = f"SELECT {columns}{reads}, zincir_now_ms() FROM agent_runs WHERE id = ?"
        else:
            sql = (
                f"WITH locked AS (SELECT {columns} FROM agent_runs WHERE id = ?{POSTGRES.lock_nowait})"
                f" SELECT locked.*{reads}, zincir_now_ms() FROM locked"
            )
        return Sent(self._send(sql, (run_id, *params)), self, fenced=False)

    def _locked(self, lock: Sent) -> Any:
        """The lock's row without its clock, which becomes the operation's now."""
        row = lock.one()
        if row is None:
            return None
        if self._now is None:
            self._now = row[-1]
        return row[:-1]

    def fence(self, lease: Lease) -> None:
        self.fence_reading(lease, "")

    def fence_reading(self, lease: Lease, reads: str, params: Sequence[Any] = ()) -> Fence:
        """:meth:`fence`, reading ``reads`` (``, <expressions>``, with ``params``) in the same
        statement once the row is locked: an operation's checks share the fence's round trip."""
        self._judge()
        self._fence = Fence(self, lease, self._send_lock(lease.run_id, _LEASE_COLUMNS, reads, params))
        return self._fence

    def _judge(self) -> None:
        """Read the fence's answer, if it has not been read, and raise unless it holds."""
        if self._fence is not None:
            fence, self._fence = self._fence, None
            row = self._locked(fence.lock)
            lease_row = None if row is None else row[:_LEASE_WIDTH]
            judge_lease(fence.lease, lease_row, self._now if self._now is not None else 0)
            fence.reads = row[_LEASE_WIDTH:]

    def lock_run(self, run_id: str, columns: str) -> Any:
        self._judge()
        return self._locked(self._send_lock(run_id, columns))

    def _log(
        self, run_id: str, type: EventType, payload: str, key: str | None, sets: str, params: Sequence[Any]
    ) -> Sent:
        # One statement where two would be sent: the seq is allocated and the event inserted
        # together, so an operation that does not read the seq pays no round trip for it. Now
        # is one value for both (read here unless the operation's is known).
        return self.send(
            "WITH now AS MATERIALIZED (SELECT CAST(:now AS BIGINT) AS ms),"
            " allocated AS (UPDATE agent_runs SET last_seq = last_seq + 1, updated_at = (SELECT ms FROM now)"
            f"{sets.replace(':now', '(SELECT ms FROM now)')} WHERE id = ?"
            " RETURNING last_seq, parent_run_id),"
            " logged AS (INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
            " SELECT ?, last_seq, ?, ?, ?, now.ms FROM allocated, now)"
            " SELECT last_seq, parent_run_id FROM allocated",
            (*params, run_id, run_id, type.value, payload, key),
        )

    # -- savepoints ----------------------------------------------------------------------------

    def unless_busy(self, end: Callable[..., object], *args: Any) -> bool:
        """``end`` in a savepoint; a row lock it cannot take at once (NOWAIT) rolls it back, with
        what it meant to wake, so that the caller goes on with its other work meanwhile."""
        woken = None if self.wakes is None else self.wakes.copy()
        self._session.open_block()  # a savepoint cannot live in an implicit transaction
        self._session.send("SAVEPOINT zincir_ending")
        try:
            end(self, *args)
        except pg_errors.LockNotAvailable:
            # The server ignores anything sent after a failure until the pipeline is synced.
            self._session.settle_quietly()
            self._session.send("ROLLBACK TO SAVEPOINT zincir_ending")
            self._session.settle()
            self._session.send("RELEASE SAVEPOINT zincir_ending")
            self.wakes = woken
            return False
        self._session.send("RELEASE SAVEPOINT zincir_ending")
        return True

    def close(self) -> Wakes | None:
        self._judge()
        return self.wakes
