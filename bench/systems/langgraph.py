"""LangGraph's functional API: ``@task`` inside ``@entrypoint(checkpointer=SqliteSaver(conn))``,
invoked with ``durability="sync"``.

Imported only inside a child process (``langgraph`` is an optional peer). The connection is
opened the way ``SqliteSaver.from_conn_string`` opens it (``check_same_thread=False``, Python's
default 5 s busy timeout); ``SqliteSaver.setup()`` switches the file to WAL, and we set
``synchronous=FULL`` explicitly (it is also SQLite's compiled default here).
"""

from __future__ import annotations

import logging
import sqlite3
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.func import entrypoint, task

from ..harness.child import Channel
from .common import (
    Ledger,
    System,
    host,
    is_ledger_step,
    multi_outcome,
    sqlite_pragmas,
)

_ledger: Ledger | None = None
_trial = ""


@task
def noop(i: int) -> int:
    return i


@task
def ledger_step(thread_id: str, i: int) -> int:
    assert _ledger is not None
    # The idempotency key: the run's thread id and the step's name (its index).
    _ledger.append(f"{thread_id}:step-{i}", _trial, i)
    return i


def _config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


class LanggraphSystem(System):
    name = "langgraph"
    is_async = False

    def prepare(self, options: dict[str, Any]) -> None:
        if "ledger" in options:
            global _ledger, _trial
            _ledger, _trial = Ledger(options["ledger"]), options["trial"]

    def open(self) -> dict[str, Any]:
        logging.getLogger().addHandler(self.locked_logs)
        self.conn = sqlite3.connect(self.path, check_same_thread=False)
        self.conn.execute("PRAGMA synchronous = FULL")
        saver = SqliteSaver(self.conn)
        saver.setup()
        self.saver = saver

        @entrypoint(checkpointer=saver)
        def steps_wf(n: int) -> int:
            for i in range(n):
                noop(i).result()
            return n

        @entrypoint(checkpointer=saver)
        def crash_wf(inputs: dict[str, Any]) -> int:
            thread_id, n = inputs["thread_id"], inputs["n"]
            for i in range(n):
                if is_ledger_step(i):
                    ledger_step(thread_id, i).result()
                else:
                    noop(i).result()
            return int(n)

        self.steps_wf = steps_wf
        self.crash_wf = crash_wf
        with saver.lock:
            settings = sqlite_pragmas(self.conn)
        settings["version"] = (
            f"langgraph {version('langgraph')}, langgraph-checkpoint-sqlite "
            f"{version('langgraph-checkpoint-sqlite')}"
        )
        settings["notes"] = (
            "one shared connection behind a lock; each task's writes are one commit, submitted to a"
            " background executor (the entrypoint does not wait for it); checkpoints are"
            " awaited at superstep boundaries (durability='sync')"
        )
        return settings

    def close(self) -> None:
        self.conn.close()

    def _invoke(self, n: int) -> None:
        self.steps_wf.invoke(n, _config(str(uuid.uuid4())), durability="sync")

    # -- 1 and 2 --------------------------------------------------------------------------

    def per_step(self, n: int) -> float:
        start = time.perf_counter()
        self._invoke(n)
        return time.perf_counter() - start

    def concurrent(self, runs: int, steps: int) -> float:
        with ThreadPoolExecutor(max_workers=runs) as pool:
            start = time.perf_counter()
            for future in [pool.submit(self._invoke, steps) for _ in range(runs)]:
                future.result()
            return time.perf_counter() - start

    # -- 3 ----------------------------------------------------------------------------------

    def _finished(self, thread_id: str, steps: int) -> bool:
        snapshot = self.crash_wf.get_state(_config(thread_id))
        return snapshot.created_at is not None and not snapshot.next and snapshot.values == steps

    def crash_run(self, trial: str, steps: int, ledger_path: str) -> None:
        global _ledger, _trial
        _ledger, _trial = Ledger(ledger_path), trial
        thread_id = f"crash-{trial}"
        self.started()
        self.crash_wf.invoke({"thread_id": thread_id, "n": steps}, _config(thread_id), durability="sync")

    def crash_resume(self, trial: str, steps: int, ledger_path: str) -> dict[str, Any]:
        assert _ledger is not None, "pass the ledger in the options"
        assert _trial == trial, (_trial, trial)
        thread_id = f"crash-{trial}"
        config = _config(thread_id)
        if self.saver.get_tuple(config) is None:
            self.crash_wf.invoke({"thread_id": thread_id, "n": steps}, config, durability="sync")
            how = "started anew"
        elif self._finished(thread_id, steps):
            how = "already complete"
        else:
            self.crash_wf.invoke(None, config, durability="sync")
            how = "resumed with invoke(None)"
        return {"completed": self._finished(thread_id, steps), "how": how}

    # -- 4 ----------------------------------------------------------------------------------

    def multi(self, runs: int, steps: int) -> dict[str, Any]:
        before = self.locked_logs.count
        errors: list[BaseException] = []
        completed = 0
        with ThreadPoolExecutor(max_workers=runs) as pool:
            start = time.perf_counter()
            futures = [pool.submit(self._invoke, steps) for _ in range(runs)]
            for future in futures:
                try:
                    future.result()
                    completed += 1
                except Exception as exc:
                    errors.append(exc)
            seconds = time.perf_counter() - start
        return multi_outcome(seconds, completed, errors, self.locked_logs, before)


def child(channel: Channel, args: dict[str, Any]) -> None:
    """The child process hosting LangGraph (``bench/harness/child.py``)."""
    host(LanggraphSystem, channel, args)
