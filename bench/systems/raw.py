"""The floor and the ceiling: raw ``sqlite3`` (WAL, synchronous=FULL).

Per step (comparison 1), one INSERT + COMMIT per step: what a step costs with no hand-off and
no bookkeeping. Concurrent runs (comparison 2), the same rows 100 per transaction: what SQLite
itself commits when every transaction is as full as a group commit of those runs can make it.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from typing import Any

from ..harness.child import Channel
from .common import System, host, sqlite_pragmas

ROWS_PER_TRANSACTION = 100


class RawSystem(System):
    name = "raw"
    is_async = False

    conn: sqlite3.Connection

    def open(self) -> dict[str, Any]:
        self.conn = sqlite3.connect(self.path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = FULL")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS steps (run_id TEXT NOT NULL, name TEXT NOT NULL,"
            " result TEXT NOT NULL, PRIMARY KEY (run_id, name))"
        )
        settings = sqlite_pragmas(self.conn)
        settings["version"] = f"sqlite3 module, SQLite {sqlite3.sqlite_version}"
        settings["notes"] = (
            "BEGIN IMMEDIATE; INSERT the step's result; COMMIT -- per step (comparison 2: the same"
            f" rows, {ROWS_PER_TRANSACTION} per transaction)"
        )
        return settings

    def close(self) -> None:
        self.conn.close()

    def per_step(self, n: int) -> float:
        run_id = str(uuid.uuid4())
        start = time.perf_counter()
        for i in range(n):
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute(
                "INSERT INTO steps (run_id, name, result) VALUES (?, ?, ?)", (run_id, f"step-{i}", str(i))
            )
            self.conn.execute("COMMIT")
        return time.perf_counter() - start

    def concurrent(self, runs: int, steps: int) -> float:
        # The rows in the order a group commit of ``runs`` runs at once would write them: step i
        # of every run, then step i + 1.
        run_ids = [str(uuid.uuid4()) for _ in range(runs)]
        rows = [(run_id, f"step-{i}", str(i)) for i in range(steps) for run_id in run_ids]
        start = time.perf_counter()
        for first in range(0, len(rows), ROWS_PER_TRANSACTION):
            self.conn.execute("BEGIN IMMEDIATE")
            for row in rows[first : first + ROWS_PER_TRANSACTION]:
                self.conn.execute("INSERT INTO steps (run_id, name, result) VALUES (?, ?, ?)", row)
            self.conn.execute("COMMIT")
        return time.perf_counter() - start


def child(channel: Channel, args: dict[str, Any]) -> None:
    """The child process hosting raw sqlite3 (``bench/harness/child.py``)."""
    host(RawSystem, channel, args)
