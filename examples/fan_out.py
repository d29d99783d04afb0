"""A lead agent that fans research out to five child runs and combines what they found.

    .venv/bin/python examples/fan_out.py start                     # a new lead run; prints its id
    .venv/bin/zincir worker examples.fan_out:handler --max-concurrency 3
    .venv/bin/zincir tree RUN_ID                                   # in another shell: the family

One handler serves every run of the family (it looks at the run's role). The lead spawns a
researcher per topic in a durable nursery, which joins them all, and completes with their
notes. A researcher's work is a durable step that appends its note to research.jsonl (the
"external effect"). Kill the worker mid-way and start it again: spawning is named, so the lead
finds the same five children (no sixth); finished researchers are not run again; a researcher
killed mid-step runs that step again (at-least-once), under the same child run.

Environment: ZINCIR_DATABASE_PATH (default zincir.db, or a postgresql:// URL),
ZINCIR_NOTES (default research.jsonl), ZINCIR_RESEARCH_SECONDS (default 1.5: how long a
researcher "works").
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import trio

import zincir

LEAD = "lead"
RESEARCHER = "researcher"
TOPICS = ["durable logs", "leases", "checkpoints", "verifiers", "signals"]


async def handler(run: zincir.Run) -> None:
    """Continue whichever run of the family this is: its config says (a lead's lists topics,
    a researcher's names one), and reading it costs no query."""
    if "topics" in run.config:
        await lead(run, run.config)
    else:
        await research(run, run.config)


async def lead(run: zincir.Run, config: Any) -> None:
    async with run.children() as nursery:  # joins every child when the block ends
        for topic in config["topics"]:  # created together, in one transaction
            nursery.spawn_soon(f"research:{topic}", role=RESEARCHER, config={"topic": topic})
    notes = [child.result for child in nursery.records.values()]
    await run.complete(result={"notes": notes})


async def research(run: zincir.Run, config: Any) -> None:
    note = await run.step("research", look_into, run.id, config["topic"])
    await run.complete(result=note)


async def look_into(run_id: str, topic: str) -> str:
    await trio.sleep(float(os.environ.get("ZINCIR_RESEARCH_SECONDS", "1.5")))  # the model, the web
    note = f"{topic}: found three sources"
    notes = trio.Path(os.environ.get("ZINCIR_NOTES", "research.jsonl"))
    async with await notes.open("a") as out:
        await out.write(json.dumps({"run": run_id, "note": note}) + "\n")
    return note


async def start(database: str) -> None:
    async with zincir.open_database(database) as db, zincir.open_run(
        db, role=LEAD, config={"topics": TOPICS}
    ) as run:  # fmt: skip
        print(run.id)  # left unfinished: a worker takes it from here


if __name__ == "__main__":
    if sys.argv[1:] != ["start"]:
        sys.exit(__doc__)
    trio.run(start, os.environ.get("ZINCIR_DATABASE_PATH", "zincir.db"))
