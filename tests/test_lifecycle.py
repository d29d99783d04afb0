"""Where an owner is with its lease: the phases of a run's lifecycle and the moves between them."""

from __future__ import annotations

import pytest
import trio

import zincir
from zincir._lifecycle import Happened, Lifecycle, Phase
from zincir._types import RunStatus


def test_an_ending_write_that_fails_leaves_the_lease_held() -> None:
    lifecycle = Lifecycle()
    lifecycle.note(Happened.ENDING_BEGAN)
    assert lifecycle.phase is Phase.ENDING and lifecycle.holds() and not lifecycle.refusal_is_loss()
    lifecycle.note(Happened.ENDING_FAILED)
    assert lifecycle.phase is Phase.HOLDING and lifecycle.refusal_is_loss()


def test_the_loss_of_the_lease_is_final_and_keeps_its_first_reason() -> None:
    lifecycle = Lifecycle()
    lifecycle.note(Happened.ENDING_BEGAN)
    assert lifecycle.lose("expired")
    assert not lifecycle.lose("fenced")
    lifecycle.finish(RunStatus.COMPLETED)  # an answer that arrived after the loss changes nothing
    assert (lifecycle.phase, lifecycle.lost, lifecycle.finished) == (Phase.LOST, "expired", None)
    assert lifecycle.given_up() and not lifecycle.holds()


@pytest.mark.parametrize("event", list(Happened), ids=lambda e: e.name)
def test_a_suspended_owner_is_moved_by_nothing_it_notes(event: Happened) -> None:
    lifecycle = Lifecycle()
    lifecycle.note(Happened.ENDING_BEGAN)
    lifecycle.note(Happened.ENDED_SUSPENDED)
    lifecycle.note(event)  # another task's ending, or the release on the way out: refused
    assert lifecycle.suspended and lifecycle.given_up() and lifecycle.finished is None


async def test_an_owner_finishes_or_releases_as_its_block_ends(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        assert run._lifecycle.phase is Phase.HOLDING
        await run.complete({"ok": True})
        assert (run._lifecycle.phase, run._lifecycle.finished) == (Phase.FINISHED, RunStatus.COMPLETED)
    async with zincir.open_run(db) as left:
        pass
    assert left._lifecycle.phase is Phase.RELEASED and left._lifecycle.finished is None


def test_an_ending_write_that_fails_beside_one_in_flight_leaves_the_decision_to_the_other() -> None:
    lifecycle = Lifecycle()
    lifecycle.note(Happened.ENDING_BEGAN)  # complete(), from one task
    lifecycle.note(Happened.ENDING_BEGAN)  # fail(), from another
    lifecycle.note(Happened.ENDING_FAILED)  # fail() was refused: the run is complete already
    assert lifecycle.phase is Phase.ENDING
    lifecycle.finish(RunStatus.COMPLETED)  # complete()'s answer, read after fail()'s
    assert (lifecycle.phase, lifecycle.finished) == (Phase.FINISHED, RunStatus.COMPLETED)


async def test_a_run_completed_and_failed_at_once_by_two_tasks_ends_once_and_its_block_quietly(
    db: zincir.Database,
) -> None:
    winners: list[str] = []
    refused: list[BaseException] = []

    async def end(run: zincir.Run, how: str) -> None:
        try:
            await (run.complete(how) if how == "completed" else run.fail(how))
            winners.append(how)
        except zincir.RunTerminal as exc:
            refused.append(exc)

    async def one() -> None:
        async with zincir.open_run(db) as run, trio.open_nursery() as nursery:
            nursery.start_soon(end, run, "completed")
            nursery.start_soon(end, run, "failed")
        assert run._lifecycle.phase is Phase.FINISHED

    # Both ends are answered by one group commit and their tasks resume in either order: 20
    # runs make the order where the refused end is read first all but certain.
    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(one)
    assert len(winners) == len(refused) == 20
