"""Read-only queries over a zincir database, shared by ``zincir ui`` and the CLI.

Everything here is plain synchronous code over one :class:`sqlite3.Connection` opened by
:func:`open_readonly`. Nothing writes: the connection is opened with ``mode=ro``, so SQLite
itself refuses writes, and no function issues one. Every list is bounded (keyset
pagination), so a run with a million events costs one page, never the whole log.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from ._errors import DatabaseBusy, InvalidArgument, RunNotFound, SchemaError, StorageError
from ._migrations import APPLICATION_ID, load_migrations
from ._types import EventType

__all__ = [
    "DEFAULT_PAGE",
    "RUN_STATUSES",
    "CheckpointRow",
    "EventPage",
    "EventRow",
    "RunCursor",
    "RunDetail",
    "RunPage",
    "RunSummary",
    "StepRow",
    "TimerRow",
    "checkpoint_to_json",
    "event_to_json",
    "event_types",
    "get_event",
    "get_run",
    "iter_events",
    "json_value",
    "list_checkpoints",
    "list_events",
    "list_runs",
    "list_steps",
    "list_timers",
    "open_readonly",
    "parse_cursor",
    "parse_run_id",
    "read_snapshot",
    "run_to_json",
    "step_to_json",
    "timer_to_json",
]

REQUIRED_TABLES = frozenset(
    {
        "zincir_schema_migrations",
        "agent_runs",
        "events",
        "tool_intents",
        "checkpoints",
        "steps",
        "timers",
        "messages",
    }
)
RUN_STATUSES = ("pending", "running", "completed", "failed")
DEFAULT_PAGE = 100
MAX_PAGE = 1000
BUSY_TIMEOUT = 5.0

_RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_CURSOR = re.compile(r"(-?[0-9]{1,19})_(" + _RUN_ID.pattern + ")")


# --------------------------------------------------------------------------- opening


def _decode_text(raw: bytes) -> str:
    # A damaged or foreign TEXT value must not make a page fail to render.
    return raw.decode("utf-8", "replace")


def open_readonly(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """Open an existing zincir database strictly read-only and check its schema.

    A missing file raises :class:`StorageError` and is not created; a file that is not a
    zincir database (or is newer than this code) raises :class:`SchemaError`.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise StorageError(
            f"database file {path!r} does not exist "
            "(the inspector opens existing databases read-only and never creates one)"
        )
    uri = f"file:{urllib.parse.quote(path)}?mode=ro"
    try:
        conn = sqlite3.connect(
            uri, uri=True, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise StorageError(f"cannot open database file {path!r} read-only: {exc}") from exc
    conn.text_factory = _decode_text
    try:
        _check_schema(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn


def _check_schema(conn: sqlite3.Connection, path: str) -> None:
    try:
        application_id = conn.execute("PRAGMA application_id").fetchone()[0]
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        tables = {row[0] for row in rows}
        missing = REQUIRED_TABLES - tables
        # 0 is accepted too: files made by hand with the schema's SQL (tests, tools).
        if application_id not in (0, APPLICATION_ID) or missing:
            detail = f"missing tables: {', '.join(sorted(missing))}" if missing else "foreign file"
            raise SchemaError(f"{path!r} is not a zincir database ({detail})")
        version = conn.execute("SELECT coalesce(max(version), 0) FROM zincir_schema_migrations").fetchone()[0]
    except sqlite3.OperationalError as exc:
        raise _storage_error(exc, f"reading the schema of {path!r}") from exc
    except sqlite3.DatabaseError as exc:
        raise SchemaError(f"{path!r} is not a zincir database ({exc})") from exc
    if version < 1:
        raise SchemaError(f"{path!r} has no applied zincir migration")
    known = len(load_migrations())
    if version > known:
        raise SchemaError(
            f"{path!r} has schema version {version}, newer than this zincir (reads up to {known});"
            " upgrade zincir"
        )


def _storage_error(exc: sqlite3.Error, doing: str) -> StorageError:
    message = f"{doing}: {exc}"
    if "locked" in str(exc) or "busy" in str(exc):
        return DatabaseBusy(message)
    return StorageError(message)


@contextlib.contextmanager
def read_snapshot(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """Run the reads inside the block in one read transaction (one consistent snapshot).

    SQLite errors raised inside become :class:`StorageError` (or :class:`DatabaseBusy`).
    """
    try:
        conn.execute("BEGIN")
    except sqlite3.Error as exc:
        raise _storage_error(exc, "starting a read") from exc
    try:
        yield conn
    except sqlite3.Error as exc:
        raise _storage_error(exc, "reading the database") from exc
    finally:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


# --------------------------------------------------------------------------- validation


def parse_run_id(text: str) -> str:
    """Return the canonical (lowercase) form of a run id, or raise :class:`InvalidArgument`."""
    lowered = text.lower()
    if not _RUN_ID.fullmatch(lowered):
        shown = text if len(text) <= 80 else text[:80] + "…"
        raise InvalidArgument(f"malformed run id {shown!r}: expected a UUID like {_EXAMPLE_ID}")
    return lowered


_EXAMPLE_ID = "0b7c6a1e-5a43-4f4e-9d7e-2f0c7a1d9b11"


def _check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidArgument(f"page limit must be between 1 and {MAX_PAGE}, got {limit}")
    return limit


def _check_status(status: str | None) -> None:
    if status is not None and status not in RUN_STATUSES:
        raise InvalidArgument(f"unknown run status {status!r}: expected one of {RUN_STATUSES}")


# --------------------------------------------------------------------------- records


@attrs.frozen
class RunCursor:
    """A position in the runs list (newest activity first): the row's ``updated_at`` and id."""

    updated_at: int
    id: str

    def encode(self) -> str:
        return f"{self.updated_at}_{self.id}"


def parse_cursor(text: str) -> RunCursor:
    """Parse the ``before``/``after`` token of the runs list (see :meth:`RunCursor.encode`)."""
    match = _CURSOR.fullmatch(text)
    if match is None:
        raise InvalidArgument(f"malformed runs cursor {text[:80]!r}: expected <updated_at>_<id>")
    return RunCursor(int(match.group(1)), match.group(2))


@attrs.frozen
class RunSummary:
    """One line of the runs list. ``event_count`` is ``last_seq + 1`` (the log is gap-free)."""

    id: str
    parent_run_id: str | None
    role: str
    provider: str
    status: str
    created_at: int
    updated_at: int
    event_count: int
    lease_owner: str | None
    lease_expires_at: int | None
    attempts: int

    @property
    def cursor(self) -> RunCursor:
        return RunCursor(self.updated_at, self.id)


@attrs.frozen
class RunPage:
    """A page of runs plus the counts per status (under the role filter, not the status one)."""

    runs: tuple[RunSummary, ...]
    counts: Mapping[str, int]
    has_newer: bool
    has_older: bool

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@attrs.frozen
class RunDetail:
    """One run with its lease, resume-worker bookkeeping and family links.

    ``config`` is the stored JSON text. ``children`` holds at most the requested number of
    child runs; ``children_total`` counts them all.
    """

    id: str
    parent_run_id: str | None
    role: str
    provider: str
    status: str
    config: str
    created_at: int
    updated_at: int
    event_count: int
    lease_owner: str | None
    lease_epoch: int
    lease_expires_at: int | None
    attempts: int
    next_attempt_at: int
    children: tuple[RunSummary, ...]
    children_total: int


@attrs.frozen
class CheckpointRow:
    """A checkpoint candidate or decision. ``state``/``verification`` are stored JSON text."""

    id: int
    round: int
    tool_call_id: str
    status: str
    based_on_event_seq: int
    decision_event_seq: int | None
    state: str
    verification: str | None
    created_at: int
    decided_at: int | None


@attrs.frozen
class EventRow:
    """One event. ``payload`` is the stored JSON text, possibly cut to a prefix.

    ``payload_size`` is the stored length in characters; ``truncated`` says whether
    ``payload`` is only its beginning (then it is usually not valid JSON by itself).
    """

    seq: int
    type: str
    payload: str
    payload_size: int
    idempotency_key: str | None
    created_at: int

    @property
    def truncated(self) -> bool:
        return len(self.payload) < self.payload_size


@attrs.frozen
class EventPage:
    """A page of events in ``seq`` order, and whether more exist on either side."""

    events: tuple[EventRow, ...]
    has_before: bool
    has_after: bool


@attrs.frozen
class StepRow:
    name: str
    status: str
    epoch: int
    result: str | None
    started_at: int
    completed_at: int | None


@attrs.frozen
class TimerRow:
    name: str
    wake_at: int
    created_at: int
    completed_at: int | None


# --------------------------------------------------------------------------- runs

_SUMMARY_COLUMNS = (
    "id, parent_run_id, role, provider, status, created_at, updated_at, last_seq + 1,"
    " lease_owner, lease_expires_at, attempts"
)


def _filters(status: str | None, role: str | None) -> tuple[list[str], list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if status is not None:
        clauses.append("status = ?")
        params.append(status)
    if role is not None:
        clauses.append("role = ?")
        params.append(role)
    return clauses, params


def _where(clauses: Sequence[str]) -> str:
    return f"WHERE {' AND '.join(clauses)}" if clauses else ""


def list_runs(
    conn: sqlite3.Connection,
    *,
    status: str | None = None,
    role: str | None = None,
    limit: int = 50,
    before: RunCursor | None = None,
    after: RunCursor | None = None,
) -> RunPage:
    """Runs by newest activity (``updated_at`` desc, then id desc), one keyset page.

    ``before`` continues to older runs, ``after`` goes back to newer ones; at most one of
    them. Counts per status honour the role filter only, so the status tabs stay useful.
    """
    _check_status(status)
    _check_limit(limit)
    if before is not None and after is not None:
        raise InvalidArgument("give at most one of before= and after= to page through runs")
    clauses, params = _filters(status, role)
    if after is not None:
        rows = _runs_page(conn, clauses, params, after, ">", "ASC", limit + 1)
        has_newer = len(rows) > limit
        runs = tuple(reversed(rows[:limit]))
        has_older = bool(runs) and _runs_exist(conn, clauses, params, runs[-1].cursor, "<")
    else:
        rows = _runs_page(conn, clauses, params, before, "<", "DESC", limit + 1)
        has_older = len(rows) > limit
        runs = tuple(rows[:limit])
        has_newer = (
            before is not None and bool(runs) and _runs_exist(conn, clauses, params, runs[0].cursor, ">")
        )
    return RunPage(runs, count_runs(conn, role=role), has_newer, has_older)


def _runs_page(
    conn: sqlite3.Connection,
    clauses: list[str],
    params: list[Any],
    cursor: RunCursor | None,
    op: str,
    order: str,
    limit: int,
) -> list[RunSummary]:
    clauses, params = list(clauses), list(params)
    if cursor is not None:
        clauses.append(f"(updated_at, id) {op} (?, ?)")
        params += [cursor.updated_at, cursor.id]
    sql = (
        f"SELECT {_SUMMARY_COLUMNS} FROM agent_runs {_where(clauses)}"
        f" ORDER BY updated_at {order}, id {order} LIMIT ?"
    )
    return [RunSummary(*row) for row in conn.execute(sql, [*params, limit])]


def _runs_exist(
    conn: sqlite3.Connection, clauses: list[str], params: list[Any], cursor: RunCursor, op: str
) -> bool:
    where = _where([*clauses, f"(updated_at, id) {op} (?, ?)"])
    sql = f"SELECT EXISTS (SELECT 1 FROM agent_runs {where})"
    return bool(conn.execute(sql, [*params, cursor.updated_at, cursor.id]).fetchone()[0])


def count_runs(conn: sqlite3.Connection, *, role: str | None = None) -> dict[str, int]:
    """Number of runs per status (every status present, zero included)."""
    counts = dict.fromkeys(RUN_STATUSES, 0)
    clauses, params = _filters(None, role)
    # With a role filter there is no index to use (schema v1 has none on role), and walking the
    # status index with a row lookup per entry is ~10x slower than one sequential table scan.
    table = "agent_runs NOT INDEXED" if role is not None else "agent_runs"
    sql = f"SELECT status, count(*) FROM {table} {_where(clauses)} GROUP BY status"
    for status, count in conn.execute(sql, params):
        counts[status] = count
    return counts


def get_run(conn: sqlite3.Connection, run_id: str, *, children_limit: int = 100) -> RunDetail:
    """One run with its lease fields and its first ``children_limit`` children.

    Raises :class:`InvalidArgument` for a malformed id, :class:`RunNotFound` for an
    unknown one.
    """
    run_id = parse_run_id(run_id)
    row = conn.execute(
        "SELECT id, parent_run_id, role, provider, status, config, created_at, updated_at,"
        " last_seq + 1, lease_owner, lease_epoch, lease_expires_at, attempts, next_attempt_at"
        " FROM agent_runs WHERE id = ?",
        (run_id,),
    ).fetchone()
    if row is None:
        raise RunNotFound(f"run {run_id} not found")
    children = tuple(
        RunSummary(*child)
        for child in conn.execute(
            f"SELECT {_SUMMARY_COLUMNS} FROM agent_runs WHERE parent_run_id = ?"
            " ORDER BY created_at, id LIMIT ?",
            (run_id, children_limit),
        )
    )
    total = len(children)
    if total == children_limit:
        total = conn.execute("SELECT count(*) FROM agent_runs WHERE parent_run_id = ?", (run_id,)).fetchone()[
            0
        ]
    values: list[Any] = [*row, children, total]
    return RunDetail(*values)


# --------------------------------------------------------------------------- lineage, log


def list_checkpoints(
    conn: sqlite3.Connection, run_id: str, *, limit: int | None = None
) -> tuple[CheckpointRow, ...]:
    """The run's checkpoints by round (the first ``limit`` rounds; all by default)."""
    rows = conn.execute(
        "SELECT id, round, tool_call_id, status, based_on_event_seq, decision_event_seq,"
        " state, verification, created_at, decided_at"
        " FROM checkpoints WHERE run_id = ? ORDER BY round LIMIT ?",
        (run_id, -1 if limit is None else limit),
    )
    return tuple(CheckpointRow(*row) for row in rows)


def _payload_column(max_payload_chars: int | None) -> tuple[str, list[Any]]:
    if max_payload_chars is None:
        return "payload", []
    return "substr(payload, 1, ?)", [max(0, max_payload_chars)]


def list_events(
    conn: sqlite3.Connection,
    run_id: str,
    *,
    after: int | None = None,
    before: int | None = None,
    limit: int = DEFAULT_PAGE,
    type: str | None = None,
    max_payload_chars: int | None = None,
) -> EventPage:
    """One page of a run's events in ``seq`` order.

    ``after=s`` returns the first ``limit`` events with seq > s (the default is the start
    of the log); ``before=s`` returns the last ``limit`` events with seq < s. ``type``
    filters by event type. ``max_payload_chars`` cuts each payload to a prefix so that a
    page of huge payloads stays cheap (see :attr:`EventRow.truncated`).
    """
    _check_limit(limit)
    if after is not None and before is not None:
        raise InvalidArgument("give at most one of after= and before= to page through events")
    payload, payload_params = _payload_column(max_payload_chars)
    clauses = ["run_id = ?"]
    params: list[Any] = [run_id]
    if type is not None:
        clauses.append("type = ?")
        params.append(type)
    descending = before is not None
    if descending:
        clauses.append("seq < ?")
        params.append(before)
    elif after is not None:
        clauses.append("seq > ?")
        params.append(after)
    sql = (
        f"SELECT seq, type, {payload}, length(payload), idempotency_key, created_at"
        f" FROM events {_where(clauses)} ORDER BY seq {'DESC' if descending else 'ASC'} LIMIT ?"
    )
    rows = [EventRow(*row) for row in conn.execute(sql, [*payload_params, *params, limit + 1])]
    more = len(rows) > limit
    rows = rows[:limit]
    if descending:
        rows.reverse()
        assert before is not None
        edge = rows[-1].seq + 1 if rows else before
        has_before, has_after = more, _events_exist(conn, run_id, type, ">=", edge)
    else:
        edge = rows[0].seq - 1 if rows else (-1 if after is None else after)
        has_before, has_after = _events_exist(conn, run_id, type, "<=", edge), more
    return EventPage(tuple(rows), has_before, has_after)


def _events_exist(conn: sqlite3.Connection, run_id: str, type: str | None, op: str, seq: int) -> bool:
    sql = f"SELECT EXISTS (SELECT 1 FROM events WHERE run_id = ? AND seq {op} ?"
    params: list[Any] = [run_id, seq]
    if type is not None:
        sql += " AND type = ?"
        params.append(type)
    return bool(conn.execute(sql + ")", params).fetchone()[0])


def get_event(conn: sqlite3.Connection, run_id: str, seq: int) -> EventRow | None:
    """One event with its full payload, or ``None``."""
    row = conn.execute(
        "SELECT seq, type, payload, length(payload), idempotency_key, created_at"
        " FROM events WHERE run_id = ? AND seq = ?",
        (run_id, seq),
    ).fetchone()
    return None if row is None else EventRow(*row)


def event_types(conn: sqlite3.Connection, run_id: str) -> tuple[str, ...]:
    """The event types a run's timeline can be filtered by. Every type is offered: finding
    which ones a run has would need an index that each append would pay for."""
    return tuple(t.value for t in EventType)


def iter_events(
    conn: sqlite3.Connection, run_id: str, *, after: int = -1, page: int = 500
) -> Iterator[EventRow]:
    """Every event after ``after``, fetched page by page (full payloads)."""
    while True:
        batch = list_events(conn, run_id, after=after, limit=page).events
        yield from batch
        if len(batch) < page:
            return
        after = batch[-1].seq


def list_steps(conn: sqlite3.Connection, run_id: str, *, limit: int | None = None) -> tuple[StepRow, ...]:
    """The run's durable steps by start time (the first ``limit``; all by default)."""
    rows = conn.execute(
        "SELECT name, status, epoch, result, started_at, completed_at"
        " FROM steps WHERE run_id = ? ORDER BY started_at, name LIMIT ?",
        (run_id, -1 if limit is None else limit),
    )
    return tuple(StepRow(*row) for row in rows)


def list_timers(conn: sqlite3.Connection, run_id: str, *, limit: int | None = None) -> tuple[TimerRow, ...]:
    """The run's durable timers by wake time (the first ``limit``; all by default)."""
    rows = conn.execute(
        "SELECT name, wake_at, created_at, completed_at"
        " FROM timers WHERE run_id = ? ORDER BY wake_at, name LIMIT ?",
        (run_id, -1 if limit is None else limit),
    )
    return tuple(TimerRow(*row) for row in rows)


# --------------------------------------------------------------------------- JSON views


def json_value(text: str | None) -> Any:
    """Decode a stored JSON column; text that is not JSON is returned as the string itself."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def run_to_json(run: RunDetail | RunSummary) -> dict[str, Any]:
    """A JSON-ready dict of a run (``config`` decoded, children as ids)."""
    data = attrs.asdict(run, recurse=False)
    if isinstance(run, RunDetail):
        data["config"] = json_value(run.config)
        data["children"] = [child.id for child in run.children]
    return data


def event_to_json(run_id: str, event: EventRow) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "seq": event.seq,
        "type": event.type,
        "payload": json_value(event.payload),
        "idempotency_key": event.idempotency_key,
        "created_at": event.created_at,
    }


def checkpoint_to_json(run_id: str, checkpoint: CheckpointRow) -> dict[str, Any]:
    data = attrs.asdict(checkpoint)
    data["run_id"] = run_id
    data["state"] = json_value(checkpoint.state)
    data["verification"] = json_value(checkpoint.verification)
    return data


def step_to_json(run_id: str, step: StepRow) -> dict[str, Any]:
    data = attrs.asdict(step)
    data["run_id"] = run_id
    data["result"] = json_value(step.result)
    return data


def timer_to_json(run_id: str, timer: TimerRow) -> dict[str, Any]:
    data = attrs.asdict(timer)
    data["run_id"] = run_id
    return data
