"""A run's durable streams (schema with streams and later): each stream's attempts, and its
chunks page by page (docs/streams.md)."""

from __future__ import annotations

from collections.abc import Iterator

import attrs

from .._payloads import cut_texts
from ._connect import Reader
from ._keys import check_limit
from ._values import Int, as_int, as_size, as_text, json_columns, name_column, was_cut

__all__ = [
    "STREAMS_SHOWN",
    "StreamAttemptRow",
    "StreamChunkRow",
    "StreamRow",
    "iter_chunks_of",
    "iter_stream_chunks",
    "list_stream_chunks",
    "list_streams",
]

#: Streams of one run listed at most (a run writes a handful; the rest are counted).
STREAMS_SHOWN = 100


@attrs.frozen
class StreamAttemptRow:
    """One attempt of a stream: the chunks ``first_offset`` .. ``next_offset - 1``, written by
    the owner of lease ``epoch``. ``state``: ``open`` (its writer may still flush), ``closed``
    (its writer exited), or ``interrupted`` (a later attempt began while it was open, or its
    writer can no longer write: the run moved on to another owner, was suspended, or ended)."""

    attempt: Int
    epoch: Int
    first_offset: Int
    next_offset: Int
    state: str
    updated_at: Int


@attrs.frozen
class StreamRow:
    """One named stream of a run and its attempts, in order."""

    name: str
    attempts: tuple[StreamAttemptRow, ...]

    @property
    def chunks(self) -> int:
        """How many chunks it has (the offsets are gap-free across its attempts)."""
        return sum(
            a.next_offset - a.first_offset
            for a in self.attempts
            if type(a.next_offset) is int and type(a.first_offset) is int
        )


@attrs.frozen
class StreamChunkRow:
    """One chunk: its offset, the attempt that wrote it, its JSON text (cut to a prefix when
    ``truncated``: ``size`` is the whole text's), whether it starts an attempt after the first
    (``restarted``), and when it was stored."""

    name: str
    offset: Int
    attempt: Int
    data: str
    truncated: bool
    size: int
    restarted: bool
    created_at: Int


def list_streams(conn: Reader, run_id: str, *, limit: int | None = STREAMS_SHOWN) -> tuple[StreamRow, ...]:
    """The run's streams by name (the first ``limit``; None: all), each with its attempts; an
    attempt still ``open`` whose writer can no longer write is given as ``interrupted``. A
    database from before streams has none."""
    if not conn.has_table("streams"):
        return ()
    d = conn.dialect
    # The writer of an open attempt is the run's owner of its epoch, while it holds the lease.
    rows = conn.execute(
        f"SELECT {name_column('s.name')}, {d.int_column('s.attempt')}, {d.int_column('s.epoch')},"
        f" {d.int_column('s.first_offset')}, {d.int_column('s.next_offset')},"
        " CASE WHEN s.state = 'open' AND NOT (r.status = 'running' AND r.lease_owner IS NOT NULL"
        " AND r.lease_epoch = s.epoch) THEN 'interrupted' ELSE s.state END,"
        f" {d.int_column('s.updated_at')}"
        " FROM streams AS s JOIN agent_runs AS r ON r.id = s.run_id"
        " WHERE s.run_id = ? AND s.name IN (SELECT DISTINCT name FROM streams WHERE run_id = ?"
        " ORDER BY name LIMIT ?) ORDER BY s.name, s.attempt",
        (run_id, run_id, d.limit(limit)),
    )
    streams: dict[str, list[StreamAttemptRow]] = {}
    for name, attempt, epoch, first, after, state, updated_at in rows:
        streams.setdefault(as_text(name), []).append(
            StreamAttemptRow(
                as_int(attempt),
                as_int(epoch),
                as_int(first),
                as_int(after),
                as_text(state),
                as_int(updated_at),
            )
        )
    return tuple(StreamRow(name, tuple(attempts)) for name, attempts in streams.items())


def list_stream_chunks(
    conn: Reader, run_id: str, name: str, *, after: int = -1, limit: int = 100, max_chars: int | None = None
) -> tuple[StreamChunkRow, ...]:
    """Up to ``limit`` chunks of a stream with offsets past ``after``, in order, each cut to
    ``max_chars`` characters (all of it by default)."""
    check_limit(limit)
    if not conn.has_table("streams"):
        return ()
    d = conn.dialect
    rows = conn.execute(
        f"SELECT {d.int_column('c.chunk_offset')}, {d.int_column('c.attempt')},"
        f" {json_columns('c.data', max_chars)}, c.chunk_offset = s.first_offset AND c.attempt > 1,"
        f" {d.int_column('c.created_at')}"
        " FROM stream_chunks AS c JOIN streams AS s"
        " ON s.run_id = c.run_id AND s.name = c.name AND s.attempt = c.attempt"
        " WHERE c.run_id = ? AND c.name = ? AND c.chunk_offset > ? ORDER BY c.chunk_offset LIMIT ?",
        (run_id, name, after, limit),
    )
    chunks = []
    for offset, attempt, data, size, restarted, created_at in cut_texts(conn, list(rows), (2,), max_chars):
        length = as_size(size)
        chunks.append(
            StreamChunkRow(
                name,
                as_int(offset),
                as_int(attempt),
                as_text(data),
                was_cut(max_chars, length),
                length,
                bool(restarted),
                as_int(created_at),
            )
        )
    return tuple(chunks)


def iter_stream_chunks(conn: Reader, run_id: str, *, page: int = 500) -> Iterator[StreamChunkRow]:
    """Every chunk of every stream of the run, stream by stream, fetched page by page."""
    for stream in list_streams(conn, run_id, limit=None):
        yield from iter_chunks_of(conn, run_id, stream.name, page=page)


def iter_chunks_of(
    conn: Reader, run_id: str, name: str, *, after: int = -1, page: int = 500
) -> Iterator[StreamChunkRow]:
    """Every chunk of one stream with an offset past ``after``, fetched page by page."""
    while True:
        batch = list_stream_chunks(conn, run_id, name, after=after, limit=page)
        yield from batch
        if len(batch) < page or type(batch[-1].offset) is not int:
            return
        after = batch[-1].offset
