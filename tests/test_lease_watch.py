"""The one timer of every lease held through a database (zincir/_lease_watch.py): it calls each
holder in the order of its moments, never one taken back, ends its task when nothing is left,
and spares the runs that end before their first renewal a heartbeat task."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio
import trio.testing

import zincir
from zincir._database import storage
from zincir._lease_watch import LeaseWatch
from zincir._store._ends import request_cancel
from zincir._wakes import _RECENT_NEWS, WakeHub, Wakes

from .helpers import status_of


class Holder:
    def __init__(self, name: str, calls: list[tuple[str, float]]) -> None:
        self.name, self.calls = name, calls

    def _due(self, now: float) -> None:
        self.calls.append((self.name, now))

    def _watch_failed(self, exc: Exception) -> None:
        raise AssertionError(f"{self.name}: {exc!r}")


async def test_holders_are_called_in_the_order_of_their_moments_and_never_once_forgotten(
    autojump_clock: trio.testing.MockClock,
) -> None:
    watch, calls, start = LeaseWatch(), [], trio.current_time()
    moments = [start + m for m in random.Random(7).sample(range(1, 400), 200)]
    asks = [watch.at(when, Holder(f"h{i}", calls)) for i, when in enumerate(moments)]
    forgotten = {f"h{i}" for i in range(0, 200, 3)}
    for i in range(0, 200, 3):
        watch.forget(asks[i])
    await trio.sleep(500)
    expected = sorted((when, f"h{i}") for i, when in enumerate(moments) if f"h{i}" not in forgotten)
    assert [name for name, _ in calls] == [name for _, name in expected]
    assert all(now == when for (_, now), (when, _) in zip(calls, expected, strict=True))  # none late
    assert not watch._running  # nothing left: its task ended


async def test_an_earlier_ask_wakes_the_sleeping_timer_and_a_holder_may_ask_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    watch, calls, start = LeaseWatch(), [], trio.current_time()

    class Again(Holder):
        def _due(self, now: float) -> None:
            super()._due(now)
            if len(self.calls) < 3:
                watch.at(now + 1, self)

    watch.at(start + 100, Holder("late", calls))
    await trio.testing.wait_all_tasks_blocked()  # the timer sleeps until the late one
    watch.at(start + 5, Again("again", calls))
    await trio.sleep(200)
    assert calls == [("again", start + 5), ("again", start + 6), ("again", start + 7), ("late", start + 100)]


async def test_runs_that_end_before_their_first_renewal_start_no_task_of_their_own(
    db: zincir.Database,
) -> None:
    spawned: list[str] = []

    class Spawns(trio.abc.Instrument):
        def task_spawned(self, task: trio.lowlevel.Task) -> None:
            spawned.append(task.name)

    async def one() -> None:
        async with zincir.open_run(db, lease_ttl=30) as run:  # the first renewal is 10 s away
            await run.step("only", _answer)
            await run.complete()

    instrument = Spawns()
    trio.lowlevel.add_instrument(instrument)
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(one)
    finally:
        trio.lowlevel.remove_instrument(instrument)
    assert "zincir lease watch" in spawned
    assert not [name for name in spawned if "heartbeat" in name or "deadline" in name]


async def _answer() -> int:
    return 42


async def test_a_cancellation_committed_with_the_lease_stops_the_body_at_once(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The request lands before the owner signs up for its run's news (here: in the very
    # transaction that takes the lease); it must not wait for the first renewal, 10 s away.
    async with zincir.open_run(db) as run:
        run_id = run.id
    store = storage(db).store
    acquire = store.acquire_run

    def acquired_then_cancelled(tx: Any, run_id: str, *args: Any) -> Any:
        lease = acquire(tx, run_id, *args)
        request_cancel(tx, run_id, "changed my mind")
        return lease

    monkeypatch.setattr(store, "acquire_run", acquired_then_cancelled)
    stopped_after = None
    with trio.move_on_after(5):  # (a bound for the failure only: the renewal would take 10 s)
        with pytest.raises(zincir.RunCancelled, match="changed my mind"):
            async with zincir.open_run(db, run_id, lease_ttl=30):
                started = trio.current_time()
                await trio.sleep_forever()
        stopped_after = trio.current_time() - started
    assert stopped_after is not None, "the body ran on: the cancellation waited for a renewal"
    assert stopped_after < 3  # at once (the renewal that would read it is 10 s away)
    assert await status_of(db, run_id) is zincir.RunStatus.CANCELLED


async def test_a_new_owner_hears_news_since_its_lease_and_errs_towards_hearing(
    mock_clock: trio.testing.MockClock,
) -> None:
    hub = WakeHub(listen=_no_listener)
    told: list[str] = []

    def owner(run_id: str, since: float) -> None:
        hub.add_owner(run_id, lambda: told.append(run_id), since)

    leased_at = trio.current_time()
    mock_clock.jump(1)
    hub.deliver(Wakes(inbox={"cancelled"}))
    owner("cancelled", leased_at)  # its news came after its lease: told at once
    owner("quiet", leased_at)  # none: not told
    assert told == ["cancelled"]
    mock_clock.jump(1)
    for i in range(_RECENT_NEWS + 1):  # more runs' news than it remembers: the first falls out
        hub.deliver(Wakes(inbox={f"run-{i}"}))
    owner("maybe", leased_at)  # its news may be what fell out: told, to be safe
    assert told == ["cancelled", "maybe"]
    mock_clock.jump(1)
    owner("later", trio.current_time())  # nothing since its lease
    assert told == ["cancelled", "maybe"]
    mock_clock.jump(1)
    told.clear()
    hub.hear(None, None)  # anything may have been missed: every owner looks, and later ones too
    owner("after the word", leased_at)
    assert sorted(told[:-1]) == ["cancelled", "later", "maybe", "quiet"]
    assert told[-1] == "after the word"


def _no_listener(*_: Any) -> Any:
    raise AssertionError("nothing here listens to other processes")
