"""Child runs (docs/children.md), on both backends: spawn once per name, join as a wait, cancel
with the whole family below, and a durable nursery."""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from typing import Any

import pytest
import trio
import trio.testing

import zincir
from zincir._store import NewChild
from zincir._threads import DatabaseThread

from .helpers import dump, listening, rows, running_python, scalar, status_of, until
from .helpers import has_status as _is
from .test_suspension import working


def types_of(events: list[zincir.Event]) -> list[zincir.EventType]:
    return [e.type for e in events]


async def test_spawn_creates_a_pending_unleased_child_once_per_name(db: zincir.Database) -> None:
    async with zincir.open_run(db, role="lead") as parent:
        child = await parent.spawn("researcher-1", role="researcher", config={"source": "arxiv"})
        assert await parent.spawn("researcher-1", role="ignored") == child
        other = await parent.spawn("researcher-2")
        [record] = [r for r in await db.runs(role="researcher")]
        assert (record.id, record.parent_run_id, record.status) == (
            child,
            parent.id,
            zincir.RunStatus.PENDING,
        )
        assert record.config == {"source": "arxiv"}
        assert rows(db, "SELECT lease_owner FROM agent_runs WHERE id = ?", (child,)) == [(None,)]
        spawned = [e.payload for e in await db.events(parent.id) if e.type is zincir.EventType.CHILD_SPAWNED]
        assert spawned == [
            {"child_id": child, "name": "researcher-1", "role": "researcher"},
            {"child_id": other, "name": "researcher-2", "role": "agent"},
        ]
        await parent.cancel_child(child, "done with it")
        await parent.cancel_child(other, "done with it")
        await parent.complete()


async def test_a_spawn_repeated_after_a_crash_before_it_returned_finds_the_child(db: zincir.Database) -> None:
    async with zincir.open_run(db) as parent:
        # The first attempt committed, then its process died before spawn() returned.
        first = str(uuid.uuid4())
        kid = NewChild("kid", first, "agent", "", "{}")
        await db._write(db._store.spawn_children, parent._lease, [kid], route=parent.id)
        assert await parent.spawn("kid") == first
        assert scalar(db, "SELECT count(*) FROM agent_runs WHERE parent_run_id = ?", (parent.id,)) == 1
        assert types_of(await db.events(parent.id)).count(zincir.EventType.CHILD_SPAWNED) == 1


async def test_join_of_a_child_that_already_ended_returns_it_at_once_with_its_result(
    db: zincir.Database,
) -> None:
    async with zincir.open_run(db) as parent:
        child = await parent.spawn("kid")
        async with zincir.open_run(db, child) as run:
            await run.complete(result={"answer": 42})
        with trio.fail_after(2):
            joined = await parent.join(child)
        assert (joined.status, joined.result) == (zincir.RunStatus.COMPLETED, {"answer": 42})
        assert (await parent.join(child)).result == {"answer": 42}  # replayed
        [event] = [e.payload for e in await db.events(parent.id) if e.type is zincir.EventType.CHILD_JOINED]
        assert event == {"child_id": child, "result": {"answer": 42}, "status": "completed"}
        await parent.complete(result=["all", "done"])
    assert (await db.state(parent.id)).run.result == ["all", "done"]


async def test_a_join_waits_for_a_child_ending_in_the_same_process(db: zincir.Database) -> None:
    async with zincir.open_run(db) as parent:
        child = await parent.spawn("kid")
        got: list[zincir.RunRecord] = []

        async def joiner() -> None:
            got.append(await parent.join(child))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(joiner)
            await trio.testing.wait_all_tasks_blocked()
            async with zincir.open_run(db, child) as run:
                await run.fail("no luck")
        assert [(r.id, r.status) for r in got] == [(child, zincir.RunStatus.FAILED)]


async def test_a_child_ending_wakes_its_parents_join_not_its_heartbeat(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The heartbeat looks for a cancellation or a budget change when poked; a child's end is
    # neither, so the parent's owner must not read the database for it (here or, on
    # PostgreSQL, when the notification of the end comes back).
    looked: list[str] = []
    owner_news = db._store.owner_news

    def counted(tx: Any, run_id: str) -> Any:
        looked.append(run_id)
        return owner_news(tx, run_id)

    monkeypatch.setattr(db._store, "owner_news", counted)
    words = await listening(db, monkeypatch)  # before the parent: that first word wakes everyone
    async with zincir.open_run(db) as marker, zincir.open_run(db) as parent:
        for i in range(4):
            child = await parent.spawn(f"kid-{i}")
            async with zincir.open_run(db, child) as run:
                await run.complete(result=1)
            assert (await parent.join(child)).result == 1
            # The listener delivers words in commit order: once a later signal's has come, so
            # has whatever word of the child's end comes back to this process ...
            await zincir.send_signal(db, marker.id, "flush", i)
            with trio.fail_after(10):
                await words.word("inbox", marker.id)
            # ... and what it woke has run, up to a read it queued (the heartbeat's look),
            # which the reader thread answers before this one.
            await trio.testing.wait_all_tasks_blocked()
            await db.state(parent.id)
        await parent.complete()
    assert parent.id not in looked
    assert marker.id in looked  # the marker's signal did make its heartbeat look


async def test_only_a_runs_own_children_can_be_joined_or_cancelled(db: zincir.Database) -> None:
    async with zincir.open_run(db) as stranger, zincir.open_run(db) as parent:
        before = dump(db)
        with pytest.raises(zincir.InvalidArgument, match="is not a child of this run"):
            await parent.join(stranger.id)
        with pytest.raises(zincir.InvalidArgument, match="is not a child of this run"):
            await parent.cancel_child(stranger.id, "no")
        with pytest.raises(zincir.InvalidArgument):
            await parent.join("not-a-run-id")
        assert dump(db) == before


async def test_a_parent_cannot_complete_before_its_children_have_ended(db: zincir.Database) -> None:
    async with zincir.open_run(db) as parent:
        child = await parent.spawn("kid")
        with pytest.raises(zincir.UnfinishedWork, match="child runs"):
            await parent.complete()
        async with zincir.open_run(db, child) as run:
            await run.complete()
        await parent.join(child)
        await parent.complete()


async def test_failing_a_parent_cancels_its_live_children_and_theirs(db: zincir.Database) -> None:
    async with zincir.open_run(db) as parent:
        child = await parent.spawn("kid")
        async with zincir.open_run(db, child) as run:
            grandchild = await run.spawn("grandkid")
        done = await parent.spawn("done")
        async with zincir.open_run(db, done) as run:
            await run.complete()
        await parent.fail("gave up")
    assert [await status_of(db, r) for r in (child, grandchild, done)] == [
        zincir.RunStatus.CANCELLED,
        zincir.RunStatus.CANCELLED,
        zincir.RunStatus.COMPLETED,
    ]
    [transition] = [e.payload for e in await db.events(grandchild) if e.payload.get("to") == "cancelled"]
    assert transition["reason"] == f"its ancestor {parent.id} ended failed"


async def test_a_fenced_parent_cannot_spawn(db: zincir.Database) -> None:
    with pytest.raises(zincir.LeaseLost):
        async with zincir.open_run(db) as stale:
            async with zincir.open_run(db, stale.id, force=True) as current:
                await current.complete()
            before = dump(db)
            with pytest.raises(zincir.LeaseLost):
                await stale.spawn("kid")
            assert dump(db) == before


async def test_cancelling_an_unowned_run_ends_it_and_its_family_at_once(db: zincir.Database) -> None:
    async with zincir.open_run(db) as root:
        level = [root.id]
        child = await root.spawn("a")
    for depth in range(5):  # a chain of grandchildren five deep, nobody running any of them
        async with zincir.open_run(db, child) as run:
            level.append(child)
            if depth < 4:
                child = await run.spawn(f"level-{depth}")
    await zincir.cancel_run(db, root.id, "the user changed their mind")
    assert [await status_of(db, r) for r in level] == [zincir.RunStatus.CANCELLED] * 6
    [transition] = [e.payload for e in await db.events(root.id) if e.payload.get("to") == "cancelled"]
    assert transition == {"from": "running", "reason": "the user changed their mind", "to": "cancelled"}
    await zincir.cancel_run(db, root.id, "again")  # cancelling a cancelled run does nothing
    async with zincir.open_run(db) as finished:
        await finished.complete()
    with pytest.raises(zincir.RunTerminal, match="completed"):
        await zincir.cancel_run(db, finished.id, "too late")
    with pytest.raises(zincir.RunNotFound):
        await zincir.cancel_run(db, str(uuid.uuid4()), "who?")


async def test_an_owners_body_stops_promptly_when_its_run_is_cancelled(db: zincir.Database) -> None:
    stopped_after: list[float] = []
    with pytest.raises(zincir.RunCancelled, match="stop now"):
        async with zincir.open_run(db, lease_ttl=60) as run:  # a renewal is 20 s away
            child = await run.spawn("kid")
            started = trio.current_time()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(zincir.cancel_run, db, run.id, "stop now")
                    await trio.sleep_forever()
            finally:
                stopped_after.append(trio.current_time() - started)
    assert stopped_after[0] < 5
    assert await status_of(db, run.id) is zincir.RunStatus.CANCELLED
    assert await status_of(db, child) is zincir.RunStatus.CANCELLED


async def test_a_cancellation_from_another_process_stops_a_workers_handler(db: zincir.Database) -> None:
    async with zincir.open_run(db, role="sleeper"):
        pass
    [run_id] = [r.id for r in await db.runs(role="sleeper")]

    async def handler(run: zincir.Run) -> None:
        await trio.sleep_forever()

    canceller = """
        import sys, trio, zincir
        async def main():
            async with zincir.open_database(sys.argv[1]) as db:
                await zincir.cancel_run(db, sys.argv[2], "from elsewhere")
        trio.run(main)
    """
    async with working(db, handler, lease_ttl=60, suspend_after=None):
        await until(lambda: _is(db, run_id, zincir.RunStatus.RUNNING))
        await until(lambda: _leased(db, run_id))
        with running_python(canceller, db.path, run_id) as proc:
            # The renewal is 20 s away: the watcher of the file (SQLite) or NOTIFY (PostgreSQL)
            # has the heartbeat look now.
            await until(lambda: _is(db, run_id, zincir.RunStatus.CANCELLED), within=10)
            _, err = await trio.to_thread.run_sync(proc.communicate)
            assert proc.returncode == 0, err
    assert not [e for e in await db.events(run_id) if e.type is zincir.EventType.ATTEMPT_FAILED]


async def _leased(db: zincir.Database, run_id: str) -> bool:
    return scalar(db, "SELECT lease_owner FROM agent_runs WHERE id = ?", (run_id,)) is not None


async def test_a_cancellation_racing_a_completion_leaves_exactly_one_end(db: zincir.Database) -> None:
    async def cancel(run_id: str) -> None:
        with contextlib.suppress(zincir.RunTerminal):  # the completion came first
            await zincir.cancel_run(db, run_id, "race")

    for _ in range(10):
        with contextlib.suppress(zincir.RunCancelled):  # the cancellation came first
            async with zincir.open_run(db) as run, trio.open_nursery() as nursery:
                nursery.start_soon(cancel, run.id)
                with contextlib.suppress(zincir.RunTerminal):
                    await run.complete()
        events = await db.events(run.id)
        ends = [e.payload["to"] for e in events if e.type is zincir.EventType.STATE_TRANSITION][1:]
        assert ends in (["completed"], ["cancelled"])
        assert (await status_of(db, run.id)).value == ends[0]


# -- under a worker ------------------------------------------------------------------------------


async def family(run: zincir.Run) -> None:
    """A parent (role "lead") fans out to its children (awaiting each spawn, or with
    ``spawn_soon`` if its config says ``soon``); each child completes with its number."""
    record = (await run.state()).run
    config: Any = record.config
    if record.role == "lead":
        async with run.children() as nursery:
            for i in range(config["children"]):
                options: Any = {"role": "child", "config": {"i": i, "gated": config.get("gated")}}
                if config.get("soon"):
                    nursery.spawn_soon(f"child-{i}", **options)
                else:
                    await nursery.spawn(f"child-{i}", **options)
        assert [child.id for child in nursery.records.values()] == nursery.spawned
        await run.complete(result=[child.result for child in nursery.records.values()])
    else:
        if config.get("gated"):
            await run.wait_for_signal("gate", "go")
        await run.complete(result=config["i"])


@pytest.mark.parametrize("soon", [False, True], ids=["spawn", "spawn_soon"])
async def test_a_worker_runs_a_family_and_a_childs_end_wakes_its_suspended_parent(
    db: zincir.Database, soon: bool
) -> None:
    async with zincir.open_run(db, role="lead", config={"children": 3, "gated": True, "soon": soon}) as lead:
        pass
    async with working(db, family, suspend_after=0, max_concurrency=2):
        await until(lambda: _waits_for_a_child(db, lead.id))
        children = [r[0] for r in rows(db, "SELECT id FROM agent_runs WHERE parent_run_id = ?", (lead.id,))]
        for child in children:
            await zincir.send_signal(db, child, "go", None)
        # poll_interval is 60 s: only a child's end can wake the suspended parent this fast.
        await until(lambda: _is(db, lead.id, zincir.RunStatus.COMPLETED), within=30)
    record = (await db.state(lead.id)).run
    assert record.result == [0, 1, 2]
    events = await db.events(lead.id)
    assert types_of(events).count(zincir.EventType.CHILD_SPAWNED) == 3
    assert types_of(events).count(zincir.EventType.CHILD_JOINED) == 3
    assert any(e.payload.get("waiting_for", {}).get("kind") == "child" for e in events)


async def _waits_for_a_child(db: zincir.Database, run_id: str) -> bool:
    found = rows(db, "SELECT status, wait_kind FROM agent_runs WHERE id = ?", (run_id,))
    return found == [("waiting", "child")]


@pytest.mark.parametrize("soon", [False, True], ids=["spawn", "spawn_soon"])
async def test_two_hundred_children_joined_in_one_nursery(db: zincir.Database, soon: bool) -> None:
    async with zincir.open_run(db, role="lead", config={"children": 200, "soon": soon}) as lead:
        pass
    async with working(db, family, suspend_after=0.5, max_concurrency=64):
        await until(lambda: _is(db, lead.id, zincir.RunStatus.COMPLETED), within=120, every=0.1)
    assert (await db.state(lead.id)).run.result == list(range(200))
    assert scalar(db, "SELECT count(*) FROM agent_runs WHERE parent_run_id = ?", (lead.id,)) == 200


async def test_a_nursery_that_raises_cancels_its_children(db: zincir.Database) -> None:
    async with zincir.open_run(db) as parent:
        with pytest.raises(ValueError, match="planner broke"):
            async with parent.children() as nursery:
                kids = [await nursery.spawn(f"kid-{i}") for i in range(3)]
                raise ValueError("planner broke")
        assert [await status_of(db, k) for k in kids] == [zincir.RunStatus.CANCELLED] * 3
        await parent.complete()  # every child has ended


async def test_a_parent_restarted_inside_its_nursery_finds_the_same_children(db: zincir.Database) -> None:
    async with zincir.open_run(db) as parent:
        with trio.move_on_after(0.3):  # the first owner dies while its nursery joins
            async with parent.children() as nursery:
                first = [await nursery.spawn(f"kid-{i}") for i in range(3)]
    for kid in first:
        async with zincir.open_run(db, kid) as run:
            await run.complete(result=kid[:4])
    async with zincir.open_run(db, parent.id) as again:
        async with again.children() as nursery:
            second = [await nursery.spawn(f"kid-{i}") for i in range(3)]
        assert second == first
        await again.complete()
    assert scalar(db, "SELECT count(*) FROM agent_runs WHERE parent_run_id = ?", (parent.id,)) == 3


async def _has_children(db: zincir.Database, parent_id: str, count: int) -> bool:
    return scalar(db, "SELECT count(*) FROM agent_runs WHERE parent_run_id = ?", (parent_id,)) == count


async def test_spawn_soon_creates_what_was_queued_together_in_few_transactions(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: dict[str, list[int]] = {"spawn": [], "join": []}

    def counted(kind: str, batched: Any) -> Any:
        def operation(tx: Any, lease: Any, items: Any) -> Any:
            sizes[kind].append(len(items))
            return batched(tx, lease, items)

        return operation

    monkeypatch.setattr(db._store, "spawn_children", counted("spawn", db._store.spawn_children))
    monkeypatch.setattr(db._store, "join_children", counted("join", db._store.join_children))
    names = [f"kid-{i}" for i in range(120)]
    async with zincir.open_run(db, role="lead") as parent:
        async with parent.children() as nursery:
            for i, name in enumerate(names):
                nursery.spawn_soon(name, role="kid", config={"i": i})
            await until(lambda: _has_children(db, parent.id, len(names)))
            await until(lambda: _spawned_all(nursery, len(names)))
            for kid in nursery.spawned:  # each ends, so the block's end joins them at once
                async with zincir.open_run(db, kid) as run:
                    await run.complete(result=(await run.state()).run.config)
        assert list(nursery.records) == names
        assert [child.result for child in nursery.records.values()] == [{"i": i} for i in range(120)]
        await parent.complete()
    assert sizes == {"spawn": [100, 20], "join": [100, 20]}
    events = await db.events(parent.id)
    spawned = [e.payload for e in events if e.type is zincir.EventType.CHILD_SPAWNED]
    assert [(p["name"], p["child_id"], p["role"]) for p in spawned] == [
        (name, child, "kid") for name, child in zip(names, nursery.spawned, strict=True)
    ]
    joined = [e.payload["child_id"] for e in events if e.type is zincir.EventType.CHILD_JOINED]
    assert joined == nursery.spawned


async def _spawned_all(nursery: zincir.Children, count: int) -> bool:
    return len(nursery.spawned) == count


async def test_spawn_soon_in_a_restarted_block_finds_the_same_children(db: zincir.Database) -> None:
    async with zincir.open_run(db) as parent:
        with trio.move_on_after(0.3):  # the first owner dies while its nursery joins
            async with parent.children() as nursery:
                for i in range(3):
                    nursery.spawn_soon(f"kid-{i}")
        first = dict(zip(nursery.spawned, [f"kid-{i}" for i in range(3)], strict=True))
    for kid in first:
        async with zincir.open_run(db, kid) as run:
            await run.complete(result=first[kid])
    async with zincir.open_run(db, parent.id) as again:
        async with again.children() as nursery:
            assert await nursery.spawn("kid-1") in first  # awaited or not, one child per name
            for i in range(3):
                nursery.spawn_soon(f"kid-{i}")
        assert {name: child.result for name, child in nursery.records.items()} == {
            name: name for name in first.values()
        }
        await again.complete()
    assert await _has_children(db, parent.id, 3)
    assert types_of(await db.events(parent.id)).count(zincir.EventType.CHILD_SPAWNED) == 3


async def test_a_nursery_that_raises_cancels_what_spawn_soon_created_and_drops_the_rest(
    db: zincir.Database,
) -> None:
    async with zincir.open_run(db) as parent:
        with pytest.raises(ValueError, match="planner broke"):
            async with parent.children() as nursery:
                for i in range(3):
                    nursery.spawn_soon(f"kid-{i}")
                await until(lambda: _has_children(db, parent.id, 3))
                nursery.spawn_soon("never")  # queued, and the block raises before it is sent
                raise ValueError("planner broke")
        assert [await status_of(db, k) for k in nursery.spawned] == [zincir.RunStatus.CANCELLED] * 3
        assert await _has_children(db, parent.id, 3)
        with pytest.raises(zincir.InvalidArgument, match="block has ended"):
            nursery.spawn_soon("late")
        await parent.complete()


async def test_a_parent_cannot_complete_while_spawn_soon_has_children_to_create(db: zincir.Database) -> None:
    async with zincir.open_run(db) as parent:
        async with parent.children() as nursery:
            nursery.spawn_soon("kid")
            with pytest.raises(zincir.UnfinishedWork, match="spawn_soon"):
                await parent.complete()  # the child does not exist yet: nothing else would refuse
            await until(lambda: _spawned_all(nursery, 1))
            with pytest.raises(zincir.UnfinishedWork, match="child runs"):
                await parent.complete()
            async with zincir.open_run(db, nursery.spawned[0]) as kid:
                await kid.complete()
        await parent.complete()


def _on_the_loop(token: trio.lowlevel.TrioToken, fn: Any) -> None:
    """Call ``fn`` on the Trio thread, from a store operation wherever it runs (SQLite may run
    a write inline on the Trio thread), and return once it has run."""
    if threading.current_thread() is threading.main_thread():
        fn()
    else:
        trio.from_thread.run_sync(fn, trio_token=token)


async def test_a_cancelled_block_end_sends_no_batch_after_the_one_in_flight(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []
    batched, token, outside = db._store.spawn_children, trio.lowlevel.current_trio_token(), trio.CancelScope()

    def spawn_children(tx: Any, lease: Any, children: Any) -> Any:
        sizes.append(len(children))
        _on_the_loop(token, outside.cancel)  # while the first batch is in flight
        return batched(tx, lease, children)

    monkeypatch.setattr(db._store, "spawn_children", spawn_children)
    async with zincir.open_run(db) as parent:
        with outside:
            async with parent.children() as nursery:
                for i in range(300):
                    nursery.spawn_soon(f"kid-{i}")
        assert outside.cancelled_caught and sizes == [100]
        assert len(nursery.spawned) == 100 and await _has_children(db, parent.id, 100)
        # A cancellation is not an error of the block: the children go on, for a restarted block.
        assert {await status_of(db, kid) for kid in nursery.spawned} == {zincir.RunStatus.PENDING}


async def test_a_suspension_beside_a_batch_is_no_lost_lease(db: zincir.Database, caplog: Any) -> None:
    owners: list[zincir.Run] = []

    async def spawn_then_wait(run: zincir.Run) -> None:
        if (await run.state()).run.role == "lead":
            owners.append(run)
            async with run.children() as nursery:
                for i in range(300):
                    nursery.spawn_soon(f"kid-{i}", role="kid")
                await run.wait_for_signal("gate", "go")  # suspend_after=0: at once, beside a batch

    async with zincir.open_run(db, role="lead") as lead:
        pass
    with caplog.at_level("WARNING", logger="zincir"):
        async with working(db, spawn_then_wait, suspend_after=0, max_concurrency=1):
            await until(lambda: _is(db, lead.id, zincir.RunStatus.WAITING))
    # The worker has stopped: its handler, nursery sender included, has ended.
    assert [run._lifecycle.lost for run in owners] == [None]
    assert not [r for r in caplog.records if "lost" in r.getMessage() or "failed" in r.getMessage()]


@pytest.mark.parametrize("soon", [False, True], ids=["spawn", "spawn_soon"])
async def test_a_nursery_rides_out_a_moments_outage(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch, soon: bool
) -> None:
    def once_unavailable(operation: Any) -> Any:
        failed: list[bool] = []

        def flaky(*args: Any) -> Any:
            if not failed:
                failed.append(True)
                raise zincir.DatabaseUnavailable("connection reset (injected)")
            return operation(*args)

        return flaky

    for name in ("spawn_children", "ended_children", "join_children"):
        monkeypatch.setattr(db._store, name, once_unavailable(getattr(db._store, name)))
    async with zincir.open_run(db) as parent:
        async with parent.children() as nursery:
            if soon:
                nursery.spawn_soon("kid")
                await until(lambda: _spawned_all(nursery, 1))
            else:
                with pytest.raises(zincir.DatabaseUnavailable):  # an awaited spawn says so itself
                    await nursery.spawn("kid")
                await nursery.spawn("kid")
            async with zincir.open_run(db, nursery.spawned[0]) as kid:
                await kid.complete(result=1)
        assert nursery.records["kid"].result == 1
        await parent.complete()


@pytest.mark.sqlite_only
async def test_large_spawns_stay_off_the_trio_thread(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    inline: list[tuple[str, int]] = []  # what ran on the Trio thread: operation, config chars
    run_inline = DatabaseThread.run_inline

    async def spy(thread: DatabaseThread, request: Any) -> Any:
        children = request.args[1] if request.fn.__name__ == "spawn_children" else []
        inline.append((request.fn.__name__, sum(len(child.config_json) for child in children)))
        return await run_inline(thread, request)

    monkeypatch.setattr(DatabaseThread, "run_inline", spy)
    async with zincir.open_run(db) as parent:
        async with parent.children() as nursery:
            await nursery.spawn("large", config={"doc": "x" * 100_000})
            for i in range(2):  # each under the inline limit, the two together over it
                nursery.spawn_soon(f"kid-{i}", config={"doc": "x" * 40_000})
            await until(lambda: _spawned_all(nursery, 3))
            for kid in nursery.spawned:
                await parent.cancel_child(kid, "done")
        await parent.complete()
    assert ("create_run", 0) in inline  # writes do go inline here,
    assert [chars for name, chars in inline if name == "spawn_children"] == []  # but not these


async def test_spawn_soon_refuses_bad_arguments_at_once(db: zincir.Database) -> None:
    async with zincir.open_run(db) as parent:
        before = dump(db)
        async with parent.children() as nursery:
            with pytest.raises(zincir.InvalidArgument, match="child name"):
                nursery.spawn_soon("")
            with pytest.raises(zincir.InvalidArgument, match="budget"):
                nursery.spawn_soon("kid", budget=5)  # type: ignore[arg-type]
            with pytest.raises(zincir.InvalidArgument, match="config"):
                nursery.spawn_soon("kid", config={"x": float("nan")})
        assert dump(db) == before and nursery.spawned == [] and nursery.records == {}
        await parent.complete()


async def test_a_fenced_parent_cannot_spawn_soon(db: zincir.Database) -> None:
    with pytest.raises(zincir.LeaseLost):
        async with zincir.open_run(db) as stale:
            async with zincir.open_run(db, stale.id, force=True) as current:
                await current.complete()
            before = dump(db)
            with pytest.raises(zincir.LeaseLost):
                async with stale.children() as nursery:
                    nursery.spawn_soon("kid")
            assert dump(db) == before and nursery.spawned == []


async def test_cancelling_a_suspended_parent_cancels_its_children_with_no_process_running(
    db: zincir.Database,
) -> None:
    async with zincir.open_run(db, role="lead", config={"children": 4}) as lead:
        pass

    async def spawn_then_wait(run: zincir.Run) -> None:  # children never get to run
        if (await run.state()).run.role == "lead":
            async with run.children() as nursery:
                for i in range(4):
                    await nursery.spawn(f"child-{i}", role="child")
        else:
            await trio.sleep_forever()

    async with working(db, spawn_then_wait, suspend_after=0, max_concurrency=1):
        await until(lambda: _is(db, lead.id, zincir.RunStatus.WAITING))
    kids = [r[0] for r in rows(db, "SELECT id FROM agent_runs WHERE parent_run_id = ?", (lead.id,))]
    assert len(kids) == 4 and scalar(db, "SELECT count(*) FROM agent_runs WHERE lease_owner IS NOT NULL") == 0
    await zincir.cancel_run(db, lead.id, "no longer needed")
    assert [await status_of(db, r) for r in [lead.id, *kids]] == [zincir.RunStatus.CANCELLED] * 5


async def test_a_run_asked_to_cancel_does_not_suspend_but_stops(db: zincir.Database) -> None:
    async with zincir.open_run(db) as parent:
        child = await parent.spawn("kid")
    with pytest.raises(zincir.RunCancelled):
        async with zincir.open_run(db, child, lease_ttl=60) as run:
            with trio.move_on_after(0.05):
                await run.wait_for_signal("w", "go")  # the wait is recorded
            await zincir.cancel_run(db, child, "now")  # a request: the run is owned
            # Its owner, about to suspend, sees the request instead of going to sleep with it.
            assert await db._write(db._store.suspend, run._lease, [("signal", "w")], route=child) is False
            run._suspend_after = 0
            await run.wait_for_signal("w", "go")
    assert await status_of(db, child) is zincir.RunStatus.CANCELLED


# -- a nursery beside another wait; the run ending inside the block (docs/waits.md) ------------


async def lead_beside_an_abort_listener(run: zincir.Run) -> None:
    """A lead (role "lead") joins three children in a nursery while another task listens for
    "abort", whichever comes first; each child waits for "go" and completes with its number."""
    record = (await run.state()).run
    config: Any = record.config
    if record.role != "lead":
        await run.wait_for_signal("go", "go")
        await run.complete(result=config["i"])
        return
    aborted: list[object] = []
    async with trio.open_nursery() as lead:

        async def listen() -> None:
            aborted.append(await run.wait_for_signal("abort", "abort"))
            lead.cancel_scope.cancel()

        lead.start_soon(listen)
        async with run.children() as nursery:
            for i in range(3):
                nursery.spawn_soon(f"kid-{i}", role="kid", config={"i": i})
        lead.cancel_scope.cancel()
    if aborted:
        await run.fail(f"aborted: {aborted[0]}")
    else:
        await run.complete(result=[child.result for child in nursery.records.values()])


async def test_a_nursery_beside_an_abort_listener_resumes_when_its_children_end(db: zincir.Database) -> None:
    async with zincir.open_run(db, role="lead") as lead:
        pass
    async with working(db, lead_beside_an_abort_listener, suspend_after=0.05, max_concurrency=4):
        await until(lambda: _is(db, lead.id, zincir.RunStatus.WAITING))
        await until(lambda: _children_waiting(db, lead.id, 3))
        kids = [r[0] for r in rows(db, "SELECT id FROM agent_runs WHERE parent_run_id = ?", (lead.id,))]
        with trio.fail_after(30):  # poll_interval is 60 s: only the children's ends wake the lead
            for kid in kids:
                await zincir.send_signal(db, kid, "go", None)
            await until(lambda: _is(db, lead.id, zincir.RunStatus.COMPLETED))
    assert (await db.state(lead.id)).run.result == [0, 1, 2]
    suspensions = [e.payload for e in await db.events(lead.id) if e.payload.get("to") == "waiting"]
    # The listener's wait began first and so began the suspension; the nursery's join was in it.
    first = suspensions[0]["waits"]
    assert {"kind": "signal", "name": "abort", "signal": "abort", "until": None} in first
    assert [w["kind"] for w in first].count("child") == 1


async def _children_waiting(db: zincir.Database, parent_id: str, count: int) -> bool:
    found = rows(db, "SELECT status FROM agent_runs WHERE parent_run_id = ?", (parent_id,))
    return found == [("waiting",)] * count


@pytest.mark.parametrize(
    "end",
    ["complete after joining", "fail with children live", "complete with none spawned", "fail with none"],
)
async def test_ending_the_run_inside_its_nursery_leaves_the_block_quietly_under_a_worker(
    db: zincir.Database, caplog: pytest.LogCaptureFixture, end: str
) -> None:
    after_the_block: list[str] = []

    async def lead(run: zincir.Run) -> None:
        record = (await run.state()).run
        if record.role != "lead":
            await run.wait_for_signal("go", "go")
            await run.complete(result=record.config)
            return
        async with run.children() as nursery:
            kids = (
                []
                if "none" in end
                else [await nursery.spawn(f"kid-{i}", role="kid", config=i) for i in range(2)]
            )
            if end.startswith("complete"):
                for kid in kids:
                    await zincir.send_signal(run.database, kid, "go", None)
                records = [await run.join(kid) for kid in kids]
                await run.complete(result=[r.result for r in records])
            else:
                await run.fail("gave up")
        after_the_block.append(run.id)

    async with zincir.open_run(db, role="lead") as root:
        pass
    with caplog.at_level("INFO", logger="zincir"):
        async with working(db, lead, suspend_after=None, max_concurrency=4):
            await until(lambda: _ended(db, root.id))
    expected = zincir.RunStatus.COMPLETED if end.startswith("complete") else zincir.RunStatus.FAILED
    assert await status_of(db, root.id) is expected
    assert after_the_block == [root.id]  # left quietly, and the handler went on
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not noisy, caplog.text  # no RunTerminal, no failed attempt, no cancel or join tried after the end
    events = await db.events(root.id)
    assert not [e for e in events if e.type is zincir.EventType.ATTEMPT_FAILED]


async def _ended(db: zincir.Database, run_id: str) -> bool:
    return (await status_of(db, run_id)) in (zincir.RunStatus.COMPLETED, zincir.RunStatus.FAILED)


async def test_a_block_that_raises_after_fail_tries_no_cancellation(
    db: zincir.Database, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="zincir"):
        async with zincir.open_run(db) as run:
            with pytest.raises(ValueError, match="after the end"):
                async with run.children() as nursery:
                    kid = await nursery.spawn("kid")
                    await run.fail("gave up")
                    raise ValueError("after the end")
    assert await status_of(db, kid) is zincir.RunStatus.CANCELLED  # by fail(), with the run
    assert not caplog.records, caplog.text


async def test_a_handler_raising_after_failing_its_run_inside_a_nursery_is_a_warning_not_an_error(
    db: zincir.Database, caplog: pytest.LogCaptureFixture
) -> None:
    async def lead(run: zincir.Run) -> None:
        if (await run.state()).run.role != "lead":
            return  # a child: left pending, cancelled by its parent's fail()
        async with run.children() as nursery:
            await nursery.spawn("kid")
            await run.fail("gave up")
            raise ValueError("and then this")

    async with zincir.open_run(db, role="lead") as root:
        pass
    async with working(db, lead, suspend_after=None, max_concurrency=1):
        await until(lambda: _ended(db, root.id))
    assert await status_of(db, root.id) is zincir.RunStatus.FAILED
    assert not [e for e in await db.events(root.id) if e.type is zincir.EventType.ATTEMPT_FAILED]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "raised after the run failed: ValueError('and then this')" in warning
