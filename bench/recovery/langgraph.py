"""LangGraph's side of ``python -m bench.recovery`` (imported only in its child processes): the
duplicates workflow as ``@task`` calls in an ``@entrypoint(checkpointer=SqliteSaver(conn))``,
invoked with ``durability="sync"``; resumed after the kill with ``invoke(None, config)`` on the same
thread id, LangGraph's documented way. LangGraph has no recovery of its own: a resume happens when
the application invokes the thread again.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.func import entrypoint, task

from ..harness.child import Channel
from .ledger import TOOL_AFTER_S, TOOL_BEFORE_S, append_line, is_tool_step

_ledger = ""


@task
def noop(i: int) -> int:
    return i


@task
def append_task(thread_id: str, i: int) -> int:
    time.sleep(TOOL_BEFORE_S)
    append_line(_ledger, i, f"{thread_id}:step-{i}")
    time.sleep(TOOL_AFTER_S)
    return i


def _workflow(db: str) -> tuple[Any, SqliteSaver]:
    conn = sqlite3.connect(db, check_same_thread=False)
    conn.execute("PRAGMA synchronous = FULL")
    saver = SqliteSaver(conn)
    saver.setup()  # switches the file to WAL

    @entrypoint(checkpointer=saver)
    def dup_wf(inputs: dict[str, Any]) -> int:
        thread_id, steps, every = inputs["thread_id"], inputs["steps"], inputs["every"]
        for i in range(steps):
            if is_tool_step(i, every):
                append_task(thread_id, i).result()
            else:
                noop(i).result()
        return int(steps)

    return dup_wf, saver


def child(ch: Channel, args: dict[str, Any]) -> None:
    """One child process of ``bench.recovery``, in the role ``args["mode"]`` (``bench/harness/child.py``)."""
    global _ledger
    mode = args["mode"]
    _ledger = args["ledger"]
    thread_id = f"dup-{args['trial']}"
    config = {"configurable": {"thread_id": thread_id}}
    inputs = {"thread_id": thread_id, "steps": args["steps"], "every": args["every"]}
    if mode == "dup-run":
        wf, _ = _workflow(args["db"])
        ch.emit("ready")
        ch.next_command()
        ch.emit("started")
        wf.invoke(inputs, config, durability="sync")
        ch.emit("done")
    elif mode == "dup-resume":
        ch.emit("ready")
        ch.next_command()
        wf, saver = _workflow(args["db"])

        def finished() -> bool:
            snap = wf.get_state(config)
            return snap.created_at is not None and not snap.next and snap.values == args["steps"]

        if saver.get_tuple(config) is None:
            wf.invoke(inputs, config, durability="sync")
            how = "started anew"
        elif finished():
            how = "already complete"
        else:
            wf.invoke(None, config, durability="sync")
            how = "resumed with invoke(None)"
        ch.emit("result", completed=finished(), how=how)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
