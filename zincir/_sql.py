"""What the read queries and each backend's read-only connection agree on.

The read queries (:mod:`zincir._queries`) are written once, in qmark-style SQL of the subset
SQLite and PostgreSQL share. Each backend brings a :class:`ReadOnly` connection that runs them
and a :class:`Dialect` that supplies the few fragments where the two differ
(:mod:`zincir._sqlite._readonly`, :mod:`zincir._postgres._readonly`). Both sides import this
module and nothing of each other, so the queries can open a backend's connection without an
import inside a function.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Final, Protocol

__all__ = ["KEY_CHARS", "Cursor", "Dialect", "ReadOnly"]

#: Characters read of a TEXT or BLOB value found in an INTEGER column (a cursor keeps them).
KEY_CHARS: Final = 256


class Cursor(Protocol):
    """What ``execute`` returns: rows one by one, or the first one."""

    def fetchone(self) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...

    def close(self) -> None: ...


class Dialect(abc.ABC):
    """How one backend's SQL differs from the common subset the read queries are written in."""

    name: str
    loose_types: bool
    """Whether any column may hold any type (SQLite without ``STRICT``): then a key of any type
    can name a row, and INTEGER columns are read through :meth:`int_column`."""
    unlimited: int | None
    """The ``LIMIT`` parameter that means "no limit"."""
    runs_by_role: str
    """The table expression to count runs by role from (no index covers the role)."""

    @abc.abstractmethod
    def int_column(self, column: str) -> str:
        """SQL for an INTEGER column, bounded when something else was stored there."""

    @abc.abstractmethod
    def event_count(self) -> str:
        """SQL for a run's ``last_seq + 1`` (a malformed ``last_seq`` is read as it is)."""


class ReadOnly(abc.ABC):
    """A read-only connection to one zincir database, as a backend provides it.

    ``execute`` takes qmark-style SQL and parameters and translates them for its driver;
    :meth:`snapshot` runs a block in one read-only transaction and turns the driver's errors
    into :class:`StorageError` (or :class:`~zincir.DatabaseBusy`).
    """

    dialect: Dialect
    target: str
    """What to call the database in messages and pages (a path, a URL without its password)."""
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
