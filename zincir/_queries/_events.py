"""A run's event log, read a page at a time in ``seq`` order, forward or backward.

A page is one index range read, with a bounded scan when filtered by type (no index covers
the type: every append would pay for one). Payloads can be cut to a prefix per event and per
page, so a run with a million events, or one huge payload, costs one bounded page.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import attrs

from .._errors import InvalidArgument
from .._payloads import cut_texts
from .._sql import Cursor, Dialect
from .._types import EventType
from ._connect import Reader
from ._keys import DEFAULT_PAGE, LATEST, check_key, check_limit, comparable
from ._values import (
    MAX_INT,
    MIN_INT,
    Int,
    as_int,
    as_opt_text,
    as_size,
    as_text,
    json_columns,
    name_column,
    raw_value,
    was_cut,
    where_sql,
)

__all__ = [
    "SCAN_WINDOW",
    "EventPage",
    "EventRow",
    "event_row",
    "event_sql",
    "event_types",
    "get_event",
    "iter_events",
    "list_events",
]


#: A type filter looks at most this many events past its cursor per page (there is no index
#: on the event type: every append would pay for one).
SCAN_WINDOW: Final = 20_000


@attrs.frozen
class EventRow:
    """One event. ``payload`` is the stored JSON text, possibly cut to a prefix.

    ``payload_size`` is the stored length in characters; ``truncated`` says whether
    ``payload`` is only its beginning (then it is usually not valid JSON by itself).
    """

    seq: Int
    type: str
    payload: str
    payload_size: int
    idempotency_key: str | None
    created_at: Int
    truncated: bool = False


@attrs.frozen
class EventPage:
    """A page of events in ``seq`` order, and whether more exist on either side.

    ``next_after`` is the ``after=`` that continues forward (set when ``has_after``) and
    ``prev_before`` the ``before=`` that continues backward (set when ``has_before``, or
    ``None`` when only the first page can be offered). ``scan_edge`` is set when a type filter
    stopped at :data:`SCAN_WINDOW` events without filling the page: the scan reached that seq,
    and the page's cursor continues the scan from there.
    """

    events: tuple[EventRow, ...]
    has_before: bool
    has_after: bool
    next_after: object = None
    prev_before: object = None
    scan_edge: object = None


def event_sql(d: Dialect, max_payload_chars: int | None) -> str:
    """The ``SELECT`` of an event's columns, bounded, for :func:`event_row`."""
    return (
        f"SELECT {d.int_column('seq')}, {name_column('type')}, {json_columns('payload', max_payload_chars)},"
        f" {name_column('idempotency_key')}, {d.int_column('created_at')} FROM events"
    )


def event_row(row: Sequence[Any], max_payload_chars: int | None) -> EventRow:
    """An event read by :func:`event_sql`, normalised."""
    size = as_size(row[3])
    return EventRow(
        seq=as_int(row[0]),
        type=as_text(row[1]),
        payload=as_text(row[2]),
        payload_size=size,
        idempotency_key=as_opt_text(row[4]),
        created_at=as_int(row[5]),
        truncated=was_cut(max_payload_chars, size),
    )


def list_events(
    conn: Reader,
    run_id: str,
    *,
    after: object = None,
    before: object = None,
    limit: int = DEFAULT_PAGE,
    type: str | None = None,
    max_payload_chars: int | None = None,
    max_chars_total: int | None = None,
) -> EventPage:
    """One page of a run's events in ``seq`` order.

    ``after=s`` returns the first ``limit`` events with seq > s (the default is the start
    of the log); ``before=s`` returns the last ``limit`` events with seq < s, and
    ``before=LATEST`` the last page. Cursors are stored values (see :func:`decode_key`).

    ``type`` filters by event type. No index covers the type (each append would pay for it),
    so the filter looks at no more than :data:`SCAN_WINDOW` events past the cursor: a page cut
    that way has ``scan_edge`` set, and its cursor continues the scan.

    ``max_payload_chars`` cuts each payload to a prefix (see :attr:`EventRow.truncated`);
    ``max_chars_total`` ends the page early once the payloads add up to that many characters
    (at least one event is always returned).
    """
    check_limit(limit)
    if after is not None and before is not None:
        raise InvalidArgument("give at most one of after= and before= to page through events")
    d = conn.dialect
    check_key(conn, after, int, "after")
    if before is not LATEST:
        check_key(conn, before, int, "before")
    descending = before is not None
    order = "DESC" if descending else "ASC"
    clauses = ["run_id = ?"]
    params: list[Any] = [run_id]
    if descending and before is not LATEST:
        clauses.append("seq < ?")
        params.append(before)
    elif after is not None:
        clauses.append("seq > ?")
        params.append(after)
    scan_edge: object = None
    if type is not None:
        edge = conn.execute(
            f"SELECT {d.int_column('seq')} FROM events {where_sql(clauses)} ORDER BY seq {order}"
            f" LIMIT 1 OFFSET {SCAN_WINDOW - 1}",
            params,
        ).fetchone()
        if edge is not None:
            scan_edge = edge[0]
            clauses.append("seq >= ?" if descending else "seq <= ?")
            params.append(scan_edge)
        clauses.append("type = ?")
        params.append(type)
    sql = f"{event_sql(d, max_payload_chars)} {where_sql(clauses)} ORDER BY seq {order} LIMIT ?"
    rows, more = _collect(
        conn, conn.execute(sql, [*params, limit + 1]), limit, max_payload_chars, max_chars_total
    )
    if descending:
        rows.reverse()
        page = _backward_page(conn, run_id, rows, more, before, scan_edge)
        if type is not None and before is LATEST:
            # Nothing of the type comes after the log's end: events of other types after the
            # last one shown would only lead "Next" to an empty page.
            page = attrs.evolve(page, has_after=False, next_after=None)
        return page
    page = _forward_page(conn, run_id, rows, more, after, scan_edge)
    if type is not None and after is None:
        # The scan started at the log's start and found nothing of the type before this page's
        # first event: earlier events of other types give "Previous" nothing to show.
        page = attrs.evolve(page, has_before=False, prev_before=None)
    return page


def _collect(
    conn: Reader, cursor: Cursor, limit: int, max_payload_chars: int | None, max_chars_total: int | None
) -> tuple[list[EventRow], bool]:
    rows: list[EventRow] = []
    used, more = 0, False
    try:
        raws = list(itertools.islice(cursor, limit + 1))
    finally:
        cursor.close()
    for raw in cut_texts(conn, raws, (2,), max_payload_chars):
        if len(rows) == limit:
            more = True
            break
        row = event_row(raw, max_payload_chars)
        if max_chars_total is not None and rows and used + len(row.payload) > max_chars_total:
            more = True
            break
        used += len(row.payload)
        rows.append(row)
    return rows, more


def _forward_page(
    conn: Reader, run_id: str, rows: list[EventRow], more: bool, after: object, scan_edge: object
) -> EventPage:
    has_after = more or scan_edge is not None
    next_after = raw_value(rows[-1].seq) if more else scan_edge
    has_before, prev_before = _behind(conn, run_id, rows, 0, "<", after, None, _successor)
    return EventPage(
        tuple(rows), has_before, has_after, next_after, prev_before if has_before else None, scan_edge
    )


def _backward_page(
    conn: Reader, run_id: str, rows: list[EventRow], more: bool, before: object, scan_edge: object
) -> EventPage:
    # The mirror of _forward_page, before and after swapped (the few lines that name them).
    has_before = more or scan_edge is not None
    prev_before = raw_value(rows[0].seq) if more else scan_edge
    has_after, next_after = _behind(conn, run_id, rows, -1, ">", before, LATEST, _predecessor)
    return EventPage(
        tuple(rows), has_before, has_after, next_after if has_after else None, prev_before, scan_edge
    )


def _behind(
    conn: Reader,
    run_id: str,
    rows: list[EventRow],
    edge: int,
    op: str,
    cursor: object,
    no_cursor: object,
    past: Callable[[object], object],
) -> tuple[bool, object]:
    """Whether the log has events behind a page, the way it was not read (``op``: ``<`` or
    ``>``), and the cursor that reads them: behind its row on that side (``rows[edge]``), or,
    for an empty page, behind its own ``cursor`` (inclusive; ``no_cursor``: the page began at
    the log's edge, so nothing is behind it)."""
    if rows:
        seq = raw_value(rows[edge].seq)
        return _events_exist(conn, run_id, op, seq), seq
    return cursor is not no_cursor and _events_exist(conn, run_id, op + "=", cursor), past(cursor)


def _successor(value: object) -> object:
    """The ``before=`` that includes ``value`` itself, when there is one."""
    if type(value) is int:
        return value + 1 if value < MAX_INT else LATEST
    return None


def _predecessor(value: object) -> object:
    """The ``after=`` that includes ``value`` itself, when there is one."""
    if type(value) is int:
        return value - 1 if value > MIN_INT else None
    return None


def _events_exist(conn: Reader, run_id: str, op: str, seq: object) -> bool:
    # The nearest such event in index order, not EXISTS: PostgreSQL plans an EXISTS as a scan
    # that stops at the first match, which reads the whole table when there is none.
    order = "DESC" if "<" in op else "ASC"
    sql = f"SELECT 1 FROM events WHERE run_id = ? AND seq {op} ? ORDER BY seq {order} LIMIT 1"
    return conn.execute(sql, (run_id, seq)).fetchone() is not None


def get_event(conn: Reader, run_id: str, seq: object) -> EventRow | None:
    """One event with its full payload, or ``None``."""
    d = conn.dialect
    if not comparable(d, seq, int):
        return None
    row = conn.execute(event_sql(d, None) + " WHERE run_id = ? AND seq = ?", (run_id, seq)).fetchone()
    return None if row is None else event_row(cut_texts(conn, [row], (2,), None)[0], None)


def event_types(conn: Reader, run_id: str) -> tuple[str, ...]:
    """The event types a run's timeline can be filtered by. Every type is offered: finding
    which ones a run has would need an index that each append would pay for."""
    return tuple(t.value for t in EventType)


def iter_events(conn: Reader, run_id: str, *, after: object = -1, page: int = 500) -> Iterator[EventRow]:
    """Every event after ``after``, fetched page by page (full payloads)."""
    while True:
        batch = list_events(conn, run_id, after=after, limit=page)
        yield from batch.events
        if not batch.has_after or batch.next_after == after:
            return
        after = batch.next_after
