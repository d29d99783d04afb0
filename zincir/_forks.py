"""Forking a run: a new run from any point of an old one, without repeating its effects.

See docs/forks.md for what a fork holds and why; the storage operation is
:func:`zincir._store._forks.fork_run`.
"""

from __future__ import annotations

import uuid
from typing import Any

from ._database import Database, storage
from ._errors import InvalidArgument, InvalidForkPoint
from ._inbox import _as_outsider, _check_by
from ._json import JSONValue, dump_trusted, encode
from ._store import ForkOutcome
from ._tracing import creating_fork
from ._validation import MAX_INT, canonical_run_id, check_text

__all__ = ["fork_run"]


async def fork_run(
    db: Database,
    run_id: str,
    at_seq: int | None = None,
    *,
    at_checkpoint: int | None = None,
    config: JSONValue = None,
    by: str | None = None,
    reason: str | None = None,
) -> str:
    """Fork run ``run_id`` after seq ``at_seq`` (or after the checkpoint it accepted in round
    ``at_checkpoint``); returns the new run's id.

    The new run is ``pending``, claimable by a worker (or open it with ``open_run(db, id)``).
    Its log begins with a copy of the source's events ``0..at_seq``, then a ``forked`` event.
    ``config`` replaces the run's config (None keeps the source's); role, provider and budget
    limits carry over, and the spend is what the source had spent as of ``at_seq``. Nothing the
    source did in the world is done again: a tool call of the copied prefix that the source
    answered, even later, has that answer in the fork; one it started without an answer is
    pending with its start count (so :meth:`Run.execute` probes first) and the source's
    ``effect_key``; children spawned in the prefix are shared, not copied. The source is not
    changed. Forking a finished run or a fork works alike. While tracing is on, the fork's
    creation is a span of the caller's trace, linked to the source's (docs/tracing.md).

    An outsider's write (no lease), audited as ``fork`` by ``by`` in the new run's trail.
    :class:`RunNotFound`; :class:`InvalidForkPoint` for a seq below 0 or past the end, a round
    with no accepted checkpoint, or a seq inside what one write recorded together (a model
    response and its tool calls).
    """
    if not isinstance(db, Database):
        raise InvalidArgument(f"fork_run() needs a Database, not {db!r}")
    run_id = canonical_run_id(run_id)
    where = f"run {run_id}"
    if (at_seq is None) == (at_checkpoint is None):
        raise InvalidArgument(f"{where}: fork_run() takes at_seq or at_checkpoint, exactly one of them")
    point = at_seq if at_checkpoint is None else at_checkpoint
    name = "at_seq" if at_checkpoint is None else "at_checkpoint"
    if isinstance(point, bool) or not isinstance(point, int) or not 0 <= point <= MAX_INT:
        raise InvalidForkPoint(f"{where}: cannot fork at {name}={point!r}: it must be an int of 0 or more")
    config_json = None
    if config is not None:
        config_json = encode(config, what=f"{where}: the fork's config", limit=db.max_payload_bytes)
    by = _check_by(by, run_id)
    if reason is not None:
        reason = check_text(reason, f"{where}: the reason", max_chars=4000, allow_empty=True)

    record = storage(db).store.record_action
    fork = storage(db).store.fork_run

    def audited(tx: Any, source_id: str, *args: Any) -> ForkOutcome:
        # The audit row is the new run's, so that the source stays as it was, row for row.
        forked = fork(tx, source_id, *args)
        detail = {
            "config_changed": config_json is not None, "fork_seq": forked.fork_seq,
            "forked_from": source_id, "reason": reason,
        }  # fmt: skip
        record(tx, forked.fork_id, "fork", by, dump_trusted(detail))
        return forked

    fork_id = str(uuid.uuid4())
    with creating_fork(db._tracing, fork_id, run_id) as traced:
        forked: ForkOutcome = await _as_outsider(
            db, run_id, audited, fork_id, at_seq, at_checkpoint, config_json, by, reason,
            None if traced is None else traced.traceparent,
        )  # fmt: skip
        if traced is not None:
            traced.created(forked)
    return forked.fork_id
