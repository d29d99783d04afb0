"""zincir's pytest plugin and test helpers (docs/crash-testing.md): zincir_db on either backend,
a scripted model that plays a list (or a recorded run), and a clock that skips durable sleeps and
wait timeouts. tests/conftest.py loads the plugin as a user's conftest would."""

from __future__ import annotations

import time

import pytest
import trio.testing

import zincir
from zincir.testing import ScriptedModel, ScriptExhausted


@pytest.mark.parametrize("zincir_backend", ["sqlite", "postgresql"])
async def test_zincir_db_is_a_fresh_database_on_the_backend_asked_for(
    zincir_db: zincir.Database, zincir_backend: str
) -> None:
    assert zincir_db.backend == zincir_backend
    assert await zincir_db.runs() == []


async def test_zincir_db_is_on_sqlite_unless_asked(zincir_db: zincir.Database, zincir_backend: str) -> None:
    assert (zincir_db.backend, zincir_backend) == ("sqlite", "sqlite")


def test_the_plugin_loads_with_dash_p_and_runs_a_test_on_each_backend_given(
    pytester: pytest.Pytester, postgres_admin_url: str
) -> None:
    pytester.makepyfile(
        """
        async def test_backend(zincir_db, zincir_backend):
            assert zincir_db.backend == zincir_backend
        """
    )
    result = pytester.runpytest_inprocess(
        "-p", "zincir.testing", "-o", "trio_mode=true", "-p", "no:cacheprovider",
        "--zincir-backend", "sqlite", "--zincir-backend", "postgresql",
        "--zincir-postgres-url", postgres_admin_url, "-v",
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_backend?sqlite? PASSED*", "*test_backend?postgresql? PASSED*"])


async def test_a_scripted_model_continues_where_the_run_left_off(
    zincir_db: zincir.Database, scripted_model: type[ScriptedModel]
) -> None:
    model = scripted_model(
        [
            {
                "content": "Let me look.",
                "tool_calls": [{"id": "c1", "name": "search", "args": {"q": "zincir"}}],
            },
            "Found it.",
        ]
    )
    async with zincir.open_run(zincir_db) as run:
        first = await model.respond(run)
        assert (first.stop_reason, [c.name for c in first.tool_calls]) == ("tool_use", ["search"])
        await run.record_tool_result("c1", ["a result"])
    # Another owner (after a crash, say) hears the rest of the script, not its beginning.
    async with zincir.open_run(zincir_db, run.id) as again:
        second = await model.respond(again)
        assert (second.content, second.tool_calls, second.stop_reason) == ("Found it.", (), "end_turn")
        with pytest.raises(ScriptExhausted, match=rf"run {run.id}: the scripted model has no response #3"):
            await model.respond(again)
        await again.complete()
    # The responses a run recorded, played again.
    replay = await ScriptedModel.from_run(zincir_db, run.id)
    assert replay.responses == model.responses
    with pytest.raises(zincir.InvalidArgument, match="a response has no field"):
        ScriptedModel([{"text": "?"}])


async def test_the_clock_skips_an_hour_of_durable_sleep_and_a_wait_timeout(
    zincir_db: zincir.Database, zincir_clock: trio.testing.MockClock
) -> None:
    async def handler(run: zincir.Run) -> None:
        await run.sleep("nap", 3600)
        try:
            await run.wait_for_signal("reply", "reply", timeout=600)
        except zincir.WaitTimeout:
            await run.complete("no reply")
            worker.stop()

    async with zincir.open_run(zincir_db) as run:
        pass  # for the worker
    real = time.monotonic()
    started = trio.current_time()
    # Suspended at once (no lease held), the run is due at its wake time, then at its deadline:
    # the clock jumps to each.
    worker = zincir.ResumeWorker(zincir_db, handler, suspend_after=0, poll_interval=3600, lease_ttl=300)
    await worker.run()
    record = (await zincir_db.state(run.id)).run
    assert (record.status, record.result) == (zincir.RunStatus.COMPLETED, "no reply")
    assert trio.current_time() - started >= 4200  # an hour and ten minutes, as the test's clock says
    assert record.updated_at - record.created_at >= 4_200_000  # and as the database's says
    assert time.monotonic() - real < 30  # in seconds of real time


async def test_the_clock_skips_a_sleep_in_the_process_one_renewal_at_a_time(
    zincir_db: zincir.Database, zincir_clock: trio.testing.MockClock
) -> None:
    real = time.monotonic()
    # A long lease: while a renewal is in flight the clock may jump (to the wake time here, never
    # to the renewal's deadline 240 s after the last one).
    async with zincir.open_run(zincir_db, lease_ttl=300) as run:
        await run.sleep("nap", 150)  # the lease is renewed after 100 s meanwhile
        await run.complete()
    events = await zincir_db.events(run.id)
    assert events[-1].created_at - events[0].created_at >= 150_000
    assert time.monotonic() - real < 30
