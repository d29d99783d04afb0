"""Versions of an agent in flight: which runs a worker serving some versions may claim, what a
new run takes from the run it comes from, and moving a run to another version on purpose
(docs/versions.md).

A worker that serves one version claims through ``idx_agent_runs_version_claimable``
(version, next_attempt_at, created_at): its version's due runs are one index range, most
overdue first, however many due runs other versions have. A worker serving several versions
reads one such range per version. ``None`` stands for the runs that have no version.
"""

from __future__ import annotations

from typing import Any, Final

from .._errors import RunLeased
from .._json import dump_trusted as _dump
from .._types import EventType
from ._tx import Tx, lease_held, lock_live_run

__all__ = [
    "NOT_ENDED",
    "SKIPPED_CAP",
    "VERSION_INDEX",
    "Move",
    "Versions",
    "inherited",
    "one_version",
    "served",
    "set_version",
    "shown",
    "skipped_for_version",
    "unserved",
]

Versions = tuple[str | None, ...]
"""The versions a worker serves (``None``: the runs without one). A worker serving every
version passes None instead of a tuple."""

VERSION_INDEX: Final = "idx_agent_runs_version_claimable"
NOT_ENDED: Final = "status NOT IN ('completed', 'failed', 'cancelled')"
"""A run is live, as :data:`VERSION_INDEX`'s predicate says it: a read of one version's live runs
says it so, to read that index (the claimable index names the live statuses instead; see the
migration that made them)."""

SKIPPED_CAP: Final = 1_000
""":func:`skipped_for_version` counts up to this many: a worker says "at least" past it, rather
than walk every due run of other versions at every poll (a worker whose version has drained
polls while the others' workers are busiest)."""


def one_version(version: str | None) -> tuple[str, tuple[Any, ...]]:
    """SQL that a run is of ``version``, and its parameters: an equality on the index's first
    column (``IS NULL`` for None), so the index range is the version's runs alone."""
    return ("version IS NULL", ()) if version is None else ("version = ?", (version,))


def served(tx: Tx, versions: Versions) -> tuple[str, tuple[Any, ...]]:
    """SQL that a run's version is one of ``versions``, and its parameters (a filter: for the
    few rows already found some other way, such as a dead owner's)."""
    named = [version for version in versions if version is not None]
    parts, params = [], ()
    if None in versions:
        parts.append("version IS NULL")
    if named:
        among, params = tx.dialect.any_of("version", named)
        parts.append(among)
    return f"({' OR '.join(parts) or 'FALSE'})", params


def unserved(tx: Tx, versions: Versions) -> tuple[str, tuple[Any, ...]]:
    """SQL that a run's version is none of ``versions`` (a NULL version is one: SQL's NOT IN
    would let it through as unknown)."""
    named = [version for version in versions if version is not None]
    if not named:
        return ("version IS NOT NULL", ()) if None in versions else ("TRUE", ())
    among, params = tx.dialect.any_of("version", named)
    if None in versions:
        return f"(version IS NOT NULL AND NOT ({among}))", params
    return f"(version IS NULL OR NOT ({among}))", params


def skipped_for_version(tx: Tx, versions: Versions) -> int:
    """How many runs are due and free now whose version is not among ``versions`` (at most
    :data:`SKIPPED_CAP`): what a worker serving them leaves for others. Read when the worker
    is idle, at most once per poll; it walks the due runs (the claimable index), not the table."""
    skips, params = unserved(tx, versions)
    (count,) = tx.one(
        "SELECT count(*) FROM (SELECT 1 FROM agent_runs"
        f"{tx.dialect.indexed('idx_agent_runs_claimable')}"
        " WHERE status IN ('pending', 'running', 'waiting') AND next_attempt_at <= :now"
        f" AND (lease_owner IS NULL OR lease_expires_at <= :now) AND {skips} LIMIT ?) AS due",
        (*params, SKIPPED_CAP),
    )
    return int(count)


def inherited(tx: Tx, parent_run_id: str) -> tuple[str | None, str | None] | None:
    """The version and fingerprints (JSON) a new run of ``parent_run_id`` takes when it is
    given none: its parent's. None: no such run. A run made from another one (a child, a fork)
    reads them here."""
    row = tx.one("SELECT version, fingerprints FROM agent_runs WHERE id = ?", (parent_run_id,))
    return None if row is None else (row[0], row[1])


Move = tuple[str | None, str | None]
"""A run's move to another version: (from, to)."""


def set_version(tx: Tx, run_id: str, version: str | None, by: str | None) -> Move | None:
    """Move a run nobody holds to ``version`` and log ``version_changed`` (from, to, by): its
    next claim is by a worker of that version. Returns (from, to); None if it is of that
    version already (nothing written). RunNotFound, RunTerminal; RunLeased while an owner
    holds it: only the lease holder writes a running run's log, and the owner's code is of the
    old version until it lets the run go (docs/versions.md)."""
    _, owner, expires_at, current = lock_live_run(
        tx,
        run_id,
        "status, lease_owner, lease_expires_at, version",
        "an ended run keeps the version it ran under",
    )
    if lease_held(owner, expires_at, tx.now):
        raise RunLeased(
            f"run {run_id} is leased by {owner} for {expires_at - tx.now} ms more, running version"
            f" {shown(current)}; move it once its owner lets it go (it ends, suspends or backs off)"
        )
    if current == version:
        return None
    payload = _dump({"by": by, "from": current, "to": version})
    tx.log(run_id, EventType.VERSION_CHANGED, payload, run_set=", version = ?", run_params=(version,))
    tx.wake(claimable=True)  # if it is due, a worker of its new version may take it now
    return current, version


def shown(version: str | None) -> str:
    return "(none)" if version is None else repr(version)
