"""What the SQL written once for both backends and each backend's connections agree on.

The storage operations (:mod:`zincir._store`) and the read queries (:mod:`zincir._queries`) are
written once, in qmark-style SQL of the subset SQLite and PostgreSQL share; a :class:`Dialect`
supplies the few fragments where the two differ. Each backend also brings a :class:`ReadOnly`
connection that runs the read queries (:mod:`zincir._sqlite._readonly`,
:mod:`zincir._postgres._readonly`). Both sides import this
module and nothing of each other, so the queries can open a backend's connection without an
import inside a function.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs

if TYPE_CHECKING:
    from ._crypto import Sealer


__all__ = ["KEY_CHARS", "Cursor", "Dialect", "ReadOnly"]

#: Characters read of a TEXT or BLOB value found in an INTEGER column (a cursor keeps them).
KEY_CHARS: Final = 256


class Cursor(Protocol):
    """What ``execute`` returns: rows one by one, or the first one."""

    def fetchone(self) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...

    def close(self) -> None: ...


@attrs.frozen(kw_only=True)
class Dialect:
    """Where one backend's SQL differs from the subset the operations and the read queries are
    written in. The defaults are a database whose one writer holds it whole (no row locks) and
    whose every column holds its declared type. Each backend has one (``zincir._sqlite``'s
    ``SQLITE``, ``zincir._postgres``'s ``POSTGRES``)."""

    name: str = attrs.field(kw_only=False)
    row_locks: bool = False
    """Whether a transaction locks rows (PostgreSQL, whose writers run side by side); without,
    every fragment below that locks is empty."""
    lock_nowait: str = ""
    """After a SELECT of ``agent_runs``: hold the rows against their owners' writes, failing at
    once (TransientConflict, retried) if one is held elsewhere, so no writer ever waits for a
    row while its group commit holds others."""
    skip_locked: str = ""
    """After a claim's SELECT: hold the rows, and pass over those another claim holds."""
    for_update_nowait: str = ""
    """After a SELECT of one row of another table: hold it until the transaction ends, failing
    at once (TransientConflict, retried) if another transaction holds it, as ``lock_nowait``."""
    delete_skip_locked: str = ""
    """After a SELECT of ``agent_runs`` rows about to be deleted (a prune): hold them against
    every write, and against a new row that refers to one, passing over those held elsewhere."""
    reclaim_space: bool = False
    """Whether freed pages go back to the file system by ``PRAGMA incremental_vacuum`` (SQLite:
    a database zincir creates has incremental auto-vacuum; docs/retention.md)."""
    least: str = "LEAST"
    """The name of the smaller-of-two function."""
    greatest: str = "GREATEST"
    wide: str = ""
    """A cast that lets a BIGINT sum overflow without an error (it is capped after)."""
    unlimited: int | None = None
    """The LIMIT parameter that means no limit."""
    chunk: int | None = None
    """How many values one ``IN`` list takes at most (None: one array parameter, any size)."""
    end_waiters: bool = False
    """Whether ``wait_for_end``'s waiters are rows (``run_waiters``) that a run's end notifies."""
    index_hints: bool = False
    """Whether the planner takes (and sometimes needs) a hint of the index to read by, or of none."""
    content_guard: str = ""
    """A statement a write that stores payload parts runs first (:mod:`zincir._payloads`), and
    ``sweep_guard`` one a sweep of unreferenced parts runs first: PostgreSQL's writers run side
    by side, so a writer that found a part already stored (and added only its reference) must
    not commit after a sweep that saw no reference deleted it. Writers take one advisory lock
    shared (they never wait for each other), a sweep takes it exclusive: it waits for the
    writers in flight, and a writer that comes meanwhile fails its lock_timeout and is retried.
    SQLite has one writer: nothing to guard."""
    sweep_guard: str = ""
    loose_types: bool = False
    """Whether any column may hold any type (SQLite without ``STRICT``): then a key of any type
    can name a row, and the read queries read INTEGER columns through :meth:`int_column`."""
    table_exists: str = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    """A row if the table ``?`` names exists (for a check that must work on an older schema)."""
    secure_delete: str = ""
    """The statement that makes a connection zero the bytes it deletes or moves, for good (SQLite's
    ``secure_delete``, kept on by an encrypted database's writer so that no copy of an erased
    run's key is left in free space; PostgreSQL has none: docs/payloads.md#erasure)."""

    def limit(self, limit: int | None) -> int | None:
        """The LIMIT parameter of at most ``limit`` rows (None: all of them)."""
        return self.unlimited if limit is None else limit

    def indexed(self, index: str) -> str:
        """After a table's name: read it through ``index`` (SQLite's planner may not see that
        a partial index or a range is best; PostgreSQL's does)."""
        return f" INDEXED BY {index}" if self.index_hints else ""

    def unindexed(self, table: str) -> str:
        """``table``, read by a scan of its rows (SQLite may walk an index where a scan is faster)."""
        return f"{table} NOT INDEXED" if self.index_hints else table

    def share_nowait(self, alias: str) -> str:
        """After a SELECT: hold ``alias``'s row against being written, failing at once if it is."""
        return f" FOR SHARE OF {alias} NOWAIT" if self.row_locks else ""

    def any_of(self, column: str, values: Sequence[Any]) -> tuple[str, tuple[Any, ...]]:
        """SQL that ``column`` is one of ``values`` (at most :attr:`chunk`), and its parameters."""
        if self.chunk is None:
            return f"{column} = ANY(?)", (list(values),)
        return f"{column} IN ({', '.join('?' * len(values))})", tuple(values)

    def chunks(self, values: Sequence[Any]) -> list[Sequence[Any]]:
        """``values`` in pieces that :meth:`any_of` takes."""
        if self.chunk is None:
            return [values]
        return [values[i : i + self.chunk] for i in range(0, len(values), self.chunk)]

    def int_column(self, column: str) -> str:
        """SQL for an INTEGER column, bounded when something else was stored there."""
        if not self.loose_types:
            return column
        cut = f"substr({column}, 1, {KEY_CHARS})"
        return f"CASE WHEN typeof({column}) IN ('text', 'blob') THEN {cut} ELSE {column} END"

    def event_count(self) -> str:
        """SQL for a run's ``last_seq + 1`` (a malformed ``last_seq`` is read as it is)."""
        if not self.loose_types:
            return "last_seq + 1"
        return (
            f"CASE typeof(last_seq) WHEN 'integer' THEN last_seq + 1 ELSE {self.int_column('last_seq')} END"
        )


class ReadOnly(abc.ABC):
    """A read-only connection to one zincir database, as a backend provides it.

    ``execute`` takes qmark-style SQL and parameters and translates them for its driver;
    :meth:`snapshot` runs a block in one read-only transaction and turns the driver's errors
    into :class:`StorageError` (or :class:`~zincir.DatabaseBusy`).
    """

    dialect: Dialect
    target: str
    """What to call the database in messages and pages (a path, a URL without its password)."""
    sealer: Sealer | None = None
    """The keys encrypted values are opened with (None: none given; an encrypted value then
    raises EncryptionKeyMissing): see ``zincir/_payloads.py``."""
    worth_keeping: bool
    """Whether a long-lived reader (the inspector) should keep this connection between reads
    rather than open a new one for each."""

    @abc.abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor: ...

    @abc.abstractmethod
    def snapshot(self) -> contextlib.AbstractContextManager[None]: ...

    @abc.abstractmethod
    def has_table(self, name: str) -> bool:
        """Whether the schema has this table (older schema versions lack some)."""

    @abc.abstractmethod
    def has_column(self, table: str, column: str) -> bool:
        """Whether ``table`` has this column (older schema versions lack some)."""

    @abc.abstractmethod
    def close(self) -> None: ...
