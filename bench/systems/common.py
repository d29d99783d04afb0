"""Helpers shared by the parent (the harness) and the children (the systems under test)."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from ..harness.child import Channel, serve

LEDGER_EVERY = 10  # every 10th step of the crash workflow appends to the external ledger
SYNCHRONOUS_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
LOCKED = "database is locked"


# How each system's killed run is finished in comparison 3 (quoted in the report).
RECOVERY = {
    "zincir": (
        "the restarted process finds the run by its role and takes it with "
        "`open_run(db, run_id, force=True)` (the old process is known dead), then replays the "
        "workflow: completed steps return their stored results"
    ),
    "dbos": (
        "the restarted process calls `DBOS.launch()`, which recovers this executor's PENDING "
        "workflows; it waits with `DBOS.retrieve_workflow(id).get_result()` (or starts the workflow "
        "with the same id if it was never recorded)"
    ),
    "langgraph": (
        "the restarted process calls `entrypoint.invoke(None, config)` with the same thread id "
        "(LangGraph's documented resume): the entrypoint runs again from its last checkpoint and "
        "tasks whose writes were saved return them (or it invokes with the input if no checkpoint "
        "was saved)"
    ),
}


def is_ledger_step(i: int) -> bool:
    return i % LEDGER_EVERY == LEDGER_EVERY - 1


def pragmas(query: Callable[[str], Any]) -> dict[str, Any]:
    """journal_mode / synchronous / busy_timeout through ``query(sql) -> first column``."""
    sync = int(query("PRAGMA synchronous"))
    return {
        "journal_mode": str(query("PRAGMA journal_mode")).lower(),
        "synchronous": SYNCHRONOUS_NAMES.get(sync, str(sync)),
        "busy_timeout_ms": int(query("PRAGMA busy_timeout")),
    }


def sqlite_pragmas(conn: sqlite3.Connection) -> dict[str, Any]:
    return pragmas(lambda sql: conn.execute(sql).fetchone()[0])


# -- the external ledger of comparison 3 ----------------------------------------------------------

LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS keyed (
    key TEXT PRIMARY KEY,          -- the idempotency key: run id + step name, as the system exposes them
    trial TEXT NOT NULL,
    step INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS plain (  -- the same effect without a key: a plain append
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    trial TEXT NOT NULL,
    step INTEGER NOT NULL
);
"""


def ledger_connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.executescript(LEDGER_SCHEMA)
    return conn


class Ledger:
    """The external side effect: one transaction appends the keyed line and the plain line."""

    def __init__(self, path: str) -> None:
        self._conn = ledger_connect(path)
        self._lock = threading.Lock()

    def append(self, key: str, trial: str, step: int) -> None:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute(
                "INSERT OR IGNORE INTO keyed (key, trial, step) VALUES (?, ?, ?)", (key, trial, step)
            )
            self._conn.execute("INSERT INTO plain (key, trial, step) VALUES (?, ?, ?)", (key, trial, step))
            self._conn.execute("COMMIT")

    def close(self) -> None:
        self._conn.close()


def ledger_counts(path: str, trial: str) -> dict[str, int]:
    """What one trial left in the ledger (read by the parent with plain sqlite3)."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        conn.executescript(LEDGER_SCHEMA)
        (keyed_rows, keyed_steps) = conn.execute(
            "SELECT count(*), count(DISTINCT step) FROM keyed WHERE trial = ?", (trial,)
        ).fetchone()
        (plain_rows, plain_steps) = conn.execute(
            "SELECT count(*), count(DISTINCT step) FROM plain WHERE trial = ?", (trial,)
        ).fetchone()
    finally:
        conn.close()
    return {
        "keyed_rows": keyed_rows,
        "keyed_steps": keyed_steps,
        "plain_rows": plain_rows,
        "plain_steps": plain_steps,
    }


# -- counting "database is locked" wherever it shows up ----------------------------------------


class LockedLogCounter(logging.Handler):
    """Counts log records that mention a locked database (systems that retry internally log)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0
        self.samples: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                text += " " + str(record.exc_info[1])
        except Exception:
            return
        if LOCKED in text.lower() or "database is busy" in text.lower():
            self.count += 1
            if len(self.samples) < 3:
                self.samples.append(text[:300])


def is_lock_error(exc: BaseException) -> bool:
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        name = type(e).__name__
        if LOCKED in str(e).lower() or name == "DatabaseBusy":
            return True
        if isinstance(e, BaseExceptionGroup):
            stack.extend(e.exceptions)
        for nxt in (e.__cause__, e.__context__):
            if nxt is not None:
                stack.append(nxt)
    return False


def multi_outcome(
    seconds: float, completed: int, errors: list[BaseException], logs: LockedLogCounter, logged_before: int
) -> dict[str, Any]:
    """One process's answer in comparison 4: its runs, and every "database is locked" it met,
    raised to the benchmark or only logged by the system's own retries."""
    return {
        "seconds": seconds,
        "completed_runs": completed,
        "failed_runs": len(errors),
        "lock_errors_raised": sum(is_lock_error(e) for e in errors),
        "lock_errors_logged": logs.count - logged_before,
        "errors": [repr(e)[:300] for e in errors[:3]] + logs.samples[:2],
    }


def wal_connections(path: str) -> Callable[[], sqlite3.Connection]:
    """A connection factory for DBOS's engine (``db_engine_kwargs={"creator": ...}``): each
    connection switches the file to WAL and sets synchronous=FULL, zincir's settings. DBOS's
    own connect listener (IMMEDIATE transactions, busy_timeout=30000) still applies."""

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(path, check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        return conn

    return connect


class System:
    """One system under test of the main comparison, as its child process serves it (:func:`host`).

    Its methods, plain or awaited (``is_async``): ``open()`` opens its database and returns the
    durability settings it really uses; ``close()``; ``per_step(n)`` (comparison 1) and
    ``concurrent(runs, steps)`` (comparison 2) return the seconds they took; ``crash_run`` and
    ``crash_resume`` (comparison 3, see :class:`Ledger`) and ``multi`` (comparison 4, see
    :func:`multi_outcome`) where the system takes part in them. ``bench.postgres`` passes a
    PostgreSQL URL as ``path``."""

    name = ""
    is_async = False

    def __init__(
        self, variant: str, path: str, options: dict[str, Any], started: Callable[[], None] = lambda: None
    ) -> None:
        self.variant = variant
        self.path = path
        self.started = started  # comparison 3: called the moment the crash workflow starts
        self.locked_logs = LockedLogCounter()
        self.prepare(options)

    def prepare(self, options: dict[str, Any]) -> None:
        """What the system sets up when its process starts: before it is opened, outside every
        timing (a recovering process's ledger, for one)."""


def host(system: type[System], channel: Channel, args: dict[str, Any]) -> None:
    """Serve one system of the main comparison in this child process (``bench/harness/child.py``);
    comparison 3's crash workflow says "started" the moment it starts."""
    started = partial(channel.emit, "started")
    serve(system(args["variant"], args["path"], args["options"], started=started), channel)
