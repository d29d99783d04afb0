"""Fork a run that went wrong, fix its prompt, let a worker continue the fork, and compare.

    .venv/bin/python examples/fork_and_compare.py

1. A worker runs a small research agent with prompt v1. It searches, then answers, and its
   answer is wrong: v1 tells it to name the largest city.
2. We fork the run right after its search was asked for (before its result came back), with
   prompt v2. The fork inherits the search's result instead of searching again: an effect the
   run already had in the world is never repeated.
3. A worker continues the fork; it answers with v2 and gets it right.
4. ``zincir diff`` shows where the two runs part, side by side.

The model is scripted, so the example runs offline; its answer depends on the prompt as a
real model's would. See docs/forks.md.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

import trio

import zincir

PROMPT_V1 = "Answer with the country's largest city."
PROMPT_V2 = "Answer with the country's seat of government."
QUESTION = "What is the capital of Australia?"

searches: list[str] = []
"""Each search the tool ran (an effect we would not want twice)."""
outbox: dict[str, str] = {}
"""The answers sent to the user, by effect key: a keyed service sends each key once."""


def scripted_model(config: Any, responses_so_far: int) -> tuple[str, list[zincir.ToolCall], str]:
    """What the model says next: it searches first, then answers as its prompt tells it."""
    if responses_so_far == 0:
        return "Let me look that up.", [zincir.ToolCall("search-1", "search", {"q": QUESTION})], "tool_use"
    city = "Sydney" if config["prompt"] == PROMPT_V1 else "Canberra"
    answer = f"The capital of Australia is {city}."
    if responses_so_far == 1:
        return answer, [zincir.ToolCall("answer-1", "send_answer", {"text": answer})], "tool_use"
    return answer, [], "end_turn"


async def run_tool(pending: zincir.PendingToolCall) -> Any:
    if pending.call.name == "search":
        searches.append(pending.call.args["q"])
        return ["Canberra is the capital of Australia.", "Sydney is Australia's largest city."]
    outbox.setdefault(pending.effect_key, pending.call.args["text"])
    return {"sent": True}


async def sent_before(pending: zincir.PendingToolCall) -> Any:
    """The probe a tool of unknown outcome gets: did this effect happen already?"""
    return {"sent": True} if pending.effect_key in outbox else None


async def agent(run: zincir.Run) -> None:
    """The handler a worker runs, for the original run and for its fork alike."""
    while True:
        for pending in await run.pending_tools():
            await run.execute(pending, run_tool, reconcile=sent_before)
        state = await run.state()
        responses = sum(1 for e in state.events if e.type is zincir.EventType.LLM_CALL)
        content, calls, stop = scripted_model(run.config, responses)
        usage = {"input_tokens": 200 + 50 * responses, "output_tokens": 20, "cost": 0.001}
        await run.record_response(content, calls, stop, usage=usage)
        if not calls:
            await run.complete(content)
            return


async def main(database: str) -> None:
    async with zincir.open_database(database) as db:
        async with zincir.open_run(db, role="researcher", config={"prompt": PROMPT_V1}) as run:
            original = run.id  # created here, left to a worker
        await zincir.ResumeWorker(db, agent, until_idle=True).run()
        print(f"original {original}: {(await db.state(original)).run.result}")

        # The step that went wrong is the second response. Fork just before it: after the first
        # response's tool call, whose result the fork inherits.
        events = await db.events(original)
        search_call = next(e for e in events if e.type is zincir.EventType.TOOL_CALL)
        fork = await zincir.fork_run(
            db, original, search_call.seq, config={"prompt": PROMPT_V2}, by="example", reason="prompt v2"
        )
        await zincir.ResumeWorker(db, agent, until_idle=True).run()
        print(f"fork     {fork}: {(await db.state(fork)).run.result}")
        print(f"the search ran {len(searches)} time(s); answers sent: {sorted(outbox.values())}")
    # The same comparison as `zincir diff ORIGINAL FORK` from a shell.
    diff = await trio.run_process([sys.executable, "-m", "zincir", "diff", original, fork, "--db", database],
                                  capture_stdout=True)  # fmt: skip
    print(diff.stdout.decode())


if __name__ == "__main__":
    target = os.environ.get("ZINCIR_DATABASE_PATH")
    if target is None:
        with tempfile.TemporaryDirectory() as directory:
            trio.run(main, os.path.join(directory, "forks.db"))
    else:
        trio.run(main, target)
