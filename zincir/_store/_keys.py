"""Encryption's own operations: the master keys a database is opened with, erasure, rotation.

The data keys themselves are created and read by the sealer (``zincir/_crypto.py``) inside the
operations that write and read payloads; these are the operations on ``run_keys`` and
``encryption_keys`` as a whole (docs/payloads.md#encryption-and-erasure).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._errors import EncryptionError, EncryptionKeyInvalid, EncryptionKeyMissing, RunNotEnded, RunNotFound
from .._json import dump_trusted as _dump
from ._tx import LIVE, Tx

if TYPE_CHECKING:
    from .._crypto import Sealer

__all__ = ["erase_run_key", "is_encrypted", "prepare_keys", "rewrap_keys"]


def is_encrypted(tx: Tx) -> bool:
    """Whether any master key ever encrypted this database (not on a schema from before
    encryption, as a test's may be)."""
    if tx.one(tx.dialect.table_exists, ("encryption_keys",)) is None:
        return False
    return tx.one("SELECT 1 FROM encryption_keys LIMIT 1") is not None


def prepare_keys(tx: Tx, sealer: Sealer) -> None:
    """Check the provider's keys against the database before anything is written with them:
    one of the database's master keys must be among them (EncryptionKeyInvalid when none is:
    the wrong key), every one that wraps a run's key too (EncryptionKeyMissing: an old key
    dropped before rotating), and each be the key it was (its check value). Then the current
    key is registered."""
    if tx.dialect.secure_delete:
        # From now on this writer zeroes what it frees: a run key moved by a page split, or
        # erased, leaves no copy behind in free space (docs/payloads.md#erasure).
        tx.execute(tx.dialect.secure_delete)
    known = dict(tx.all("SELECT key_id, check_value FROM encryption_keys ORDER BY key_id"))
    used = [row[0] for row in tx.all("SELECT DISTINCT key_id FROM run_keys WHERE key_id IS NOT NULL")]
    provider = sealer.provider
    if known and all(provider.key(key_id) is None for key_id in known):
        raise EncryptionKeyInvalid(
            "the key given is not one this database was encrypted with"
            f" (its master keys: {', '.join(sorted(known))})"
        )
    absent = sorted(key_id for key_id in used if provider.key(key_id) is None)
    if absent:
        raise EncryptionKeyMissing(
            f"master key {', '.join(absent)} still wraps runs' keys and is not among the keys given:"
            " keep it until zincir.rotate_keys() has re-wrapped them"
        )
    for key_id, check_value in known.items():
        if provider.key(key_id) is not None:
            sealer.verify(key_id, check_value)
    current = provider.current_key_id
    if current not in known:
        tx.execute(
            # Processes that start together with a new key each try; the first one registers it.
            "INSERT INTO encryption_keys (key_id, check_value, created_at) VALUES (?, ?, :now)"
            " ON CONFLICT (key_id) DO NOTHING",
            (current, sealer.check_value(current)),
        )


_FORKS_LIVE = (
    "WITH RECURSIVE forks (id) AS (SELECT id FROM agent_runs WHERE forked_from = ?"
    " UNION SELECT r.id FROM agent_runs AS r JOIN forks AS f ON r.forked_from = f.id)"
    f" SELECT r.id FROM agent_runs AS r JOIN forks AS f ON r.id = f.id WHERE r.status IN {LIVE!r}"
    " ORDER BY r.id LIMIT 1"
)
"""A fork (or a fork of a fork) that has not ended: it still reads the history it copied, which
stays under the key of the run it came from."""


def erase_run_key(tx: Tx, run_id: str, by: str | None) -> int:
    """Delete an ended run's data key (its payloads can never be read again), with an audit row;
    when it was erased (an erased run stays erased: the first time is kept). RunNotFound;
    RunNotEnded for a live run, or one a live fork still reads; EncryptionError for a run
    written before encryption (nothing of it is encrypted)."""
    row = tx.lock_run(run_id, "status")
    if row is None:
        raise RunNotFound(f"run {run_id} does not exist")
    if row[0] in LIVE:
        raise RunNotEnded(f"run {run_id} is {row[0]}: cancel it, or wait for its end, before erasing it")
    fork = tx.one(_FORKS_LIVE, (run_id,))
    if fork is not None:
        raise RunNotEnded(
            f"run {run_id}: its fork {fork[0]} has not ended and still reads the history it copied"
        )
    done = tx.one("SELECT erased_at FROM run_keys WHERE run_id = ? AND erased_at IS NOT NULL", (run_id,))
    if done is not None:
        return int(done[0])
    if tx.dialect.secure_delete:  # on since prepare_keys; said again where it matters most
        tx.execute(tx.dialect.secure_delete)
    updated = tx.count(
        "UPDATE run_keys SET key_id = NULL, wrapped_dek = NULL, erased_at = :now WHERE run_id = ?", (run_id,)
    )
    if not updated:
        raise EncryptionError(
            f"run {run_id} was written before the database was encrypted: its payloads are in clear,"
            " with no key to delete"
        )
    tx.execute(
        "INSERT INTO outsider_actions (run_id, action, done_by, detail, created_at)"
        " VALUES (?, 'erase', ?, ?, :now)",
        (run_id, by, _dump({})),
    )
    return tx.now


def rewrap_keys(tx: Tx, sealer: Sealer, after: str, limit: int) -> tuple[int, str | None]:
    """Re-wrap the run keys that another master key than the current one wraps, among up to
    ``limit`` runs after run id ``after`` (in id order, so that a rotation reads each row
    once); how many, and where the next batch starts (None: at the end). The payloads are not
    touched."""
    current = sealer.provider.current_key_id
    page = tx.all(
        "SELECT run_id, key_id, wrapped_dek FROM run_keys WHERE run_id > ? ORDER BY run_id LIMIT ?",
        (after, limit),
    )
    rows = [row for row in page if row[1] is not None and row[1] != current]
    for run_id, key_id, wrapped in rows:
        new_id, rewrapped = sealer.wrap(run_id, sealer.unwrap(run_id, key_id, wrapped))
        tx.execute(
            "UPDATE run_keys SET key_id = ?, wrapped_dek = ? WHERE run_id = ? AND key_id = ?",
            (new_id, rewrapped, run_id, key_id),
        )
        sealer.forget(run_id)
    return len(rows), (page[-1][0] if len(page) == limit else None)
