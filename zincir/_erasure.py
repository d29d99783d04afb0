"""Erasure and key rotation on an encrypted database (docs/payloads.md#encryption-and-erasure)."""

from __future__ import annotations

import logging
import sqlite3
from typing import Final

import trio

from ._database import Database, storage
from ._errors import EncryptionError, InvalidArgument
from ._target import parse_target
from ._validation import canonical_run_id, check_int, check_text

__all__ = ["erase_run", "rotate_keys"]

logger = logging.getLogger("zincir")

_REWRAP_BATCH: Final = 500


async def erase_run(db: Database, run_id: str, *, by: str | None = None) -> int:
    """Delete an ended run's data key: its payloads (events, config, result, steps, checkpoints,
    signals, stream chunks) can never be read again, by anyone, while its shape (ids, types,
    seqs, times, statuses) stays, and readers show the values as erased (``zincir.ERASED``).
    Audited (``by``: who asked). Returns when it was erased (ms; the first time, for a run
    erased before).

    On SQLite the key's bytes are zeroed in the file and the WAL is checkpointed and truncated,
    so that neither file keeps them. Backups, PostgreSQL's WAL and replicas keep what they had.

    :class:`RunNotEnded` for a run that has not ended (cancel it first) or that a fork still
    running reads from; :class:`RunNotFound`; :class:`EncryptionError` on a database opened
    without encryption (there is no key to delete: its payloads are in clear)."""
    if not isinstance(db, Database):
        raise InvalidArgument(f"erase_run() needs a Database, not {db!r}")
    run_id = canonical_run_id(run_id)
    if by is not None:
        check_text(by, "by")
    core = storage(db)
    if core.sealer is None:
        raise EncryptionError(
            f"database {db.path!r} is not opened with encryption: erase_run deletes a run's key,"
            " and payloads written without encryption have none"
        )
    erased_at = await core.write(core.store.erase_run_key, run_id, by, route=run_id)
    core.sealer.forget(run_id)
    if db.backend == "sqlite":
        await trio.to_thread.run_sync(_truncate_wal, parse_target(db.path).location)
    return erased_at


def _truncate_wal(path: str) -> None:
    """Checkpoint the WAL into the file and truncate it, so that the old pages it held (the
    erased key among them) are gone from disk (as far as the file system goes)."""
    conn = sqlite3.connect(path, timeout=5.0)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.close()
    if busy:
        logger.warning("zincir: erase_run: a reader kept the WAL of %s from being truncated", path)


async def rotate_keys(db: Database, *, batch: int = _REWRAP_BATCH) -> int:
    """Re-wrap every run's data key with the key provider's current master key, in batches of
    ``batch`` runs (a short transaction each); how many keys were re-wrapped. The payloads are
    not touched, so this is quick at any size. Afterwards the previous master keys wrap nothing
    and may be dropped from the provider. EncryptionError on a database without encryption."""
    if not isinstance(db, Database):
        raise InvalidArgument(f"rotate_keys() needs a Database, not {db!r}")
    check_int(batch, "batch", minimum=1)
    core = storage(db)
    sealer = core.sealer
    if sealer is None:
        raise EncryptionError(f"database {db.path!r} is not opened with encryption: it has no keys to rotate")
    total = 0
    after: str | None = ""  # run ids are UUIDs: "" comes before every one
    while after is not None:
        done, after = await core.write(core.store.rewrap_keys, sealer, after, batch, route=None)
        total += done
    return total
