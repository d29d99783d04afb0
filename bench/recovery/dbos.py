"""DBOS Transact's side of ``python -m bench.recovery`` (imported only in its child processes).

SQLite system database in WAL with ``synchronous=FULL`` (a connection factory, as comparison 3 of
``python -m bench`` does), one executor id (``local``) for the killed and the recovering process.
DBOS recovers a PENDING workflow of its executor when a process calls ``DBOS.launch()``.

* ``dup-run`` / ``dup-resume``: the duplicates workflow; every ``every``-th ``@DBOS.step`` is the
  non-idempotent append.
* ``victim`` / ``relaunch``: a workflow making steady progress, SIGKILLed; ``relaunch`` is a
  process started after the kill: it configures DBOS and calls ``DBOS.launch()``, which recovers
  the workflow. Progress is reported when the first step that runs in it has been recorded (at the
  start of the next one: DBOS records a step's output before the workflow goes on).
"""

from __future__ import annotations

import time
from typing import Any

from dbos import DBOS, SetWorkflowID

from ..harness.child import Channel
from ..systems.common import wal_connections
from .ledger import TOOL_AFTER_S, TOOL_BEFORE_S, append_line, is_tool_step

_ledger = ""
_pace = 0.0
_ran = 0
_stop = False
_channel: Channel | None = None


@DBOS.step()
def noop(i: int) -> int:
    return i


@DBOS.step()
def append_step(i: int) -> int:
    time.sleep(TOOL_BEFORE_S)
    append_line(_ledger, i, f"{DBOS.workflow_id}:{DBOS.step_id}")
    time.sleep(TOOL_AFTER_S)
    return i


@DBOS.workflow()
def dup_wf(steps: int, every: int) -> int:
    for i in range(steps):
        if is_tool_step(i, every):
            append_step(i)
        else:
            noop(i)
    return steps


@DBOS.step()
def paced_step(i: int) -> int:
    global _ran, _stop
    _ran += 1
    if _channel is not None and _ran == 2:  # the first step run here has been recorded
        _channel.emit("progress", step=i - 1)
        _stop = True
    time.sleep(_pace)
    return i


@DBOS.workflow()
def paced_wf(max_steps: int) -> int:
    for i in range(max_steps):
        paced_step(i)
        if _stop:
            break
    return max_steps


def _configure(db: str) -> None:
    DBOS(
        config={  # type: ignore[arg-type]
            "name": "zincir-bench-recovery",
            "system_database_url": f"sqlite:///{db}",
            "log_level": "WARNING",
            "executor_id": "local",
            "db_engine_kwargs": {"creator": wal_connections(db)},
        }
    )


def child(ch: Channel, args: dict[str, Any]) -> None:
    """One child process of ``bench.recovery``, in the role ``args["mode"]`` (``bench/harness/child.py``)."""
    global _ledger, _pace, _channel
    mode = args["mode"]
    if mode == "dup-run":
        _ledger = args["ledger"]
        _configure(args["db"])
        DBOS.launch()
        ch.emit("ready")
        ch.next_command()
        ch.emit("started")
        with SetWorkflowID(f"dup-{args['trial']}"):
            dup_wf(args["steps"], args["every"])
        ch.emit("done")
    elif mode == "dup-resume":
        _ledger = args["ledger"]
        ch.emit("ready")
        ch.next_command()
        _configure(args["db"])
        DBOS.launch()  # recovers this executor's PENDING workflows
        workflow_id = f"dup-{args['trial']}"
        status = DBOS.get_workflow_status(workflow_id)
        if status is None:
            with SetWorkflowID(workflow_id):
                DBOS.start_workflow(dup_wf, args["steps"], args["every"]).get_result()
            how = "started anew"
        else:
            how = "already complete" if status.status == "SUCCESS" else "recovered by DBOS.launch()"
            DBOS.retrieve_workflow(workflow_id).get_result()
        status = DBOS.get_workflow_status(workflow_id)
        ch.emit("result", completed=status is not None and status.status == "SUCCESS", how=how)
    elif mode == "victim":
        _pace = args["pace"]
        _configure(args["db"])
        DBOS.launch()
        ch.emit("ready")
        ch.next_command()
        with SetWorkflowID(args["workflow_id"]):
            handle = DBOS.start_workflow(paced_wf, args["max_steps"])
            ch.emit("started", run_id=handle.workflow_id)
            handle.get_result()
        ch.emit("done")
    elif mode == "relaunch":
        _channel = ch
        _configure(args["db"])
        ch.emit("opened")
        DBOS.launch()
        ch.emit("owned", retries=0)
        DBOS.retrieve_workflow(args["run_id"]).get_result()
        ch.emit("ended")
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    DBOS.destroy()
