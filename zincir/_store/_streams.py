"""Durable streams: a run's named streams of JSON chunks, written by its lease holder in
flushes and read by anyone (docs/streams.md).

A stream's chunks have gap-free offsets per (run, name). Each lease epoch that writes a stream
writes one *attempt* of it: the first flush of a new epoch starts attempt + 1 where the last
attempt's offsets ended, and marks that attempt ``interrupted`` if its writer never closed it
(a crash, a lost lease). A reader sees the first chunk of every attempt after the first flagged
as a restart, so two attempts' output is never spliced into one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import attrs

from .._errors import RunNotFound
from .._payloads import resolved, stored
from ._tx import Tx
from ._types import Lease

__all__ = ["StreamAttempt", "StreamPage", "flush_stream", "stream_page"]

# Chunks per INSERT where there are no array parameters (SQLite): 5 values each, far below its
# limit of parameters per statement.
_ROWS_PER_INSERT: Final = 200


@attrs.frozen
class StreamAttempt:
    """One attempt of a stream, as stored."""

    attempt: int
    epoch: int
    first_offset: int
    next_offset: int
    state: str


@attrs.frozen
class StreamPage:
    """Chunks of a stream after an offset, read in one snapshot with the run's status."""

    status: str
    """The run's status when the page was read: once it is terminal, no chunk can follow."""
    chunks: list[tuple[int, int, str]]
    """(offset, attempt, JSON text), in offset order."""
    first_offsets: dict[int, int]
    """The first offset of each attempt of the stream."""


def flush_stream(
    tx: Tx, lease: Lease, name: str, token: str, chunks: Sequence[str], close: bool
) -> tuple[int, int]:
    """Store a writer's buffered chunks (JSON texts) at the stream's next offsets, and with
    ``close`` mark its attempt closed; (the attempt, the next offset). Fenced. ``token`` names
    this flush: the same flush stored already (retried after its commit's outcome was unknown)
    stores nothing again. A writer of a new epoch with nothing to store stores nothing."""
    tx.fence(lease)
    run_id = lease.run_id
    row = tx.one(
        "SELECT attempt, epoch, next_offset, state, last_flush FROM streams"
        " WHERE run_id = ? AND name = ? ORDER BY attempt DESC LIMIT 1",
        (run_id, name),
    )
    state = "closed" if close else "open"
    if row is not None and row[4] == token:
        return int(row[0]), int(row[2])  # this very flush was stored before
    if row is not None and int(row[1]) == lease.epoch:
        # This epoch's attempt goes on (a writer of it flushed before, or closed and reopened it).
        attempt, offset = int(row[0]), int(row[2])
        tx.execute(
            "UPDATE streams SET next_offset = ?, state = ?, last_flush = ?, updated_at = :now"
            " WHERE run_id = ? AND name = ? AND attempt = ?",
            (offset + len(chunks), state, token, run_id, name, attempt),
        )
    elif not chunks:
        return (0, 0) if row is None else (int(row[0]), int(row[2]))
    else:
        attempt, offset = 1, 0
        if row is not None:
            attempt, offset = int(row[0]) + 1, int(row[2])
            if row[3] == "open":  # its writer is gone without closing it
                tx.execute(
                    "UPDATE streams SET state = 'interrupted', updated_at = :now"
                    " WHERE run_id = ? AND name = ? AND attempt = ?",
                    (run_id, name, attempt - 1),
                )
        tx.execute(
            "INSERT INTO streams (run_id, name, attempt, epoch, first_offset, next_offset, state,"
            " last_flush, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, :now, :now)",
            (run_id, name, attempt, lease.epoch, offset, offset + len(chunks), state, token),
        )
    _insert_chunks(tx, run_id, name, attempt, offset, chunks)
    if chunks:
        tx.wake(streams=run_id)
    return attempt, offset + len(chunks)


def _insert_chunks(tx: Tx, run_id: str, name: str, attempt: int, offset: int, chunks: Sequence[str]) -> None:
    chunks = [stored(tx, run_id, chunk, whole=True) for chunk in chunks]
    if tx.dialect.chunk is None:
        # One array parameter (PostgreSQL): one statement, prepared once, for any number of
        # chunks; rows of VALUES would make a new statement text, parsed anew, per flush size.
        tx.execute(
            "INSERT INTO stream_chunks (run_id, name, chunk_offset, attempt, data, created_at)"
            " SELECT ?, ?, ? + c.n - 1, ?, c.data, :now"
            " FROM unnest(CAST(? AS text[])) WITH ORDINALITY AS c (data, n)",
            (run_id, name, offset, attempt, list(chunks)),
        )
        return
    for start in range(0, len(chunks), _ROWS_PER_INSERT):
        part = chunks[start : start + _ROWS_PER_INSERT]
        params: list[Any] = []
        for at, data in enumerate(part, start=offset + start):
            params += (run_id, name, at, attempt, data)
        tx.execute(
            "INSERT INTO stream_chunks (run_id, name, chunk_offset, attempt, data, created_at) VALUES "
            + ", ".join(["(?, ?, ?, ?, ?, :now)"] * len(part)),
            params,
        )


def stream_page(tx: Tx, run_id: str, name: str, after: int, limit: int) -> StreamPage:
    """Up to ``limit`` chunks of stream ``name`` of run ``run_id`` with offsets past ``after``,
    and the run's status, in one snapshot. RunNotFound."""
    run = tx.send("SELECT status FROM agent_runs WHERE id = ?", (run_id,))
    chunks = tx.send(
        "SELECT chunk_offset, attempt, data FROM stream_chunks"
        " WHERE run_id = ? AND name = ? AND chunk_offset > ? ORDER BY chunk_offset LIMIT ?",
        (run_id, name, after, limit),
    )
    attempts = tx.send(
        "SELECT attempt, first_offset FROM streams WHERE run_id = ? AND name = ?", (run_id, name)
    )
    status = run.one()
    if status is None:
        raise RunNotFound(f"run {run_id} does not exist")
    return StreamPage(
        status=str(status[0]),
        chunks=[(int(at), int(attempt), str(data)) for at, attempt, data in resolved(tx, chunks.all(), (2,))],
        first_offsets={int(attempt): int(first) for attempt, first in attempts.all()},
    )


def stream_attempts(tx: Tx, run_id: str, name: str) -> list[StreamAttempt]:
    """Every attempt of a stream, in order (for tests and tools; readers use :func:`stream_page`)."""
    rows = tx.all(
        "SELECT attempt, epoch, first_offset, next_offset, state FROM streams"
        " WHERE run_id = ? AND name = ? ORDER BY attempt",
        (run_id, name),
    )
    return [StreamAttempt(int(a), int(e), int(f), int(n), str(s)) for a, e, f, n, s in rows]
