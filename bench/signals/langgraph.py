"""LangGraph's processes for ``python -m bench.signals``: ``interrupt()``, then resume by re-invocation.

Imported only in a child process (``langgraph`` is an optional peer). LangGraph has no wait that
another process wakes: a node calls ``interrupt()``, the invocation ends with the graph's state
checkpointed (``SqliteSaver``, WAL, synchronous=FULL, ``durability="sync"``), and whoever has the
answer later calls ``graph.invoke(Command(resume=value), config)``, which loads the checkpoint and
runs the node again from its top; this time ``interrupt()`` returns the value. That is the
closest analogue of a signal.

Roles: ``waiter`` runs each new thread up to its ``interrupt()`` (``arm(n)`` answers once the n
invocations returned, their checkpoints committed); ``sender`` resumes them, recording
``time.monotonic()`` just before ``invoke(Command(resume=...))`` and, inside the node, the instant
the code after ``interrupt()`` runs (returned in the graph's state).
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from importlib.metadata import version
from typing import TYPE_CHECKING, Any, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from ..harness.child import Channel, serve

if TYPE_CHECKING:
    from ..harness.child import Emit


class State(TypedDict, total=False):
    answer: Any
    resumed_at: float


def ask(state: State) -> State:
    answer = interrupt({"question": "approve?"})
    return {"answer": answer, "resumed_at": time.monotonic()}


def make(role: str, target: str, options: dict[str, Any], emit: Emit) -> Any:
    if role not in ("waiter", "sender"):
        raise SystemExit(f"unknown LangGraph role {role!r}")
    return LanggraphSide(target)


def _config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


class LanggraphSide:
    is_async = False

    def __init__(self, path: str) -> None:
        self.path = path

    def open(self) -> dict[str, Any]:
        self.conn = sqlite3.connect(self.path, check_same_thread=False)
        self.conn.execute("PRAGMA synchronous = FULL")
        saver = SqliteSaver(self.conn)
        saver.setup()  # WAL
        builder = StateGraph(State)
        builder.add_node("ask", ask)
        builder.add_edge(START, "ask")
        builder.add_edge("ask", END)
        self.graph = builder.compile(checkpointer=saver)
        return {
            "version": f"langgraph {version('langgraph')}, langgraph-checkpoint-sqlite"
            f" {version('langgraph-checkpoint-sqlite')}",
            "notes": "no waiting process: the resuming invoke() loads the checkpoint and reruns the node",
        }

    def close(self) -> None:
        self.conn.close()

    def arm(self, n: int, tag: str) -> list[str]:
        ids = [f"signals-{tag}-{i}-{uuid.uuid4().hex[:8]}" for i in range(n)]
        for thread_id in ids:
            out = self.graph.invoke({"answer": None}, _config(thread_id), durability="sync")
            if "__interrupt__" not in out:
                raise RuntimeError(f"thread {thread_id}: the graph did not stop at interrupt(): {out!r}")
        return ids

    def send(self, targets: list[tuple[str, float]]) -> dict[str, list[float]]:
        """Resume each thread at its moment; (instant before invoke, instant after interrupt())."""
        t0 = time.monotonic()
        out: dict[str, list[float]] = {}
        for i, (thread_id, delay) in enumerate(sorted(targets, key=lambda t: t[1])):
            time.sleep(max(0.0, t0 + delay - time.monotonic()))
            sent = time.monotonic()
            state = self.graph.invoke(
                Command(resume={"approved": True, "i": i}), _config(thread_id), durability="sync"
            )
            out[thread_id] = [sent, float(state["resumed_at"])]
        return out


def child(channel: Channel, args: dict[str, Any]) -> None:
    """The child process of one of LangGraph's roles (``bench/harness/child.py``)."""
    serve(make(args["role"], args["target"], args["options"], channel.send), channel)
