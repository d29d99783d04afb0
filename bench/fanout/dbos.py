"""DBOS Transact's process for ``python -m bench.fanout``: child workflows started and awaited.

Imported only in a child process (``dbos`` is an optional peer). The parent workflow starts
``children`` child workflows with ``DBOS.start_workflow(fanout_child)`` (each returns 1), then
calls ``get_result()`` on every handle in order and returns ``{"children": n, "sum": total}``.
The clock starts just before the first ``start_workflow`` and stops when the outer
``get_result()`` of the parent returned, i.e. once DBOS has recorded the parent's output.

Options (the second argument of ``DBOS(config=...)`` aside, DBOS as shipped):

* ``threads``: ``max_executor_threads`` (DBOS's workflow thread pool; unbounded by default). The
  benchmark passes the same number as zincir's ``max_concurrency``, so at most that many
  workflows (the parent included) run at once in both systems; ``0`` keeps DBOS's default.
* ``wal`` (SQLite only): connections made by a ``creator`` that switches the file to WAL with
  ``synchronous=FULL``, zincir's settings; without it DBOS keeps SQLite's rollback journal.

Counted besides the times: the process's CPU and, on SQLite, the transactions DBOS committed
(an SQLAlchemy ``commit`` listener on DBOS's engine: a private attribute, absent if it moves).
"""

from __future__ import annotations

import resource
import threading
import time
import uuid
from importlib.metadata import version
from typing import Any

from dbos import DBOS, SetWorkflowID

from ..harness.child import Channel, serve
from ..systems.common import wal_connections

_lock = threading.Lock()
_children_ended = 0
_marks: dict[str, float] = {}


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@DBOS.workflow()
def fanout_child() -> int:
    global _children_ended
    with _lock:
        _children_ended += 1
    return 1


@DBOS.workflow()
def fanout_parent(children: int) -> dict[str, int]:
    _marks["ended_before"] = _children_ended
    _marks["cpu_first"] = process_cpu()
    _marks["t_first"] = time.monotonic()
    handles = [DBOS.start_workflow(fanout_child) for _ in range(children)]
    _marks["t_spawned"] = time.monotonic()
    _marks["ended_at_spawned"] = _children_ended
    total = sum(handle.get_result() for handle in handles)
    _marks["t_joined"] = time.monotonic()
    return {"children": children, "sum": total}


class CommitCount:
    def __init__(self) -> None:
        self.commits = 0
        self._lock = threading.Lock()

    def __call__(self, *_: Any) -> None:
        with self._lock:
            self.commits += 1


class DbosSide:
    is_async = False

    def __init__(self, target: str, options: dict[str, Any]) -> None:
        self.postgres = target.startswith(("postgresql://", "postgres://"))
        self.target = target
        self.threads = int(options.get("threads", 0))
        self.wal = bool(options.get("wal")) and not self.postgres
        self.commits: CommitCount | None = None

    def open(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "name": "zincir-bench-fanout",
            "system_database_url": self.target if self.postgres else f"sqlite:///{self.target}",
            "log_level": "WARNING",
        }
        if self.threads:
            config["max_executor_threads"] = self.threads
        if self.wal:
            config["db_engine_kwargs"] = {"creator": wal_connections(self.target)}
        instance = DBOS(config=config)  # type: ignore[arg-type]
        DBOS.launch()
        facts: dict[str, Any] = {
            "version": f"dbos {version('dbos')}, SQLAlchemy {version('sqlalchemy')}",
            "max_executor_threads": self.threads or "unbounded (DBOS's default)",
        }
        engine = getattr(getattr(instance, "_sys_db", None), "engine", None)
        if engine is not None and not self.postgres:
            import sqlalchemy

            self.commits = CommitCount()
            sqlalchemy.event.listen(engine, "commit", self.commits)
            with engine.connect() as conn:
                levels = {0: "off", 1: "normal", 2: "full", 3: "extra"}
                mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
                sync = conn.exec_driver_sql("PRAGMA synchronous").scalar()
                busy = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
            facts["pragmas"] = {
                "journal_mode": mode,
                "synchronous": levels.get(sync, sync),  # type: ignore[call-overload]
                "busy_timeout": busy,
            }
        if self.postgres:
            facts["notes"] = "PostgreSQL system database (SQLAlchemy pool over psycopg 3)"
        elif self.wal:
            facts["notes"] = (
                "SQLite system database switched to WAL + synchronous=FULL by a connection creator"
                " (db_engine_kwargs); DBOS's own connect hook (IMMEDIATE transactions, busy_timeout) applies"
            )
        else:
            facts["notes"] = "SQLite system database as shipped: rollback journal, DBOS's connect hook"
        return facts

    def close(self) -> None:
        DBOS.destroy()

    def fanout(self, children: int, profile: bool = False) -> dict[str, Any]:
        del profile  # only zincir's process profiles its statements
        _marks.clear()
        commits0 = self.commits.commits if self.commits else None
        with SetWorkflowID(f"fanout-{uuid.uuid4().hex}"):
            handle = DBOS.start_workflow(fanout_parent, children)
        result = handle.get_result()
        t_end = time.monotonic()
        cpu_end = process_cpu()
        commits1 = self.commits.commits if self.commits else None
        status = handle.get_status().status
        return {
            "parent": handle.get_workflow_id(),
            "children": children,
            "style": "start_workflow + get_result",
            "seconds": t_end - _marks["t_first"],
            "spawn_seconds": _marks["t_spawned"] - _marks["t_first"],
            "join_seconds": _marks["t_joined"] - _marks["t_spawned"],
            "complete_seconds": t_end - _marks["t_joined"],
            "ended_when_spawned": int(_marks["ended_at_spawned"] - _marks["ended_before"]),
            "starts": 1,
            "status": str(status),
            "result": result,
            "cpu_seconds": cpu_end - _marks["cpu_first"],
            "commits": None if commits0 is None or commits1 is None else commits1 - commits0,
        }


def child(channel: Channel, args: dict[str, Any]) -> None:
    """The child process hosting DBOS's fan-outs (``bench/harness/child.py``)."""
    serve(DbosSide(args["target"], args["options"]), channel)
