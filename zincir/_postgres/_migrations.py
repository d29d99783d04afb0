"""PostgreSQL schema versioning: serialized across concurrent first starts by an advisory lock."""

from __future__ import annotations

from typing import Any, Final

import psycopg

from .. import _schema
from .._errors import SchemaError

VERSION_TABLE: Final = "zincir_schema_migrations"
# pg_advisory_xact_lock key: "zncr" as an integer, shared by every zincir process.
_MIGRATION_LOCK: Final = 0x7A6E6372
_ZINCIR_TABLES: Final = ("agent_runs", "events", "tool_intents", "checkpoints", "steps", "timers")


def applied_version(conn: psycopg.Connection[Any], where: str) -> int:
    """The schema version, 0 for a database without zincir's tables; refuse foreign or newer ones.

    Only reads, so a database that is refused is left unchanged.
    """
    # One statement, one snapshot: a migration committing meanwhile is seen whole or not at all.
    has_versions, found = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL,"
        " array(SELECT t FROM unnest(%s::text[]) AS t WHERE to_regclass(t) IS NOT NULL)",
        (VERSION_TABLE, list(_ZINCIR_TABLES)),
    ).fetchone() or (False, [])
    if not has_versions:
        if found:
            raise SchemaError(
                f"{where} has tables named like zincir's ({', '.join(found)}) but is not a zincir database"
            )
        return 0
    (version,) = conn.execute(f"SELECT coalesce(max(version), 0) FROM {VERSION_TABLE}").fetchone() or (0,)
    latest = len(_schema.load("postgresql"))
    if version > latest:
        raise SchemaError(
            f"{where} has schema version {version}, newer than this zincir (knows up to {latest});"
            " upgrade zincir to open it"
        )
    return int(version)


def migrate(conn: psycopg.Connection[Any], where: str) -> None:
    """Apply the missing migrations in one transaction, under an advisory lock, so that
    processes starting at once on a new database apply each migration exactly once."""
    migrations = _schema.load("postgresql")
    if applied_version(conn, where) == len(migrations):
        return
    # A session lock taken before the transaction begins: the transaction then starts after
    # the previous holder committed, so its catalog lookups see the tables that one created.
    conn.execute("SET lock_timeout = '60s'")  # this connection only migrates, then closes
    conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
    try:
        _migrate_locked(conn, where, migrations)
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))


def _migrate_locked(
    conn: psycopg.Connection[Any], where: str, migrations: tuple[_schema.Migration, ...]
) -> None:
    conn.execute("BEGIN")
    try:
        current = applied_version(conn, where)  # again, now that the lock is held
        if current == 0:
            conn.execute(
                f"CREATE TABLE {VERSION_TABLE} (version BIGINT PRIMARY KEY, name TEXT NOT NULL,"
                " applied_at BIGINT NOT NULL)"
            )
        for migration in migrations[current:]:
            conn.execute(migration.sql.encode())  # several statements: the simple query protocol
            conn.execute(
                f"INSERT INTO {VERSION_TABLE} (version, name, applied_at) VALUES (%s, %s, zincir_now_ms())",
                (migration.version, migration.name),
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
