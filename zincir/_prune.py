"""Retention: ``zincir.prune`` deletes ended runs with everything of theirs (docs/retention.md).

The storage operation, one batch in one transaction, is :func:`zincir._store._prune.prune_batch`;
this module checks the arguments, finds the bound and drives the batches.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final, TypeVar

import attrs
import trio

from ._database import Database, storage
from ._errors import InvalidArgument, TransientConflict
from ._store._prune import BEFORE_EVERYTHING, ENDED, Bound, PruneSpec
from ._types import RunStatus
from ._validation import check_int

__all__ = ["PruneReport", "prune"]

_MAX_BATCH: Final = 10_000
DEFAULT_BATCH: Final = {"sqlite": 2, "postgresql": 10}
"""Runs per batch unless told: on SQLite a batch holds the file's one write lock for its
deletes, and a live writer that comes meanwhile waits for the rest of them; on PostgreSQL a
batch's deletes fill the WAL that a live writer's COMMIT must flush. So batches are small on
both (docs/retention.md has the figures)."""
_EXTRA_PAUSE_S: Final = {"sqlite": 0.002, "postgresql": 0.0}
"""After each batch a prune pauses as long as the batch took, and this much more: it uses the
database (the file's lock and disk, the server's cores and WAL) about half of the time at most,
beside the live writers. On SQLite a writer that waited for the lock polls for it every quarter
of a millisecond (zincir/_sqlite/_connection.py) and takes it meanwhile."""
_SWEEP_BATCH: Final = 1000
T = TypeVar("T")
Write = Callable[..., Awaitable[Any]]


@attrs.frozen
class PruneReport:
    """What :func:`prune` did (or, with ``dry_run``, would do)."""

    runs: int
    """Runs deleted."""
    rows: Mapping[str, int]
    """Rows deleted per table (``agent_runs`` is the runs themselves)."""
    batches: int
    """Transactions that deleted something."""
    kept_for_family: int
    """Runs old enough that were kept because a member of their family (a parent, a child, a
    fork, a fork's source, a shared child) is live, too recent, of a status not asked for, or
    being written at that moment."""
    seconds: float
    """How long the prune took."""
    dry_run: bool = False

    @property
    def total_rows(self) -> int:
        """Rows deleted in every table together."""
        return sum(self.rows.values())


async def prune(
    db: Database,
    *,
    finished_before: datetime.datetime,
    keep_latest: int = 0,
    statuses: Iterable[str] = ENDED,
    dry_run: bool = False,
    batch_size: int | None = None,
    progress: Callable[[PruneReport], object] | None = None,
) -> PruneReport:
    """Delete the runs that ended before ``finished_before``, with all their rows.

    ``finished_before`` is a timezone-aware datetime (a naive one is refused: whose clock would
    it be?); a run ended when its status last changed (``updated_at``, the database's clock).
    ``statuses`` are the ended statuses to delete (``completed``, ``failed``, ``cancelled``).
    ``keep_latest=N`` keeps the N runs of those statuses that ended last, however old.

    Runs go in batches of ``batch_size`` runs (default: 10 on PostgreSQL, 2 on SQLite), one
    short transaction each, with a pause after each as long as it took (so that live writers
    keep most of the database), whole families at once: a run whose parent, child, fork,
    fork's source or shared child is live (or too recent, or of another status) stays, and so
    does that whole family. A crash leaves every run whole or gone. ``dry_run`` deletes nothing
    and reports what would go. ``progress`` is called after every batch with the report so far.
    Returns a :class:`PruneReport`.
    """
    started = time.monotonic()
    if not isinstance(db, Database):
        raise InvalidArgument(f"prune() needs a Database, not {db!r}")
    cutoff = _epoch_ms(finished_before)
    keep = check_int(keep_latest, "keep_latest", minimum=0)
    wanted = _statuses(statuses)
    if batch_size is None:
        batch_size = DEFAULT_BATCH[db.backend]
    size = check_int(batch_size, "batch_size", minimum=1, maximum=_MAX_BATCH)
    if progress is not None and not callable(progress):
        raise InvalidArgument(f"progress must be a callable, not {progress!r}")
    upper: Bound = (cutoff, "")
    if keep:
        upper = min(upper, await storage(db).read(storage(db).store.oldest_kept, wanted, keep))
    spec = PruneSpec(wanted, upper, size, bool(dry_run))
    if spec.dry_run:
        return await _batches(db, _writes_nothing, spec, progress, started)
    async with storage(db).bulk_writes() as write:
        return await _batches(db, write, spec, progress, started)


async def _writes_nothing(fn: Callable[..., Any], *args: Any) -> Any:
    raise AssertionError("a dry run reads, and writes nothing")


async def _batches(
    db: Database,
    write: Write,
    spec: PruneSpec,
    progress: Callable[[PruneReport], object] | None,
    started: float,
) -> PruneReport:
    runs, batches, kept = 0, 0, 0
    rows: dict[str, int] = {}
    seen: set[str] = set()
    exhausted: frozenset[str] = frozenset()
    cursor: Bound | None = BEFORE_EVERYTHING
    while cursor is not None:
        took = time.monotonic()
        batch_of = (storage(db).store.prune_batch, spec, cursor, seen, exhausted)
        if spec.dry_run:
            batch = await storage(db).read(*batch_of)
        else:
            batch = await _again_on_conflict(write, *batch_of)
            if batch.runs:
                await trio.sleep(time.monotonic() - took + _EXTRA_PAUSE_S[db.backend])
        seen.update(batch.kept)
        if spec.dry_run:
            seen.update(batch.runs)
        kept += len(batch.kept)
        if batch.runs:
            runs, batches = runs + len(batch.runs), batches + 1
            for table, count in batch.rows.items():
                rows[table] = rows.get(table, 0) + count
            if progress is not None:
                progress(
                    PruneReport(runs, dict(rows), batches, kept, time.monotonic() - started, spec.dry_run)
                )
        cursor, exhausted = batch.cursor, batch.exhausted
    if not spec.dry_run:  # also what a prune that crashed before its sweep left behind
        swept = await _sweep_content(db, write)
        if swept:  # a dry run cannot tell which parts will be left unreferenced
            rows["payload_content"] = swept
    return PruneReport(runs, rows, batches, kept, time.monotonic() - started, spec.dry_run)


async def _again_on_conflict(write: Write, operation: Callable[..., T], *args: Any) -> T:
    """``await write(operation, *args)``, tried again while a lock on PostgreSQL outlasts the
    writers' lock timeout (a row a foreign key's check waits for, the content store's lock that
    writers storing a part hold): undone each time, so trying again is safe."""
    delay = 0.001
    for _ in range(100):
        try:
            result: T = await write(operation, *args)
            return result
        except TransientConflict:
            await trio.sleep(delay)
            delay = min(2 * delay, 0.1)
    result = await write(operation, *args)
    return result


async def _sweep_content(db: Database, write: Write) -> int:
    """Delete the stored parts (docs/payloads.md) that only the deleted runs referred to, a
    bounded batch per transaction; how many."""
    parts = 0
    while True:
        swept = await _again_on_conflict(write, storage(db).store.sweep_pruned, _SWEEP_BATCH)
        parts += swept.parts
        if swept.parts < _SWEEP_BATCH:
            return parts


def _epoch_ms(value: object) -> int:
    if not isinstance(value, datetime.datetime):
        raise InvalidArgument(f"finished_before must be a datetime, not {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(
            "finished_before must be timezone-aware (datetime.now(timezone.utc) - timedelta(...)),"
            f" not {value!r}"
        )
    return int(value.timestamp() * 1000)


def _statuses(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, Iterable):
        raise InvalidArgument(f"statuses must be some of {list(ENDED)}, not {value!r}")
    given = list(value)
    chosen = []
    for status in given:
        name = status.value if isinstance(status, RunStatus) else status
        if name not in ENDED:
            raise InvalidArgument(f"statuses must be ended statuses ({', '.join(ENDED)}), not {status!r}")
        if name not in chosen:
            chosen.append(name)
    if not chosen:
        raise InvalidArgument("statuses must name at least one ended status")
    return tuple(chosen)
