"""Leases: taking a run (a new one, an existing one, the due ones a worker claims), keeping
it, suspending it, and letting it go again after a backoff (or at once, when an outsider asks).

A claim reads ``agent_runs`` by the claimable index, most overdue first. On PostgreSQL its rows
are taken ``SKIP LOCKED``, so that workers claiming at once split the due runs between them,
and a run whose end has to wait for a busy descendant is left for a later claim
(``tx.unless_busy``) while the others are claimed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from .._budget import judge
from .._errors import RunLeased, RunNotFound, RunTerminal, RunWaiting, VersionMismatch
from .._json import dump_trusted as _dump
from .._owner import Owner, Verdict, gone_holders, this_process
from .._owner import judge as judge_holder
from .._payloads import refer, stored_unreferenced, texts
from .._types import EventType, RunStatus
from ._budgets import WALL_END, budget_usage, insert_budget, wall_end
from ._calls import close_unanswered
from ._ends import cancel_requested, cancel_unowned, fail_exhausted
from ._log import insert_event
from ._tx import LIVE, Tx, lease_held, lock_live_run
from ._types import (
    Awaited,
    Claims,
    Lease,
    LostAttempt,
    OpenWait,
    WaitKind,
    earliest,
    exhausted_reason,
    lost_attempt,
    suspension_payload,
)
from ._versions import NOT_ENDED, VERSION_INDEX, Versions, inherited, one_version, served, shown
from ._waits import signal_ready

# -- taking a lease ---------------------------------------------------------------------------


def create_run(
    tx: Tx,
    run_id: str,
    parent_run_id: str | None,
    role: str,
    provider: str,
    config_json: str,
    owner: str,
    ttl_ms: int,
    budget: tuple[Any, ...] | None = None,
    version: str | None = None,
    fingerprints_json: str | None = None,
    traceparent: str | None = None,
) -> Lease:
    """Insert a run already leased and running, with its first event, its budget's limits (in
    LIMIT_COLUMNS order) and the trace context its spans continue. ``version`` and
    ``fingerprints_json`` (None: the parent's, if it has a parent) are the run's for good,
    unless moved (set_version). RunNotFound (parent)."""
    if parent_run_id is not None:
        parents = inherited(tx, parent_run_id)
        if parents is None:
            raise RunNotFound(f"parent run {parent_run_id} does not exist")
        version = parents[0] if version is None else version
        fingerprints_json = parents[1] if fingerprints_json is None else fingerprints_json
    expires_at = tx.now + ttl_ms
    config, parts = stored_unreferenced(tx, config_json, run_id)
    tx.execute(
        "INSERT INTO agent_runs (id, parent_run_id, role, provider, status, config, created_at,"
        " updated_at, last_seq, lease_owner, lease_epoch, lease_expires_at, next_attempt_at, lease_host,"
        " lease_pid, lease_process_start, version, fingerprints, traceparent)"
        " VALUES (?, ?, ?, ?, 'running', ?, :now, :now, 0, ?, 1, ?, :now, ?, ?, ?, ?, ?, ?)",
        (
            *(run_id, parent_run_id, role, provider, config, owner, expires_at),
            *(*this_process().as_row(), version, fingerprints_json, traceparent),
        ),
    )
    refer(tx, run_id, parts)
    insert_event(tx, run_id, 0, EventType.STATE_TRANSITION, '{"from":"pending","to":"running"}')
    ends_at = None
    if budget is not None:
        insert_budget(tx, run_id, budget)
        ends_at = wall_end(tx, run_id)
    return Lease(
        run_id, owner, 1, ttl_ms, expires_at, ends_at,
        config_json=config_json, version=version, role=role, provider=provider, traceparent=traceparent,
    )  # fmt: skip


_LEASE_ROW = "lease_owner, lease_epoch, lease_expires_at, lease_host, lease_pid, lease_process_start"
"""The columns that say who held a lease, for :func:`lost_attempt`."""

_CLAIM_COLUMNS = (
    f"id, status, attempts, cancel_reason, {WALL_END}, config, version, role, provider, traceparent,"
    f" model_call_seq, {_LEASE_ROW}"
)
"""What taking a run needs to know of it, read by the statement that finds it."""


@attrs.frozen
class _Claim:
    """A run about to be leased, as the statement that found it read it (_CLAIM_COLUMNS)."""

    run_id: str
    status: str
    attempts: int
    cancel_reason: str | None
    wall_end: int | None
    config_json: str
    version: str | None
    role: str
    provider: str
    traceparent: str | None
    model_call_seq: int | None
    """The run's open model-call mark: the call an earlier attempt left in flight."""
    lease_row: Sequence[Any]

    @classmethod
    def of(cls, row: Sequence[Any]) -> _Claim:
        return cls(*row[:11], lease_row=row[11:])  # type: ignore[misc]

    @property
    def epoch(self) -> int:
        return int(self.lease_row[1])


def acquire_run(
    tx: Tx, run_id: str, owner: str, ttl_ms: int, force: bool, version: str | None = None
) -> Lease | None:
    """Take a free or expired lease (any, with ``force``); start a pending run. None: the run
    had a cancellation request nobody acted on, and it was cancelled now. ``version``: the
    version of the code that asks (None: any); a run of another is VersionMismatch, before
    anything is written. RunNotFound, RunTerminal, RunLeased."""
    row = tx.lock_run(run_id, _CLAIM_COLUMNS)
    if row is None:
        raise RunNotFound(f"run {run_id} does not exist")
    claim = _Claim.of(row)
    lease_owner, epoch, expires_at, *holder = claim.lease_row
    if claim.status not in LIVE:
        raise RunTerminal(f"run {run_id} is {claim.status}; a terminal run cannot be leased")
    if version is not None and claim.version != version:
        raise VersionMismatch(
            f"run {run_id} belongs to version {shown(claim.version)}, not {version!r}: resume it with"
            " code of its version, or move it on purpose with zincir.set_version()"
        )
    if lease_held(lease_owner, expires_at, tx.now) and not force:
        verdict = judge_holder(Owner(*holder))
        if not verdict.at_once:
            raise RunLeased(_still_leased(run_id, epoch, expires_at - tx.now, verdict))
    lost = lost_attempt(tx.now, claim.lease_row, claim.attempts, forced=force)
    if claim.cancel_reason is not None:
        cancel_unowned(tx, run_id, claim.status, claim.cancel_reason, lost)
        return None
    return _take(tx, claim, owner, ttl_ms, lost)


def _still_leased(run_id: str, epoch: int, remaining_ms: int, verdict: Verdict) -> str:
    held = f"run {run_id} is leased by another owner (epoch {epoch}) for {remaining_ms} ms more"
    if verdict.gone:  # a process it started may still apply an effect: let the lease expire
        return f"{held}: {verdict.reason}; it is taken when the lease expires"
    return f"{held}; pass force=True only once that owner is known to be dead"


def claim_due(
    tx: Tx, owner: str, ttl_ms: int, max_attempts: int | None, limit: int, versions: Versions | None = None
) -> Claims:
    """Lease up to ``limit`` due runs, most overdue first, after those of dead owners of this
    host with nothing they started alive; log ``attempt_lost`` for a lease nobody released.
    A run past ``max_attempts`` is failed instead, and one with a cancellation requested is
    cancelled. ``versions``: only runs of these (None: of any version), each version's most
    overdue first, in the order given (a worker serving several turns it from claim to claim)."""
    claims = Claims()
    _take_from_the_dead(tx, owner, ttl_ms, max_attempts, limit, claims, versions)
    if versions is None:
        _claim_from(tx, claims, owner, ttl_ms, max_attempts, limit, None)
        return claims
    for version in dict.fromkeys(versions):
        if len(claims.leased) >= limit:
            break
        _claim_from(tx, claims, owner, ttl_ms, max_attempts, limit, one_version(version))
    return claims


def _claim_from(
    tx: Tx,
    claims: Claims,
    owner: str,
    ttl_ms: int,
    max_attempts: int | None,
    limit: int,
    version: tuple[str, tuple[Any, ...]] | None,
) -> None:
    """Claim due runs, most overdue first, until ``claims`` holds ``limit``: any run
    (``version`` None: the claimable index), or one version's (``version``: its SQL, read as one
    range of the version index; ORDER BY starts with the version, constant in the range, so
    PostgreSQL reads the range in order for ``IS NULL`` too)."""
    d = tx.dialect
    if version is None:
        index, live, params, order = (
            "idx_agent_runs_claimable",
            "status IN ('pending', 'running', 'waiting')",
            (),
            "",
        )
    else:
        index, live, params, order = VERSION_INDEX, f"{version[0]} AND {NOT_ENDED}", version[1], "version, "
    postponed: list[str] = []  # runs whose end has to wait for a busy descendant
    while len(claims.leased) < limit:
        # Now as a value (read first, on PostgreSQL a round trip): the index's bound, where the
        # server's clock function would not be one, and the scan would walk every waiting run.
        now, wanted = tx.now, limit - len(claims.leased)
        others, skipped = d.any_of("id", postponed) if postponed else ("", ())
        rows = tx.all(
            f"SELECT {_CLAIM_COLUMNS} FROM agent_runs{d.indexed(index)}"
            f" WHERE {live} AND next_attempt_at <= ?"
            f" AND (lease_owner IS NULL OR lease_expires_at <= ?){f' AND NOT ({others})' if others else ''}"
            f" ORDER BY {order}next_attempt_at, created_at LIMIT ?{d.skip_locked}",
            (*params, now, now, *skipped, wanted),
        )
        plain: list[str] = []
        for row in rows:
            claim = _Claim.of(row)
            if not _claim_one(tx, claims, claim, owner, ttl_ms, max_attempts, plain):
                postponed.append(claim.run_id)
        _take_plain(tx, plain, owner, ttl_ms)
        if len(rows) < wanted:
            break  # no more are due (a run another claim holds is skipped again)


def _claim_one(
    tx: Tx, claims: Claims, c: _Claim, owner: str, ttl_ms: int, max_attempts: int | None, plain: list[str]
) -> bool:
    """Lease one run to a worker, or end it: cancelled (its owner died before it could stop),
    or failed (out of attempts). False: its end has to wait for a busy descendant. A run whose
    taking writes nothing but its row goes to ``plain``, for :func:`_take_plain`."""
    lost = lost_attempt(tx.now, c.lease_row, c.attempts, max_attempts)
    if c.cancel_reason is not None:
        if not tx.unless_busy(cancel_unowned, c.run_id, c.status, c.cancel_reason, lost):
            return False
        claims.ended.append((c.run_id, RunStatus.CANCELLED, c.cancel_reason))
        return True
    if max_attempts is not None and c.attempts >= max_attempts:
        how = "ended without finishing the run" if lost is None else lost.summary()
        reason = exhausted_reason(c.attempts, max_attempts, how)
        if not tx.unless_busy(fail_exhausted, c.run_id, c.status, reason, lost):
            return False
        claims.ended.append((c.run_id, RunStatus.FAILED, reason))
        return True
    claims.leased.append((_take(tx, c, owner, ttl_ms, lost, count_attempt=True, plain=plain), c.attempts + 1))
    if lost is not None:
        claims.lost[c.run_id] = lost
    return True


def _take_from_the_dead(
    tx: Tx,
    owner: str,
    ttl_ms: int,
    max_attempts: int | None,
    limit: int,
    claims: Claims,
    versions: Versions | None = None,
) -> None:
    """Lease the runs whose unexpired leases belong to processes of this host that are gone,
    with nothing they started alive, as claim_due leases due ones: a run with a cancellation
    requested ends cancelled, and one out of attempts ends failed, instead of being handed out.
    A dead owner whose tools still run keeps its leases until they expire. Of ``versions``
    only, if given: a dead worker's runs of other versions wait for their own workers."""
    ours, ours_params = ("", ()) if versions is None else served(tx, versions)
    for pid, started in _dead_owners_here(tx):
        rows = tx.all(
            f"SELECT {_CLAIM_COLUMNS} FROM agent_runs WHERE lease_host = ? AND lease_owner IS NOT NULL"
            " AND lease_expires_at > :now AND status = 'running' AND lease_pid = ?"
            f" AND lease_process_start = ?{f' AND {ours}' if ours else ''} LIMIT ?{tx.dialect.skip_locked}",
            (this_process().host, pid, started, *ours_params, limit - len(claims.leased)),
        )
        plain: list[str] = []
        for row in rows:
            _claim_one(tx, claims, _Claim.of(row), owner, ttl_ms, max_attempts, plain)
        _take_plain(tx, plain, owner, ttl_ms)
        if len(claims.leased) >= limit:
            break


def _dead_owners_here(tx: Tx) -> list[tuple[int, int]]:
    """(pid, process start) of each process of this host that holds unexpired leases, no
    longer runs, and left no process it started alive. Every holder is looked at, not the first
    few: a busy live worker must not hide a dead one."""
    me = this_process()
    if me.host is None:
        return []
    holders = tx.all(  # one row per lease held here (told apart in Python: DISTINCT would sort)
        f"SELECT lease_pid, lease_process_start FROM agent_runs{tx.dialect.indexed('idx_agent_runs_leased')}"
        " WHERE lease_host = ? AND lease_owner IS NOT NULL AND lease_expires_at > :now"
        " AND status = 'running'",
        (me.host,),
    )
    return [(pid, started) for pid, started, verdict in gone_holders(holders) if verdict.at_once]


_LEASE_CHANGE = (
    "lease_owner = ?, lease_epoch = ?, lease_expires_at = ?, status = 'running', wait_kind = NULL,"
    " wait_target = NULL, lease_host = ?, lease_pid = ?, lease_process_start = ?, attempts = attempts + ?"
)
"""What taking a run changes in its row (the parameters: :func:`_take`'s)."""


def _take(
    tx: Tx,
    c: _Claim,
    owner: str,
    ttl_ms: int,
    lost: LostAttempt | None,
    *,
    count_attempt: bool = False,
    plain: list[str] | None = None,
) -> Lease:
    """Lease the run to ``owner`` (this process: its identity is stored with the lease); a
    pending or suspended run starts running; a lease its owner never released is taken over:
    ``attempt_lost``, then ``lease_taken_over`` (at once, or after it expired); a model call an
    earlier attempt left in flight is closed and charged (``model_call_lost``: see
    :mod:`zincir._store._calls`). ``count_attempt``: a worker's claim, which counts an attempt.

    The lease, the attempt and the last event go into the row in one UPDATE: one statement and
    one new version of the row per run taken, where three UPDATEs made three. A claim's run that
    logs nothing and has no model call to close is only named in ``plain``: the claim takes all
    of those in one UPDATE (:func:`_take_plain`), the same row change, one statement for them all."""
    expires_at = tx.now + ttl_ms
    epoch = c.epoch + 1
    lease_change = f", {_LEASE_CHANGE}"
    params = (owner, epoch, expires_at, *this_process().as_row(), int(count_attempt))
    events = []
    if lost is not None:
        events.append((EventType.ATTEMPT_LOST, _dump(lost.payload())))
        events.append((EventType.LEASE_TAKEN_OVER, _dump(lost.takeover_payload())))
    if c.status != RunStatus.RUNNING:
        events.append((EventType.STATE_TRANSITION, _dump({"from": c.status, "to": "running"})))
    if not events and plain is not None and c.model_call_seq is None:
        plain.append(c.run_id)
    elif not events:
        tx.execute(f"UPDATE agent_runs SET {_LEASE_CHANGE} WHERE id = ?", (*params, c.run_id))
    for number, (type, payload) in enumerate(events, start=1):
        if number < len(events):
            tx.log(c.run_id, type, payload)
        else:
            tx.log(c.run_id, type, payload, run_set=lease_change, run_params=params)
    if c.model_call_seq is not None:
        close_unanswered(tx, c.run_id, int(c.model_call_seq), "next_owner")
    return Lease(
        c.run_id, owner, epoch, ttl_ms, expires_at, c.wall_end,
        config_json=texts(tx, [c.config_json])[0], version=c.version, role=c.role, provider=c.provider,
        traceparent=c.traceparent,
    )  # fmt: skip


def _take_plain(tx: Tx, run_ids: Sequence[str], owner: str, ttl_ms: int) -> None:
    """:func:`_take`'s UPDATE for a claim's runs that need nothing else, all in one statement
    (a worker's claim of a batch of due runs: one statement, not one per run). Each row was read
    by the claim and is held by it (PostgreSQL: locked; SQLite: one writer), so its epoch is the
    one read, and the new one its successor, as :func:`_take` computes it."""
    if not run_ids:
        return
    sets = _LEASE_CHANGE.replace("lease_epoch = ?", "lease_epoch = lease_epoch + 1")
    params = (owner, tx.now + ttl_ms, *this_process().as_row(), 1)
    for chunk in tx.dialect.chunks(run_ids):
        ids, ids_params = tx.dialect.any_of("id", chunk)
        tx.execute(f"UPDATE agent_runs SET {sets} WHERE {ids}", (*params, *ids_params))


# -- keeping it -------------------------------------------------------------------------------


def renew(tx: Tx, lease: Lease) -> tuple[Lease, str | None]:
    """Extend an unexpired lease by its TTL; with it, the reason of a cancellation someone
    requested (None: none). LeaseLost, RunTerminal. The expiry is set from now once the fence
    holds (it is judged with the row held), so a renewal that waited behind other writers past
    its expiry cannot bring the lease back."""
    tx.fence(lease)
    expires_at, cancel_reason, ends_at = tx.one(  # with the fence (PostgreSQL: one round trip)
        f"UPDATE agent_runs SET lease_expires_at = :now + ? WHERE id = ?"
        f" RETURNING lease_expires_at, cancel_reason, {WALL_END}",
        (lease.ttl_ms, lease.run_id),
    )
    return attrs.evolve(lease, expires_at=int(expires_at), wall_time_ends_at=ends_at), cancel_reason


def next_due_in(tx: Tx, versions: Versions | None = None) -> int | None:
    """Milliseconds until the next run (of ``versions``, if given) becomes due by itself (a
    backoff, a deadline, a wake time); None if none will: an idle worker sleeps until then
    rather than a poll late. 0 when one is claimable already: it became due after the worker's
    last claim looked."""
    if versions is None:
        sources = [("status IN ('pending', 'running', 'waiting')", ())]
    else:
        sources = [
            (f"{where} AND {NOT_ENDED}", params)
            for where, params in map(one_version, dict.fromkeys(versions))
        ]
    index = "idx_agent_runs_claimable" if versions is None else VERSION_INDEX
    replies = [  # sent together: one round trip on PostgreSQL
        tx.send(
            f"SELECT min(next_attempt_at) - :now FROM agent_runs{tx.dialect.indexed(index)}"
            f" WHERE {live} AND (next_attempt_at > :now OR lease_owner IS NULL OR lease_expires_at <= :now)",
            params,
        )
        for live, params in sources
    ]
    dues = [row[0] for row in (reply.one() for reply in replies) if row is not None and row[0] is not None]
    return min((max(int(due), 0) for due in dues), default=None)


def work_ahead(tx: Tx, versions: Versions | None = None) -> bool:
    """Whether a live run is, or will become, claimable without anyone's write from outside:
    one pending or running (due, backing off, or leased: a lease comes free when its owner lets
    go or dies), or one suspended in a durable sleep or already woken. A run suspended on a
    signal, an approval, a child or its budget is not, whatever its deadline. Of ``versions``
    only, if given. Read when a worker with ``until_idle`` is idle, so a scan past many
    suspended runs is rare."""
    ours, params = ("", ()) if versions is None else served(tx, versions)
    row = tx.one(
        "SELECT 1 FROM agent_runs WHERE (status IN ('pending', 'running')"
        " OR (status = 'waiting' AND (next_attempt_at <= :now OR EXISTS (SELECT 1 FROM run_waits AS w"
        f" WHERE w.run_id = agent_runs.id AND w.kind = 'sleep')))){f' AND {ours}' if ours else ''} LIMIT 1",
        params,
    )
    return row is not None


# -- suspending it ----------------------------------------------------------------------------


def suspend(tx: Tx, lease: Lease, waits: Sequence[OpenWait]) -> bool:
    """Unless one of ``waits`` (the body's open waits, the one that began the suspension first)
    can complete now (what it awaits is there, or its deadline has passed): log running ->
    waiting, record every wait, release the lease, give the claim's attempt back, and leave the
    run due at the earliest deadline (None: when an outsider's write matching any of the waits
    arrives). Not while a cancellation is requested: the owner acts on that instead. True if it
    suspended; if not, the run's waits look again at once. Fenced.

    The run's row stays held until the commit, so an outsider's write for one of the waits (its
    lock) either came first, and is seen here, or finds the committed 'waiting' run's waits."""
    tx.fence(lease)
    awaited = None
    if cancel_requested(tx, lease.run_id) is None:
        awaited = [_awaited(tx, lease.run_id, kind, name) for kind, name in dict.fromkeys(waits)]
    pending = [found for found in awaited or () if found is not None and not found.due(tx.now)]
    if awaited is None or not pending or len(pending) < len(awaited):
        tx.wake(waits=lease.run_id)  # a wait that can complete looks rather than wait for its poll
        return False
    until = earliest(found.deadline for found in pending)
    first = pending[0]
    tx.log(
        lease.run_id,
        EventType.STATE_TRANSITION,
        suspension_payload(pending, until),
        run_set=", status = 'waiting', wait_kind = ?, wait_target = ?, next_attempt_at = ?,"
        f" lease_owner = NULL, lease_expires_at = NULL, attempts = {tx.dialect.greatest}(0, attempts - 1)",
        run_params=(first.kind, first.wake_key, until),
    )
    tx.execute("DELETE FROM run_waits WHERE run_id = ?", (lease.run_id,))
    tx.execute(
        "INSERT INTO run_waits (run_id, kind, wake_key, name, deadline, created_at) VALUES "
        + ", ".join(["(?, ?, ?, ?, ?, :now)"] * len(pending)),
        [value for w in pending for value in (lease.run_id, w.kind, w.wake_key, w.name, w.deadline)],
    )
    return True


def _awaited(tx: Tx, run_id: str, kind: WaitKind, name: str) -> Awaited | None:
    """What wait ``name`` still awaits; None if it is there (or the wait is no longer open)."""
    if kind == "signal":
        row = tx.one(
            "SELECT topic, deadline FROM waits WHERE run_id = ? AND name = ? AND completed_at IS NULL",
            (run_id, name),
        )
        if row is None or signal_ready(tx, run_id, row[0], name):
            return None
        return Awaited(kind, name, row[0], row[1])
    if kind == "approval":
        row = tx.one(
            "SELECT deadline FROM approvals WHERE run_id = ? AND call_id = ? AND decided_at IS NULL"
            " AND timed_out = 0",
            (run_id, name),
        )
        return None if row is None else Awaited(kind, name, name, row[0])
    if kind == "budget":
        usage = budget_usage(tx, run_id)
        reached = None if usage is None else judge(usage)
        return None if reached is None else Awaited(kind, reached.limit, "", None)
    if kind == "child":
        # FOR SHARE orders this with the child's own write (PostgreSQL): a child ending right
        # now is seen ended here (and the run does not suspend), or commits after this run is
        # 'waiting'. NOWAIT: while the child's write holds its row, this fails and is retried.
        row = tx.one(
            "SELECT j.deadline FROM joins AS j JOIN agent_runs AS c ON c.id = j.child_id"
            " WHERE j.run_id = ? AND j.child_id = ? AND j.completed_at IS NULL"
            f" AND c.status IN ('pending', 'running', 'waiting'){tx.dialect.share_nowait('c')}",
            (run_id, name),
        )
        return None if row is None else Awaited(kind, name, name, row[0])
    row = tx.one(
        "SELECT wake_at FROM timers WHERE run_id = ? AND name = ? AND completed_at IS NULL", (run_id, name)
    )
    return None if row is None else Awaited(kind, name, name, row[0])


# -- letting it go ----------------------------------------------------------------------------


def retry_now(tx: Tx, run_id: str) -> int | None:
    """An outsider's cut of a backoff: a live run nobody holds, not waiting, whose next attempt
    is in the future becomes due now (workers are told). Returns the due time it had; None if it
    was due already (nothing written). RunNotFound, RunTerminal, RunLeased, RunWaiting."""
    status, owner, expires_at, due_at = lock_live_run(
        tx, run_id, "status, lease_owner, lease_expires_at, next_attempt_at", "there is nothing left to retry"
    )
    if lease_held(owner, expires_at, tx.now):
        raise RunLeased(f"run {run_id} is leased by {owner} for {expires_at - tx.now} ms more: it is running")
    if status == RunStatus.WAITING.value:
        raise RunWaiting(f"run {run_id} is waiting, not backing off: what it awaits makes it due")
    if due_at is None or due_at <= tx.now:
        return None
    tx.execute("UPDATE agent_runs SET next_attempt_at = :now WHERE id = ?", (run_id,))
    tx.wake(claimable=True)
    return int(due_at)
