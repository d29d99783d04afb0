"""Retention: deleting ended runs with everything of theirs, a bounded batch per transaction.

See docs/retention.md for the policy. The rules this module keeps:

- **Whole or gone.** One batch is one operation, in one transaction: every row of every run in
  it is deleted (each table named in :data:`RUN_TABLES`, explicitly, so the counts are exact
  and nothing depends on a cascade), or nothing is. A crash mid-prune leaves no half run, so no
  step result, signal key or event of a deleted run can outlive it and be found again by a run
  of the same id (the failure of an interrupted garbage collection that replayed old results).
- **Families together.** Runs are related by a parent (``parent_run_id``), a fork's source
  (``forked_from``), a shared child (``shared_children``), a join (``joins``) and a message
  (``messages``). A *family* is every run reachable over those relations; it is deleted only
  when every member is ended, with a status asked for, ended before the cutoff and not among
  the runs kept. So no live run ever loses a parent, a child, a source or a shared child.
- **Nothing live refers to it.** On PostgreSQL the relations are read again after the
  family's rows are locked (``FOR UPDATE SKIP LOCKED``, which also passes over a run whose row
  a concurrent write holds or is inserting a reference to), and a family that grew since is
  left alone. On SQLite a batch reads in one snapshot, and SQLite refuses its first write if
  another connection committed since (zincir/_sqlite/_bulk.py): what it deletes is what it read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Final

import attrs

from ._content import sweep_content
from ._tx import Tx
from ._types import SweptContent

__all__ = [
    "BEFORE_EVERYTHING",
    "ENDED",
    "RUN_TABLES",
    "Bound",
    "PruneBatch",
    "PruneSpec",
    "oldest_kept",
    "prune_batch",
    "sweep_pruned",
]

ENDED: Final = ("completed", "failed", "cancelled")
"""The statuses a run ends in."""

RUN_TABLES: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("stream_chunks", ("run_id",)),
    ("streams", ("run_id",)),
    ("waits", ("run_id",)),  # before signals: a wait names the signal it received
    ("signals", ("run_id",)),
    ("events", ("run_id",)),
    ("tool_intents", ("run_id",)),
    ("checkpoints", ("run_id",)),
    ("steps", ("run_id",)),
    ("timers", ("run_id",)),
    ("messages", ("from_run_id", "to_run_id")),
    ("approvals", ("run_id",)),
    ("joins", ("run_id", "child_id")),
    ("budgets", ("run_id",)),
    ("tool_call_counts", ("run_id",)),
    ("outsider_actions", ("run_id",)),
    ("run_waits", ("run_id",)),
    ("run_waiters", ("run_id",)),  # PostgreSQL only (Dialect.end_waiters)
    ("shared_children", ("run_id", "child_id")),
    ("payload_refs", ("run_id",)),  # the parts themselves go in the sweep after the batches
    ("run_keys", ("run_id",)),
    ("agent_runs", ("id",)),  # last, children before their parents
)
"""Every table that holds a run's rows, in the order a batch deletes them, with the columns
that name the run. tests/test_prune.py fails when the schema has a table that is neither here
nor known to hold no run's rows: a new run-keyed table must be added here."""

Bound = tuple[int, str]
"""A place in the order runs ended: (``updated_at``, ``id``)."""

BEFORE_EVERYTHING: Final[Bound] = (-(2**63), "")
"""The :data:`Bound` before every run."""


@attrs.frozen
class PruneSpec:
    """What a prune deletes: runs with one of ``statuses`` that ended before ``upper`` (an
    exclusive bound in (updated_at, id) order: the cutoff, or the oldest run kept by
    ``keep_latest`` if that comes first), in batches of about ``batch_size`` runs."""

    statuses: tuple[str, ...]
    upper: Bound
    batch_size: int
    dry_run: bool = False


@attrs.frozen
class PruneBatch:
    """What one batch did (or, for a dry run, would do)."""

    runs: tuple[str, ...]
    """The runs deleted."""
    rows: dict[str, int]
    """Rows deleted per table."""
    kept: tuple[str, ...]
    """Runs old enough, left because their family has a member that is live, too recent, of
    another status, or being written right now."""
    cursor: Bound | None
    """Where the next batch starts; None: there is nothing more to prune."""
    exhausted: frozenset[str] = frozenset()
    """The statuses with no run left to look at before ``spec.upper``: later batches skip them
    (before PostgreSQL 18 an index scan does not stop at a row comparison's end, so each look
    would read every later run of that status)."""


def prune_batch(
    tx: Tx, spec: PruneSpec, after: Bound, seen: AbstractSet[str], exhausted: frozenset[str] = frozenset()
) -> PruneBatch:
    """Delete the next batch of prunable runs after ``after`` (in the order they ended), each
    with all its family and all their rows; runs in ``seen`` were judged already and are
    passed over, and so are the statuses ``exhausted`` (a previous batch's). A dry run deletes
    nothing and counts the rows it would."""
    candidates, exhausted = _candidates(tx, spec, after, exhausted)
    cursor = candidates[-1] if len(candidates) >= spec.batch_size else None
    fresh = [run for _, run in candidates if run not in seen]
    fresh_set = set(fresh)
    if not fresh:
        return PruneBatch((), {}, (), cursor, exhausted)
    edges = _relations(tx, fresh)
    families = _families(fresh, edges)
    rows = _member_rows(tx, sorted({run for family in families for run in family}), lock=False)
    doomed, kept = _judged(families, rows, spec)
    if doomed and not spec.dry_run and tx.dialect.row_locks:
        # Only the families that look deletable are locked (a live member's row never is),
        # then judged again: a row held elsewhere, or a run that came back to life meanwhile
        # (retry_now), keeps its family.
        rows.update(_member_rows(tx, doomed, lock=True))
        doomed_set = set(doomed)
        doomed, held = _judged([family for family in families if family & doomed_set], rows, spec)
        kept += held
        doomed, grown = _still_closed(tx, doomed, edges)
        kept += grown
    if spec.dry_run:
        counted = _count_rows(tx, doomed)
    else:
        counted = _delete(tx, _children_first(doomed, rows))
        if doomed:
            _reclaim_space(tx)
    old_enough = [run for run in kept if run in fresh_set or _ended_in_range(run, rows.get(run), spec)]
    return PruneBatch(tuple(doomed), counted, tuple(old_enough), cursor, exhausted)


def oldest_kept(tx: Tx, statuses: tuple[str, ...], keep: int) -> Bound:
    """The oldest of the ``keep`` runs of ``statuses`` that ended last: nothing from it on is
    pruned (when fewer ended, they are all kept: the bound is before everything)."""
    latest: list[Bound] = []
    for status in statuses:
        rows = tx.all(
            "SELECT updated_at, id FROM agent_runs WHERE status = ?"
            " ORDER BY updated_at DESC, id DESC LIMIT ?",
            (status, keep),
        )
        latest += [(row[0], row[1]) for row in rows]
    latest.sort(reverse=True)
    return latest[keep - 1] if len(latest) >= keep else BEFORE_EVERYTHING


def _judged(
    families: list[set[str]], rows: dict[str, Member], spec: PruneSpec
) -> tuple[list[str], list[str]]:
    """The runs of the families to delete, and those of the families to keep."""
    doomed: list[str] = []
    kept: list[str] = []
    for family in families:
        present = sorted(run for run in family if run in rows)  # a fork's source may be gone
        (doomed if _prunable(present, rows, spec) else kept).extend(present)
    return doomed, kept


def _candidates(
    tx: Tx, spec: PruneSpec, after: Bound, exhausted: frozenset[str] = frozenset()
) -> tuple[list[Bound], frozenset[str]]:
    """The next ``batch_size`` runs of the statuses asked for that ended after ``after`` and
    before ``spec.upper``, in the order they ended: one range of idx_agent_runs_status_activity
    per status, merged here (one query over several statuses would sort every match).

    The range's two ends are spelled as whole keys of the index, (status, updated_at, id), both
    with the same status: so PostgreSQL's generic plan of the prepared statement, which does
    not know the status, still seeks the index. With ``status = ?`` and two pairs it walked
    idx_agent_runs_activity from the cursor's instant and sorted every run that ended then.
    Also returns the statuses now known to have nothing left: ``exhausted``, and those that
    found fewer runs than asked for, all of them in this batch (a run that ends from now on
    ends after the cutoff)."""
    found: dict[str, list[Bound]] = {}
    (low_ms, low_id), (high_ms, high_id) = after, spec.upper
    for status in spec.statuses:
        if status not in exhausted:
            found[status] = [
                (row[1], row[0])
                for row in tx.all(
                    "SELECT id, updated_at FROM agent_runs"
                    " WHERE (status, updated_at, id) > (?, ?, ?) AND (status, updated_at, id) < (?, ?, ?)"
                    " ORDER BY status, updated_at, id LIMIT ?",
                    (status, low_ms, low_id, status, high_ms, high_id, spec.batch_size),
                )
            ]
    batch = sorted(run for runs in found.values() for run in runs)[: spec.batch_size]
    done = {
        status
        for status, runs in found.items()
        if len(runs) < spec.batch_size and (not runs or runs[-1] <= batch[-1])
    }
    return batch, exhausted | done


_RELATED: Final = (
    # (table, column, column): a row relates the runs its two columns name
    ("agent_runs", "id", "parent_run_id"),
    ("agent_runs", "id", "forked_from"),
    ("shared_children", "run_id", "child_id"),
    ("joins", "run_id", "child_id"),
    ("messages", "from_run_id", "to_run_id"),
)
_RELATIONS: Final = tuple(
    # (SQL of the pairs of related runs where the run looked at is ``{}``, the column looked at):
    # each relation from both sides (a run without a parent or a source relates to nothing)
    (f"SELECT {a}, {b} FROM {table} WHERE {{}} AND {other} IS NOT NULL", seen)
    for table, a, b in _RELATED
    for seen, other in ((a, b), (b, a))
)


def _relations(tx: Tx, start: Sequence[str]) -> set[tuple[str, str]]:
    """Every relation (a pair of run ids) of the runs reachable from ``start``."""
    edges: set[tuple[str, str]] = set()
    known, frontier = set(start), list(start)
    while frontier:
        found = _relations_of(tx, frontier)
        edges |= found
        frontier = sorted({run for pair in found for run in pair} - known)
        known.update(frontier)
    return edges


def _relations_of(tx: Tx, runs: Sequence[str]) -> set[tuple[str, str]]:
    """The relations in which one of ``runs`` takes part (all statements sent, then read)."""
    replies = []
    for part in tx.dialect.chunks(runs):
        for sql, column in _RELATIONS:
            where, params = tx.dialect.any_of(column, part)
            replies.append(tx.send(sql.format(where), params))
    return {(row[0], row[1]) for reply in replies for row in reply.all()}


def _families(runs: Iterable[str], edges: Iterable[tuple[str, str]]) -> list[set[str]]:
    """``runs`` and every run related to them, as the families they fall into (the
    connected parts of the relations)."""
    parent: dict[str, str] = {}

    def root(run: str) -> str:
        parent.setdefault(run, run)
        while parent[run] != run:
            parent[run] = parent[parent[run]]
            run = parent[run]
        return run

    for a, b in edges:
        parent[root(a)] = root(b)
    grouped: dict[str, set[str]] = {}
    for run in runs:
        grouped.setdefault(root(run), set())
    for run in list(parent):
        family = grouped.get(root(run))
        if family is not None:
            family.add(run)
    for key, family in grouped.items():
        family.add(key)
    return list(grouped.values())


Member = tuple[str, int, str | None] | None
"""A run's (status, updated_at, parent_run_id); None: a concurrent transaction holds its row."""


def _member_rows(tx: Tx, runs: Sequence[str], *, lock: bool) -> dict[str, Member]:
    """Each run's :data:`Member` row, locked with ``lock`` (PostgreSQL, which passes over a row
    held elsewhere: that run's is None). A run that does not exist (a fork's deleted source)
    is left out."""
    found: dict[str, Member] = {}
    hold = tx.dialect.delete_skip_locked if lock else ""
    for part in tx.dialect.chunks(runs):
        where, params = tx.dialect.any_of("id", part)
        sql = f"SELECT id, status, updated_at, parent_run_id FROM agent_runs WHERE {where}{hold}"
        for row in tx.all(sql, params):
            found[row[0]] = (row[1], row[2], row[3])
        if hold:
            for run in _existing(tx, [run for run in part if run not in found]):
                found[run] = None
    return found


def _existing(tx: Tx, runs: Sequence[str]) -> list[str]:
    if not runs:
        return []
    where, params = tx.dialect.any_of("id", runs)
    return [row[0] for row in tx.all(f"SELECT id FROM agent_runs WHERE {where}", params)]


def _ended_in_range(run: str, row: Member, spec: PruneSpec) -> bool:
    """Whether the run, by itself, is one to prune: ended with a status asked for, before the bound."""
    return row is not None and row[0] in spec.statuses and (row[1], run) < spec.upper


def _prunable(family: Sequence[str], rows: dict[str, Member], spec: PruneSpec) -> bool:
    """Whether every member of the family is one to prune, none held by a concurrent transaction."""
    return all(_ended_in_range(run, rows[run], spec) for run in family)


def _still_closed(tx: Tx, doomed: list[str], edges: set[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """``doomed`` split in the runs whose families have no relation now, with their rows
    locked, that they had not when they were read, and those of families that grew meanwhile
    (a fork created between the two reads, say): those are left."""
    new = _relations_of(tx, doomed) - edges
    doomed_set = set(doomed)
    outside = {run for pair in new for run in pair} - doomed_set
    if not outside:
        return doomed, []
    grown = [family for family in _families(doomed, edges | new) if family & outside]
    left = {run for family in grown for run in family} & doomed_set
    return [run for run in doomed if run not in left], sorted(left)


def _delete(tx: Tx, runs: list[str]) -> dict[str, int]:
    """Delete every row of ``runs`` (whole families, children before parents), table by
    table; rows deleted per table."""
    holding = _holding(tx, runs)
    return _per_table(
        tx,
        runs,
        lambda table, where, params: (
            tx.count(f"DELETE FROM {table} WHERE {where}", params) if table in holding else 0
        ),
    )


def _holding(tx: Tx, runs: list[str]) -> set[str]:
    """The tables that hold a row of ``runs``. On SQLite, read in one statement before the
    batch's first write: a batch takes the file's one write lock only at its first write
    (zincir/_sqlite/_bulk.py), and a table it finds empty needs no DELETE under it; what the
    batch read still holds when it writes, or SQLite refuses the write. On PostgreSQL, every
    table: the batch's locks are on its runs' rows, not on the other tables."""
    tables = _tables(tx)
    if tx.dialect.row_locks:
        return {table for table, _ in tables}
    found: set[str] = set()
    for part in tx.dialect.chunks(runs):
        probes: list[str] = []
        params: list[Any] = []
        for table, columns in tables:
            where, values = _naming(tx, columns, part)
            probes.append(f"SELECT '{table}' WHERE EXISTS (SELECT 1 FROM {table} WHERE {where})")
            params += values
        found.update(row[0] for row in tx.all(" UNION ALL ".join(probes), tuple(params)))
    return found


def _count_rows(tx: Tx, runs: list[str]) -> dict[str, int]:
    """What :func:`_delete` would delete: rows per table (a dry run)."""
    return _per_table(
        tx,
        runs,
        lambda table, where, params: int(tx.one(f"SELECT count(*) FROM {table} WHERE {where}", params)[0]),
    )


def _per_table(
    tx: Tx, runs: list[str], rows_where: Callable[[str, str, tuple[Any, ...]], int]
) -> dict[str, int]:
    """``rows_where(table, where, params)`` summed per table of :data:`RUN_TABLES`, ``where``
    naming a chunk of ``runs`` in the table's run columns."""
    if not runs:
        return {}
    return {
        table: sum(rows_where(table, *_naming(tx, columns, part)) for part in tx.dialect.chunks(runs))
        for table, columns in _tables(tx)
    }


def _tables(tx: Tx) -> list[tuple[str, tuple[str, ...]]]:
    """:data:`RUN_TABLES` as this backend has them."""
    return [(t, c) for t, c in RUN_TABLES if t != "run_waiters" or tx.dialect.end_waiters]


def _naming(tx: Tx, columns: Sequence[str], runs: Sequence[str]) -> tuple[str, tuple[Any, ...]]:
    """SQL that a row names one of ``runs`` in one of ``columns``, and its parameters."""
    wheres: list[str] = []
    params: list[Any] = []
    for column in columns:
        where, values = tx.dialect.any_of(column, runs)
        wheres.append(where)
        params += values
    return " OR ".join(wheres), tuple(params)


def _children_first(runs: list[str], rows: dict[str, Member]) -> list[str]:
    """``runs`` ordered so that a child comes before its parent, so that no statement (on
    SQLite, a chunk of at most 500 runs) deletes a parent whose child is still there: the
    parent is the one relation between runs that is a foreign key."""
    depth: dict[str, int] = {}

    def depth_of(run: str) -> int:
        if run not in depth:
            depth[run] = 0  # a cycle cannot be stored, but never loop on one
            row = rows.get(run)
            parent = None if row is None else row[2]
            depth[run] = 0 if parent is None or parent not in rows else depth_of(parent) + 1
        return depth[run]

    return sorted(runs, key=lambda run: -depth_of(run))


def sweep_pruned(tx: Tx, limit: int = 1000) -> SweptContent:
    """Delete up to ``limit`` stored parts that only deleted runs referred to (the content
    store's sweep, in its own transaction after the batches: it waits for writers storing
    parts, which a batch holding row locks must not), and give their pages back."""
    swept = sweep_content(tx, limit)
    if swept.parts:
        _reclaim_space(tx)
    return swept


_INCREMENTAL: Final = 2  # PRAGMA auto_vacuum's value for incremental


def _reclaim_space(tx: Tx) -> None:
    """Give the pages the batch freed back to the file system (SQLite with incremental
    auto-vacuum, what a database zincir created has: docs/retention.md); nothing elsewhere."""
    if not tx.dialect.reclaim_space or tx.one("PRAGMA auto_vacuum")[0] != _INCREMENTAL:
        return  # a file of an older zincir keeps its free pages until `zincir vacuum`
    # Python's sqlite3 steps a statement that returns no rows once, and each step of
    # incremental_vacuum frees one page: so it is run once per free page.
    for _ in range(tx.one("PRAGMA freelist_count")[0]):
        tx.execute("PRAGMA incremental_vacuum")
