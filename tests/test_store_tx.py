"""The transaction every storage operation is written against (zincir/_store/_tx.py), on both
backends: the fence, what is sent behind it, ``:now``, counts, and the wake-ups an operation
notes, delivered after its COMMIT or, if it did not keep its writes, to nobody."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import trio

import zincir
from zincir._database import storage
from zincir._store import Lease, Tx

from .helpers import hearing_others
from .postgres_server import fresh_database


class Refused(Exception):
    """What an operation raises after noting a wake-up (the database has no part in it)."""


async def stale_lease(db: zincir.Database) -> tuple[Lease, str]:
    """A lease its owner lost (another owner took the run over), and the run's id."""
    async with zincir.open_run(db) as first:
        stale = first._lease
    async with zincir.open_run(db, stale.run_id):
        pass
    return stale, stale.run_id


async def role_of(db: zincir.Database, run_id: str) -> str:
    return (await db._read(db._store.get_run, run_id)).role


async def test_a_fence_that_does_not_hold_undoes_the_writes_sent_behind_it(db: zincir.Database) -> None:
    stale, run_id = await stale_lease(db)

    def rename(tx: Tx) -> None:  # never reads: the fence is judged when the operation ends
        tx.fence(stale)
        tx.execute("UPDATE agent_runs SET role = 'renamed' WHERE id = ?", (run_id,))

    with pytest.raises(zincir.LeaseLost, match="fenced by a newer owner"):
        await db._write(rename, route=run_id)
    assert await role_of(db, run_id) == "agent"


async def test_a_fence_is_judged_before_the_first_answer_after_it_is_used(db: zincir.Database) -> None:
    stale, run_id = await stale_lease(db)
    answered: list[Any] = []

    def read_behind_the_fence(tx: Tx) -> None:
        tx.fence(stale)
        answered.append(tx.one("SELECT role FROM agent_runs WHERE id = ?", (run_id,)))

    with pytest.raises(zincir.LeaseLost):
        await db._write(read_behind_the_fence, route=run_id)
    assert answered == []


async def test_count_is_the_rows_a_write_changed(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await run.spawn("a")
        await run.spawn("b")

        def count(tx: Tx) -> tuple[int, int, int]:
            children = "UPDATE agent_runs SET role = 'child' WHERE parent_run_id = ?"
            return (
                tx.count(children, (run.id,)),
                tx.send(children, (run.id,)).count(),
                tx.count("UPDATE agent_runs SET role = 'none' WHERE id = ?", ("no-such-run",)),
            )

        assert await db._write(count, route=run.id) == (2, 2, 0)


async def test_now_in_sql_is_the_operations_now(db: zincir.Database) -> None:
    def both(tx: Tx) -> tuple[int, int]:
        now = tx.now
        (in_sql,) = tx.one("SELECT CAST(:now AS BIGINT)")
        return now, in_sql

    now, in_sql = await db._write(both)
    assert in_sql == now


async def test_wake_ups_are_delivered_before_the_writer_resumes(
    db: zincir.Database, monkeypatch: Any
) -> None:
    # The listener's first word ("look at everything") calls the claim listeners too, whenever
    # it comes: it must be behind us before the write whose wake-ups are counted.
    await hearing_others(db, monkeypatch)
    wakes = storage(db).wakes
    inbox, waits = (
        wakes.inbox_event("run-a", hear_others=False),
        wakes.inbox_event("run-b", hear_others=False),
    )
    told: list[None] = []
    wakes.add_owner("run-a", lambda: told.append(None), since=trio.current_time())
    claims: list[None] = []
    wakes.add_claim_listener(lambda: claims.append(None))

    def note(tx: Tx) -> None:
        tx.wake(inbox="run-a", waits="run-b", claimable=True)

    await db._write(note)
    assert inbox.is_set() and told == [None] and waits.is_set()
    assert claims == [None]


async def test_an_operation_that_raises_wakes_nobody_while_its_neighbours_commit(db: zincir.Database) -> None:
    wakes = storage(db).wakes
    refused = wakes.inbox_event("run-a", hear_others=False)
    kept = wakes.inbox_event("run-b", hear_others=False)

    def refuse(tx: Tx) -> None:
        tx.wake(inbox="run-a")
        tx.execute("UPDATE agent_runs SET role = role WHERE id = ?", ("run-a",))
        raise Refused

    def keep(tx: Tx) -> None:
        tx.wake(inbox="run-b")

    outcomes: list[str] = []

    async def write(fn: Any) -> None:
        try:
            await db._write(fn, route="one writer")
            outcomes.append("kept")
        except Refused:
            outcomes.append("refused")

    async with trio.open_nursery() as nursery:  # submitted together: one group commit
        nursery.start_soon(write, refuse)
        nursery.start_soon(write, keep)
    assert sorted(outcomes) == ["kept", "refused"]
    assert kept.is_set()
    assert not refused.is_set()


async def test_a_claims_end_rolled_back_for_a_busy_row_wakes_nobody(
    postgres_admin_url: str,
) -> None:
    """unless_busy: an end that finds a row held elsewhere is undone, with what it woke."""
    with fresh_database(postgres_admin_url) as url:
        async with zincir.open_database(url) as db:
            async with zincir.open_run(db) as run:
                pass
            wakes = storage(db).wakes
            undone, kept = (
                wakes.inbox_event("run-a", hear_others=False),
                wakes.inbox_event("run-b", hear_others=False),
            )

            def end(tx: Tx) -> None:
                tx.wake(inbox="run-a")
                tx.one(f"SELECT 1 FROM agent_runs WHERE id = ?{tx.dialect.lock_nowait}", (run.id,))

            def claim(tx: Tx) -> bool:
                ended = tx.unless_busy(end)
                tx.wake(inbox="run-b")
                return ended

            with psycopg.connect(url) as other:
                other.execute("SELECT 1 FROM agent_runs WHERE id = %s FOR UPDATE", (run.id,))
                assert await db._write(claim) is False
            assert kept.is_set()
            assert not undone.is_set()


async def test_an_outsiders_write_wakes_the_waits_of_another_process(
    postgres_admin_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: the wake-ups a transaction notes go to every process, as notifications sent
    with its COMMIT."""
    with fresh_database(postgres_admin_url) as url:
        async with zincir.open_database(url) as here, zincir.open_database(url) as there:
            await hearing_others(there, monkeypatch)
            async with zincir.open_run(here) as run:
                woken = storage(there).wakes.inbox_event(run.id)
                await zincir.send_signal(here, run.id, "go")
                with trio.fail_after(10):  # a notification's trip, on a machine that may be busy
                    await woken.wait()
