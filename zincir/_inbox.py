"""Outsiders' writes: they need no lease and only ever write a run's inbox.

Only the lease holder writes a run's log: a signal sent here lands in the ``signals`` table and
enters the log (``signal_received``) when the run's owner consumes it, in the owner's own fenced
transaction. So nothing an outsider does can interleave with the owner's sequence.
"""

from __future__ import annotations

from ._database import Database
from ._errors import InvalidArgument
from ._json import JSONValue, encode
from ._validation import canonical_run_id, check_name, check_text

__all__ = ["send_signal"]


async def send_signal(
    db: Database, run_id: str, signal: str, payload: JSONValue = None, *, key: str | None = None
) -> int:
    """Send ``signal`` (a topic name) with a JSON ``payload`` to a run; returns the signal's id.

    The run need not be owned, or even running yet. The oldest unconsumed signal of a topic goes
    to the next :meth:`Run.wait_for_signal` for that topic, whenever it comes. With ``key``,
    sending is idempotent: a repeat returns the first signal's id and stores nothing.
    Raises :class:`RunNotFound`, or :class:`RunTerminal` for a completed or failed run.
    """
    if not isinstance(db, Database):
        raise InvalidArgument(f"send_signal() needs a Database, not {db!r}")
    run_id = canonical_run_id(run_id)
    topic = check_name(signal, f"run {run_id}: signal name")
    if key is not None:
        check_text(key, f"run {run_id}: signal key", max_chars=1024)
    payload_json = encode(
        payload, what=f"run {run_id}: the payload of signal {topic!r}", limit=db.max_payload_bytes
    )
    signal_id, stored = await db._write(db._store.send_signal, run_id, topic, payload_json, key)
    if stored:
        db._announce_signal(run_id)
    return signal_id
