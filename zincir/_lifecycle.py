"""Where an owner of a run is with its lease: one :class:`Lifecycle` per
:class:`~zincir._run.Run`, its phase an enum and every move between phases written down in one
table (:data:`_MOVES`), so that no combination of "released", "suspended", "ending" and the rest
that cannot happen can be held either (docs/leases.md).

The run, its heartbeat (:mod:`zincir._heartbeat`) and its waits (:mod:`zincir._waiting`) ask it
questions (:meth:`Lifecycle.holds`, ...) and note what happened (:meth:`Lifecycle.note`).
"""

from __future__ import annotations

import enum
from typing import Final, final

from ._types import RunStatus

__all__ = ["Happened", "Lifecycle", "Phase"]


class Phase(enum.Enum):
    """The phases of one ownership of a run."""

    HOLDING = "holding"
    """The lease is this owner's: the body works, the heartbeat renews it."""
    ENDING = "ending"
    """A write that gives the lease up is in flight: complete, fail, a worker's record of a
    failed attempt, a suspension. A renewal it races is refused without meaning a loss."""
    RELEASING = "releasing"
    """The release on leaving the block is in flight (the deadline still watches it)."""
    RELEASED = "released"
    """Given back without ending the run: released on leaving the block, or a failed attempt
    recorded with a retry to come."""
    SUSPENDED = "suspended"
    """Given back by a suspension: the run waits in the database for what wakes it."""
    FINISHED = "finished"
    """This owner ended the run (completed, failed, cancelled: :attr:`Lifecycle.finished`)."""
    LOST = "lost"
    """The lease is gone for good (:attr:`Lifecycle.lost` says why). Final: what an ending
    write in flight then returns is of no more use than its outcome was known."""


class Happened(enum.Enum):
    """What an owner notes in its lifecycle."""

    ENDING_BEGAN = "ending began"
    ENDING_FAILED = "ending failed"  # the write failed, or a suspension found a wait can complete
    ENDED_RELEASED = "ended, released"
    ENDED_SUSPENDED = "ended, suspended"
    ENDED_FINISHED = "ended, finished"
    RELEASE_BEGAN = "release began"
    RELEASE_FAILED = "release failed"  # the lease will expire instead
    RELEASED = "released"


# Every move there is. An event in a phase it has no move from leaves the phase as it is: another
# task of the body ended the ownership first (its own ending write is then refused), or the lease
# was lost meanwhile. Losing the lease is :meth:`Lifecycle.lose`, from any phase but LOST.
_MOVES: Final[dict[tuple[Phase, Happened], Phase]] = {
    (Phase.HOLDING, Happened.ENDING_BEGAN): Phase.ENDING,
    (Phase.ENDING, Happened.ENDING_FAILED): Phase.HOLDING,
    (Phase.ENDING, Happened.ENDED_RELEASED): Phase.RELEASED,
    (Phase.ENDING, Happened.ENDED_SUSPENDED): Phase.SUSPENDED,
    (Phase.ENDING, Happened.ENDED_FINISHED): Phase.FINISHED,
    (Phase.HOLDING, Happened.RELEASE_BEGAN): Phase.RELEASING,
    (Phase.RELEASING, Happened.RELEASE_FAILED): Phase.HOLDING,
    (Phase.RELEASING, Happened.RELEASED): Phase.RELEASED,
}

# What ends an ending write, one for each ENDING_BEGAN.
_ENDING_OUTCOMES: Final = frozenset(
    {Happened.ENDING_FAILED, Happened.ENDED_RELEASED, Happened.ENDED_SUSPENDED, Happened.ENDED_FINISHED}
)

# Where the lease is still this owner's, as far as it knows.
_HOLDS: Final = frozenset({Phase.HOLDING, Phase.ENDING, Phase.RELEASING})

# Where a renewal refused (LeaseLost) means the lease is lost. Not while an ending write is in
# flight or done: the refusal is that write's doing. (Not after the release on leaving the block
# either: the heartbeat is stopped first, and a renewal sent before goes first on the same writer.)
_REFUSAL_IS_LOSS: Final = frozenset({Phase.HOLDING, Phase.RELEASING, Phase.LOST})


@final
class Lifecycle:
    """The phase of one ownership, with what the phase carries: the status the run ended in
    (FINISHED), why the lease was lost (LOST)."""

    __slots__ = ("_endings", "_finished", "_lost", "phase")

    def __init__(self) -> None:
        self.phase = Phase.HOLDING
        self._finished: RunStatus | None = None
        self._lost: str | None = None
        self._endings = 0  # ending writes in flight (two tasks of a body may end it at once)

    def __repr__(self) -> str:
        return f"<Lifecycle {self.phase.value}>"

    # -- questions ------------------------------------------------------------------------

    @property
    def finished(self) -> RunStatus | None:
        """The status this owner ended the run in, once it has (None: it has not)."""
        return self._finished if self.phase is Phase.FINISHED else None

    @property
    def lost(self) -> str | None:
        """Why the lease was lost, once it is (None: it is not)."""
        return self._lost if self.phase is Phase.LOST else None

    @property
    def suspended(self) -> bool:
        """Whether this owner gave the lease back by suspending the run."""
        return self.phase is Phase.SUSPENDED

    def holds(self) -> bool:
        """Whether the lease is still this owner's, as far as it knows."""
        return self.phase in _HOLDS

    def given_up(self) -> bool:
        """Whether this owner is done with the lease: lost, or given back (ended, suspended,
        released), so that nothing is left to end or release."""
        return self.phase not in _HOLDS

    def refusal_is_loss(self) -> bool:
        """Whether a renewal refused now means the lease is lost (see :data:`_REFUSAL_IS_LOSS`)."""
        return self.phase in _REFUSAL_IS_LOSS

    # -- moves ----------------------------------------------------------------------------

    def note(self, event: Happened) -> None:
        """Note ``event``: the phase moves as :data:`_MOVES` says (if it says nothing, the
        phase stays). An ending write that failed while another is in flight moves nothing:
        the other's outcome decides (complete() and fail() from two tasks at once)."""
        if event is Happened.ENDING_BEGAN:
            self._endings += 1
        elif event in _ENDING_OUTCOMES:
            self._endings -= 1
            if event is Happened.ENDING_FAILED and self._endings > 0:
                return
        self.phase = _MOVES.get((self.phase, event), self.phase)

    def finish(self, status: RunStatus) -> None:
        """The ending write in flight ended the run in ``status``."""
        if (self.phase, Happened.ENDED_FINISHED) in _MOVES:
            self._finished = status
        self.note(Happened.ENDED_FINISHED)

    def lose(self, message: str) -> bool:
        """The lease is gone for good, for the reason ``message``; whether this is the first
        time (the first reason is kept)."""
        if self.phase is Phase.LOST:
            return False
        self.phase, self._lost = Phase.LOST, message
        return True
