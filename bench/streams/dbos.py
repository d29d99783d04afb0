"""DBOS Transact's processes for ``python -m bench.streams``: ``DBOS.write_stream`` in a workflow,
``DBOS.read_stream`` in another process.

Imported only in a child process (``dbos`` is an optional peer). The system database is the
target: ``sqlite:///PATH`` as shipped (a stream's reader waits for a value by polling the database
every ``notification_listener_polling_interval_sec``, 1 s by default), or a PostgreSQL URL (a
trigger on the streams table sends NOTIFY to the readers).

The same commands as zincir's processes (``bench/streams/zincir.py``): ``writer`` (executor id
``bench-writer``) with ``create()`` (a workflow that waits, in ``DBOS.recv``, for the gaps to
write its chunks after), ``write(run_id, gaps)``, ``throughput(streams, chunks)``; ``follower``
(executor id ``bench-follower``) with ``follow(run_id)``. DBOS stores each ``write_stream`` in a
transaction of its own: a flush per chunk.
"""

from __future__ import annotations

import threading
import time
import uuid
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from dbos import DBOS, SetWorkflowID

from ..harness.child import Channel, serve

if TYPE_CHECKING:
    from ..harness.child import Emit

STREAM = "tokens"
_emit: Emit | None = None


@DBOS.workflow()
def paced_wf() -> None:
    gaps = DBOS.recv("go", timeout_seconds=600)
    for i, gap in enumerate(gaps):
        time.sleep(gap)
        DBOS.write_stream(STREAM, {"i": i, "t": time.monotonic()})
    DBOS.close_stream(STREAM)


@DBOS.workflow()
def flood_wf(chunks: int, text: str) -> float:
    for _ in range(chunks):
        DBOS.write_stream(STREAM, text)
    DBOS.close_stream(STREAM)
    return time.monotonic()


class DbosSide:
    is_async = False

    def __init__(self, role: str, target: str, emit: Emit) -> None:
        self.role = role
        self.postgres = target.startswith(("postgresql://", "postgres://"))
        self.url = target if self.postgres else f"sqlite:///{target}"
        self.emit = emit

    def open(self) -> dict[str, Any]:
        DBOS(
            config={
                "name": "zincir-bench-streams",
                "system_database_url": self.url,
                "executor_id": f"bench-{self.role}",
                "log_level": "WARNING",
            }
        )
        DBOS.launch()
        return {"version": f"dbos {version('dbos')}", "backend": "postgresql" if self.postgres else "sqlite"}

    def close(self) -> None:
        DBOS.destroy()

    # -- the writing process ------------------------------------------------------------------------

    def create(self) -> str:
        workflow_id = f"streams-{uuid.uuid4().hex}"
        with SetWorkflowID(workflow_id):
            DBOS.start_workflow(paced_wf)
        return workflow_id

    def write(self, run_id: str, gaps: list[float], flush_interval: float) -> dict[str, Any]:
        DBOS.send(run_id, gaps, "go")
        DBOS.retrieve_workflow(run_id).get_result()
        return {"chunks": len(gaps)}

    def throughput(self, streams: int, chunks: int, flush_interval: float, chunk_text: str) -> dict[str, Any]:
        started = time.monotonic()
        handles = [DBOS.start_workflow(flood_wf, chunks, chunk_text) for _ in range(streams)]
        done = max(handle.get_result() for handle in handles)
        seconds = done - started
        return {
            "streams": streams,
            "chunks": streams * chunks,
            "seconds": seconds,
            "flushes": streams * chunks,  # a transaction per write_stream
            "commits": None,
            "chunks_per_s": streams * chunks / seconds,
        }

    # -- the following process ----------------------------------------------------------------------

    def follow(self, run_id: str) -> str:
        threading.Thread(target=self._follow, args=(run_id,), daemon=True).start()
        return run_id

    def _follow(self, run_id: str) -> None:
        latencies = [(time.monotonic() - value["t"]) * 1e3 for value in DBOS.read_stream(run_id, STREAM)]
        self.emit({"event": "followed", "id": run_id, "latencies_ms": latencies})


def child(channel: Channel, args: dict[str, Any]) -> None:
    """The child process of one of DBOS Transact's roles (``bench/harness/child.py``)."""
    if args["role"] not in ("writer", "follower"):
        raise SystemExit(f"unknown DBOS role {args['role']!r}")
    serve(DbosSide(args["role"], args["target"], channel.send), channel)
