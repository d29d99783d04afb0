"""libpq's pipeline mode, driven by hand: one flush per round trip.

psycopg's own pipeline flushes and polls after every statement it sends (a ``sendto`` and two
``poll`` calls each); here statements wait in libpq's output buffer and leave together with the
next read or sync. Queries are converted and their parameters dumped by psycopg's own
``PostgresQuery``, rows loaded by its ``Transformer``, errors built by ``error_from_result``: the
same values and the same exceptions as psycopg's cursors give, at a fraction of the calls.
"""

from __future__ import annotations

import select
from collections import deque
from typing import Any, Final

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg._queries import PostgresQuery  # private: pyproject allows psycopg below 3.4 only
from psycopg.adapt import Transformer

__all__ = ["Pending", "Pipe"]

_PREPARED: Final = 256  # statements prepared per connection at most (the rest go unprepared)
_SEEN: Final = 4096  # texts remembered as sent once (the second sending prepares)
_POLL_S: Final = 1.0  # a wait on the socket looks again this often (the server ends a stuck one)

_FATAL: Final = pq.ExecStatus.FATAL_ERROR
_ABORTED: Final = pq.ExecStatus.PIPELINE_ABORTED
_SYNC: Final = pq.ExecStatus.PIPELINE_SYNC
_TUPLES: Final = pq.ExecStatus.TUPLES_OK

_Key = tuple[bytes, tuple[int, ...]]  # a statement as prepared: its text and parameter types


class Pending:
    """A statement sent and not read yet; its results arrive in order with the others'."""

    __slots__ = ("_pipe", "_results", "prepares")

    def __init__(self, pipe: Pipe, prepares: tuple[_Key, bytes] | None = None) -> None:
        self._pipe = pipe
        self._results: list[pq.abc.PGresult] | None = None
        self.prepares = prepares  # (query key, name) of a PREPARE, None for a statement

    def _arrive(self, results: list[pq.abc.PGresult]) -> None:
        self._results = results

    def result(self) -> pq.abc.PGresult:
        """Wait for this statement's (last) result; raise its error."""
        if self._results is None:
            self._pipe.read_through(self)
        assert self._results is not None
        result = self._results[-1]
        self._pipe.check(result)
        return result

    def one(self) -> Any:
        result = self._rows()
        return self._pipe.load(result, 1)[0] if result.ntuples else None

    def all(self) -> list[Any]:
        result = self._rows()
        return self._pipe.load(result, result.ntuples)

    def _rows(self) -> pq.abc.PGresult:
        result = self.result()
        if result.status != _TUPLES:  # as psycopg's fetch: a statement without rows is a bug
            raise psycopg.ProgrammingError("the statement returned no rows to read (no RETURNING?)")
        return result

    @property
    def status(self) -> str | None:
        """The command's status tag (``COMMIT``, ``ROLLBACK``, ``INSERT 0 1``), once read."""
        tag = self.result().command_status
        return None if tag is None else tag.decode()


class Pipe:
    """One psycopg connection's libpq in pipeline mode. Only this object may use the connection
    from here on (psycopg's cursors would not know of the pipeline)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._pg = conn.pgconn
        self._encoding = conn.info.encoding
        self._transformer = Transformer(conn)
        self._prepared: dict[_Key, bytes] = {}  # statement -> its prepared name
        self._seen: set[_Key] = set()  # sent once unprepared: prepared on the second time
        self._names = 0
        self._queue: deque[Pending | None] = deque()  # None: a sync
        self._flush_requested = False
        # poll, not select: a process with many files open gets descriptors past select's 1024.
        self._readable, self._writable = select.poll(), select.poll()
        self._readable.register(self._pg.socket, select.POLLIN)
        self._writable.register(self._pg.socket, select.POLLIN | select.POLLOUT)
        self._pg.enter_pipeline_mode()

    @property
    def aborted(self) -> bool:
        return self._pg.pipeline_status == pq.PipelineStatus.ABORTED

    # -- sending ----------------------------------------------------------------------------

    def send(self, query: Any, params: Any = (), *, prepare: bool = True) -> Pending:
        """Send a statement (prepared the second time its text is sent, unless ``prepare`` is
        false); nothing leaves libpq's buffer until the next read or sync."""
        pgq = PostgresQuery(self._transformer)
        pgq.convert(query, params)
        key = (pgq.query, tuple(pgq.types))
        name = self._prepared.get(key) if prepare else None
        if name is None and prepare and key in self._seen:
            name = self._prepare(key, pgq)
        elif prepare:
            if len(self._seen) >= _SEEN:
                self._seen.clear()  # statements built on the fly must not grow it for ever
            self._seen.add(key)
        if name is None:
            self._pg.send_query_params(
                pgq.query, pgq.params, param_types=pgq.types, param_formats=pgq.formats
            )
        else:
            self._pg.send_query_prepared(name, pgq.params, param_formats=pgq.formats)
        pending = Pending(self)
        self._queue.append(pending)
        self._flush_requested = False
        return pending

    def _prepare(self, key: _Key, pgq: PostgresQuery) -> bytes | None:
        if len(self._prepared) >= _PREPARED:
            return None  # enough: the rest go unprepared
        self._names += 1
        name = f"_zincir_{self._names}".encode()
        self._pg.send_prepare(name, pgq.query, param_types=pgq.types)
        self._queue.append(Pending(self, prepares=(key, name)))
        self._prepared[key] = name
        return name

    def sync(self) -> None:
        """Send a sync (the end of an implicit transaction), wait for everything sent before it,
        and raise the first error among the results nobody has read. Statements the server
        skipped (aborted) are not errors of their own: the failure that made it skip them came
        first, here or in a read already."""
        self._pg.pipeline_sync()
        self._queue.append(None)
        self._flush_requested = False
        self._flush()
        first: psycopg.Error | None = None
        while self._queue:
            pending = self._queue.popleft()
            if pending is None:
                error = self._read_sync()
                if first is None:
                    first = error
                break
            error = self._read_next(pending)
            if first is None:
                first = error
        if first is not None:
            raise first

    # -- reading ----------------------------------------------------------------------------

    def read_through(self, target: Pending) -> None:
        """Read results in order until ``target``'s are in (the others' are kept for them)."""
        if not self._flush_requested:
            self._pg.send_flush_request()
            self._flush_requested = True
        self._flush()
        while target._results is None:
            pending = self._queue.popleft()
            if pending is None:  # a sync that was not read (its reader failed): its errors are old
                self._read_sync()
                continue
            error = self._read_next(pending)
            if error is not None and pending is not target:
                raise error  # the first failure is the one to report, as psycopg does

    def _read_next(self, pending: Pending) -> psycopg.Error | None:
        """Read ``pending``'s results (the next in line); the error it failed with, if any. A
        statement the server skipped behind a failure has none of its own (reading it raises,
        for whoever asks); a PREPARE that failed is forgotten, and its error is the statement's."""
        results = self._next()
        pending._arrive(results)
        status = results[-1].status
        if pending.prepares is not None and status in (_FATAL, _ABORTED):
            key, name = pending.prepares
            if self._prepared.get(key) == name:
                del self._prepared[key]
            self._seen.discard(key)
        if status != _FATAL:
            return None
        return pg_errors.error_from_result(results[-1], encoding=self._encoding)

    def check(self, result: pq.abc.PGresult) -> None:
        if result.status == _FATAL:
            raise pg_errors.error_from_result(result, encoding=self._encoding)
        if result.status == _ABORTED:
            raise pg_errors.PipelineAborted("pipeline aborted")

    def load(self, result: pq.abc.PGresult, rows: int) -> list[Any]:
        self._transformer.set_pgresult(result)
        return self._transformer.load_rows(0, rows, tuple)

    def _read_sync(self) -> psycopg.Error | None:
        """Read up to a sync's PIPELINE_SYNC; the error that came in its place first, if any (an
        implicit commit that failed, or the server ending the connection)."""
        error: psycopg.Error | None = None
        idle = False
        while True:
            self._until_ready()
            result = self._pg.get_result()
            if result is None:
                if self._pg.status == pq.ConnStatus.BAD:
                    raise error or self._lost()
                if idle and not self._pg.is_busy():
                    raise self._out_of_step("awaited a sync that was never sent")
                idle = True  # the end of an error's results: the sync's own comes next
                continue
            idle = False
            if result.status == _SYNC:
                return error
            if error is None:
                try:
                    self.check(result)
                except psycopg.Error as exc:
                    error = exc

    def _until_ready(self) -> None:
        while self._pg.is_busy():
            self._wait()
            self._consume()

    def _next(self) -> list[pq.abc.PGresult]:
        """The next statement's results, up to the NULL that ends them."""
        results: list[pq.abc.PGresult] = []
        while True:
            self._until_ready()
            result = self._pg.get_result()
            if result is None:
                if results:
                    return results
                if self._pg.status == pq.ConnStatus.BAD:
                    raise self._lost()
                # libpq has no command left although one was awaited: a bug, never a wait.
                raise self._out_of_step("awaited a result that was never sent")
            if result.status == _SYNC:  # a statement's place
                raise self._out_of_step("read a sync where a statement's result was due")
            results.append(result)

    def _flush(self) -> None:
        while True:
            left = self._pg.flush()
            if left == 0:
                return
            if left < 0:
                raise self._lost()
            if self._wait(write=True):
                self._consume()

    def _consume(self) -> None:
        try:
            self._pg.consume_input()
        except psycopg.OperationalError as exc:
            raise self._lost() from exc

    def _wait(self, *, write: bool = False) -> bool:
        """Wait until the socket can be read (or written); whether it can be read."""
        poller = self._writable if write else self._readable
        while True:
            events = poller.poll(_POLL_S * 1000)
            if events:
                return any(mask & (select.POLLIN | select.POLLHUP | select.POLLERR) for _, mask in events)

    def _out_of_step(self, what: str) -> psycopg.OperationalError:
        """A bug: the queue and libpq's results disagree. Every later result would go to the
        wrong statement, so the connection ends here (and is found lost, its work unknown)."""
        self._pg.finish()
        return psycopg.OperationalError(f"zincir's pipeline {what}; the connection was closed")

    def _lost(self) -> psycopg.OperationalError:
        message = self._pg.error_message.decode(errors="replace").strip() or "the connection was lost"
        return psycopg.OperationalError(f"consuming input failed: {message}")
