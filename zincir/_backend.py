"""What a backend package gives the database: its operations, its threads, its clock.

A backend is a package (``zincir._sqlite``, ``zincir._postgres``) whose ``open_backend``
returns a :class:`Backend`: the storage operations (:class:`~zincir._store.Store`, written
once over the transaction each backend implements), the database threads that run them
(:mod:`zincir._threads`), and how to hear other processes' writes. Both the backends and
:mod:`zincir._database` import this module, and neither imports the other.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, TypeVar

import attrs

from ._crypto import Sealer
from ._store import Store
from ._threads import DatabaseThread
from ._wakes import Listen

__all__ = ["Backend", "BulkSession", "Clock", "wall_clock_ms"]

T = TypeVar("T")

Clock = Callable[[], int]
"""A clock returns the current time in integer Unix milliseconds; it must be thread-safe."""


def wall_clock_ms() -> int:
    """The default clock: wall-clock time, shared by every process that opens the file."""
    return time.time_ns() // 1_000_000


class BulkSession(Protocol):
    """A connection of a backend's own for a long series of maintenance writes (a prune's
    batches) that stand aside for its live writers (see zincir/_sqlite/_bulk.py). Blocking:
    used from a worker thread, one call at a time."""

    def write(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(tx, *args)`` in a transaction of its own, committed and durable."""

    def close(self) -> None: ...


@attrs.define(eq=False)
class Backend:
    """What a backend package's ``open_backend`` returns: its store and its threads."""

    name: Literal["sqlite", "postgresql"]
    target: str
    """The path or URL (without a password) it was opened with."""
    store: Store
    writers: Sequence[DatabaseThread]
    """One or more; the operations of one run always go to the same one."""
    reader: DatabaseThread
    clock: Clock
    """The clock operations use (SQLite, or a test's fake server clock), or an estimate of the
    server's (PostgreSQL)."""
    listen: Listen
    """Start hearing other processes' writes (see :data:`zincir._wakes.Listen`)."""
    open_bulk: Callable[[Sealer | None], BulkSession] | None = None
    """Open a :class:`BulkSession` (blocking) for a database encrypted with the sealer given (or
    not: None); None: maintenance writes go to the writers, as any other write (PostgreSQL,
    whose row locks keep them out of the live writers' way)."""
