"""Model-call marks: a durable mark before a model call, closed by the reply recorded after it;
a call whose reply is never recorded shows in ``zincir show`` and the inspector, and is charged
to the budget by its request size exactly once, however many crashes follow."""

from __future__ import annotations

import json
import math
import signal
from typing import Any

import pytest
import trio

import zincir
from zincir.adapters import _common

from .helpers import dump, running_python, scalar
from .test_waiting_views import cli, page


def types_of(events: list[zincir.Event]) -> list[str]:
    return [e.type.value for e in events]


async def usage_of(db: zincir.Database, run_id: str) -> zincir.Spend:
    usage: zincir.Usage | None = await db._read(db._store.budget_usage, run_id)
    assert usage is not None
    return usage.spent


def open_mark(db: zincir.Database, run_id: str) -> object:
    return scalar(db, "SELECT model_call_seq FROM agent_runs WHERE id = ?", (run_id,))


async def lost_calls(db: zincir.Database, run_id: str) -> list[dict[str, Any]]:
    return [e.payload for e in await db.events(run_id) if e.type == zincir.EventType.MODEL_CALL_LOST]


async def test_the_reply_closes_its_mark_and_only_its_usage_is_charged(db: zincir.Database) -> None:
    async with zincir.open_run(db, budget=zincir.Budget(tokens=10_000)) as run:
        seq = await run.start_model_call(900, model="m-1", cost=0.3)
        assert open_mark(db, run.id) == seq
        replied = await run.record_response(
            "hi", [], "end_turn", usage={"input_tokens": 850, "output_tokens": 20}
        )
        assert open_mark(db, run.id) is None
        spent = await usage_of(db, run.id)
    assert (spent.input_tokens, spent.output_tokens, spent.cost, spent.model_calls) == (850, 20, 0.0, 1)
    events = await db.events(run.id)
    assert types_of(events)[1:] == ["model_call_started", "llm_call"] and replied == seq + 1
    assert events[1].payload == {"cost": 0.3, "epoch": 1, "model": "m-1", "request_tokens": 900}
    async with zincir.open_run(db, run.id) as again:  # the next owner finds nothing to charge
        assert (await usage_of(db, again.id)).model_calls == 1
    assert await lost_calls(db, run.id) == []


async def test_a_mark_the_next_mark_finds_open_is_charged_once(db: zincir.Database) -> None:
    async with zincir.open_run(db, budget=zincir.Budget(cost=10.0)) as run:
        failed = await run.start_model_call(300, model="m-1", cost=0.25)  # the SDK raised, say
        retried = await run.start_model_call(310, model="m-1", cost=0.25)
        await run.record_response("ok", [], "end_turn", usage={"input_tokens": 305, "cost": 0.26})
        spent = await usage_of(db, run.id)
        assert (spent.input_tokens, spent.cost, spent.model_calls) == (605, 0.51, 2)
        assert await lost_calls(db, run.id) == [
            {"cost": 0.25, "epoch": 1, "found_by": "next_call", "mark_seq": failed, "model": "m-1",
             "request_tokens": 300}
        ]  # fmt: skip
        assert retried == failed + 2  # the lost call's event came first
        assert open_mark(db, run.id) is None


async def test_a_call_left_in_flight_is_charged_by_the_next_owner_once(db: zincir.Database) -> None:
    async with zincir.open_run(db, budget=zincir.Budget(tokens=5_000)) as run:
        mark = await run.start_model_call(1_200)
    for _ in range(3):  # the first owner after it charges it; the others find nothing open
        async with zincir.open_run(db, run.id) as again:
            pass
        spent = await usage_of(db, again.id)
        assert (spent.input_tokens, spent.cost, spent.model_calls) == (1_200, 0.0, 1)
    [lost] = await lost_calls(db, run.id)
    assert lost == {
        "cost": None, "epoch": 1, "found_by": "next_owner", "mark_seq": mark, "model": None,
        "request_tokens": 1_200,
    }  # fmt: skip


async def test_a_run_without_a_budget_logs_the_lost_call(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await run.start_model_call(7)
        await run.start_model_call()
    async with zincir.open_run(db, run.id):
        pass
    assert [(c["request_tokens"], c["found_by"]) for c in await lost_calls(db, run.id)] == [
        (7, "next_call"),
        (None, "next_owner"),
    ]
    assert await db._read(db._store.budget_usage, run.id) is None


async def test_a_spent_budget_refuses_the_mark_and_writes_nothing(db: zincir.Database) -> None:
    async with zincir.open_run(db, budget=zincir.Budget(tokens=100)) as run:
        with pytest.raises(zincir.BudgetExceeded):
            await run.record_response("big", [], "end_turn", usage={"input_tokens": 100})
        before = dump(db)
        with pytest.raises(zincir.BudgetExceeded, match=f"run {run.id}: budget exceeded: tokens"):
            await run.start_model_call(10)
        assert dump(db) == before


async def test_the_charge_of_a_lost_call_may_reach_the_limit(db: zincir.Database) -> None:
    async with zincir.open_run(db, budget=zincir.Budget(tokens=100, model_calls=5)) as run:
        lost = await run.start_model_call(150)
        with pytest.raises(zincir.BudgetExceeded) as raised:
            await run.start_model_call(10)  # charges the first: over the limit, so no second mark
        assert raised.value.limit == "tokens" and open_mark(db, run.id) is None
        events = await db.events(run.id)
        assert types_of(events)[-3:] == ["model_call_started", "model_call_lost", "budget_exceeded"]
        assert events[-2].payload["mark_seq"] == lost
        with pytest.raises(zincir.BudgetExceeded):
            await run.check_budget()


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((-1,), {}), (("10",), {}), ((True,), {}), ((2**63,), {}), ((), {"model": ""}),
     ((), {"model": "m" * 256}), ((), {"model": "a\x00b"}), ((), {"model": 3}), ((), {"cost": math.nan}),
     ((), {"cost": -0.1}),
     ((), {"cost": math.inf}), ((), {"cost": "1"}), ((), {"cost": False})],
    ids=str,
)  # fmt: skip
async def test_bad_marks_are_invalid_and_write_nothing(
    db: zincir.Database, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    async with zincir.open_run(db) as run:
        before = dump(db)
        with pytest.raises(zincir.InvalidArgument, match=f"run {run.id}"):
            await run.start_model_call(*args, **kwargs)
        assert dump(db) == before


# -- a real process killed between the mark and the reply -------------------------------------------------

# Killed while its model call is in flight: the mock transport (the "provider") receives the
# request the adapter sent after its mark, and the process dies before any reply is recorded.
# "take": the next owner takes the run over, then dies too, before anything else.
OWNER = """
    import os, signal, sys, trio, zincir

    def provider(request):
        print("request", len(request.content), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    async def main():
        target, run_id, mode = sys.argv[1:]
        if mode == "call":  # before the lease (a blocking import); "take" needs none of it
            import anthropic, httpx2
            from zincir.adapters import Price, anthropic as za
        async with zincir.open_database(target) as db:
            while True:  # the dead owner's lease is taken at once, or after it expires
                try:
                    run_cm = zincir.open_run(db, run_id, lease_ttl=3)
                    run = await run_cm.__aenter__()
                    break
                except zincir.RunLeased:
                    await trio.sleep(0.05)
            if mode == "call":
                async with httpx2.AsyncClient(transport=httpx2.MockTransport(provider)) as http:
                    url = "http://api.invalid"
                    client = anthropic.AsyncAnthropic(api_key="k", base_url=url, http_client=http)
                    await za.create(
                        run, client, prices=Price(input=3.0, output=15.0), model="claude-sonnet-4-5",
                        max_tokens=256, messages=za.messages(await run.state()),
                    )
            print("taken", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    trio.run(main)
"""


async def die_as_owner(db: zincir.Database, run_id: str, mode: str) -> list[str]:
    with running_python(OWNER, db.path, run_id, mode) as proc:
        out, err = await trio.to_thread.run_sync(proc.communicate)
    assert proc.returncode == -signal.SIGKILL, err
    return out.split()


async def test_a_call_in_flight_when_its_process_is_killed_shows_and_is_charged_once(
    db: zincir.Database,
) -> None:
    async with zincir.open_run(db, config={"goal": "fix it"}, budget=zincir.Budget(tokens=100_000)) as run:
        pass
    printed = await die_as_owner(db, run.id, "call")
    assert printed[0] == "request"  # the request left (and was paid for); no reply was recorded
    mark = open_mark(db, run.id)
    [started] = [e for e in await db.events(run.id) if e.seq == mark]
    request = started.payload
    assert request["model"] == "claude-sonnet-4-5" and request["epoch"] == 2
    body_tokens = int(printed[1]) / 4  # the estimate sizes what the SDK sent, give or take its framing
    assert 0.5 * body_tokens <= request["request_tokens"] <= 1.5 * body_tokens
    assert request["cost"] == pytest.approx(request["request_tokens"] * 3.0 / 1e6)

    shown = cli("show", run.id, "--db", db.path)  # visible before anyone takes the run
    assert shown.exit_code == 0, shown.output
    [line] = [row for row in shown.stdout.splitlines() if row.strip().startswith(str(mark))]
    assert "claude-sonnet-4-5" in line and "in flight" in line
    html = await page(db, f"/runs/{run.id}")
    assert "Model call in flight" in html and "no reply recorded yet" in html

    # Two crashes more: the first owner after it charges the call; the second finds nothing open.
    assert await die_as_owner(db, run.id, "take") == ["taken"]
    assert await die_as_owner(db, run.id, "take") == ["taken"]
    async with zincir.open_run(db, run.id, lease_ttl=3) as last:
        spent = await usage_of(db, last.id)
    assert (spent.input_tokens, spent.cost, spent.model_calls) == (
        request["request_tokens"],
        request["cost"],
        1,
    )
    [lost] = await lost_calls(db, run.id)
    assert lost["mark_seq"] == mark and lost["found_by"] == "next_owner" and lost["epoch"] == 2
    assert lost["cost"] == request["cost"]
    assert open_mark(db, run.id) is None

    shown = cli("show", run.id, "--db", db.path, "--json")
    calls = json.loads(shown.stdout)["model_calls"]
    assert calls["in_flight"] is None and [c["mark_seq"] for c in calls["lost"]] == [mark]
    assert calls["lost"][0]["found_by"] == "next_owner"
    html = await page(db, f"/runs/{run.id}")
    assert "Model call lost in flight" in html and "reply never recorded, charged" in html
    assert "lost, charged at #" in html


def test_the_adapters_size_and_price_the_mark_from_the_request() -> None:
    request = {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "ü" * 40}]}
    text = json.dumps(request, ensure_ascii=False, separators=(",", ":"))
    assert _common.request_tokens(request) == math.ceil(len(text) / 4)
    assert _common.request_tokens({"x": object()}) > 0  # what is not JSON counts as its text
