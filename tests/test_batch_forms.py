"""Several runs' steps in one group commit go through the store's batch form (PostgreSQL: one
statement for all of them; SQLite: one read of their leases and one executemany), and each
caller still gets the answer its own operation would give, whatever its neighbours do. The
steps are queued behind a write that holds the writer, so that they reach it as one batch."""

from __future__ import annotations

import contextlib
from typing import Any

import attrs
import psycopg
import pytest
import trio

import zincir
from zincir._database import storage
from zincir._errors import TransientConflict
from zincir._store import Lease, Store

from .helpers import counting_batches, in_one_batch, rows


async def _as_one_batch(db: zincir.Database, calls: list[tuple[Lease, str, str]]) -> list[Any]:
    """``complete_step`` for each call (lease, name, result), all in one batch of one writer."""
    return await in_one_batch(db, Store.complete_step, [(*call, 5) for call in calls])


@contextlib.asynccontextmanager
async def _leases(db: zincir.Database, n: int) -> Any:
    async with contextlib.AsyncExitStack() as stack:
        runs = [await stack.enter_async_context(zincir.open_run(db)) for _ in range(n)]
        yield [run._lease for run in runs]


async def test_steps_of_several_runs_in_one_batch_are_each_stored_once(db: zincir.Database) -> None:
    batches = counting_batches(db, Store.complete_step)
    async with _leases(db, 4) as leases:
        calls = [(lease, f"step-{i}", f'"result {i}"') for i, lease in enumerate(leases)]
        assert await _as_one_batch(db, calls) == [result for _, _, result in calls]
    assert [batch.size for batch in batches] == [4]
    stored = rows(db, "SELECT run_id, name, result, status, epoch, completed_at - started_at FROM steps")
    expected = [(lease.run_id, name, result, "completed", 1, 5) for lease, name, result in calls]
    assert sorted(stored) == sorted(expected)


async def test_a_batch_with_a_lost_lease_and_a_repeated_step_answers_each_call_as_alone(
    db: zincir.Database,
) -> None:
    batches = counting_batches(db, Store.complete_step)
    async with _leases(db, 3) as (done, fenced, fresh):
        first = await storage(db).write(Store.complete_step, done, "again", '"first"', 1, route=done.run_id)
        calls = [
            (done, "again", '"second"'),  # completed before: the first result wins
            (attrs.evolve(fenced, epoch=fenced.epoch - 1), "lost", '"never"'),  # a stale epoch
            (fresh, "new", '"fresh"'),
        ]
        repeated, lost, new = await _as_one_batch(db, calls)
    assert (first, repeated, new) == ('"first"', '"first"', '"fresh"')
    assert isinstance(lost, zincir.LeaseLost) and "fenced by a newer owner" in str(lost)
    assert [batch.size for batch in batches] == [3]  # refused, then each on its own
    stored = rows(db, "SELECT run_id, name, result FROM steps")
    assert sorted(stored) == sorted([(done.run_id, "again", '"first"'), (fresh.run_id, "new", '"fresh"')])


@pytest.mark.parametrize("n", [2, 50])
async def test_runs_stepping_at_once_keep_every_step(db: zincir.Database, n: int) -> None:
    async def one(results: list[object]) -> None:
        async with zincir.open_run(db) as run:
            for i in range(20):
                results.append(await run.step(f"s{i}", _echo, i))
            await run.complete()

    results: list[object] = []
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one, results)
    assert sorted(results) == sorted(list(range(20)) * n)
    assert rows(db, "SELECT count(*), count(DISTINCT run_id) FROM steps") == [(20 * n, n)]


async def _echo(i: int) -> int:
    return i


@pytest.mark.parametrize("encrypted", [False, True], ids=["clear", "encrypted"])
async def test_large_and_encrypted_results_in_a_batch_read_back_as_written(
    db_target: str, encrypted: bool
) -> None:
    keys: dict[str, Any] = {"encryption_key": b"k" * 32} if encrypted else {}
    async with zincir.open_database(db_target, content_threshold=64, **keys) as db:
        batches = counting_batches(db, Store.complete_step)
        async with _leases(db, 3) as leases:
            large = ['"' + f"part {i} " * 40 + '"' for i in range(3)]  # over the threshold: stored apart
            calls = [(lease, f"s{i}", large[i]) for i, lease in enumerate(leases)]
            assert await _as_one_batch(db, calls) == large
            for lease, name, result in calls:  # each stored result reads back whole
                again = await storage(db).write(
                    Store.complete_step, lease, name, '"other"', 1, route=lease.run_id
                )
                assert again == result
        assert [batch.size for batch in batches] == [3]


async def test_one_step_twice_in_a_batch_is_stored_once(db: zincir.Database) -> None:
    batches = counting_batches(db, Store.complete_step)
    async with _leases(db, 2) as (one, other):
        calls = [(one, "same", '"first"'), (one, "same", '"second"'), (other, "own", '"own"')]
        first, second, own = await _as_one_batch(db, calls)
    # Refused, then each on its own: whichever Trio let submit first wins, for both calls.
    assert first == second and first in ('"first"', '"second"') and own == '"own"'
    assert [batch.size for batch in batches] == [3]
    assert rows(db, "SELECT count(*) FROM steps WHERE run_id = ?", (one.run_id,)) == [(1,)]


@pytest.mark.postgresql_only
async def test_a_run_row_held_elsewhere_refuses_only_its_own_step(db: zincir.Database) -> None:
    async with _leases(db, 3) as leases:
        holder = psycopg.connect(db.path, autocommit=False)
        holder.execute("SELECT 1 FROM agent_runs WHERE id = %s FOR UPDATE", (leases[1].run_id,))
        try:
            calls = [(lease, f"s{i}", f'"{i}"') for i, lease in enumerate(leases)]
            first, held, third = await _as_one_batch(db, calls)
        finally:
            holder.rollback()
            holder.close()
    assert (first, third) == ('"0"', '"2"')
    assert isinstance(held, TransientConflict)  # as the step alone would be: retried by its run
    assert rows(db, "SELECT count(*) FROM steps") == [(2,)]
