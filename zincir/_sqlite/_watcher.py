"""SQLite has no NOTIFY: a thread watches the file for other processes' commits instead.

``PRAGMA data_version`` changes when another connection has committed; reading it touches only
the shared-memory WAL index, so looking every few milliseconds costs next to nothing. Only when
it changed does the thread read what matters (signals sent since it last looked, whether a run
is due), and only that becomes a wake-up in Trio. Polling stays the fallback, as on PostgreSQL.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import Final

import trio

from .._backend import Clock
from .._wakes import Hear, Hearing
from ._connection import BUSY_TIMEOUT_MS

logger = logging.getLogger("zincir")

_LOOK_EVERY_S: Final = 0.005
_MOST_SEEN: Final = 100_000  # streams whose last offset the watcher remembers


class Watcher(Hearing[sqlite3.Connection]):
    """Hears ``("inbox", run_id)`` for each new signal and each run whose cancellation is
    requested, ``("claimable", None)`` when a run is due, and, for each run of ``awaited()``
    (the runs this process waits to see end, or follows a stream of), ``("run_ended", run_id)``
    once it has ended and ``("stream", run_id)`` when one of its streams has new chunks. This
    process's own commits are seen too: the watcher's connection is another connection."""

    def __init__(
        self,
        path: str,
        clock: Clock,
        token: trio.lowlevel.TrioToken,
        hear: Hear,
        awaited: Callable[[], frozenset[str]],
    ) -> None:
        self._path = path
        self._clock = clock
        self._awaited = awaited
        super().__init__(f"zincir-watcher:{path}", token, hear)

    errors = (sqlite3.Error,)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA query_only = ON")
        except BaseException:
            conn.close()
            raise
        return conn

    def _listen(self, conn: sqlite3.Connection) -> None:
        version = _data_version(conn)
        (last_signal,) = conn.execute("SELECT coalesce(max(id), 0) FROM signals").fetchone()
        streamed: dict[tuple[str, str], int] = {}  # the next offset of each stream of awaited runs
        self._announce(None, None)
        while not self._stopping.wait(_LOOK_EVERY_S):
            current = _data_version(conn)
            if current == version:
                continue
            version = current
            conn.execute("BEGIN")  # one snapshot for both looks
            try:
                signalled = conn.execute(
                    "SELECT id, run_id FROM signals WHERE id > ? ORDER BY id", (last_signal,)
                ).fetchall()
                # Requests not yet acted on: the index holds only those (ending a run clears it).
                cancelling = conn.execute(
                    "SELECT id FROM agent_runs INDEXED BY idx_agent_runs_cancel"
                    " WHERE cancel_requested_at IS NOT NULL"
                ).fetchall()
                due = _anything_due(conn, self._clock())
                awaited = self._awaited()
                ended = _ended(conn, awaited)
                grown = _streams_grown(conn, awaited, streamed)
            finally:
                conn.execute("COMMIT")
            for signal_id, run_id in signalled:
                last_signal = signal_id
                self._announce("inbox", run_id)
            for (run_id,) in cancelling:
                self._announce("inbox", run_id)
            if due:
                self._announce("claimable", None)
            for run_id in ended:
                self._announce("run_ended", run_id)
            for run_id in grown:
                self._announce("stream", run_id)


def _data_version(conn: sqlite3.Connection) -> int:
    (version,) = conn.execute("PRAGMA data_version").fetchone()
    return int(version)


def _ended(conn: sqlite3.Connection, run_ids: frozenset[str]) -> list[str]:
    """Those of ``run_ids`` that have ended (found by their primary key, a few hundred a look)."""
    ids, ended = sorted(run_ids), []
    for first in range(0, len(ids), 500):
        chunk = ids[first : first + 500]
        ended += [
            row[0]
            for row in conn.execute(
                f"SELECT id FROM agent_runs WHERE id IN ({','.join('?' * len(chunk))})"
                " AND status IN ('completed', 'failed', 'cancelled')",
                chunk,
            )
        ]
    return ended


def _streams_grown(
    conn: sqlite3.Connection, run_ids: frozenset[str], seen: dict[tuple[str, str], int]
) -> set[str]:
    """Those of ``run_ids`` with a stream whose next offset is not the one ``seen`` last time
    (a stream not seen before counts: its follower may have read before this look); ``seen``
    is brought up to date. A follower is awaited only while it waits, so ``seen`` keeps the
    streams of runs no longer awaited too (within bounds): one awaited again is not new."""
    if len(seen) > _MOST_SEEN:
        seen.clear()
    ids, grown = sorted(run_ids), set()
    for first in range(0, len(ids), 500):
        chunk = ids[first : first + 500]
        among = ",".join("?" * len(chunk))
        for run_id, name, next_offset in conn.execute(
            f"SELECT run_id, name, max(next_offset) FROM streams WHERE run_id IN ({among})"
            " GROUP BY run_id, name",
            chunk,
        ):
            if seen.get((run_id, name)) != next_offset:
                seen[(run_id, name)] = next_offset
                grown.add(run_id)
    return grown


def _anything_due(conn: sqlite3.Connection, now: int) -> bool:
    # The claim's own condition: waking a worker is worth it only if its claim would find a run.
    row = conn.execute(
        "SELECT 1 FROM agent_runs INDEXED BY idx_agent_runs_claimable"
        " WHERE status IN ('pending', 'running', 'waiting') AND next_attempt_at <= ?1"
        " AND (lease_owner IS NULL OR lease_expires_at <= ?1) LIMIT 1",
        (now,),
    ).fetchone()
    return row is not None
