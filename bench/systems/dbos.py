"""DBOS Transact on its SQLite system database: ``@DBOS.step`` inside ``@DBOS.workflow``.

Imported only inside a child process (``dbos`` is an optional peer). Variants:

* ``default``: ``system_database_url="sqlite:///..."`` as shipped (rollback journal).
* ``postgres``: ``system_database_url`` is the PostgreSQL URL given as the path
  (``python -m bench.postgres``); DBOS creates that database if it is missing.
* ``wal``: the same as ``default``, plus the engine option ``db_engine_kwargs={"creator": ...}``: a connection
  factory that switches the file to WAL and sets ``synchronous=FULL`` on every connection.
  DBOS's own ``connect`` listener (IMMEDIATE transactions, busy_timeout=30000) still applies.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from importlib.metadata import version
from typing import Any

from dbos import DBOS, SetWorkflowID

from ..harness.child import Channel
from .common import (
    Ledger,
    System,
    host,
    is_ledger_step,
    multi_outcome,
    pragmas,
    wal_connections,
)

_ledger: Ledger | None = None
_trial = ""


@DBOS.step()
def noop(i: int) -> int:
    return i


@DBOS.workflow()
def steps_wf(n: int) -> int:
    for i in range(n):
        noop(i)
    return n


@DBOS.step()
def ledger_step(i: int) -> int:
    assert _ledger is not None
    # The idempotency key DBOS exposes to a step: its workflow id and its step id.
    _ledger.append(f"{DBOS.workflow_id}:{DBOS.step_id}", _trial, i)
    return i


@DBOS.workflow()
def crash_wf(n: int) -> int:
    for i in range(n):
        if is_ledger_step(i):
            ledger_step(i)
        else:
            noop(i)
    return n


class DbosSystem(System):
    name = "dbos"
    is_async = False

    def prepare(self, options: dict[str, Any]) -> None:
        assert self.variant in ("default", "wal", "postgres"), self.variant
        self.executor_id: str | None = options.get("executor_id")
        if "ledger" in options:
            # A recovering process: launch() starts replaying workflows at once, so the
            # ledger their steps append to must exist before it.
            global _ledger, _trial
            _ledger, _trial = Ledger(options["ledger"]), options["trial"]

    def open(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "name": "zincir-bench",
            "system_database_url": self.path if self.variant == "postgres" else f"sqlite:///{self.path}",
            "log_level": "WARNING",
        }
        if self.executor_id is not None:
            config["executor_id"] = self.executor_id
        if self.variant == "wal":
            config["db_engine_kwargs"] = {"creator": wal_connections(self.path)}
        self.instance = DBOS(config=config)  # type: ignore[arg-type]
        # After DBOS() set up its logger ("dbos" does not propagate to the root logger): DBOS
        # retries "database is locked" internally and logs a warning each time.
        logging.getLogger("dbos").addHandler(self.locked_logs)
        logging.getLogger().addHandler(self.locked_logs)
        DBOS.launch()
        if self.variant == "postgres":
            from ..harness.server import server_settings

            settings = server_settings(self.path)
            settings["version"] = f"dbos {version('dbos')}, SQLAlchemy {version('sqlalchemy')}"
            settings["notes"] = (
                "one transaction per step output (operation_outputs) plus workflow status writes;"
                " SQLAlchemy pool over psycopg 3"
            )
            return settings
        with self.instance._sys_db.engine.connect() as conn:
            settings = pragmas(lambda sql: conn.exec_driver_sql(sql).scalar())
        settings["version"] = f"dbos {version('dbos')}, SQLAlchemy {version('sqlalchemy')}"
        settings["notes"] = (
            "one transaction per step output (operation_outputs) plus workflow status writes;"
            " IMMEDIATE transactions, SQLAlchemy pool"
        )
        return settings

    def close(self) -> None:
        DBOS.destroy()

    # -- 1 and 2 --------------------------------------------------------------------------

    def per_step(self, n: int) -> float:
        start = time.perf_counter()
        with SetWorkflowID(str(uuid.uuid4())):
            steps_wf(n)
        return time.perf_counter() - start

    def concurrent(self, runs: int, steps: int) -> float:
        start = time.perf_counter()
        handles = [DBOS.start_workflow(steps_wf, steps) for _ in range(runs)]
        for handle in handles:
            handle.get_result()
        return time.perf_counter() - start

    # -- 3 ----------------------------------------------------------------------------------

    def crash_run(self, trial: str, steps: int, ledger_path: str) -> None:
        global _ledger, _trial
        _ledger, _trial = Ledger(ledger_path), trial
        self.started()
        with SetWorkflowID(f"crash-{trial}"):
            crash_wf(steps)

    def crash_resume(self, trial: str, steps: int, ledger_path: str) -> dict[str, Any]:
        assert _ledger is not None, "pass the ledger in the options"
        assert _trial == trial, (_trial, trial)
        workflow_id = f"crash-{trial}"
        status = DBOS.get_workflow_status(workflow_id)
        if status is None:
            with SetWorkflowID(workflow_id):
                DBOS.start_workflow(crash_wf, steps).get_result()
            how = "started anew"
        else:
            how = "already complete" if status.status == "SUCCESS" else "recovered by launch()"
            DBOS.retrieve_workflow(workflow_id).get_result()
        status = DBOS.get_workflow_status(workflow_id)
        return {"completed": status is not None and status.status == "SUCCESS", "how": how}

    # -- 4 ----------------------------------------------------------------------------------

    def multi(self, runs: int, steps: int) -> dict[str, Any]:
        before = self.locked_logs.count
        errors: list[BaseException] = []
        completed = 0
        lock = threading.Lock()
        start = time.perf_counter()
        handles = []
        for _ in range(runs):
            try:
                handles.append(DBOS.start_workflow(steps_wf, steps))
            except Exception as exc:
                errors.append(exc)
        for handle in handles:
            try:
                handle.get_result()
                with lock:
                    completed += 1
            except Exception as exc:
                errors.append(exc)
        return multi_outcome(time.perf_counter() - start, completed, errors, self.locked_logs, before)


def child(channel: Channel, args: dict[str, Any]) -> None:
    """The child process hosting DBOS Transact (``bench/harness/child.py``)."""
    host(DbosSystem, channel, args)
