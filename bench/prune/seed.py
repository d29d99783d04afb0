"""Ended runs written in bulk with SQL, as zincir stores them: a database to prune.

Recording 100,000 runs through the API would take most of an hour and measure nothing of the
prune, so each run's rows are inserted by a separate connection in large transactions: its row
(completed, ended at ``ended_ms``), ``events`` events (a state transition, then model responses
of about ``payload`` bytes each), ``steps`` completed steps (one by default), one signal and
its audit row. Every ``family_every``-th run also has a completed child, with the parent's
join of it. The schema must exist (open the database with zincir first). Used by bench/prune
and tests/test_prune.py.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator
from typing import Any

__all__ = ["seed_runs"]

_RUN = (
    "INSERT INTO agent_runs (id, parent_run_id, role, provider, status, config, created_at, updated_at,"
    " last_seq, lease_epoch, attempts, next_attempt_at, result) VALUES (?, ?, 'agent', '', 'completed',"
    " '{}', ?, ?, ?, 1, 1, 0, 'null')"
)
_EVENT = (
    "INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
    " VALUES (?, ?, ?, ?, NULL, ?)"
)
_STEP = (
    "INSERT INTO steps (run_id, name, status, epoch, result, started_at, completed_at)"
    " VALUES (?, ?, 'completed', 1, '{\"ok\":true}', ?, ?)"
)
_SIGNAL = (
    "INSERT INTO signals (run_id, topic, payload, key, created_at, consumed_by, consumed_at)"
    " VALUES (?, 'go', '{}', 'k', ?, NULL, NULL)"
)
_ACTION = (
    "INSERT INTO outsider_actions (run_id, action, done_by, detail, created_at)"
    " VALUES (?, 'signal', 'seed', '{}', ?)"
)
_JOIN = "INSERT INTO joins (run_id, child_id, deadline, created_at, completed_at) VALUES (?, ?, NULL, ?, ?)"


def _content(payload: int) -> str:
    return json.dumps({"content": "x" * payload, "stop_reason": "end_turn", "tool_calls": []})


def _runs(
    count: int, events: int, steps: int, ended_ms: int, payload: int, family_every: int
) -> Iterator[dict[str, list[Any]]]:
    """The rows of ``count`` runs, a chunk of runs at a time, per statement."""
    response = _content(payload)
    start = '{"from":"pending","to":"running"}'
    chunk: dict[str, list[Any]] = {
        "runs": [],
        "events": [],
        "steps": [],
        "signals": [],
        "actions": [],
        "joins": [],
    }
    made = 0
    while made < count:
        run_id = str(uuid.uuid4())
        ended = ended_ms - (count - made)  # distinct end times, oldest first
        family = [(run_id, None)]
        if family_every and made % family_every == family_every - 1 and made + 1 < count:
            family.append((str(uuid.uuid4()), run_id))
        for rid, parent in family:
            chunk["runs"].append((rid, parent, ended - 1000, ended, events - 1))
            chunk["events"].append((rid, 0, "state_transition", start, ended - 1000))
            chunk["events"] += [
                (rid, seq, "llm_call", response, ended - 1000 + seq) for seq in range(1, events)
            ]
            chunk["steps"] += [(rid, f"fetch {i}", ended - 900, ended - 800) for i in range(steps)]
            chunk["signals"].append((rid, ended - 700))
            chunk["actions"].append((rid, ended - 700))
            if parent is not None:
                chunk["joins"].append((parent, rid, ended - 500, ended - 400))
            made += 1
        if len(chunk["runs"]) >= 2000 or made >= count:
            yield chunk
            chunk = {key: [] for key in chunk}


def seed_runs(
    target: str,
    count: int,
    *,
    events: int = 10,
    steps: int = 1,
    ended_ms: int,
    payload: int = 200,
    family_every: int = 0,
) -> list[str]:
    """Write ``count`` completed runs (children included) into ``target`` (a SQLite path or a
    ``postgresql://`` URL); their ids."""
    ids: list[str] = []
    statements = {
        "runs": _RUN,
        "events": _EVENT,
        "steps": _STEP,
        "signals": _SIGNAL,
        "actions": _ACTION,
        "joins": _JOIN,
    }
    if target.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(target) as conn, conn.cursor() as cur:
            for chunk in _runs(count, events, steps, ended_ms, payload, family_every):
                ids += [row[0] for row in chunk["runs"]]
                for key, sql in statements.items():
                    if chunk[key]:
                        cur.executemany(sql.replace("?", "%s"), chunk[key])
            cur.execute("ANALYZE")
        return ids
    conn = sqlite3.connect(target)
    try:
        for chunk in _runs(count, events, steps, ended_ms, payload, family_every):
            ids += [row[0] for row in chunk["runs"]]
            with conn:
                for key, sql in statements.items():
                    conn.executemany(sql, chunk[key])
        conn.execute("ANALYZE")
    finally:
        conn.close()
    return ids
