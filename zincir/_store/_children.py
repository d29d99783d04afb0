"""Child runs: spawning them (once per name) and joining them (once each, logged).

Each operation sends its statements for every child before it reads any answer: on
PostgreSQL a batch of a hundred children costs the same round trips as one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .._errors import InvalidArgument
from .._json import dump_trusted as _dump
from .._payloads import refer, resolved, stored_unreferenced
from .._rows import RUN_COLUMNS, RUN_JSON, to_run
from .._types import EventType, RunRecord
from ._budgets import insert_budget
from ._tx import Reply, Tx
from ._types import JoinOutcome, Lease, NewChild


def spawn_children(tx: Tx, lease: Lease, children: Sequence[NewChild]) -> list[str]:
    """Create each child, in order, as a pending, unleased run, once per name: a repeat (after
    a restart) returns the first child's id, and so does a name a fork shares with its source
    (``shared_children``: docs/forks.md). Logs ``child_spawned`` for each new one. One lease
    check for the lot. Fenced."""
    tx.fence(lease)
    parent_id = lease.run_id
    # The configs' parts are referenced by the children that are new (a repeated spawn writes no row).
    configs = [stored_unreferenced(tx, child.config_json, child.child_id) for child in children]
    inserts = [
        tx.send(insert_child_sql(":now"), insert_child_params(child, parent_id, config))
        for child, (config, _) in zip(children, configs, strict=True)
    ]
    ids: dict[str, str] = {}
    for child, insert, (_, parts) in zip(children, inserts, configs, strict=True):
        if insert.count():  # new: logged in the order asked for
            ids[child.name] = child.child_id
            refer(tx, child.child_id, parts)
            event = _dump({"child_id": child.child_id, "name": child.name, "role": child.role})
            tx.log(parent_id, EventType.CHILD_SPAWNED, event, f"spawn:{child.name}")
            if child.budget is not None:  # the child's own, whatever its parent spends
                insert_budget(tx, child.child_id, child.budget)
    if ids:
        tx.wake(claimable=True)
    repeated = [child.name for child in children if child.name not in ids]
    for names in tx.dialect.chunks(repeated):  # spawned before, under these names
        among, params = tx.dialect.any_of("spawn_name", names)
        found = tx.all(
            f"SELECT spawn_name, id FROM agent_runs WHERE parent_run_id = ? AND {among} UNION ALL"
            f" SELECT spawn_name, child_id FROM shared_children WHERE run_id = ? AND {among}",
            (parent_id, *params, parent_id, *params),
        )
        ids.update(found)
    return [ids[child.name] for child in children]


def insert_child_sql(now: str, source: str = "") -> str:
    """The insert of a new child as a pending run, unless its name is taken (spawned before, or a
    child its fork shares): ``now`` the clock's expression, ``source`` the FROM that gives it."""
    return (
        "INSERT INTO agent_runs (id, parent_run_id, role, provider, status, config, created_at,"
        " updated_at, next_attempt_at, spawn_name, version, fingerprints, traceparent)"
        f" SELECT ?, ?, ?, ?, 'pending', ?, {now}, {now}, {now}, ?, {INHERITED}, ?{source}"
        f" WHERE NOT EXISTS ({SHARED_CHILD})"
        " ON CONFLICT (parent_run_id, spawn_name) WHERE spawn_name IS NOT NULL DO NOTHING"
    )


def insert_child_params(child: NewChild, parent_id: str, config: str) -> tuple[object, ...]:
    """:func:`insert_child_sql`'s parameters (``config``: the stored config)."""
    return (
        *(child.child_id, parent_id, child.role, child.provider),
        *(config, child.name),
        *inherited_params(child, parent_id),
        child.traceparent,
        *(parent_id, child.name),
    )


SHARED_CHILD = "SELECT child_id FROM shared_children WHERE run_id = ? AND spawn_name = ?"
"""The child a fork shares with its source under a spawn name (params: the fork, the name)."""


INHERITED = (
    "coalesce(?, (SELECT version FROM agent_runs WHERE id = ?)),"
    " coalesce(?, (SELECT fingerprints FROM agent_runs WHERE id = ?))"
)
"""A child's version and fingerprints: its own if given, else its parent's (as the parent's
row has them now: the parent's lease holds, so nobody moves it meanwhile)."""


def inherited_params(child: NewChild, parent_id: str) -> tuple[str | None, ...]:
    """:data:`INHERITED`'s parameters."""
    return (child.version, parent_id, child.fingerprints_json, parent_id)


Look = Callable[[Tx, str, str, "int | None"], Reply]
"""Record a join and read it with the child (:func:`look`): the child's RUN_COLUMNS, whether
the run shares it with its source (a fork: docs/forks.md), then the join's deadline,
completed_at and timed_out (None: no such run)."""
Mark = Callable[[Tx, str, str, EventType, str, bool], None]
"""Record that a join ended (:func:`mark`): the parent, the child, the event, its payload,
and whether it timed out."""


def await_child(
    tx: Tx,
    lease: Lease,
    child_id: str,
    timeout_ms: int | None,
    *,
    look: Look | None = None,
    mark: Mark | None = None,
) -> JoinOutcome:
    """Record the join (its deadline on the first call); once the child has ended, log
    ``child_joined`` and return it; time out past the deadline. Fenced; InvalidArgument (not
    a child of this run). ``look`` and ``mark``: a backend's own statements for the two steps."""
    tx.fence(lease)
    looked = (look or _look)(tx, lease.run_id, child_id, timeout_ms)
    return _judge(tx, lease.run_id, child_id, looked, mark or _mark)


def join_children(
    tx: Tx, lease: Lease, child_ids: Sequence[str], *, look: Look | None = None, mark: Mark | None = None
) -> list[RunRecord | None]:
    """:func:`await_child` with no deadline for each, with one lease check: each child's record
    if it has ended (``child_joined`` logged the first time), else None (still running, or a
    join of it timed out before: :func:`await_child` says which). Fenced; InvalidArgument."""
    tx.fence(lease)
    looks = [(look or _look)(tx, lease.run_id, child_id, None) for child_id in child_ids]
    return [
        _judge(tx, lease.run_id, c, found, mark or _mark).child
        for c, found in zip(child_ids, looks, strict=True)
    ]


CHILD_COLUMNS = ", ".join(f"c.{column.strip()}" for column in RUN_COLUMNS.split(","))
"""The child's RUN_COLUMNS, of ``agent_runs AS c``."""


def _look(tx: Tx, parent_id: str, child_id: str, timeout_ms: int | None) -> Reply:
    """Record the join (of a child of the run, or one it shares, only: another run's gets no
    record) and read the child with it."""
    tx.execute(
        "INSERT INTO joins (run_id, child_id, deadline, created_at) SELECT ?, id, :now + ?, :now"
        f" FROM agent_runs WHERE id = ? AND (parent_run_id = ? OR EXISTS ({SHARES}))"
        " ON CONFLICT (run_id, child_id) DO NOTHING",
        (parent_id, timeout_ms, child_id, parent_id, parent_id, child_id),
    )
    return tx.send(
        f"SELECT {CHILD_COLUMNS}, EXISTS ({SHARES}), j.deadline, j.completed_at, j.timed_out"
        " FROM agent_runs AS c LEFT JOIN joins AS j ON j.run_id = ? AND j.child_id = c.id WHERE c.id = ?",
        (parent_id, child_id, parent_id, child_id),
    )


SHARES = "SELECT 1 FROM shared_children WHERE run_id = ? AND child_id = ?"
"""Whether a fork shares a child with its source (params: the fork, the child)."""


def _judge(tx: Tx, parent_id: str, child_id: str, look: Reply, mark: Mark) -> JoinOutcome:
    """What the look found: log the end (or the timeout) the first time it is seen."""
    found = look.one()
    child = None if found is None else to_run(resolved(tx, [found[:-4]], RUN_JSON)[0])
    if child is None or (child.parent_run_id != parent_id and not found[-4]):
        raise InvalidArgument(f"run {parent_id}: {child_id} is not a child of this run")
    deadline, completed_at, timed_out = found[-3:]
    if timed_out:
        return JoinOutcome("timed_out")
    if completed_at is not None:
        return JoinOutcome("ended", child)
    if child.status.is_terminal:
        event = _dump({"child_id": child_id, "result": child.result, "status": child.status.value})
        mark(tx, parent_id, child_id, EventType.CHILD_JOINED, event, False)
        return JoinOutcome("ended", child)
    if deadline is not None and deadline <= tx.now:
        event = _dump({"child_id": child_id, "deadline": deadline, "name": f"join:{child_id}"})
        mark(tx, parent_id, child_id, EventType.WAIT_TIMED_OUT, event, True)
        return JoinOutcome("timed_out")
    return JoinOutcome("pending", remaining_ms=None if deadline is None else deadline - tx.now)


def _mark(tx: Tx, parent_id: str, child_id: str, type: EventType, payload_json: str, timed_out: bool) -> None:
    ended = ", timed_out = 1" if timed_out else ""
    tx.execute(
        f"UPDATE joins SET completed_at = :now{ended} WHERE run_id = ? AND child_id = ?",
        (parent_id, child_id),
    )
    tx.log(parent_id, type, payload_json, f"join:{child_id}")


def ended_children(tx: Tx, child_ids: Sequence[str]) -> set[str]:
    """Those of ``child_ids`` that have ended (a read, for a nursery's joins)."""
    ended: set[str] = set()
    for chunk in tx.dialect.chunks(child_ids):
        among, params = tx.dialect.any_of("id", chunk)
        found = tx.all(
            f"SELECT id FROM agent_runs WHERE {among} AND status IN ('completed', 'failed', 'cancelled')",
            params,
        )
        ended.update(str(row[0]) for row in found)
    return ended


def child_ready(tx: Tx, run_id: str, child_id: str) -> bool:
    """Whether await_child would now decide (a cheap read, for polling)."""
    row = tx.one(
        "SELECT 1 FROM agent_runs WHERE id = ? AND status IN ('completed', 'failed', 'cancelled')"
        " UNION ALL SELECT 1 FROM joins WHERE run_id = ? AND child_id = ? AND deadline <= :now LIMIT 1",
        (child_id, run_id, child_id),
    )
    return row is not None
