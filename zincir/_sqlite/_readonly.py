"""A read-only SQLite connection for the inspector and the read-only CLI commands.

It drives the queries of :mod:`zincir._queries` over one ``mode=ro`` connection, so that SQLite
itself refuses any write and never creates a missing file. Columns are not typed here (the
tables are not ``STRICT``): its dialect (``SQLITE``) reads INTEGER columns through ``typeof()``,
so a TEXT or BLOB that someone stored there is read bounded instead of whole.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

from .._errors import DatabaseBusy, SchemaError, StorageError
from .._sql import Cursor, ReadOnly
from ._connection import SQLITE
from ._migrations import APPLICATION_ID, load_migrations

__all__ = ["SQLiteReadOnly", "open_sqlite_readonly"]

_BUSY_TIMEOUT: Final = 5.0


class SQLiteReadOnly(ReadOnly):
    """One ``mode=ro`` connection in autocommit mode; :meth:`snapshot` is a read transaction."""

    dialect = SQLITE
    # Opening costs under a millisecond; and a statement left open by one read (a cursor kept
    # alive by a traceback) would hold its snapshot into the next read on this connection.
    worth_keeping = False

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self._conn = conn
        self.target = path

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        return self._conn.execute(sql, params)

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        try:
            self._conn.execute("BEGIN")
        except sqlite3.Error as exc:
            raise _storage_error(exc, "starting a read") from exc
        try:
            yield
        except sqlite3.Error as exc:
            raise _storage_error(exc, "reading the database") from exc
        finally:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")

    def has_table(self, name: str) -> bool:
        found = self._conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
        return found.fetchone() is not None

    def has_column(self, table: str, column: str) -> bool:
        found = self._conn.execute("SELECT 1 FROM pragma_table_info(?) WHERE name = ?", (table, column))
        return found.fetchone() is not None

    def close(self) -> None:
        self._conn.close()


def _decode_text(raw: bytes) -> str:
    # A damaged or foreign TEXT value must not make a page fail to render.
    return raw.decode("utf-8", "replace")


def open_sqlite_readonly(path: str, required_tables: Iterable[str]) -> SQLiteReadOnly:
    """Open an existing file read-only and check that it holds zincir's schema, not a newer one."""
    if not os.path.isfile(path):
        raise StorageError(
            f"database file {path!r} does not exist "
            "(the inspector opens existing databases read-only and never creates one)"
        )
    uri = f"file:{urllib.parse.quote(path)}?mode=ro"
    try:
        conn = sqlite3.connect(
            uri, uri=True, timeout=_BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise StorageError(f"cannot open database file {path!r} read-only: {exc}") from exc
    conn.text_factory = _decode_text
    try:
        _check_schema(conn, path, frozenset(required_tables))
    except BaseException:
        conn.close()
        raise
    return SQLiteReadOnly(conn, path)


def _check_schema(conn: sqlite3.Connection, path: str, required_tables: frozenset[str]) -> None:
    try:
        application_id = conn.execute("PRAGMA application_id").fetchone()[0]
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        missing = required_tables - {row[0] for row in rows}
        # 0 is accepted too: files made by hand with the schema's SQL (tests, tools).
        if application_id not in (0, APPLICATION_ID) or missing:
            detail = f"missing tables: {', '.join(sorted(missing))}" if missing else "foreign file"
            raise SchemaError(f"{path!r} is not a zincir database ({detail})")
        version = conn.execute("SELECT coalesce(max(version), 0) FROM zincir_schema_migrations").fetchone()[0]
    except sqlite3.OperationalError as exc:
        raise _storage_error(exc, f"reading the schema of {path!r}") from exc
    except sqlite3.DatabaseError as exc:
        raise SchemaError(f"{path!r} is not a zincir database ({exc})") from exc
    if type(version) is not int or version < 1:
        raise SchemaError(f"{path!r} has no applied zincir migration")
    known = len(load_migrations())
    if version > known:
        raise SchemaError(
            f"{path!r} has schema version {version}, newer than this zincir (reads up to {known});"
            " upgrade zincir"
        )


def _storage_error(exc: sqlite3.Error, doing: str) -> StorageError:
    message = f"{doing}: {exc}"
    if "locked" in str(exc) or "busy" in str(exc):
        return DatabaseBusy(message)
    return StorageError(message)
