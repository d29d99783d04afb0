"""DBOS Transact's process for ``python -m bench.forks``: ``DBOS.fork_workflow`` beside zincir's fork.

Imported only in a child process (``dbos`` is an optional peer). ``build(steps)`` runs one
workflow of up to 100 steps to its end (DBOS launched for it, and destroyed after, so that no
queue runner of this process picks up the forks), each step returning a string of about the
size of a zincir event's payload; past 100, its recorded steps are multiplied in bulk in
``operation_outputs`` (a step takes DBOS 1-20 ms to record: 100,000 one by one would take
minutes to half an hour, and measure nothing of the fork); ``fork(workflow_id, steps)`` forks it with a
``DBOSClient`` (no executor: the fork stays enqueued, as a fork nobody runs yet) at its last
step, so that every step's recorded output is copied: the same prefix a zincir fork at the last
seq copies. Storage is the system database's size: the SQLite file (DBOS as shipped: rollback
journal), or ``pg_database_size`` of the PostgreSQL database.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

from dbos import DBOS, DBOSClient, SetWorkflowID

from ..harness.child import Channel, serve

BUILT = 100
"""Steps a workflow runs for real; the rest are copies of its recorded ones."""


@DBOS.step()
def search(i: int) -> str:
    return f"step {i}: looking further into the topic; results {i}-0, {i}-1, {i}-2 ".ljust(160, ".")


@DBOS.workflow()
def steps_wf(n: int) -> int:
    for i in range(n):
        search(i)
    return n


class DbosForkSide:
    is_async = False

    def __init__(self, target: str) -> None:
        self.postgres = target.startswith(("postgresql://", "postgres://"))
        self.target = target
        self.url = target if self.postgres else f"sqlite:///{target}"
        self.client: DBOSClient | None = None

    def open(self) -> dict[str, Any]:
        return {"version": f"dbos {version('dbos')}, SQLAlchemy {version('sqlalchemy')}"}

    def close(self) -> None:
        if self.client is not None:
            self.client.destroy()

    def build(self, steps: int) -> str:
        """Run one workflow of ``steps`` steps; its id."""
        DBOS(config={"name": "zincir-bench-forks", "system_database_url": self.url, "log_level": "WARNING"})
        DBOS.launch()
        try:
            workflow_id = f"forks-{uuid.uuid4().hex}"
            built = min(steps, BUILT)
            with SetWorkflowID(workflow_id):
                assert steps_wf(built) == built
        finally:
            DBOS.destroy(destroy_registry=False)
        self._multiply(workflow_id, built, steps)
        return workflow_id

    def _multiply(self, workflow_id: str, have: int, want: int) -> None:
        """Copy the workflow's recorded steps under the next step ids until it has ``want``."""
        table = "dbos.operation_outputs" if self.postgres else "operation_outputs"
        with self._connect() as conn:
            columns = self._columns(conn)
            select = ", ".join("function_id + ?" if c == "function_id" else c for c in columns)
            sql = (
                f"INSERT INTO {table} ({', '.join(columns)}) SELECT {select} FROM {table}"
                " WHERE workflow_uuid = ? AND function_id <= ?"
            )
            if self.postgres:
                sql = sql.replace("?", "%s")
            while have < want:
                conn.execute(sql, (have, workflow_id, min(have, want - have)))
                have += min(have, want - have)

    def _connect(self) -> Any:
        if self.postgres:
            import psycopg

            return psycopg.connect(self.target)
        return _committed_sqlite(self.target)

    def _columns(self, conn: Any) -> list[str]:
        if self.postgres:
            rows = conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = 'dbos'"
                " AND table_name = 'operation_outputs' ORDER BY ordinal_position"
            ).fetchall()
            return [str(r[0]) for r in rows]
        return [str(r[1]) for r in conn.execute("PRAGMA table_info(operation_outputs)")]

    def fork(self, workflow_id: str, steps: int) -> dict[str, Any]:
        """Fork the workflow at its last step (every step before it copied): ms and bytes grown."""
        if self.client is None:
            self.client = DBOSClient(system_database_url=self.url)
        before = self._size()
        started = time.perf_counter()
        handle = self.client.fork_workflow(workflow_id, steps + 1)
        ms = (time.perf_counter() - started) * 1000
        return {"ms": ms, "bytes": self._size() - before, "fork": handle.get_workflow_id()}

    def _size(self) -> int:
        if not self.postgres:
            return os.path.getsize(self.target)
        import psycopg

        with psycopg.connect(self.target) as conn:
            row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
            assert row is not None
            return int(row[0])


@contextlib.contextmanager
def _committed_sqlite(path: str) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(path)
    try:
        with conn:
            yield conn
    finally:
        conn.close()


def child(channel: Channel, args: dict[str, Any]) -> None:
    """The child process hosting DBOS's forks (``bench/harness/child.py``)."""
    serve(DbosForkSide(args["target"]), channel)
