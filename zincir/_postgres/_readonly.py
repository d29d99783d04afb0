"""A read-only PostgreSQL connection for the inspector and the read-only CLI commands.

It drives the queries of :mod:`zincir._queries` (qmark-style SQL in the common subset of
SQLite and PostgreSQL, plus the fragments its dialect, ``POSTGRES``, supplies) over one psycopg
connection:

- the session is ``default_transaction_read_only`` and every snapshot is a ``REPEATABLE READ
  READ ONLY`` transaction, so the server refuses any write; nothing here migrates;
- a database without zincir's schema, or with a newer one, is refused with
  :class:`~zincir.SchemaError` (after reads only: it is left as it was);
- psycopg errors become zincir's (:class:`~zincir.DatabaseUnavailable` for a lost or refused
  connection, :class:`~zincir.DatabaseBusy` for a statement timeout).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

import psycopg

from .._errors import SchemaError, StorageError
from .._sql import Cursor, ReadOnly
from ._connection import connect, redact, storage_error
from ._migrations import VERSION_TABLE, applied_version
from ._tx import POSTGRES

__all__ = ["PostgresReadOnly", "open_postgres_readonly"]

_BEGIN: Final = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"


def _error(exc: psycopg.Error, where: str) -> StorageError:
    """zincir's error for ``exc``, on one line (libpq's messages span several)."""
    error = storage_error(exc, where)
    return type(error)(" ".join(str(error).split()))


def _translate(sql: str) -> str:
    """qmark placeholders to psycopg's; a literal ``%`` must be doubled for psycopg."""
    return sql.replace("%", "%%").replace("?", "%s")


class PostgresReadOnly(ReadOnly):
    """One read-only psycopg connection (autocommit, explicit read-only transactions)."""

    dialect = POSTGRES
    worth_keeping = True  # a new server connection costs ~10 ms; results are fetched whole

    def __init__(self, conn: psycopg.Connection[Any], target: str) -> None:
        self._conn = conn
        self.target = target

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        return self._conn.execute(_translate(sql), list(params))

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        try:
            self._conn.execute(_BEGIN)
        except psycopg.Error as exc:
            raise _error(exc, f"{self.target}: starting a read") from exc
        try:
            yield
        except psycopg.Error as exc:
            raise _error(exc, f"{self.target}: reading the database") from exc
        finally:
            with contextlib.suppress(psycopg.Error):
                self._conn.execute("ROLLBACK")

    def has_table(self, name: str) -> bool:
        # to_regclass resolves the name the queries use (through search_path).
        return bool(self._conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()[0])  # type: ignore[index]

    def has_column(self, table: str, column: str) -> bool:
        # The catalog itself, not information_schema (whose views cost milliseconds a page).
        found = self._conn.execute(
            "SELECT 1 FROM pg_attribute"
            " WHERE attrelid = to_regclass(%s) AND attname = %s AND NOT attisdropped",
            (table, column),
        )
        return found.fetchone() is not None

    def close(self) -> None:
        self._conn.close()


def open_postgres_readonly(url: str, required_tables: Iterable[str]) -> PostgresReadOnly:
    """Connect read-only and check that the database has zincir's schema, not a newer one."""
    where = redact(url)
    try:
        conn = connect(url, application_name="zincir inspect")
    except psycopg.Error as exc:
        raise _error(exc, f"cannot connect to {where}") from exc
    except ValueError as exc:  # a URL psycopg cannot parse
        raise StorageError(f"cannot connect to {where}: {exc}") from exc
    try:
        conn.execute("SET default_transaction_read_only = on")
        _check_schema(conn, where, required_tables)
    except psycopg.Error as exc:
        conn.close()
        raise _error(exc, f"{where}: reading the schema") from exc
    except BaseException:
        conn.close()
        raise
    return PostgresReadOnly(conn, where)


def _check_schema(conn: psycopg.Connection[Any], where: str, required_tables: Iterable[str]) -> None:
    conn.execute(_BEGIN)
    try:
        version = applied_version(conn, where)  # refuses a newer schema and look-alike tables
        if version < 1:
            raise SchemaError(
                f"{where} is not a zincir database (no {VERSION_TABLE} table; the inspector"
                " never creates or migrates one: open it with zincir first)"
            )
        rows = conn.execute(
            "SELECT t FROM unnest(%s::text[]) AS t WHERE to_regclass(t) IS NULL", (sorted(required_tables),)
        ).fetchall()
        if rows:
            raise SchemaError(
                f"{where} is not a zincir database (missing tables: {', '.join(r[0] for r in rows)})"
            )
    finally:
        conn.execute("ROLLBACK")
