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
from typing import Any, Final, TypeVar

from .._backend import Clock
from .._errors import StorageError
from .._payloads import Payloads
from ._connection import SQLiteSession, Tx, connect, is_busy, storage_error

__all__ = ["BulkSession"]

T = TypeVar("T")

logger = logging.getLogger("zincir")

OPTIMISTIC_TRIES: Final = 3
"""Tries with the reads outside the lock before a batch takes the lock first."""
_RETRY_AFTER_S: Final = 0.0005
"""A refused batch waits this long before it reads again: a live writer's step is about this
long, so it is likely done by then."""


class BulkSession:
    """Runs ``fn(tx, *args)``, each in a transaction of its own, on a connection of its own (see
    the module's doc). Blocking: call it from a worker thread, one call at a time."""

    def __init__(self, path: str, clock: Clock, payloads: Payloads) -> None:
        self._path = path
        self._clock = clock
        self._payloads = payloads
        self._wal = path + "-wal"
        conn = connect(path, "NORMAL")
        # The fallback's BEGIN IMMEDIATE waits in Python, as the writer's does.
        self._session = SQLiteSession(conn, path, clock, writer=True)
        self._conn = conn
        self.optimistic_refusals = 0
        """How many tries SQLite refused (the statistics of a prune; tests read it)."""

    def write(self, fn: Callable[..., T], *args: Any) -> T:
        changes = self._conn.total_changes
        result = self._committed(fn, args)
        if self._conn.total_changes != changes:  # not a batch that found nothing
            self._sync_wal()
            self._checkpoint()
        return result

    def _committed(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        for _ in range(OPTIMISTIC_TRIES):
            try:
                self._conn.execute("BEGIN")  # deferred: the lock comes with the first write
                result = fn(self._tx(), *args)
                self._session.commit()
            except sqlite3.Error as exc:
                self._session.rollback()
                if not is_busy(exc):
                    raise storage_error(exc, self._path) from exc
                self.optimistic_refusals += 1
                time.sleep(_RETRY_AFTER_S)
                continue
            except BaseException:
                self._session.rollback()
                raise
            return result
        try:  # a database that is never quiet: the lock first, as the writer takes it
            self._session.begin()
            result = fn(self._tx(), *args)
            self._session.commit()
        except sqlite3.Error as exc:
            raise storage_error(exc, self._path) from exc
        finally:
            self._session.rollback()  # nothing to undo once committed
        return result

    def _tx(self) -> Tx:
        tx = Tx(self._conn, self._clock())
        tx.payloads = self._payloads
        return tx

    def _sync_wal(self) -> None:
        """Make the batch just committed durable: it is in the WAL (which a checkpoint only
        empties once what it copied is synced in the database file, and this connection keeps)."""
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
        self._session.close()
