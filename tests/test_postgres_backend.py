"""What only the PostgreSQL backend has: URLs, its migrations, its refusals, its connections."""

from __future__ import annotations

import socket
from pathlib import Path

import psycopg
import pytest

import zincir
from zincir import _schema

from .helpers import dump
from .test_database import open_from_processes_at_once


def tables(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename"
        ).fetchall()
    return [name for (name,) in found]


def test_four_processes_opening_a_new_database_migrate_it_once(pg_url: str, tmp_path: Path) -> None:
    open_from_processes_at_once(pg_url, tmp_path / "go")
    with psycopg.connect(pg_url) as conn:
        versions = conn.execute("SELECT version FROM zincir_schema_migrations ORDER BY version").fetchall()
    assert versions == [(m.version,) for m in _schema.load("postgresql")]


async def test_the_postgres_scheme_alias_and_the_backend_name(pg_url: str) -> None:
    alias = "postgres://" + pg_url.removeprefix("postgresql://")
    async with zincir.open_database(alias) as db:
        assert db.backend == "postgresql"
        assert "postgresql://" in repr(db)
        async with zincir.open_run(db) as run:
            await run.complete()
        assert [r.status for r in await db.runs()] == [zincir.RunStatus.COMPLETED]


async def test_sqlite_urls_name_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    async with zincir.open_database("sqlite:///relative.db") as db:
        assert db.backend == "sqlite"
    async with zincir.open_database(f"sqlite:///{tmp_path}/absolute.db") as db:
        assert db.path == f"{tmp_path}/absolute.db"
    assert (tmp_path / "relative.db").is_file() and (tmp_path / "absolute.db").is_file()


async def test_an_unknown_url_scheme_is_invalid() -> None:
    with pytest.raises(zincir.InvalidArgument, match="scheme 'mysql'"):
        async with zincir.open_database("mysql://host/db"):
            pass


async def test_an_unreachable_server_is_a_storage_error() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(zincir.StorageError, match="cannot connect"):
        async with zincir.open_database(f"postgresql://nobody@127.0.0.1:{port}/nothing"):
            pass


async def test_a_database_with_a_newer_schema_is_refused_and_left_unchanged(pg_url: str) -> None:
    async with zincir.open_database(pg_url) as db:
        pass
    with psycopg.connect(pg_url) as conn:
        conn.execute("INSERT INTO zincir_schema_migrations VALUES (999, '0999_future', 0)")
    before = dump(db)
    with pytest.raises(zincir.SchemaError, match="schema version 999"):
        async with zincir.open_database(pg_url):
            pass
    assert dump(db) == before


async def test_a_database_with_foreign_tables_of_zincirs_names_is_refused(pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE TABLE agent_runs (id INTEGER)")
    with pytest.raises(zincir.SchemaError, match="not a zincir database"):
        async with zincir.open_database(pg_url):
            pass
    assert tables(pg_url) == ["agent_runs"]  # nothing was created beside it


async def test_writers_are_configurable_and_sqlite_has_one(pg_url: str, tmp_path: Path) -> None:
    async with zincir.open_database(pg_url, writers=3) as db:
        assert len(db._writers) == 3
        async with zincir.open_run(db) as run:
            for i in range(5):  # one run's operations always on one writer: in order
                await run.record_response(f"r{i}", [], "end")
            await run.complete()
        assert [e.seq for e in await db.events(run.id)] == list(range(7))
    with pytest.raises(zincir.InvalidArgument, match="one writer"):
        async with zincir.open_database(tmp_path / "x.db", writers=2):
            pass
    with pytest.raises(zincir.InvalidArgument, match="writers"):
        async with zincir.open_database(pg_url, writers=0):
            pass
