"""The throwaway PostgreSQL server and per-test databases, and the PostgreSQL schema on them."""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

# The session fixture is imported explicitly. Once conftest.py imports it for every module, drop
# it from this import: a second definition here would start a second server for this module.
from .postgres_server import fresh_database, fresh_schema, postgres_admin_url  # noqa: F401

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
# The SQLite schema moves from migrations/ to migrations/sqlite/; read it wherever it is.
SQLITE_SCHEMA = next(
    path
    for path in (MIGRATIONS / "sqlite" / "0001_initial.sql", MIGRATIONS / "0001_initial.sql")
    if path.exists()
)


def _exists(admin_url: str, query: str, name: str) -> bool:
    with psycopg.connect(admin_url) as admin:
        return admin.execute(query, (name,)).fetchone() is not None


def test_fresh_database_is_usable_then_dropped(postgres_admin_url: str) -> None:  # noqa: F811
    with fresh_database(postgres_admin_url) as url:
        name = urlsplit(url).path.removeprefix("/")
        with psycopg.connect(url) as conn:
            assert conn.info.dbname == name
            row = conn.execute("SELECT clock_timestamp()").fetchone()
            assert row is not None
            assert abs(row[0] - datetime.now(UTC)) < timedelta(minutes=1)
            conn.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, payload TEXT NOT NULL)")
            conn.execute("INSERT INTO t VALUES (1, '{\"a\": 1}')")
            conn.commit()
            assert conn.execute("SELECT id, payload FROM t").fetchall() == [(1, '{"a": 1}')]
        # A connection still open at the end (a failed test's) must not stop the drop.
        lingering = psycopg.connect(url)
    try:
        assert not _exists(postgres_admin_url, "SELECT 1 FROM pg_database WHERE datname = %s", name)
    finally:
        lingering.close()


def test_fresh_schema_is_selected_then_dropped(postgres_admin_url: str) -> None:  # noqa: F811
    with fresh_schema(postgres_admin_url) as url, psycopg.connect(url) as conn:
        row = conn.execute("SELECT current_schema()").fetchone()
        assert row is not None
        name = row[0]
        assert name.startswith("zincir_test_")
        conn.execute("CREATE TABLE t (id BIGINT)")
        conn.commit()
        assert _exists(
            postgres_admin_url, "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = 't'", name
        )
    assert not _exists(postgres_admin_url, "SELECT 1 FROM pg_namespace WHERE nspname = %s", name)


def test_postgresql_schema_matches_sqlite_and_fakes_the_clock(postgres_admin_url: str) -> None:  # noqa: F811
    lite = sqlite3.connect(":memory:")
    try:
        lite.executescript(SQLITE_SCHEMA.read_text())
        sqlite_tables = {
            row[0]: [c[1] for c in lite.execute(f"PRAGMA table_info({row[0]})")]
            for row in lite.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        }
        sqlite_indexes = {
            row[0]
            for row in lite.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_%'"
            )
        }
    finally:
        lite.close()
    with fresh_database(postgres_admin_url) as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute((MIGRATIONS / "postgresql" / "0001_initial.sql").read_text())
        columns: dict[str, list[str]] = {}
        for table, column, data_type in conn.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = 'public' ORDER BY table_name, ordinal_position"
        ):
            columns.setdefault(table, []).append(column)
            assert data_type in ("text", "bigint"), (table, column, data_type)
        assert columns == sqlite_tables
        indexes = {
            row[0] for row in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'public'")
        }
        assert sqlite_indexes <= indexes

        def now_ms() -> int:
            row = conn.execute("SELECT zincir_now_ms()").fetchone()
            assert row is not None
            return int(row[0])

        before = time.time_ns() // 1_000_000
        assert before <= now_ms() <= time.time_ns() // 1_000_000
        conn.execute("SET zincir.now_ms = '1700000000000'")
        assert now_ms() == 1_700_000_000_000
        conn.execute("RESET zincir.now_ms")  # the setting now reads as '', not as unset
        assert now_ms() >= before
