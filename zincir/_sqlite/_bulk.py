"""A connection of its own for long series of maintenance writes (a prune's batches) that must
stand aside for the database's live writers.

SQLite has one write lock, and a writer that comes while a batch holds it waits for the rest of
the batch. So a batch here holds it only for what must be: its writes and their COMMIT.

- **Read without the lock.** A batch begins deferred: what it reads (which runs, their families)
  is read in a snapshot, and the lock is taken at its first write. SQLite refuses that write
  (``SQLITE_BUSY_SNAPSHOT``) if another connection committed since the snapshot began, so what
  a batch deletes is exactly what it read; a refused batch is rolled back and read again.
  After a few refusals in a row it is done as the writer does it, from ``BEGIN IMMEDIATE``
  (the lock held from its first read), so that a database that is never quiet is still pruned.
- **The fsync after the lock.** A COMMIT runs at ``synchronous=NORMAL``: it appends the batch
  to the WAL and lets the lock go, and the WAL is fsynced then, before :meth:`BulkSession.write`
  returns. So a batch is durable when it returns, as any write is, but a live writer does not
  wait for its fsync; a power loss in between loses the batch whole (the WAL's checksums).
- **A checkpoint after each batch**, with the lock free, so that a live writer's own periodic
  checkpoint (which it runs before answering a step) does not find the batches' pages to copy.

docs/retention.md gives the figures.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar, cast

from .._backend import Clock
from .._crypto import Sealer
from .._errors import StorageError
from .._payloads import Payloads
from ._connection import SQLITE, SQLiteSession, Tx, connect, is_busy, storage_error

__all__ = ["BulkSession"]

T = TypeVar("T")

logger = logging.getLogger("zincir")

OPTIMISTIC_TRIES: Final = 3
"""Tries with the reads outside the lock before a batch takes the lock first."""
_RETRY_AFTER_S: Final = 0.0005
"""A refused batch waits this long before it reads again: a live writer's step is about this
long, so it is likely done by then."""
_REFUSED: Final = object()


class BulkSession:
    """Runs ``fn(tx, *args)``, each in a transaction of its own, on a connection of its own (see
    the module's doc). Blocking: call it from a worker thread, one call at a time."""

    def __init__(self, path: str, clock: Clock, payloads: Payloads, sealer: Sealer | None) -> None:
        self._path = path
        self._wal = path + "-wal"
        self._sealer = sealer
        conn = connect(path, "NORMAL")
        try:
            # Its fallback's BEGIN IMMEDIATE waits in Python, as the writer's does.
            self._session = SQLiteSession(conn, path, clock, writer=True)
            if sealer is not None and SQLITE.secure_delete:
                # As the writers of an encrypted database do: what a batch frees is zeroed, so
                # no copy of a run's key is left in free space (docs/payloads.md#erasure).
                conn.execute(SQLITE.secure_delete)
        except sqlite3.Error as exc:
            conn.close()
            raise storage_error(exc, path) from exc
        self._session.payloads = payloads
        self._conn = conn
        self.refusals = 0
        """How many tries SQLite refused, since the session was opened."""

    def write(self, fn: Callable[..., T], *args: Any) -> T:
        changes = self._conn.total_changes
        result = self._optimistic(fn, args)
        if result is _REFUSED:
            result = self._locked_first(fn, args)
        if self._conn.total_changes != changes:  # not a batch that found nothing
            self._sync_wal()
            self._checkpoint()
        return cast(T, result)

    def _optimistic(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T | object:
        """``fn`` begun without the lock, tried again while SQLite refuses its first write;
        _REFUSED after OPTIMISTIC_TRIES refusals."""
        for _ in range(OPTIMISTIC_TRIES):
            try:
                self._conn.execute("BEGIN")  # deferred: the lock comes with the first write
                result = fn(self._tx(), *args)
                self._session.commit()
            except sqlite3.Error as exc:
                self._session.rollback()
                if not is_busy(exc):
                    raise storage_error(exc, self._path) from exc
                self.refusals += 1
                time.sleep(_RETRY_AFTER_S)
                continue
            except BaseException:
                self._session.rollback()
                raise
            return result
        return _REFUSED

    def _locked_first(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        """``fn`` with the lock held from its BEGIN, as the writer runs an operation: for a
        database that is never quiet long enough for the optimistic tries."""
        try:
            self._session.begin()
            result = fn(self._tx(), *args)
            self._session.commit()
        except sqlite3.Error as exc:
            raise storage_error(exc, self._path) from exc
        finally:
            self._session.rollback()  # nothing to undo once committed
        return result

    def _tx(self) -> Tx:
        tx = self._session.tx()
        tx.sealer = self._sealer
        return tx

    def _sync_wal(self) -> None:
        """Make the batch just committed durable: it is in the WAL, or a checkpoint has copied it
        into the database file and synced that before the WAL could start over (as every
        connection at synchronous NORMAL or FULL does, zincir's among them)."""
        try:
            fd = os.open(self._wal, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageError(
                f"{self._path}: a batch committed, but its WAL was not synced ({exc})"
            ) from exc

    def _checkpoint(self) -> None:
        """A live writer checkpoints every so many commits, before it answers the last one, and
        would copy every page of the batches since: they are copied here instead, after each
        batch, with the lock free (PASSIVE: never waits for a reader)."""
        try:
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error:  # the next batch's, or a writer's, tries again
            logger.exception("checkpoint of %s after a batch failed", self._path)

    def close(self) -> None:
        try:
            self._session.close()
        except sqlite3.Error:  # nothing is left uncommitted: every write() ended its transaction
            logger.exception("closing the bulk connection of %s failed", self._path)
