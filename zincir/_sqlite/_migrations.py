"""Schema versioning: validate a file before touching it, then apply missing migrations."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

from .. import _schema
from .._errors import SchemaError
from .._schema import Migration

# PRAGMA application_id of every zincir database ("zncr"): tells our files from others.
APPLICATION_ID = 0x7A6E6372
VERSION_TABLE = "zincir_schema_migrations"
# What SQLite says about a file that is not a database at all; every other error (busy, I/O,
# cannot open) is about the file's situation, not its content.
_NOT_A_DATABASE = frozenset({sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT})


def _sqlite_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def load_migrations() -> tuple[Migration, ...]:
    return _schema.load("sqlite")


def _statements(sql: str) -> Iterator[str]:
    # executescript() would COMMIT first, so statements run one by one inside our transaction.
    buffer = ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            yield buffer
            buffer = ""
    if buffer.strip() and not buffer.strip().startswith("--"):
        raise SchemaError(f"incomplete SQL statement at the end of a migration: {buffer!r}")


def applied_version(conn: sqlite3.Connection, path: str) -> int:
    """The schema version of the file, 0 for an empty file; refuse foreign or newer files.

    Only reads, so a file that is refused is left byte-for-byte unchanged.
    """
    # One read transaction for every read: a migration another process commits meanwhile is
    # seen whole or not at all (not an application id of 0 beside zincir's tables).
    conn.execute("SAVEPOINT zincir_schema_check")
    try:
        return _read_version(conn, path)
    finally:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("RELEASE zincir_schema_check")


def _read_version(conn: sqlite3.Connection, path: str) -> int:
    try:
        application_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables and application_id == 0:
            return 0
        if application_id != APPLICATION_ID or VERSION_TABLE not in tables:
            raise SchemaError(f"{path} is a SQLite database, but not a zincir database")
        version: int = conn.execute(f"SELECT coalesce(max(version), 0) FROM {VERSION_TABLE}").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        if _sqlite_code(exc) in _NOT_A_DATABASE:
            raise SchemaError(f"{path} is not a zincir database ({exc})") from exc
        raise  # locked, unreadable, a read-only location: the caller says which
    latest = len(load_migrations())
    if version > latest:
        raise SchemaError(
            f"{path} has schema version {version}, newer than this zincir (knows up to {latest});"
            " upgrade zincir to open it"
        )
    return version


def migrate(conn: sqlite3.Connection, path: str, now_ms: int) -> None:
    """Apply the missing migrations in one IMMEDIATE transaction.

    The version is read again after the write lock is held, so two processes opening the same
    new file at once apply each migration exactly once.
    """
    migrations = load_migrations()
    if applied_version(conn, path) == len(migrations):
        return
    # A migration that rebuilds a table drops the old one: with foreign keys on, that drop would
    # delete (cascade) every row pointing at it. The pragma is ignored inside a transaction, so it
    # is switched off around it, and the keys are checked before the commit instead.
    conn.execute("PRAGMA foreign_keys = OFF")
    try:
        _migrate_immediate(conn, path, migrations, now_ms)
    finally:
        conn.execute("PRAGMA foreign_keys = ON")


def _migrate_immediate(
    conn: sqlite3.Connection, path: str, migrations: tuple[Migration, ...], now_ms: int
) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = applied_version(conn, path)
        if current == 0:
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(
                f"CREATE TABLE {VERSION_TABLE} (version INTEGER PRIMARY KEY,"
                " name TEXT NOT NULL, applied_at INTEGER NOT NULL)"
            )
        for migration in migrations[current:]:
            for statement in _statements(migration.sql):
                conn.execute(statement)
            conn.execute(
                f"INSERT INTO {VERSION_TABLE} (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, now_ms),
            )
        broken = conn.execute("PRAGMA foreign_key_check").fetchmany(5)
        if broken:
            raise SchemaError(f"{path}: a migration would leave broken foreign keys: {broken!r}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # SQLite rolls back by itself after some errors
            conn.execute("ROLLBACK")
        raise
