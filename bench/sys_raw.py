"""The floor: raw ``sqlite3``, one INSERT + COMMIT per step (WAL, synchronous=FULL)."""

from __future__ import annotations

import sqlite3
import time
import uuid
from typing import Any

from ._common import sqlite_pragmas


class RawSystem:
    name = "raw"
    is_async = False

    def __init__(self, variant: str, path: str, options: dict[str, Any]) -> None:
        self.path = path
        self.conn: sqlite3.Connection

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
        settings["notes"] = "BEGIN IMMEDIATE; INSERT the step's result; COMMIT -- per step"
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
