"""What a caller hands a database thread (a :class:`Request`), how it waits for the answer,
and :class:`Flight`: the calls of a lease holder's block, answered at once with an error when
the lease is lost, whatever the database does (docs/leases.md). The threads that run the
requests are :mod:`zincir._threads`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import outcome
import trio

from ._wakes import Wakes

__all__ = ["Flight", "Operation", "Request", "answer", "current_flight", "flying", "wait_for_answer"]

Operation = Callable[..., Any]


@attrs.define(eq=False)
class Request:
    fn: Operation | None  # None asks the thread to finish its queue and close
    args: tuple[Any, ...]
    task: trio.lowlevel.Task
    result: outcome.Outcome[Any] | None = None
    wakes: Wakes | None = None  # what it woke, once it returned
    # The flights it was submitted in (innermost first), each with its abandonment count then.
    flights: tuple[tuple[Flight, int], ...] = ()
    parked: bool = False  # its task sleeps until it is answered (only then may it be abandoned)
    abandoned: bool = False  # answered with an error already: the thread's answer is dropped


class Flight:
    """The database calls made inside one scope (a lease holder's block) that wait for their
    outcome, so that they can be abandoned together.

    :meth:`abandon` wakes each of them at once, without waiting for the database: its outcome
    is unknown to its caller (it may commit later, or never), as after a crash of the process.
    The thread still runs it when it gets to it. A caller inside a cancelled scope (the stopped
    body) gets the cancellation, as at any checkpoint; one shielded from it, the flight's error.
    Only calls submitted before the abandonment are abandoned; later ones (a read after the
    loss, say) run as usual. A flight opened inside another (a run owned inside another run's
    block) is abandoned with it: the enclosing block could not end while the inner one waits.
    """

    def __init__(self, parent: Flight | None = None) -> None:
        self._parent = parent
        self._parked: set[Request] = set()
        self._abandonments = 0
        self._error: Callable[[], BaseException] | None = None

    def _chain(self) -> tuple[tuple[Flight, int], ...]:
        if self._parent is None:  # a run's own block, not one inside another's: the common case
            return ((self, self._abandonments),)
        flights = []
        flight: Flight | None = self
        while flight is not None:
            flights.append((flight, flight._abandonments))
            flight = flight._parent
        return tuple(flights)

    def abandon(self, error: Callable[[], BaseException]) -> None:
        """Answer every call of this flight (or of one inside it) still waiting with ``error()``
        (a new exception each). On the Trio thread."""
        self._abandonments += 1
        self._error = error
        parked, self._parked = self._parked, set()
        for request in parked:
            _abandon(request, error())


_FLIGHT: contextvars.ContextVar[Flight | None] = contextvars.ContextVar("zincir_flight", default=None)


@contextlib.contextmanager
def flying(flight: Flight) -> Iterator[None]:
    """Make the database calls of this task (and of the tasks it starts) part of ``flight``."""
    token = _FLIGHT.set(flight)
    try:
        yield
    finally:
        _FLIGHT.reset(token)


def current_flight() -> Flight | None:
    """The flight the calls made here join, if any (the new flight of a nested block's parent)."""
    return _FLIGHT.get()


def answer(request: Request, result: outcome.Outcome[Any]) -> None:
    """Wake the task waiting for ``request`` with its outcome, unless it was abandoned."""
    if not request.abandoned:
        request.parked = False
        trio.lowlevel.reschedule(request.task, result)


class _Abandoned(Exception):
    """Wakes a caller whose request was abandoned; :func:`wait_for_answer` raises ``error``
    instead (or the caller's cancellation)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _abandon(request: Request, error: BaseException) -> None:
    if request.parked and not request.abandoned:
        request.abandoned = True
        request.parked = False
        trio.lowlevel.reschedule(request.task, outcome.Error(_Abandoned(error)))


def _never_abort(_: Any) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED


async def wait_for_answer(request: Request) -> Any:
    """Sleep until ``request`` is answered (by its thread, the inline batch it joined, or its
    flight's abandonment); a cancellation waits for the answer."""
    try:
        for flight, abandonments in request.flights:
            if flight._abandonments != abandonments and flight._error is not None:
                # Abandoned after it was submitted, before its task got here: at once, then.
                request.abandoned = True
                raise _Abandoned(flight._error())
        request.parked = True
        for flight, _ in request.flights:
            flight._parked.add(request)
        try:
            return await trio.lowlevel.wait_task_rescheduled(_never_abort)
        finally:
            for flight, _ in request.flights:
                flight._parked.discard(request)
    except _Abandoned as abandoned:
        # A stopped body sees its cancellation (never an error inside its own nurseries); a
        # caller shielded from it (a release, a batch of spawns) sees why it was abandoned.
        await trio.lowlevel.checkpoint_if_cancelled()
        raise abandoned.error from None
