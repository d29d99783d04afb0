"""Signals and named waits (docs/signals.md), on both backends: outsiders write the inbox, only
the lease holder writes the log."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import zincir

from .conftest import ManualClock
from .helpers import REPO, dump, running_python
from .postgres_server import restartable_server
from .test_waiting_views import cli


def received(events: list[zincir.Event]) -> list[dict[str, object]]:
    return [e.payload for e in events if e.type is zincir.EventType.SIGNAL_RECEIVED]


async def test_a_signal_sent_before_the_wait_is_received_and_logged(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        signal_id = await zincir.send_signal(db, run.id, "approved", {"by": "ada"})
        assert await run.wait_for_signal("approval", "approved") == {"by": "ada"}
        [event] = [e for e in (await run.state()).events if e.type is zincir.EventType.SIGNAL_RECEIVED]
        assert event.payload == {
            "name": "approval",
            "payload": {"by": "ada"},
            "signal": "approved",
            "signal_id": signal_id,
        }
        assert event.seq == 1 and event.idempotency_key == "wait:approval"
        await run.complete()


async def test_two_signals_of_one_topic_go_to_two_waits_in_order(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await zincir.send_signal(db, run.id, "page", 1)
        await zincir.send_signal(db, run.id, "other", "not me")
        await zincir.send_signal(db, run.id, "page", 2)
        assert await run.wait_for_signal("first", "page") == 1
        assert await run.wait_for_signal("second", "page") == 2
        assert await run.wait_for_signal("first", "page") == 1  # a named wait replays its payload
        assert [p["payload"] for p in received((await run.state()).events)] == [1, 2]


async def test_a_named_wait_returns_the_same_payload_to_a_later_owner(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await zincir.send_signal(db, run.id, "go", "first")
        assert await run.wait_for_signal("w", "go") == "first"
    await zincir.send_signal(db, run.id, "go", "second")
    async with zincir.open_run(db, run.id) as again:
        assert await again.wait_for_signal("w", "go") == "first"
        assert await again.wait_for_signal("w2", "go") == "second"
        await again.complete()


async def test_a_duplicate_key_stores_nothing(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        first = await zincir.send_signal(db, run.id, "hook", {"n": 1}, key="delivery-7")
        before = dump(db)
        assert await zincir.send_signal(db, run.id, "hook", {"n": 1}, key="delivery-7") == first
        assert dump(db) == before
        assert await run.wait_for_signal("a", "hook") == {"n": 1}
        with trio.move_on_after(0.3) as scope:  # nothing else was stored for a second wait
            await run.wait_for_signal("b", "hook")
        assert scope.cancelled_caught


async def test_signals_to_unknown_or_terminal_runs_are_refused_and_write_nothing(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await run.complete()
    before = dump(db)
    with pytest.raises(zincir.RunTerminal, match="completed"):
        await zincir.send_signal(db, run.id, "late", None)
    with pytest.raises(zincir.RunNotFound):
        await zincir.send_signal(db, "00000000-0000-4000-8000-000000000000", "x", None)
    assert dump(db) == before


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"signal": ""}, "signal name"),
        ({"signal": "bad\ud800"}, "surrogate"),
        ({"signal": "ok", "payload": {1, 2}}, "not a JSON value"),
        ({"signal": "ok", "payload": float("nan")}, "not a JSON value"),
        ({"signal": "ok", "key": ""}, "signal key"),
    ],
)
async def test_bad_signals_are_invalid_and_write_nothing(
    db: zincir.Database, kwargs: dict[str, object], match: str
) -> None:
    async with zincir.open_run(db) as run:
        before = dump(db)
        with pytest.raises(zincir.InvalidArgument, match=match):
            await zincir.send_signal(db, run.id, **kwargs)  # type: ignore[arg-type]
        assert dump(db) == before


async def test_a_wait_name_is_bound_to_its_topic(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await zincir.send_signal(db, run.id, "a", 1)
        assert await run.wait_for_signal("w", "a") == 1
        with pytest.raises(zincir.InvalidArgument, match="waits for signal 'a', not 'b'"):
            await run.wait_for_signal("w", "b")


async def test_a_waiting_owner_is_woken_by_a_send_in_its_process(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        got: list[object] = []

        async def waiter(task_status: trio.TaskStatus[None]) -> None:
            task_status.started()
            got.append(await run.wait_for_signal("w", "go"))

        async with trio.open_nursery() as nursery:
            await nursery.start(waiter)
            await trio.testing.wait_all_tasks_blocked()
            await zincir.send_signal(db, run.id, "go", "now")
        assert got == ["now"]


async def test_a_signal_from_another_process_reaches_a_waiting_owner(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        sender = """
            import sys, trio, zincir
            async def main():
                async with zincir.open_database(sys.argv[1]) as db:
                    print(await zincir.send_signal(db, sys.argv[2], "go", {"from": "elsewhere"}))
            trio.run(main)
        """
        with trio.fail_after(20):
            with running_python(sender, db_target_of(db), run.id) as proc:
                payload = await run.wait_for_signal("w", "go")
                out, err = await trio.to_thread.run_sync(proc.communicate)
        assert payload == {"from": "elsewhere"}, err
        assert int(out) >= 1


def db_target_of(db: zincir.Database) -> str:
    return db.path


async def test_a_timeout_is_recorded_and_raises_again(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        with pytest.raises(zincir.WaitTimeout, match="passed its deadline") as info:
            await run.wait_for_signal("w", "never", timeout=0.2)
        assert isinstance(info.value, TimeoutError)
        await zincir.send_signal(db, run.id, "never", "too late")
        with pytest.raises(zincir.WaitTimeout):  # recorded: at once, even though a signal came
            await run.wait_for_signal("w", "never", timeout=100)
        [event] = [e for e in (await run.state()).events if e.type is zincir.EventType.WAIT_TIMED_OUT]
        assert event.payload["name"] == "w"


async def test_a_deadline_stored_by_an_earlier_owner_holds_after_a_restart(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        with trio.move_on_after(0.05):  # the first owner stops waiting early (a crash, say)
            await run.wait_for_signal("w", "never", timeout=0.6)
    started = trio.current_time()
    async with zincir.open_run(db, run.id) as again:
        with pytest.raises(zincir.WaitTimeout):
            await again.wait_for_signal("w", "never", timeout=3600)  # the stored deadline wins
    assert trio.current_time() - started < 2


async def test_a_received_signal_survives_the_owners_sigkill(db: zincir.Database) -> None:
    async with zincir.open_run(db, lease_ttl=1) as run:
        run_id = run.id
    await zincir.send_signal(db, run_id, "go", {"n": 42})
    child = """
        import os, signal, sys, trio, zincir
        async def main():
            async with zincir.open_database(sys.argv[1]) as db:
                async with zincir.open_run(db, sys.argv[2], lease_ttl=1) as run:
                    print(await run.wait_for_signal("w", "go"), flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
        trio.run(main)
    """
    with running_python(child, db_target_of(db), run_id) as proc:
        out, _ = await trio.to_thread.run_sync(proc.communicate)
        assert proc.returncode == -9
    assert out.strip() == "{'n': 42}"
    with trio.fail_after(10):
        while True:  # the dead owner's 1 s lease must expire first
            try:
                async with zincir.open_run(db, run_id) as again:
                    assert await again.wait_for_signal("w", "go") == {"n": 42}
                    await again.complete()
                break
            except zincir.RunLeased:
                await trio.sleep(0.1)
    assert len(received(await db.events(run_id))) == 1


async def test_the_signal_command_sends_once_per_key(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        command = [str(REPO / ".venv" / "bin" / "zincir"), "signal", run.id, "approved", "--db", db.path]
        first = await trio.run_process(
            [*command, "--data", '{"by": "ada"}', "--key", "k"], capture_stdout=True
        )
        again = await trio.run_process(
            [*command, "--data", '{"by": "ada"}', "--key", "k"], capture_stdout=True
        )
        assert first.stdout == again.stdout and int(first.stdout) >= 1
        # Usage errors, in this process (the same command; a process each would cost a second):
        # catch_exceptions=False, so a traceback fails the test instead of being an exit code.
        args = ["signal", run.id, "approved", "--db", db.path, "--data"]
        bad = await trio.to_thread.run_sync(cli, *args, "{not json")
        assert bad.exit_code == 2 and "not JSON" in bad.stderr
        deep = "[" * 5000 + "]" * 5000  # past the JSON parser's stack: a usage error, not a traceback
        too_deep = await trio.to_thread.run_sync(cli, *args, deep)
        assert too_deep.exit_code == 2 and "deeper than 100 levels" in too_deep.stderr
        assert await run.wait_for_signal("w", "approved") == {"by": "ada"}


async def test_a_signal_sent_after_the_deadline_is_too_late(
    clocked_db: zincir.Database, clock: ManualClock
) -> None:
    async with zincir.open_run(clocked_db) as run:
        with trio.move_on_after(0.05):  # the deadline is stored, then the owner stops waiting
            await run.wait_for_signal("w", "go", timeout=5)
        clock.advance(10)
        await zincir.send_signal(clocked_db, run.id, "go", "late")
        with pytest.raises(zincir.WaitTimeout):
            await run.wait_for_signal("w", "go", timeout=5)
        assert await run.wait_for_signal("next", "go") == "late"  # still there for another wait


async def test_a_keyed_retry_after_the_run_ended_returns_the_first_id(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        first = await zincir.send_signal(db, run.id, "go", 1, key="k")
        assert await run.wait_for_signal("w", "go") == 1
        await run.complete()
    assert await zincir.send_signal(db, run.id, "go", 1, key="k") == first  # it did go through
    with pytest.raises(zincir.RunTerminal):
        await zincir.send_signal(db, run.id, "go", 2, key="other")


async def test_a_wait_rides_out_a_server_restart() -> None:
    with restartable_server() as (url, restart):
        async with zincir.open_database(url) as db, zincir.open_run(db, lease_ttl=30) as run:
            got: list[object] = []

            async def waiter(task_status: trio.TaskStatus[None]) -> None:
                task_status.started()
                got.append(await run.wait_for_signal("w", "go"))

            async with trio.open_nursery() as nursery:
                await nursery.start(waiter)
                await trio.to_thread.run_sync(restart)
                await trio.sleep(0.6)  # a few polls fail against the restarted server's old connections
                async with zincir.open_database(url) as other:  # another process sends, after the restart
                    await zincir.send_signal(other, run.id, "go", "after the restart")
            assert got == ["after the restart"]
            await run.complete()


async def test_a_signal_payload_is_held_to_the_depth_limit_of_the_event_that_keeps_it(
    db: zincir.Database,
) -> None:
    def nested(levels: int) -> Any:
        value: Any = 1
        for _ in range(levels):
            value = [value]
        return value

    async with zincir.open_run(db) as run:
        before = dump(db)
        with pytest.raises(zincir.InvalidArgument, match="deeper than 99 levels"):
            await zincir.send_signal(db, run.id, "t", nested(100))  # signal_received would nest 101
        assert dump(db) == before
        await zincir.send_signal(db, run.id, "t", nested(99))
        assert await run.wait_for_signal("w", "t") == nested(99)
        await run.complete()
