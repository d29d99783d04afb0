"""Bounded reads the agent view needs beyond :mod:`zincir._queries` (same SQL on both backends).

Every read here is keyed by the run and bounded: a call lookup by primary key for the calls
shown on one page, the latest ``limit`` events' seq, type and time (no payload but for the
rare kinds a timeline marks), and the run's waits, approvals and joins up to ``limit``.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from .. import _queries as q
from .._payloads import cut_texts, shown_text
from .._queries import Int, OptInt, Reader
from .._queries._events import event_row, event_sql
from .._queries._progress import open_state, start_marks
from .._queries._values import as_int, as_opt_int, as_opt_text, as_text, name_column

#: Event types whose payload the timeline reads (restarts, verdicts, limits, timeouts).
MARKED_TYPES = (
    "attempt_failed",
    "lease_taken_over",
    "budget_exceeded",
    "loop_detected",
    "no_progress",
    "wait_timed_out",
)
MARK_PAYLOAD_CHARS = 2000


@attrs.frozen
class CallOutcome:
    """A tool intent and what is known of it, with its result event when it has one."""

    call_id: str
    name: str
    state: str  # done / started, outcome unknown / never started / pending
    started: int | None
    last_started_at: OptInt
    intent_seq: Int
    response_seq: Int
    result: q.EventRow | None


def call_outcomes(
    conn: Reader, run_id: str, call_ids: Iterable[str], *, max_chars: int | None
) -> dict[str, CallOutcome]:
    """The intents of ``call_ids`` (looked up by primary key) and their results' events."""
    ids = sorted(set(call_ids))
    if not ids:
        return {}
    d = conn.dialect
    rows = list(
        conn.execute(
            f"SELECT {name_column('call_id')}, {name_column('name')}, {d.int_column('intent_seq')},"
            f" {d.int_column('response_seq')}, {d.int_column('result_seq')}, {start_marks(conn)}"
            f" FROM tool_intents WHERE run_id = ? AND call_id IN ({', '.join('?' * len(ids))})",
            [run_id, *ids],
        )
    )
    result_seqs = [r[4] for r in rows if r[4] is not None]
    results: dict[object, q.EventRow] = {}
    if result_seqs:
        found = conn.execute(
            event_sql(d, max_chars) + f" WHERE run_id = ? AND seq IN ({', '.join('?' * len(result_seqs))})",
            [run_id, *result_seqs],
        )
        for row in found:
            event = event_row(row, max_chars)
            results[event.seq] = event
    outcomes = {}
    for call_id, name, intent_seq, response_seq, result_seq, count, last in rows:
        state = "done" if result_seq is not None else open_state(count)
        outcomes[as_text(call_id)] = CallOutcome(
            as_text(call_id),
            as_text(name),
            state,
            count if type(count) is int else None,
            as_opt_int(last),
            as_int(intent_seq),
            as_int(response_seq),
            None if result_seq is None else results.get(as_int(result_seq)),
        )
    return outcomes


#: Event types that say an owner's attempt ended and another began: a result recorded after
#: one came from the new owner (its tool, or its reconcile probe), not from the call's turn.
RESTART_TYPES = ("attempt_failed", "attempt_lost", "lease_taken_over")


@attrs.frozen
class Restarts:
    """The restarts logged after ``after``, known up to seq ``known_until`` (the scan's end)."""

    seqs: tuple[int, ...]
    known_until: int

    def between(self, first: object, last: object) -> bool | None:
        """Whether a restart lies between seqs ``first`` and ``last``; None: not known."""
        if type(first) is not int or type(last) is not int or last > self.known_until:
            return None
        return any(first < seq < last for seq in self.seqs)


def restarts_after(conn: Reader, run_id: str, after: int, upto: int, window: int) -> Restarts:
    """The restart events of seqs ``after`` < seq <= ``upto``, scanning ``window`` events at
    most (by primary key; each row's seq and type only)."""
    if upto <= after:
        return Restarts((), upto)
    d = conn.dialect
    rows = list(
        conn.execute(
            f"SELECT {d.int_column('seq')}, {name_column('type')} FROM events WHERE run_id = ? AND seq > ?"
            " AND seq <= ? ORDER BY seq LIMIT ?",
            (run_id, after, upto, window),
        )
    )
    seqs = tuple(seq for seq, kind in rows if type(seq) is int and kind in RESTART_TYPES)
    scanned = [seq for seq, _ in rows if type(seq) is int]
    known = upto if len(rows) < window else (scanned[-1] if scanned else after)
    return Restarts(seqs, known)


@attrs.frozen
class Mark:
    """One event as the timeline sees it; ``payload`` only for :data:`MARKED_TYPES`."""

    seq: Int
    type: str
    at: Int
    payload: str | None


def latest_events(conn: Reader, run_id: str, limit: int) -> tuple[tuple[Mark, ...], bool]:
    """The run's latest ``limit`` events in seq order, and whether earlier ones exist."""
    d = conn.dialect
    kinds = ", ".join(f"'{t}'" for t in MARKED_TYPES)
    rows = list(
        conn.execute(
            f"SELECT {d.int_column('seq')}, {name_column('type')}, {d.int_column('created_at')},"
            f" CASE WHEN type IN ({kinds}) THEN {shown_text('payload', MARK_PAYLOAD_CHARS)} END, 0"
            " FROM events WHERE run_id = ? ORDER BY seq DESC LIMIT ?",
            (run_id, limit + 1),
        )
    )
    rows = cut_texts(conn, rows, (3,), MARK_PAYLOAD_CHARS)  # a payload stored in parts, joined
    marks = [Mark(as_int(r[0]), as_text(r[1]), as_int(r[2]), as_opt_text(r[3])) for r in rows[:limit]]
    return tuple(reversed(marks)), len(rows) > limit


@attrs.frozen
class Intent:
    call_id: str
    name: str
    intent_seq: Int
    result_seq: OptInt
    last_started_at: OptInt


def intents_since(conn: Reader, run_id: str, seq: object, limit: int) -> tuple[Intent, ...]:
    """The run's tool intents from ``seq`` on (the timeline's window), ``limit`` at most."""
    d = conn.dialect
    last = d.int_column("last_started_at") if conn.has_column("tool_intents", "started") else "NULL"
    rows = conn.execute(
        f"SELECT {name_column('call_id')}, {name_column('name')}, {d.int_column('intent_seq')},"
        f" {d.int_column('result_seq')}, {last} FROM tool_intents WHERE run_id = ? AND intent_seq >= ?"
        " ORDER BY intent_seq LIMIT ?",
        (run_id, seq if type(seq) is int else 0, limit),
    )
    return tuple(
        Intent(as_text(c), as_text(n), as_int(i), as_opt_int(r), as_opt_int(s)) for c, n, i, r, s in rows
    )


@attrs.frozen
class WaitSpan:
    """A wait, approval request or join of a run, open or closed."""

    kind: str  # signal / approval / child
    name: str
    target: str
    since: Int
    until: OptInt  # the deadline
    ended: OptInt  # when it was answered (None: still open)
    timed_out: bool


def wait_spans(conn: Reader, run_id: str, limit: int) -> tuple[WaitSpan, ...]:
    """The run's waits, approval requests and joins (``limit`` of each at most), oldest first."""
    d = conn.dialect
    parts: list[str] = []
    if conn.has_table("waits"):
        parts.append(
            f"SELECT 'signal', {name_column('name')}, {name_column('topic')}, {d.int_column('created_at')},"
            f" {d.int_column('deadline')}, {d.int_column('completed_at')}, timed_out"
            " FROM waits WHERE run_id = ?"
        )
        parts.append(
            f"SELECT 'approval', {name_column('call_id')}, {name_column('tool_name')},"
            f" {d.int_column('requested_at')}, {d.int_column('deadline')}, {d.int_column('decided_at')},"
            " timed_out FROM approvals WHERE run_id = ?"
        )
    if conn.has_table("joins"):
        parts.append(
            f"SELECT 'child', {name_column('child_id')}, '', {d.int_column('created_at')},"
            f" {d.int_column('deadline')}, {d.int_column('completed_at')}, timed_out"
            " FROM joins WHERE run_id = ?"
        )
    spans: list[WaitSpan] = []
    for part in parts:
        for kind, name, target, since, until, ended, timed_out in conn.execute(
            f"{part} LIMIT ?", (run_id, limit)
        ):
            spans.append(
                WaitSpan(
                    kind,
                    as_text(name),
                    as_text(target),
                    as_int(since),
                    as_opt_int(until),
                    as_opt_int(ended),
                    bool(timed_out),
                )
            )
    return tuple(sorted(spans, key=lambda s: s.since if type(s.since) is int else 0))


@attrs.frozen
class Activity:
    """Runs counted by status and by bucket of last activity, between ``oldest`` and
    ``newest`` (the ``limit`` most recently active runs at most)."""

    oldest: int
    newest: int
    buckets: int
    counts: tuple[tuple[str, int, int], ...]  # status, bucket (0 = oldest), runs


# The last activity the chart places: from 1970 to the last millisecond of year 9999 (what a
# date can show). A run outside it (a corrupt or hand-written row, such as the largest int64)
# is left out: placing it would stretch the chart over millennia, and its distance from the
# others overflows 64-bit arithmetic.
_ACTIVITY_RANGE = "updated_at BETWEEN 0 AND 253402300799999"


def activity(conn: Reader, limit: int, buckets: int) -> Activity | None:
    """Three indexed reads on ``updated_at``: the newest, the ``limit``-th newest, and the
    runs since then grouped in SQL over the (status, updated_at) index, so the cost is the
    same with a million runs. Only runs whose last activity a date can show count (see
    _ACTIVITY_RANGE; a TEXT or BLOB in ``updated_at``, which SQLite orders after every
    number, is left out by the same bound)."""
    numeric = _ACTIVITY_RANGE
    newest = conn.execute(
        f"SELECT updated_at FROM agent_runs WHERE {numeric} ORDER BY updated_at DESC LIMIT 1"
    ).fetchone()
    if newest is None:
        return None
    edge = conn.execute(
        f"SELECT updated_at FROM agent_runs WHERE {numeric} ORDER BY updated_at DESC LIMIT 1 OFFSET ?",
        (limit - 1,),
    ).fetchone()
    if edge is None:
        edge = conn.execute(
            f"SELECT updated_at FROM agent_runs WHERE {numeric} ORDER BY updated_at LIMIT 1"
        ).fetchone()
    oldest, last = int(edge[0]), int(newest[0])
    span = max(last - oldest + 1, 60_000)
    statuses = ", ".join(f"'{s}'" for s in q.RUN_STATUSES)
    rows = conn.execute(
        f"SELECT status, (updated_at - ?) * ? / ?, count(*) FROM agent_runs"
        f" WHERE status IN ({statuses}) AND updated_at >= ? AND {numeric} GROUP BY 1, 2",
        (oldest, buckets, span, oldest),
    )
    counts = tuple((as_text(st), min(int(b), buckets - 1), int(n)) for st, b, n in rows)
    return Activity(oldest, oldest + span - 1, buckets, counts)


def neighbour_rounds(conn: Reader, run_id: str, round: object) -> tuple[object, object, object]:
    """Around checkpoint ``round``: the accepted round it builds on (None: the original goal),
    and the rounds just before and after it (None at either end). Three indexed reads."""
    d = conn.dialect
    if type(round) is not int:
        return None, None, None
    builds = conn.execute(
        f"SELECT {d.int_column('round')} FROM checkpoints WHERE run_id = ? AND status = 'accepted'"
        " AND round < ? ORDER BY round DESC LIMIT 1",
        (run_id, round),
    ).fetchone()
    column = f"SELECT {d.int_column('round')} FROM checkpoints WHERE run_id = ?"
    before = conn.execute(f"{column} AND round < ? ORDER BY round DESC LIMIT 1", (run_id, round)).fetchone()
    after = conn.execute(f"{column} AND round > ? ORDER BY round LIMIT 1", (run_id, round)).fetchone()
    return (
        None if builds is None else as_int(builds[0]),
        None if before is None else as_int(before[0]),
        None if after is None else as_int(after[0]),
    )
