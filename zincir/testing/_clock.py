"""A clock for tests that skips durable sleeps and wait timeouts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._database import Clock, wall_clock_ms

if TYPE_CHECKING:
    from trio.testing import MockClock  # imported when used: it costs a quarter of a second

__all__ = ["database_clock", "skipping_clock"]

DEFAULT_THRESHOLD = 0.1


def skipping_clock(threshold: float = DEFAULT_THRESHOLD) -> MockClock:
    """A Trio clock that runs at the speed of real time, but jumps to the next deadline as soon as
    every task has been blocked for ``threshold`` real seconds. Give the database the same time
    with :func:`database_clock` (the ``zincir_db`` fixture does), so that the wake times and
    deadlines it stores have passed when the clock has jumped past them.

    A run suspended by a worker (a sleep or a wait longer than ``suspend_after``) holds no lease,
    so the clock jumps straight to its wake time or deadline, given a worker whose
    ``poll_interval`` is no shorter than the wait: an hour's sleep then takes a few jumps. A run
    that waits in its process keeps renewing its lease, every third of ``lease_ttl``, and each
    renewal is a deadline the clock stops at: an hour with a 30 s lease is 360 jumps.

    A task waiting for the database is blocked too: an operation slower than ``threshold`` lets
    the clock jump while it is in flight. Keep ``threshold`` above the slowest operation you
    expect (0.1 s by default).
    """
    from trio.testing import MockClock

    return MockClock(rate=1.0, autojump_threshold=threshold)


def database_clock(trio_clock: MockClock) -> Clock:
    """A database clock (integer Unix ms, for ``open_database(clock=...)``) that moves with
    ``trio_clock``: the wall time when it was made, plus the Trio time that passed since."""
    start_ms = wall_clock_ms()
    start = trio_clock.current_time()

    def now_ms() -> int:
        return start_ms + round((trio_clock.current_time() - start) * 1000)

    return now_ms
