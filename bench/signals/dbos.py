"""DBOS Transact's processes for ``python -m bench.signals``: ``DBOS.recv`` woken by ``DBOS.send``.

Imported only in a child process (``dbos`` is an optional peer). The system database is the
target: ``sqlite:///PATH`` as shipped (DBOS's defaults: rollback journal, a notification listener
that polls the database every ``notification_listener_polling_interval_sec``, 1 s by default), or
a PostgreSQL URL (DBOS's LISTEN / NOTIFY listener, fed by a trigger on its notifications table).

Roles: ``waiter`` (executor id ``bench-waiter``) starts workflows blocked in
``DBOS.recv("go", timeout_seconds=600)``; ``arm(n)`` answers once every one of them has recorded
the recv's timeout (``DBOS.list_workflow_steps`` shows the ``DBOS.sleep`` that ``recv`` writes
after it registered for the notification), and each workflow writes a ``resumed`` event the
moment ``recv`` returned. ``sender`` (executor id ``bench-sender``: its ``DBOS.launch()`` recovers
only its own executor's workflows, never the waiter's) calls ``DBOS.send(workflow_id, message,
"go")``.
"""

from __future__ import annotations

import time
import uuid
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from dbos import DBOS, SetWorkflowID

from ..harness.child import Channel, serve

if TYPE_CHECKING:
    from ..harness.child import Emit

TOPIC = "go"
_emit: Emit | None = None


@DBOS.workflow()
def wait_wf() -> Any:
    message = DBOS.recv(TOPIC, timeout_seconds=600)
    t = time.monotonic()
    assert _emit is not None
    _emit({"event": "resumed", "id": DBOS.workflow_id, "t": t})
    return message


def make(role: str, target: str, options: dict[str, Any], emit: Emit) -> Any:
    if role not in ("waiter", "sender"):
        raise SystemExit(f"unknown DBOS role {role!r}")
    global _emit
    _emit = emit
    return DbosSide(role, target)


class DbosSide:
    is_async = False

    def __init__(self, role: str, target: str) -> None:
        self.role = role
        self.postgres = target.startswith(("postgresql://", "postgres://"))
        self.url = target if self.postgres else f"sqlite:///{target}"

    def open(self) -> dict[str, Any]:
        DBOS(
            config={
                "name": "zincir-bench-signals",
                "system_database_url": self.url,
                "executor_id": f"bench-{self.role}",
                "log_level": "WARNING",
            }
        )
        DBOS.launch()
        notes = (
            "LISTEN / NOTIFY (a trigger on the notifications table)"
            if self.postgres
            else "the notification listener polls the database (notification_listener_polling_interval_sec,"
            " default 1 s)"
        )
        return {"version": f"dbos {version('dbos')}", "notes": notes}

    def close(self) -> None:
        DBOS.destroy()

    # -- the waiting process ----------------------------------------------------------------------

    def arm(self, n: int, tag: str) -> list[str]:
        ids = [f"signals-{tag}-{i}-{uuid.uuid4().hex[:8]}" for i in range(n)]
        for workflow_id in ids:
            with SetWorkflowID(workflow_id):
                DBOS.start_workflow(wait_wf)
        deadline = time.monotonic() + 60
        for workflow_id in ids:
            while not any(s["function_name"] == "DBOS.sleep" for s in DBOS.list_workflow_steps(workflow_id)):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"workflow {workflow_id} never reached DBOS.recv")
                time.sleep(0.005)
        return ids

    # -- the sending process ----------------------------------------------------------------------

    def send(self, targets: list[tuple[str, float]]) -> dict[str, float]:
        t0 = time.monotonic()
        sent: dict[str, float] = {}
        for i, (workflow_id, delay) in enumerate(sorted(targets, key=lambda t: t[1])):
            time.sleep(max(0.0, t0 + delay - time.monotonic()))
            sent[workflow_id] = time.monotonic()
            DBOS.send(workflow_id, {"approved": True, "i": i}, TOPIC)
        return sent


def child(channel: Channel, args: dict[str, Any]) -> None:
    """The child process of one of DBOS Transact's roles (``bench/harness/child.py``)."""
    serve(make(args["role"], args["target"], args["options"], channel.send), channel)
