"""Runs built with zincir itself for the inspector's agent view (conversation, waits, family,
budget, timeline), on whichever backend the test's database uses.

Each builder returns the run id; ``hostile`` puts script-injection payloads in every field a
model, a tool, a signal, an approver or a verifier can fill.
"""

from __future__ import annotations

import contextlib
from typing import Any

import trio

import zincir

from .inspect_fixtures import XSS_ALL, XSS_IMG, XSS_NAV


def _texts(hostile: bool) -> dict[str, str]:
    if not hostile:
        return {
            "text": "Let me look at the failing test first.",
            "tool": "read_file",
            "other": "run_tests",
            "third": "send_email",
            "signal": "review",
            "result": "def test_x(): assert flaky()",
            "by": "alice",
            "reason": "looks fine",
            "evidence": "pytest: 12 passed",
        }
    return {
        "text": f"text {XSS_ALL}{XSS_NAV}",
        "tool": f"tool {XSS_IMG}",
        "other": "other_tool",
        "third": "third_tool",
        "signal": f"sig {XSS_NAV}"[:200],
        "result": f"result {XSS_ALL}{XSS_NAV}",
        "by": f"by {XSS_NAV}",
        "reason": f"reason {XSS_ALL}",
        "evidence": f"evidence {XSS_ALL}{XSS_NAV}",
    }


async def passed(_: Any) -> zincir.Verification:
    return zincir.Verification(True, ["pytest: 12 passed"])


async def conversation_run(db: zincir.Database, *, hostile: bool = False) -> str:
    """Every kind of entry: a response with text and three tool calls (one answered, one
    started with no result, one never started), a signal received, an approval decided and
    one unanswered, a step, a sleep, an accepted checkpoint and an undecided candidate."""
    t = _texts(hostile)
    async with zincir.open_run(db, role="coder", config={"goal": t["text"]}) as run:
        calls = [
            zincir.ToolCall("c1", t["tool"], {"path": t["text"]}),
            zincir.ToolCall("c2", t["other"], {"suite": "unit"}),
            zincir.ToolCall("c3", t["third"], {"to": t["text"]}),
        ]
        await run.record_response(
            t["text"], calls, "tool_use", usage={"input_tokens": 120, "output_tokens": 30}
        )
        await run.start_tool("c1")
        await run.record_tool_result("c1", t["result"])
        await run.start_tool("c2")  # started, outcome unknown: no result
        await run.step("fetch", _value, {"rows": 3, "note": t["text"]})
        await run.sleep("pause", 0.001)
        await zincir.send_signal(db, run.id, t["signal"], {"comment": t["text"]}, by=t["by"])
        await run.wait_for_signal("w1", t["signal"])
        await run.record_response(
            t["text"], [zincir.ToolCall("a1", "refund", {"eur": 5, "why": t["text"]})], "tool_use"
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_decide_soon, db, run.id, "a1", t)
            await run.wait_for_approval("a1")
        await run.record_tool_result("a1", {"refunded": True})
        await run.record_response("", [zincir.ToolCall("s1", "submit_checkpoint", {})], "tool_use")
        state = {
            "completed": [t["text"]],
            "remaining": ["more"],
            "artifacts": [],
            "failed_attempts": [],
            "evidence": [],
        }

        async def verify(_: Any) -> zincir.Verification:
            return zincir.Verification(True, [t["evidence"]])

        await run.checkpoint("s1", state, verify)
        await run.record_response("", [zincir.ToolCall("s2", "submit_checkpoint", {})], "tool_use")

        async def crash(_: Any) -> zincir.Verification:
            raise RuntimeError("the verifier died")

        with contextlib.suppress(RuntimeError):
            await run.checkpoint("s2", state, crash)
        await run.record_response(
            t["text"], [zincir.ToolCall("a2", "deploy", {"env": t["text"]})], "tool_use"
        )
        with trio.move_on_after(0.05):
            await run.wait_for_approval("a2", timeout=3600)  # stays unanswered
        return run.id


async def _value(value: Any) -> Any:
    return value


async def _decide_soon(db: zincir.Database, run_id: str, call_id: str, t: dict[str, str]) -> None:
    for _ in range(200):
        try:
            await zincir.decide_approval(db, run_id, call_id, approved=True, by=t["by"], reason=t["reason"])
            return
        except zincir.ZincirError:
            await trio.sleep(0.01)


async def long_run(db: zincir.Database, responses: int = 100) -> str:
    """A completed run of 1 + 3 * ``responses`` events: response, tool call, result."""
    async with zincir.open_run(db, role="batch") as run:
        for i in range(responses):
            call = zincir.ToolCall(f"c{i}", "read_file", {"path": f"src/m{i}.py"})
            await run.record_response(f"step {i}: reading the next file", [call], "tool_use")
            await run.record_tool_result(f"c{i}", f"contents of m{i}.py")
        await run.complete({"files": responses})
        return run.id


async def over_budget_run(db: zincir.Database) -> str:
    """A run whose last response went past its token limit (recorded and debited all the same)."""
    budget = zincir.Budget(tokens=1000, model_calls=10, cost=1.0)
    async with zincir.open_run(db, role="spender", budget=budget) as run:
        await run.record_response("first", [], "end_turn", usage={"input_tokens": 400, "output_tokens": 200})
        with contextlib.suppress(zincir.BudgetExceeded):
            await run.record_response(
                "second", [], "end_turn", usage={"input_tokens": 500, "output_tokens": 300}
            )
        return run.id


async def family(db: zincir.Database) -> tuple[str, str, str]:
    """A root with a child with a grandchild (three levels), all left running."""
    async with zincir.open_run(db, role="planner") as root:
        child = await root.spawn("research", role="researcher")
    async with zincir.open_run(db, child) as middle:
        grandchild = await middle.spawn("read", role="reader")
    return root.id, child, grandchild
