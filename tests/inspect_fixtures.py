"""Hand-built zincir databases for the inspector tests (no dependency on the core library).

The file gets the real schema (``migrations/0001_initial.sql``) and rows inserted with plain
SQL, so these tests pin what the inspector reads, whatever writes it.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from zincir._sqlite._migrations import migrate

T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z

XSS_SCRIPT = "<script>document.body.setAttribute('data-pwned','1')</script>"
XSS_IMG = "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">"
XSS_LINK = "<a href=\"javascript:document.body.setAttribute('data-pwned','1')\">click me</a>"
XSS_ALL = f"{XSS_SCRIPT}{XSS_IMG}{XSS_LINK}"
# Break out of an attribute and navigate away (a CSP does not stop <meta http-equiv=refresh>).
XSS_META = '"><meta http-equiv="refresh" content="0;url=http://127.0.0.1:9/pwned">'
XSS_HREF = '<a href="http://evil.example/phish">click me</a>'
XSS_NAV = f"{XSS_META}{XSS_HREF}"


def create_database(path: Path) -> sqlite3.Connection:
    """Create an empty zincir database at ``path`` in WAL mode; return the open writer."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    migrate(conn, str(path), 0)  # zincir's own migrations: the schema stays current by itself
    return conn


def new_id() -> str:
    return str(uuid.uuid4())


def add_run(
    conn: sqlite3.Connection,
    *,
    run_id: str | None = None,
    role: str = "agent",
    provider: str = "openai",
    status: str = "running",
    config: Any = None,
    created_at: int = T0,
    parent_run_id: str | None = None,
    lease_owner: str | None = None,
    lease_epoch: int = 0,
    lease_expires_at: int | None = None,
    attempts: int = 0,
    next_attempt_at: int = 0,
) -> str:
    run_id = run_id or new_id()
    conn.execute(
        "INSERT INTO agent_runs (id, parent_run_id, role, provider, status, config, created_at,"
        " updated_at, lease_owner, lease_epoch, lease_expires_at, attempts, next_attempt_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            run_id,
            parent_run_id,
            role,
            provider,
            status,
            json.dumps({"goal": "test"} if config is None else config, separators=(",", ":")),
            created_at,
            created_at,
            lease_owner,
            lease_epoch,
            lease_expires_at,
            attempts,
            next_attempt_at,
        ),
    )
    return run_id


def add_event(
    conn: sqlite3.Connection,
    run_id: str,
    type: str,
    payload: Any,
    *,
    at: int | None = None,
    key: str | None = None,
) -> int:
    """Append an event at the next seq and move the run's activity time; return the seq."""
    seq, created = conn.execute(
        "SELECT last_seq + 1, created_at FROM agent_runs WHERE id = ?", (run_id,)
    ).fetchone()
    at = created + 1000 * (seq + 1) if at is None else at
    conn.execute(
        "INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (run_id, seq, type, json.dumps(payload, separators=(",", ":")), key, at),
    )
    conn.execute("UPDATE agent_runs SET last_seq = ?, updated_at = ? WHERE id = ?", (seq, at, run_id))
    return int(seq)


def add_checkpoint(
    conn: sqlite3.Connection,
    run_id: str,
    *,
    round: int,
    status: str,
    based_on: int,
    decision: int | None,
    call_id: str | None = None,
    state: Any = None,
    verification: Any = None,
    t0: int = T0,
) -> None:
    state = state or {
        "completed": [f"step {round}"],
        "remaining": ["more"],
        "artifacts": [],
        "failed_attempts": [],
        "evidence": [],
    }
    conn.execute(
        "INSERT INTO checkpoints (run_id, round, tool_call_id, based_on_event_seq,"
        " decision_event_seq, status, state, verification, created_at, decided_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            run_id,
            round,
            call_id or f"submit_{round}",
            based_on,
            decision,
            status,
            json.dumps(state),
            None if verification is None else json.dumps(verification),
            t0 + 1000 * based_on,
            None if decision is None else t0 + 1000 * decision,
        ),
    )


def add_step(
    conn: sqlite3.Connection,
    run_id: str,
    name: str,
    *,
    status: str = "completed",
    result: Any = None,
    started_at: int = T0,
) -> None:
    done = status == "completed"
    conn.execute(
        "INSERT INTO steps (run_id, name, status, epoch, result, started_at, completed_at)"
        " VALUES (?, ?, ?, 1, ?, ?, ?)",
        (
            run_id,
            name,
            status,
            json.dumps(result) if done else None,
            started_at,
            started_at + 500 if done else None,
        ),
    )


def add_timer(
    conn: sqlite3.Connection,
    run_id: str,
    name: str,
    *,
    wake_at: int,
    done: bool = False,
    created_at: int = T0,
) -> None:
    conn.execute(
        "INSERT INTO timers (run_id, name, wake_at, created_at, completed_at) VALUES (?, ?, ?, ?, ?)",
        (run_id, name, wake_at, created_at, wake_at if done else None),
    )


@attrs.frozen
class Sample:
    """The ids of the runs :func:`build_sample` creates."""

    path: Path
    main: str  # a running run with the full history: checkpoints, steps, timers, children
    children: tuple[str, ...]
    long: str  # a completed run with 250 events
    hostile: str  # script-injection payloads in every stored string
    plain: tuple[str, ...]  # filler runs for pagination


def build_sample(path: Path, *, plain_runs: int = 60, t0: int = T0) -> tuple[sqlite3.Connection, Sample]:
    """A database with every kind of row; returns the still-open writer and the ids.

    Times are relative to ``t0`` (a fixed instant by default, so tests can name them).
    """
    conn = create_database(path)
    conn.execute("BEGIN")
    main = add_run(
        conn,
        role="coder",
        provider="anthropic",
        config={"goal": "fix the flaky test", "max_rounds": 5},
        lease_owner="worker-7f3a",
        lease_epoch=3,
        lease_expires_at=t0 + 7_200_000,
        attempts=2,
        next_attempt_at=t0 + 60_000,
        created_at=t0,
    )
    _main_history(conn, main, t0)
    children = (
        add_run(conn, role="researcher", status="completed", parent_run_id=main, created_at=t0 + 5),
        add_run(conn, role="reviewer", status="failed", parent_run_id=main, created_at=t0 + 6),
    )
    long = add_run(conn, role="batch", status="completed", created_at=t0 - 10**6)
    for i in range(250):
        add_event(conn, long, "tool_result" if i % 2 else "tool_call", {"call_id": f"c{i // 2}", "i": i})
    hostile = _hostile_run(conn, t0)
    plain = tuple(
        add_run(conn, role="filler", status="pending", created_at=t0 - 10**7 + i) for i in range(plain_runs)
    )
    conn.execute("COMMIT")
    return conn, Sample(path, main, children, long, hostile, plain)


def _main_history(conn: sqlite3.Connection, run: str, t0: int) -> None:
    add_event(conn, run, "state_transition", {"from": "pending", "to": "running"})
    calls = [{"id": "call_1", "name": "read_file", "args": {"path": "tests/test_x.py"}}]
    add_event(conn, run, "llm_call", {"content": "reading", "tool_calls": calls, "stop_reason": "tool_use"})
    add_event(
        conn,
        run,
        "tool_call",
        {"call_id": "call_1", "name": "read_file", "args": {"path": "x"}, "response_tool_count": 1},
        key="tool_call:call_1",
    )
    add_event(
        conn,
        run,
        "tool_result",
        {"call_id": "call_1", "content": "def test(): ..."},
        key="tool_result:call_1",
    )
    for round, status in ((1, "rejected"), (2, "accepted"), (3, "candidate")):
        call = f"submit_{round}"
        add_event(
            conn,
            run,
            "tool_call",
            {"call_id": call, "name": "submit_checkpoint", "args": {}, "response_tool_count": 1},
            key=f"tool_call:{call}",
        )
        based_on = (
            add_event(conn, run, "checkpoint_proposed", {"checkpoint_id": round, "round": round, "state": {}})
            - 1
        )
        decision = None
        verification = None
        if status != "candidate":
            verification = {"passed": status == "accepted", "evidence": [f"pytest exit {round - 1}"]}
            decision = add_event(
                conn, run, f"checkpoint_{status}", {"checkpoint_id": round, "verification": verification}
            )
            add_event(
                conn, run, "tool_result", {"call_id": call, "content": {"accepted": status == "accepted"}}
            )
        add_checkpoint(
            conn,
            run,
            round=round,
            status=status,
            based_on=based_on,
            decision=decision,
            verification=verification,
            t0=t0,
        )
    add_step(conn, run, "fetch-dataset", result={"rows": 1200}, started_at=t0)
    add_step(conn, run, "train", status="running", started_at=t0 + 2000)
    add_timer(conn, run, "cooldown", wake_at=t0 + 3_600_000, created_at=t0)
    add_timer(conn, run, "backoff", wake_at=t0 + 1000, done=True, created_at=t0)


def _hostile_run(conn: sqlite3.Connection, t0: int) -> str:
    run = add_run(
        conn,
        role=f"role {XSS_ALL}",
        provider=f"provider {XSS_IMG}",
        config={"goal": XSS_ALL, XSS_SCRIPT: [XSS_LINK]},
        lease_owner=f"owner {XSS_IMG}",
        lease_expires_at=t0,
        created_at=t0 + 600_000,
    )
    add_event(conn, run, "state_transition", {"from": "pending", "to": "running"})
    add_event(conn, run, XSS_SCRIPT, {"content": XSS_ALL}, key=f"tool_call:{XSS_IMG}")
    add_event(conn, run, "llm_call", {"content": XSS_ALL, "tool_calls": [{"id": XSS_IMG, "name": XSS_LINK}]})
    add_step(conn, run, f"step {XSS_SCRIPT}", result=XSS_ALL, started_at=t0)
    add_timer(conn, run, f"timer {XSS_IMG}", wake_at=t0, created_at=t0)
    add_checkpoint(
        conn,
        run,
        round=1,
        status="candidate",
        based_on=2,
        decision=None,
        call_id=XSS_LINK,
        state={"completed": [XSS_ALL]},
        t0=t0,
    )
    return run


@attrs.frozen
class MalformedIds:
    """The ids :func:`add_malformed_run` creates."""

    run: str
    child: str


def add_malformed_run(conn: sqlite3.Connection, t0: int = T0) -> MalformedIds:
    """A run whose rows hold values of the wrong type in every kind of column.

    SQLite (no STRICT tables) stores TEXT or BLOB in INTEGER columns; this is what someone with
    write access to the file could leave for the inspector: markup in integer columns (seq,
    round, epoch, attempts, timestamps), a BLOB role, a BLOB, NaN, invalid and 5000-deep JSON
    payload, and a REAL seq.
    """
    run = new_id()
    conn.execute(
        "INSERT INTO agent_runs (id, parent_run_id, role, provider, status, config, created_at,"
        " updated_at, last_seq, lease_owner, lease_epoch, lease_expires_at, attempts, next_attempt_at)"
        " VALUES (?, NULL, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            run,
            f"role {XSS_NAV}".encode(),  # a BLOB
            f"provider {XSS_NAV}",
            '{"goal": NaN, "x": [Infinity, -Infinity, 1e999]}',
            XSS_META,  # created_at
            f"updated {XSS_META}",  # updated_at: TEXT sorts after every number, so first in the list
            XSS_META,  # last_seq
            f"owner {XSS_HREF}",
            XSS_META,  # lease_epoch
            XSS_HREF.encode(),  # lease_expires_at: a BLOB
            XSS_META,  # attempts
            2.5,  # next_attempt_at: a REAL
        ),
    )
    events: list[tuple[object, object, object, object, object]] = [
        (0, "state_transition", '{"from":"pending","to":"running"}', None, t0),
        (1, XSS_NAV, json.dumps({"content": XSS_NAV}), XSS_META.encode(), XSS_META),
        (1.5, "llm_call", f"{XSS_NAV}".encode(), None, t0),  # a REAL seq, a BLOB payload
        (2, "llm_call", '{"content": NaN, "n": Infinity, "big": 1e999}', None, t0),
        (3, "llm_call", "[" * 5000 + "]" * 5000, None, t0),  # nested too deep for Python
        (4, "llm_call", '{"lone": "\\ud800", "bad": ', None, t0),  # not JSON
        (5, "tool_call", '"\\ud800 lone surrogate"', None, t0),
        (XSS_META, "llm_call", json.dumps({"content": "text seq"}), None, t0),  # a TEXT seq
        (f"{XSS_HREF}".encode(), "llm_call", "{}", None, XSS_HREF.encode()),  # a BLOB seq
    ]
    conn.executemany(
        "INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        [(run, *event) for event in events],
    )
    conn.execute(
        "INSERT INTO checkpoints (run_id, round, tool_call_id, based_on_event_seq, decision_event_seq,"
        " status, state, verification, created_at, decided_at)"
        " VALUES (?, ?, ?, ?, ?, 'accepted', ?, ?, ?, ?)",
        (run, XSS_META, XSS_HREF, XSS_META, XSS_HREF.encode(), "[" * 5000, '{"passed": NaN}', XSS_META, 1.5),
    )
    conn.execute(
        "INSERT INTO checkpoints (run_id, round, tool_call_id, based_on_event_seq, decision_event_seq,"
        " status, state, verification, created_at, decided_at) VALUES (?, 1, 'c1', 0, NULL, 'candidate',"
        " ?, NULL, ?, NULL)",
        (run, XSS_NAV.encode(), t0),
    )
    conn.execute(
        "INSERT INTO steps (run_id, name, status, epoch, result, started_at, completed_at)"
        " VALUES (?, ?, 'completed', ?, ?, ?, ?)",
        (run, f"step {XSS_NAV}", XSS_META, "{" * 5000, XSS_META, XSS_HREF.encode()),
    )
    conn.execute(
        "INSERT INTO timers (run_id, name, wake_at, created_at, completed_at) VALUES (?, ?, ?, ?, NULL)",
        (run, f"timer {XSS_NAV}", XSS_META, XSS_HREF.encode()),
    )
    child = new_id()
    conn.execute(
        "INSERT INTO agent_runs (id, parent_run_id, role, provider, status, config, created_at, updated_at)"
        " VALUES (?, ?, ?, 'p', 'completed', '{}', ?, ?)",
        (child, run, XSS_HREF, XSS_META, t0),
    )
    return MalformedIds(run, child)


def add_plain_runs(conn: sqlite3.Connection, count: int, **fields: Any) -> list[str]:
    return [add_run(conn, **fields) for _ in range(count)]


def file_digests(path: Path) -> dict[str, str | None]:
    """SHA-256 of the database file and its WAL (None when absent)."""
    digests: dict[str, str | None] = {}
    for suffix in ("", "-wal"):
        candidate = Path(f"{path}{suffix}")
        digests[suffix or "db"] = (
            hashlib.sha256(candidate.read_bytes()).hexdigest() if candidate.exists() else None
        )
    return digests


def all_seqs(events: Iterable[Any]) -> list[int]:
    return [e.seq for e in events]
