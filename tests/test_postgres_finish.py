"""A run's end on PostgreSQL, its store's own two statements, against the shared form of
``finish`` on the same server: for every way an end goes, the same error, the same rows and
events left behind, the same wake-ups, in fewer statements.

Each form runs the same scenario in a database of its own, with the same run ids and a manual
clock, so that the two databases must come out identical, row for row.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import psycopg
import pytest

import zincir
from zincir._budget import Debit
from zincir._errors import TransientConflict
from zincir._postgres._store import PostgresStore
from zincir._store import IntentRow, Lease, NewChild, Tx
from zincir._store._ends import finish as shared_finish
from zincir._types import RunStatus
from zincir._wakes import Wakes

from .conftest import ManualClock
from .helpers import counting_batches, in_one_batch
from .postgres_server import fresh_database

FORMS: dict[str, Callable[..., None]] = {"shared": shared_finish, "postgresql": PostgresStore.finish}
OWNER, OTHER = "the-owner", "another-owner"
TTL_MS = 60_000
RUN, PARENT, KID, LEASED_KID = (f"00000000-0000-4000-8000-00000000000{n}" for n in range(1, 5))
COMPLETED = '{"from":"running","to":"completed"}'
FAILED = '{"from":"running","to":"failed"}'


@attrs.frozen
class Ended:
    """What one form's end did: its error, or the wake-ups it noted; and the statements it sent."""

    error: tuple[str, str] | None
    wakes: tuple[Any, ...] | None  # (claimable, inbox, waits, ended), sorted
    statements: int


async def create(db: zincir.Database, run_id: str, parent: str | None = None, owner: str = OWNER) -> Lease:
    lease: Lease = await db._write(db._store.create_run, run_id, parent, "agent", "", "{}", owner, TTL_MS)
    return lease


async def respond(db: zincir.Database, lease: Lease, call_id: str, name: str) -> None:
    intent = IntentRow(call_id, name, f'{{"call_id":"{call_id}"}}')
    await db._write(db._store.record_response, lease, '{"content":""}', [intent], Debit(0, 0, 0.0, ()))


async def suspended_parent(db: zincir.Database) -> Lease:
    """RUN, leased, whose parent is suspended on it (joining it) and whose end somebody waits for."""
    parent = await create(db, PARENT)
    lease = await create(db, RUN, PARENT)
    await db._write(db._store.await_child, parent, RUN, None)
    assert await db._write(db._store.suspend, parent, [("child", RUN)])
    await db._write(db._store.watch_end, RUN, "a-waiter")
    return lease


async def suspended_parent_and_an_open_call(db: zincir.Database) -> Lease:
    lease = await suspended_parent(db)
    await respond(db, lease, "call-1", "search")
    return lease


async def with_children(db: zincir.Database) -> Lease:
    """RUN with a child nobody holds (spawned, pending) and one another owner holds."""
    lease = await create(db, RUN)
    await db._write(db._store.spawn_children, lease, [NewChild("kid", KID, "agent", "", "{}")])
    await create(db, LEASED_KID, RUN, owner=OTHER)
    return lease


async def with_open_call(db: zincir.Database) -> Lease:
    lease = await create(db, RUN)
    await respond(db, lease, "call-1", "search")
    return lease


async def with_candidate(db: zincir.Database) -> Lease:
    lease = await create(db, RUN)
    await respond(db, lease, "cp-1", zincir.SUBMIT_CHECKPOINT)
    await db._write(
        db._store.propose_checkpoint, lease, "cp-1", json.dumps(zincir.CheckpointState().to_json())
    )
    return lease


async def taken_over(db: zincir.Database) -> Lease:
    lease = await create(db, RUN)
    await db._write(db._store.acquire_run, RUN, OTHER, TTL_MS, True)
    return lease


async def ended_already(db: zincir.Database) -> Lease:
    lease = await create(db, RUN)
    await db._write(db._store.finish, lease, RunStatus.COMPLETED, COMPLETED, None)
    return lease


@attrs.frozen
class Scenario:
    build: Callable[[zincir.Database], Awaitable[Lease]]
    status: RunStatus
    expected_error: type[Exception] | None = None
    parent_held: bool = False  # another transaction holds the parent's row while the run ends


SCENARIOS = {
    "completes-waking-its-parent-and-a-waiter": Scenario(suspended_parent, RunStatus.COMPLETED),
    "fails-waking-its-parent-and-a-waiter": Scenario(suspended_parent, RunStatus.FAILED),
    "fails-cancelling-its-children": Scenario(with_children, RunStatus.FAILED),
    "cancelled-cancelling-its-children": Scenario(with_children, RunStatus.CANCELLED),
    "completes-with-live-children": Scenario(with_children, RunStatus.COMPLETED, zincir.UnfinishedWork),
    "completes-with-an-open-call": Scenario(with_open_call, RunStatus.COMPLETED, zincir.UnfinishedWork),
    "completes-with-a-candidate": Scenario(with_candidate, RunStatus.COMPLETED, zincir.UnfinishedWork),
    "after-a-takeover": Scenario(taken_over, RunStatus.COMPLETED, zincir.LeaseLost),
    "after-its-end": Scenario(ended_already, RunStatus.FAILED, zincir.RunTerminal),
    # The open work is found before the end's lock on the parent fails (the end is undone).
    "completes-with-an-open-call-while-its-parent-is-held": Scenario(
        suspended_parent_and_an_open_call, RunStatus.COMPLETED, zincir.UnfinishedWork, parent_held=True
    ),
    "while-its-parent-is-held": Scenario(
        suspended_parent, RunStatus.COMPLETED, TransientConflict, parent_held=True
    ),
}


@contextmanager
def holding(url: str, run_id: str, held: bool) -> Iterator[None]:
    """Another connection holds ``run_id``'s row (while ``held``) until the block ends."""
    if not held:
        yield
        return
    with psycopg.connect(url) as other:
        other.execute("SELECT 1 FROM agent_runs WHERE id = %s FOR UPDATE", (run_id,))
        yield
        other.rollback()


async def end(db: zincir.Database, form: Callable[..., None], lease: Lease, scenario: Scenario) -> Ended:
    sent: list[int] = []

    def ending(tx: Tx) -> Any:
        before = tx._session.sent
        transition = COMPLETED if scenario.status is RunStatus.COMPLETED else FAILED
        try:
            form(tx, lease, scenario.status, transition, "1")
        finally:
            sent.append(tx._session.sent - before)
        return tx.wakes

    try:
        wakes = await db._write(ending, route=lease.run_id)
    except zincir.ZincirError as error:
        return Ended(said(error, db.path), None, sent[0])
    woken = (
        None if wakes is None else (wakes.claimable, *map(sorted, (wakes.inbox, wakes.waits, wakes.ended)))
    )
    return Ended(None, woken, sent[0])


def said(error: BaseException, url: str) -> tuple[str, str]:
    """An error's type and message, but the database's name and the writer's (which differ
    from one form's database to the other's)."""
    return type(error).__name__, re.sub(r" \(writer\d\)", "", str(error).replace(url, "<db>"))


def rows(url: str) -> list[str]:
    """Every row of zincir's tables (not the migrations' record, whose times are real)."""
    with psycopg.connect(url) as conn:
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            " AND tablename <> 'zincir_schema_migrations' ORDER BY tablename"
        ).fetchall()
        return [
            f"{table}: {row}"
            for (table,) in tables
            for (row,) in conn.execute(f'SELECT t::text FROM "{table}" AS t ORDER BY t::text').fetchall()
        ]


async def run_form(admin_url: str, form: str, scenario: Scenario) -> tuple[Ended, list[str]]:
    with fresh_database(admin_url) as url:
        async with zincir.open_database(url, clock=ManualClock()) as db:
            lease = await scenario.build(db)
            with holding(url, PARENT, scenario.parent_held):
                ended = await end(db, FORMS[form], lease, scenario)
        return ended, rows(url)


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_the_postgresql_finish_does_what_the_shared_one_does(
    postgres_admin_url: str, name: str
) -> None:
    scenario = SCENARIOS[name]
    shared, shared_rows = await run_form(postgres_admin_url, "shared", scenario)
    own, own_rows = await run_form(postgres_admin_url, "postgresql", scenario)

    assert (own.error, own.wakes) == (shared.error, shared.wakes)
    assert own_rows == shared_rows
    expected = None if scenario.expected_error is None else scenario.expected_error.__name__
    assert (own.error or (None,))[0] == expected, own.error
    # The open work is read with the fence, and the end is one statement (the shared form: five,
    # with the forks sharing the run and its streams), whatever follows (descendants are
    # cancelled by the shared code).
    saved = 7 if scenario.status is RunStatus.COMPLETED else 4
    assert shared.statements - own.statements == saved, (shared, own)


async def test_an_end_wakes_its_suspended_parent_its_waiter_and_the_workers(postgres_admin_url: str) -> None:
    """What the comparison above compares, spelled out for the end that wakes the most."""
    clock = ManualClock()
    with fresh_database(postgres_admin_url) as url:
        async with zincir.open_database(url, clock=clock) as db:
            lease = await suspended_parent(db)
            clock.advance(1.0)
            ended = await end(
                db, PostgresStore.finish, lease, SCENARIOS["completes-waking-its-parent-and-a-waiter"]
            )
            run = (await db.state(RUN)).run
            parent = (await db.state(PARENT)).run
        with psycopg.connect(url) as conn:
            waiters = conn.execute("SELECT count(*) FROM run_waiters").fetchone()
            due = conn.execute("SELECT next_attempt_at FROM agent_runs WHERE id = %s", (PARENT,)).fetchone()
    assert ended == Ended(None, (True, [], [PARENT], [RUN]), 2)
    assert (run.status, run.result) == (RunStatus.COMPLETED, 1)
    assert parent.status is RunStatus.WAITING and due == (clock(),)  # due now: a worker claims it
    assert waiters == (0,)  # the waiter was told; its row is gone


# Several runs' ends in one group commit go through the store's batch form (finish_runs): each
# scenario's run ends beside a plain one, in one batch of one writer, and must come out as the
# two ends one after the other do.
NEIGHBOUR = "00000000-0000-4000-8000-000000000005"


@attrs.frozen
class TwoEnds:
    error: tuple[str, str] | None  # the scenario's run's
    wakes: Wakes | None  # what both ends noted to wake (batched: if the batch form ran them)
    batch_sizes: list[int]
    rows: list[str]


def finish_noting_wakes(tx: Tx, lease: Lease, status: RunStatus, transition: str) -> Wakes:
    PostgresStore.finish(tx, lease, status, transition, "1")
    return Wakes() if tx.wakes is None else tx.wakes.copy()


Ends = list[tuple[Lease, RunStatus, str, str]]


async def two_ends(
    admin_url: str,
    build: Callable[[zincir.Database, ManualClock], Awaitable[Ends]],
    *,
    batched: bool,
    parent_held: bool = False,
) -> TwoEnds:
    """The two ends ``build`` sets up, in one batch of one writer (``batched``) or one after the
    other; the first's error, what was noted to wake, the batches the batch form was given, and
    every row afterwards."""
    clock = ManualClock()
    with fresh_database(admin_url) as url:
        async with zincir.open_database(url, clock=clock) as db:
            ends = await build(db, clock)
            batches = counting_batches(db, PostgresStore.finish)
            with holding(url, PARENT, parent_held):
                if batched:
                    outcomes = await in_one_batch(db, PostgresStore.finish, ends)
                    wakes = batches[0].wakes if batches else None
                else:
                    outcomes, wakes = [], Wakes()
                    for args in ends:
                        try:
                            wakes.add(await db._write(finish_noting_wakes, *args[:3], route=args[0].run_id))
                            outcomes.append(None)
                        except zincir.ZincirError as exc:
                            outcomes.append(exc)
            first, second = outcomes
        assert second is None  # the second is always a plain end
        error = None if first is None else said(first, url)
        return TwoEnds(error, wakes, [batch.size for batch in batches], without_event_ids(rows(url)))


def without_event_ids(table_rows: list[str]) -> list[str]:
    """The rows, but the events' serial ids: a batch that was refused took some."""
    return sorted(re.sub(r"^events: \(\d+,", "events: (", row) for row in table_rows)


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_ends_in_one_batch_do_what_each_end_alone_does(postgres_admin_url: str, name: str) -> None:
    scenario = SCENARIOS[name]
    transition = COMPLETED if scenario.status is RunStatus.COMPLETED else FAILED

    async def beside_a_neighbour(db: zincir.Database, clock: ManualClock) -> Ends:
        lease = await scenario.build(db)
        neighbour = await create(db, NEIGHBOUR)
        return [(lease, scenario.status, transition, "1"), (neighbour, RunStatus.COMPLETED, COMPLETED, "1")]

    alone = await two_ends(
        postgres_admin_url, beside_a_neighbour, batched=False, parent_held=scenario.parent_held
    )
    together = await two_ends(
        postgres_admin_url, beside_a_neighbour, batched=True, parent_held=scenario.parent_held
    )
    assert together.error == alone.error
    assert together.rows == alone.rows
    assert together.batch_sizes == [2]
    # A run with a live child is refused too: a failing one's cascade comes right after its end.
    if scenario.expected_error is None and scenario.build is not with_children:  # the batch ended both
        assert together.wakes is not None and alone.wakes is not None
        assert attrs.asdict(together.wakes) == attrs.asdict(alone.wakes)
    else:  # refused: each ended (or not) on its own
        assert together.wakes is None


async def test_a_run_and_its_child_ending_in_one_batch_end_as_one_after_the_other(
    postgres_admin_url: str,
) -> None:
    """The parent fails first: its cascade asks its child (held by the same owner) to stop
    before the child completes, and the child's row keeps the reason, as it would alone."""

    async def parent_then_child(db: zincir.Database, clock: ManualClock) -> Ends:
        parent = await create(db, PARENT)
        child = await create(db, RUN, PARENT)
        return [(parent, RunStatus.FAILED, FAILED, "1"), (child, RunStatus.COMPLETED, COMPLETED, "1")]

    alone = await two_ends(postgres_admin_url, parent_then_child, batched=False)
    together = await two_ends(postgres_admin_url, parent_then_child, batched=True)
    assert (together.error, together.batch_sizes, together.wakes) == (None, [2], None)  # refused
    assert together.rows == alone.rows
    assert any(
        row.startswith(f"agent_runs: ({RUN},") and f"its ancestor {PARENT}" in row for row in alone.rows
    )


async def test_a_lease_that_expires_at_the_batchs_now_is_lost_as_alone(postgres_admin_url: str) -> None:
    async def expiring_now(db: zincir.Database, clock: ManualClock) -> Ends:
        expiring = await create(db, RUN)
        clock.advance(TTL_MS / 1000)
        neighbour = await create(db, NEIGHBOUR)
        return [
            (expiring, RunStatus.COMPLETED, COMPLETED, "1"),
            (neighbour, RunStatus.COMPLETED, COMPLETED, "1"),
        ]

    alone = await two_ends(postgres_admin_url, expiring_now, batched=False)
    together = await two_ends(postgres_admin_url, expiring_now, batched=True)
    assert alone.error is not None and alone.error[0] == "LeaseLost"
    assert (together.error, together.rows, together.batch_sizes) == (alone.error, alone.rows, [2])


async def test_two_children_ending_in_one_batch_make_their_suspended_parent_due(
    postgres_admin_url: str,
) -> None:
    async def two_children_of_a_suspended_parent(db: zincir.Database, clock: ManualClock) -> Ends:
        parent = await create(db, PARENT)
        children = [await create(db, RUN, PARENT), await create(db, KID, PARENT)]
        for child in children:
            await db._write(db._store.await_child, parent, child.run_id, None)
        assert await db._write(db._store.suspend, parent, [("child", RUN), ("child", KID)])
        await db._write(db._store.watch_end, KID, "a-waiter")
        return [(child, RunStatus.COMPLETED, COMPLETED, "1") for child in children]

    alone = await two_ends(postgres_admin_url, two_children_of_a_suspended_parent, batched=False)
    together = await two_ends(postgres_admin_url, two_children_of_a_suspended_parent, batched=True)
    assert together.batch_sizes == [2] and together.error is None
    assert together.rows == alone.rows
    assert together.wakes is not None and alone.wakes is not None
    assert attrs.asdict(together.wakes) == attrs.asdict(alone.wakes)
    assert (together.wakes.claimable, together.wakes.waits, together.wakes.ended) == (True, {PARENT}, {KID})
