"""Read-only connections kept open between the inspector's requests.

Opening one costs a schema check, and on PostgreSQL a new server connection (about 10 ms, most
of a fast page). A served inspector therefore keeps a few idle connections for the next
requests, of the backends whose connections say they are worth keeping
(:attr:`~zincir._queries.ReadOnly.worth_keeping`: PostgreSQL's, not SQLite's). One is dropped
rather than kept after an error that may have broken it, and retired after :data:`MAX_AGE`
seconds, so that a schema migrated under a running inspector is checked again soon.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final, TypeVar

from .. import _queries as q
from .._errors import DatabaseUnavailable, StorageError, ZincirError

__all__ = ["ReadPool"]

T = TypeVar("T")

MAX_AGE: Final = 30.0


class ReadPool:
    """Up to ``keep`` idle read-only connections to one database, shared by request threads
    (``keep=0``: a new connection for every read)."""

    def __init__(self, path: str, *, keep: int) -> None:
        self._path = path
        self._keep = keep
        self._lock = threading.Lock()
        self._idle: list[tuple[q.Reader, float]] = []
        self._closed = False

    def read(self, read: Callable[[q.Reader], T]) -> T:
        """``read(conn)`` in one snapshot, on an idle connection or a new one.

        A kept connection that the server has closed since (a restart, an idle timeout) fails
        with :class:`DatabaseUnavailable`; the read then runs once more on a new connection.
        Reads change nothing, so running one twice is harmless.
        """
        idle = self._take_idle()
        if idle is not None:
            try:
                return self._read_on(*idle, read)
            except DatabaseUnavailable:
                pass
        return self._read_on(q.open_readonly(self._path), time.monotonic(), read)

    def close(self) -> None:
        """Close the idle connections; those in use are closed when their read ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()

    def _take_idle(self) -> tuple[q.Reader, float] | None:
        with self._lock:
            now = time.monotonic()
            while self._idle:
                conn, opened = self._idle.pop()
                if now - opened < MAX_AGE:
                    return conn, opened
                conn.close()
        return None

    def _read_on(self, conn: q.Reader, opened: float, read: Callable[[q.Reader], T]) -> T:
        failure: BaseException | None = None
        try:
            with q.read_snapshot(conn):
                return read(conn)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self._give_back(conn, opened, failure)

    def _give_back(self, conn: q.Reader, opened: float, failure: BaseException | None) -> None:
        # An answer like "no such run" leaves the connection as it was; a storage error or an
        # exception from anywhere else may not have.
        reusable = failure is None or (
            isinstance(failure, ZincirError) and not isinstance(failure, StorageError)
        )
        with self._lock:
            if reusable and conn.worth_keeping and not self._closed and len(self._idle) < self._keep:
                self._idle.append((conn, opened))
                return
        conn.close()
