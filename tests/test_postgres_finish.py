"""A run's end on PostgreSQL, its store's own two statements, against the shared form of
``finish`` on the same server: for every way an end goes, the same error, the same rows and
events left behind, the same wake-ups, in fewer statements.

Each form runs the same scenario in a database of its own, with the same run ids and a manual
clock, so that the two databases must come out identical, row for row.
"""

from __future__ import annotations

import json
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

from .conftest import ManualClock
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
        return Ended((type(error).__name__, str(error).replace(db.path, "<db>")), None, sent[0])
    woken = (
        None if wakes is None else (wakes.claimable, *map(sorted, (wakes.inbox, wakes.waits, wakes.ended)))
    )
    return Ended(None, woken, sent[0])


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
