"""Runs: the runs list with its counts per status, one run in detail, and its family.

Every read is bounded: the list is one keyset page by activity, the counts stop at a cap,
children come one page at a time, and a family tree is as deep and wide as asked.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from .._errors import InvalidArgument, RunNotFound
from .._payloads import cut_texts, resolved
from .._sql import Dialect
from .._types import EventType
from ._connect import Reader
from ._keys import RUN_STATUSES, RunCursor, check_cursor, check_limit, check_status, parse_run_id
from ._values import (
    Int,
    OptInt,
    as_int,
    as_opt_int,
    as_opt_text,
    as_size,
    as_text,
    json_columns,
    json_value,
    name_column,
    raw_value,
    was_cut,
    where_sql,
)

__all__ = [
    "CHILD_COUNT_CAP",
    "STATUS_COUNT_CAP",
    "FamilyNode",
    "Fork",
    "RunDetail",
    "RunPage",
    "RunSummary",
    "count_runs",
    "end_reason",
    "family_tree",
    "get_run",
    "list_runs",
]


#: Children are counted up to this many (the count walks an index); more shows as "10,000+".
CHILD_COUNT_CAP: Final = 10_000
#: Runs are counted per status up to this many, so the runs page costs the same with a million
#: runs (each count walks the status index); more shows as "10,000+".
STATUS_COUNT_CAP: Final = 10_000


@attrs.frozen
class RunSummary:
    """One line of the runs list. ``event_count`` is ``last_seq + 1`` (the log is gap-free)."""

    id: str
    parent_run_id: str | None
    role: str
    provider: str
    status: str
    created_at: Int
    updated_at: Int
    event_count: Int
    lease_owner: str | None
    lease_expires_at: OptInt
    attempts: Int
    version: str | None = None
    """The version of the agent the run belongs to (None: none, or a database from before
    versions were stored)."""
    raw_id: object = attrs.field(default=None, eq=False, repr=False)

    @property
    def cursor(self) -> RunCursor:
        """This run's position in the runs list (by activity)."""
        return RunCursor(raw_value(self.updated_at), self.raw_id)

    @property
    def child_cursor(self) -> RunCursor:
        """This run's position among its parent's children (by creation)."""
        return RunCursor(raw_value(self.created_at), self.raw_id)


def _summary_columns(conn: Reader) -> str:
    return _summary_sql(conn.dialect, has_versions(conn))


def has_versions(conn: Reader) -> bool:
    """Whether runs have versions here (schema version 13 and later)."""
    return conn.has_column("agent_runs", "version")


@functools.cache
def _summary_sql(d: Dialect, versions: bool) -> str:
    return (
        f"{name_column('id')}, {name_column('parent_run_id')}, {name_column('role')},"
        f" {name_column('provider')}, {name_column('status')},"
        f" {d.int_column('created_at')}, {d.int_column('updated_at')}, {d.event_count()},"
        f" {name_column('lease_owner')}, {d.int_column('lease_expires_at')}, {d.int_column('attempts')},"
        f" {name_column('version') if versions else 'NULL'}"
    )


_SUMMARY_WIDTH: Final = 12
"""How many columns :func:`_summary_columns` reads."""


def _summary(row: Sequence[Any]) -> RunSummary:
    """The run a row read by :func:`_summary_columns` describes."""
    return RunSummary(
        id=as_text(row[0]),
        parent_run_id=as_opt_text(row[1]),
        role=as_text(row[2]),
        provider=as_text(row[3]),
        status=as_text(row[4]),
        created_at=as_int(row[5]),
        updated_at=as_int(row[6]),
        event_count=as_int(row[7]),
        lease_owner=as_opt_text(row[8]),
        lease_expires_at=as_opt_int(row[9]),
        attempts=as_int(row[10]),
        version=as_opt_text(row[11]),
        raw_id=row[0],
    )


@attrs.frozen
class RunPage:
    """A page of runs plus the counts per status (under the role filter, not the status one).

    ``counts`` has every status of :data:`RUN_STATUSES`, and ``other`` when rows carry a
    status zincir does not write. A status in ``capped`` has more runs than its count (see
    :data:`STATUS_COUNT_CAP`).
    """

    runs: tuple[RunSummary, ...]
    counts: Mapping[str, int]
    capped: frozenset[str]
    has_newer: bool
    has_older: bool

    @property
    def total(self) -> int:
        """All the runs counted: a lower bound when :attr:`capped` is not empty."""
        return sum(self.counts.values())


@attrs.frozen
class Fork:
    """A fork of a run (docs/forks.md): the fork, and the last seq of the run it copied."""

    run: RunSummary
    fork_seq: OptInt


@attrs.frozen(kw_only=True)
class RunDetail(RunSummary):
    """One run with its lease, resume-worker bookkeeping and family links: its summary's
    fields, and these.

    ``config`` is the stored JSON text, possibly cut to a prefix (``config_truncated``);
    ``result`` likewise, the JSON the run completed with (``complete(result=...)``), or None
    (not completed, or a database from before results were stored).
    ``children`` holds one page of child runs; ``children_next`` continues after it;
    ``children_total`` counts them all, up to :data:`CHILD_COUNT_CAP` (``children_capped``
    says the real number is larger).
    """

    config: str
    config_size: int
    config_truncated: bool
    lease_epoch: Int
    next_attempt_at: OptInt
    """When a worker may claim it; None for a suspended run that only an outsider's write
    (a signal, a decision) makes due."""
    children: tuple[RunSummary, ...]
    children_total: int
    children_capped: bool = False
    children_next: RunCursor | None = None
    result: str | None = None
    result_size: int = 0
    result_truncated: bool = False
    forked_from: str | None = None
    """The run this one is a fork of (docs/forks.md), or None."""
    fork_seq: OptInt = None
    """The last seq of ``forked_from`` that the fork copied."""
    forks: tuple[Fork, ...] = ()
    """The first of its forks, by creation (``forks_more``: it has others)."""
    forks_more: bool = False
    fingerprints: str | None = None
    """The stored JSON of what shaped the run ({"prompt": "<sha>", ...}), or None."""
    erased_at: OptInt = None
    """When ``zincir.erase_run`` deleted the run's key (its payloads read as erased), or None."""


NO_VERSION: Final = ""
"""The ``version`` filter that selects the runs without a version (no version is empty)."""


def _filters(
    conn: Reader, status: str | None, role: str | None, version: str | None
) -> tuple[list[str], list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if status is not None:
        clauses.append("status = ?")
        params.append(status)
    if role is not None:
        clauses.append("role = ?")
        params.append(role)
    if version is not None:
        if not has_versions(conn):  # before versions were stored: every run had none
            clauses.append("1 = 1" if version == NO_VERSION else "1 = 0")
        elif version == NO_VERSION:
            clauses.append("version IS NULL")
        else:
            clauses.append("version = ?")
            params.append(version)
    return clauses, params


def list_runs(
    conn: Reader,
    *,
    status: str | None = None,
    role: str | None = None,
    limit: int = 50,
    before: RunCursor | None = None,
    after: RunCursor | None = None,
    version: str | None = None,
) -> RunPage:
    """Runs by newest activity (``updated_at`` desc, then id desc), one keyset page.

    ``before`` continues to older runs, ``after`` goes back to newer ones; at most one of
    them. ``version`` keeps the runs of one version (:data:`NO_VERSION`: those without one).
    Counts per status honour the role and version filters only, so the status tabs stay useful.
    """
    check_status(status)
    check_limit(limit)
    if version is not None and not isinstance(version, str):
        raise InvalidArgument(f"version must be a string, not {version!r}")
    if before is not None and after is not None:
        raise InvalidArgument("give at most one of before= and after= to page through runs")
    check_cursor(conn, before)
    check_cursor(conn, after)
    clauses, params = _filters(conn, status, role, version)
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
    counts, capped = count_runs(conn, role=role, version=version)
    return RunPage(runs, counts, capped, has_newer, has_older)


def _runs_page(
    conn: Reader,
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
        params += [cursor.key, cursor.id]
    sql = (
        f"SELECT {_summary_columns(conn)} FROM agent_runs {where_sql(clauses)}"
        f" ORDER BY updated_at {order}, id {order} LIMIT ?"
    )
    return [_summary(row) for row in conn.execute(sql, [*params, limit])]


def _runs_exist(conn: Reader, clauses: list[str], params: list[Any], cursor: RunCursor, op: str) -> bool:
    where = where_sql([*clauses, f"(updated_at, id) {op} (?, ?)"])
    order = "DESC" if "<" in op else "ASC"  # the nearest one in index order (see _events_exist)
    sql = f"SELECT 1 FROM agent_runs {where} ORDER BY updated_at {order}, id {order} LIMIT 1"
    return conn.execute(sql, [*params, cursor.key, cursor.id]).fetchone() is not None


_KNOWN_STATUSES: Final = ", ".join(f"'{status}'" for status in RUN_STATUSES)
NAMED_STATUS: Final = f"CASE WHEN status IN ({_KNOWN_STATUSES}) THEN status END AS named"
"""A run's status if zincir writes it, else NULL (``other``), told apart in SQL."""


def count_runs(
    conn: Reader, *, role: str | None = None, version: str | None = None
) -> tuple[dict[str, int], frozenset[str]]:
    """Runs per status (every status present, zero included; ``other`` if any), and the
    statuses whose count stopped at :data:`STATUS_COUNT_CAP` (none with a role or version
    filter)."""
    counts = dict.fromkeys(RUN_STATUSES, 0)
    if role is not None or version is not None:
        # No index covers the role (nor the version of an ended run), and walking the status
        # index with a row lookup per entry is ~10x slower than one table scan: count them all
        # in that scan. Statuses are told apart in SQL (exact comparison: no stored value is
        # read back).
        clauses, values = _filters(conn, None, role, version)
        table = conn.dialect.unindexed("agent_runs")
        sql = f"SELECT {NAMED_STATUS}, count(*) FROM {table} {where_sql(clauses)} GROUP BY named"
        for status, count in conn.execute(sql, values):
            name = "other" if status is None else as_text(status)
            counts[name] = counts.get(name, 0) + as_size(count)
        return counts, frozenset()
    capped = set()
    for name, ranges, params in _status_ranges():
        # One index range per branch (an OR of ranges makes SQLite walk the whole index).
        found = " UNION ALL ".join(f"SELECT 1 FROM agent_runs WHERE {where}" for where in ranges)
        sql = f"SELECT count(*) FROM ({found} LIMIT ?) AS found"
        count = as_size(conn.execute(sql, (*params, STATUS_COUNT_CAP + 1)).fetchone()[0])
        if count or name != "other":
            counts[name] = min(count, STATUS_COUNT_CAP)
        if count > STATUS_COUNT_CAP:
            capped.add(name)
    return counts, frozenset(capped)


@functools.cache
def _status_ranges() -> tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]:
    """Each status zincir writes as one point of the status index, and ``other`` as the gaps
    around them (and NULL): every walk reads only the entries it counts, and no stored value is
    read back, so a hostile status (any type, any length, not UTF-8) costs nothing extra. In
    SQLite's order numbers sort before every text and BLOBs after, so they fall in the gaps."""
    known = sorted(RUN_STATUSES)
    gaps, bounds = ["status IS NULL", "status < ?"], [known[0]]
    for low, high in itertools.pairwise(known):
        gaps.append("(status > ? AND status < ?)")
        bounds += [low, high]
    gaps.append("status > ?")
    bounds.append(known[-1])
    points = [(status, ("status = ?",), (status,)) for status in RUN_STATUSES]
    return (*points, ("other", tuple(gaps), tuple(bounds)))


def get_run(
    conn: Reader,
    run_id: str,
    *,
    children_limit: int = 100,
    children_after: RunCursor | None = None,
    max_config_chars: int | None = None,
    max_result_chars: int | None = None,
    forks_limit: int = 20,
) -> RunDetail:
    """One run with its lease fields and one keyset page of its children (by creation).

    ``children_after`` continues the children after a :attr:`RunSummary.child_cursor`.
    ``children_limit=0`` skips the family (``children_total`` is then 0).
    ``max_config_chars`` and ``max_result_chars`` cut the stored configuration and result to
    a prefix. ``forks_limit`` forks are listed (0: none). Raises
    :class:`InvalidArgument` for a malformed id, :class:`RunNotFound` for an unknown one.
    """
    run_id = parse_run_id(run_id)
    check_cursor(conn, children_after)
    d = conn.dialect
    stored = conn.has_column("agent_runs", "result")  # schema version 4 and later
    result_columns = json_columns("result", max_result_chars) if stored else "NULL, 0"
    forked = conn.has_column("agent_runs", "forked_from")  # schema version 11 and later
    fork_columns = f"{name_column('forked_from')}, {d.int_column('fork_seq')}" if forked else "NULL, NULL"
    marks_sql = json_columns("fingerprints", None) if has_versions(conn) else "NULL, 0"  # a few hashes
    erased_sql = (  # schema version 16 and later
        "(SELECT erased_at FROM run_keys WHERE run_id = agent_runs.id)"
        if conn.has_table("run_keys")
        else "NULL"
    )
    row = conn.execute(
        f"SELECT {_summary_columns(conn)}, {json_columns('config', max_config_chars)},"
        f" {d.int_column('lease_epoch')}, {d.int_column('next_attempt_at')}, {result_columns}, {marks_sql},"
        f" {fork_columns}, {erased_sql} FROM agent_runs WHERE id = ?",
        (run_id,),
    ).fetchone()
    if row is None:
        raise RunNotFound(f"run {run_id} not found")
    at = _SUMMARY_WIDTH
    row = cut_texts(conn, cut_texts(conn, [row], (at,), max_config_chars), (at + 4,), max_result_chars)[0]
    children, more = (
        _children(conn, run_id, children_limit, children_after) if children_limit > 0 else ((), False)
    )
    total, capped = len(children), False
    if more or children_after is not None:
        counted = _count_children(conn, run_id, CHILD_COUNT_CAP + 1)
        total, capped = min(counted, CHILD_COUNT_CAP), counted > CHILD_COUNT_CAP
    (
        config,
        config_size,
        lease_epoch,
        next_attempt_at,
        result,
        result_size,
        marks,
        _,
        forked_from,
        fork_seq,
        erased_at,
    ) = row[_SUMMARY_WIDTH:]
    forks, forks_more = _forks(conn, run_id, forks_limit) if forked and forks_limit > 0 else ((), False)
    return RunDetail(
        **attrs.asdict(_summary(row), recurse=False),
        config=as_text(config),
        config_size=as_size(config_size),
        config_truncated=was_cut(max_config_chars, as_size(config_size)),
        lease_epoch=as_int(lease_epoch),
        next_attempt_at=as_opt_int(next_attempt_at),
        children=children,
        children_total=total,
        children_capped=capped,
        children_next=children[-1].child_cursor if more and children else None,
        result=as_opt_text(result),
        result_size=as_size(result_size),
        result_truncated=result is not None and was_cut(max_result_chars, as_size(result_size)),
        forked_from=as_opt_text(forked_from),
        fork_seq=as_opt_int(fork_seq),
        forks=forks,
        erased_at=as_opt_int(erased_at),
        forks_more=forks_more,
        fingerprints=as_opt_text(marks),
    )


def end_reason(conn: Reader, run_id: str, status: str) -> str | None:
    """Why a failed or cancelled run ended, as its final state transition records it (the
    reason given to ``fail()``, the last error when its attempts ran out, a cancellation's
    reason); None for a run in any other status, or a log without one."""
    if status not in ("failed", "cancelled"):
        return None
    # Its last state transition, found walking its log back from the newest event (an ended
    # run's log ends with it): one row of the (run_id, seq) index, whatever the log's length.
    row = conn.execute(
        "SELECT payload FROM events WHERE run_id = ? AND type = ? ORDER BY seq DESC LIMIT 1",
        (run_id, EventType.STATE_TRANSITION.value),
    ).fetchone()
    transition = None if row is None else json_value(as_opt_text(resolved(conn, [row], (0,))[0][0]))
    if not isinstance(transition, dict) or transition.get("to") != status:
        return None
    reason = transition.get("reason")
    return reason if isinstance(reason, str) else None


def _forks(conn: Reader, run_id: str, limit: int) -> tuple[tuple[Fork, ...], bool]:
    # idx_agent_runs_forks (forked_from, created_at, id) serves both the filter and the order.
    d = conn.dialect
    rows = conn.execute(
        f"SELECT {_summary_columns(conn)}, {d.int_column('fork_seq')} FROM agent_runs WHERE forked_from = ?"
        " ORDER BY created_at, id LIMIT ?",
        (run_id, limit + 1),
    )
    found = [Fork(_summary(row), as_opt_int(row[-1])) for row in rows]
    return tuple(found[:limit]), len(found) > limit


def _children(
    conn: Reader, run_id: str, limit: int, after: RunCursor | None
) -> tuple[tuple[RunSummary, ...], bool]:
    # idx_agent_runs_parent (parent_run_id, created_at, id) serves both the filter and the order.
    sql = f"SELECT {_summary_columns(conn)} FROM agent_runs WHERE parent_run_id = ?"
    params: list[Any] = [run_id]
    if after is not None:
        sql += " AND (created_at, id) > (?, ?)"
        params += [after.key, after.id]
    rows = [_summary(r) for r in conn.execute(sql + " ORDER BY created_at, id LIMIT ?", [*params, limit + 1])]
    return tuple(rows[:limit]), len(rows) > limit


@attrs.frozen
class FamilyNode:
    """A run and (some of) its descendants: ``children`` holds at most the first ``per_node``
    by creation, ``more`` counts the others; below ``depth`` levels ``more`` counts them all."""

    run: RunSummary
    children: tuple[FamilyNode, ...]
    more: int


def family_tree(
    conn: Reader, run_id: str, *, depth: int = 20, per_node: int = 50
) -> tuple[tuple[RunSummary, ...], FamilyNode]:
    """The run's ancestors (root first) and the tree of its descendants, ``depth`` levels deep
    and ``per_node`` children wide at most: each level is one indexed read per run shown."""
    run_id = parse_run_id(run_id)
    columns = _summary_columns(conn)
    row = conn.execute(f"SELECT {columns} FROM agent_runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        raise RunNotFound(f"run {run_id} not found")
    top = _summary(row)
    ancestors: list[RunSummary] = []
    seen = {top.id}
    parent = top.parent_run_id
    while parent is not None and parent not in seen and len(ancestors) < MAX_ANCESTORS:
        found = conn.execute(f"SELECT {columns} FROM agent_runs WHERE id = ?", (parent,)).fetchone()
        if found is None:
            break
        seen.add(parent)
        ancestors.append(_summary(found))
        parent = ancestors[-1].parent_run_id
    return tuple(reversed(ancestors)), _subtree(conn, top, depth, per_node)


MAX_ANCESTORS: Final = 100


def _subtree(conn: Reader, run: RunSummary, depth: int, per_node: int) -> FamilyNode:
    if depth <= 0:
        return FamilyNode(run, (), _count_children(conn, run.id))
    children, more = _children(conn, run.id, per_node, None)
    extra = _count_children(conn, run.id) - len(children) if more else 0
    return FamilyNode(run, tuple(_subtree(conn, c, depth - 1, per_node) for c in children), extra)


def _count_children(conn: Reader, run_id: str, cap: int = CHILD_COUNT_CAP) -> int:
    """The run's children, counted up to ``cap`` (the count walks an index)."""
    return as_size(
        conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM agent_runs WHERE parent_run_id = ? LIMIT ?) AS children",
            (run_id, cap),
        ).fetchone()[0]
    )
