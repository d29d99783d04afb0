"""The inspector's kept read-only connections: reused, dropped after a fault, retired with age,
and used by a served inspector. PostgreSQL's are kept; SQLite's never are (opening one costs
under a millisecond, and an open statement would carry its snapshot into the next read)."""

from __future__ import annotations

import http.client
from typing import Any

import pytest
import trio

import zincir
from tests.postgres_server import fresh_database
from tests.test_postgres_faults import terminate
from zincir import _queries as q
from zincir._errors import RunNotFound, StorageError
from zincir._inspector import _pool, serve
from zincir._target import parse_target


class Opened:
    """Every read-only connection opened through ``q.open_readonly``, and which were closed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.conns: list[q.Reader] = []
        self.closed: list[q.Reader] = []
        real = q.open_readonly

        def open_readonly(path: Any) -> q.Reader:
            conn = real(path)
            close = conn.close

            def recorded_close() -> None:
                self.closed.append(conn)
                close()

            conn.close = recorded_close  # type: ignore[method-assign]
            self.conns.append(conn)
            return conn

        monkeypatch.setattr(q, "open_readonly", open_readonly)


@pytest.fixture
async def run_id(db: zincir.Database) -> str:
    async with zincir.open_run(db, role="pooled", provider="test") as run:
        await run.complete()
    return run.id


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Opened:
    return Opened(monkeypatch)


def status_of(run_id: str) -> Any:
    return lambda conn: q.get_run(conn, run_id).status


def kept(target: str) -> bool:
    return parse_target(target).backend == "postgresql"


async def test_a_kept_connection_serves_the_next_reads(db_target: str, run_id: str, opened: Opened) -> None:
    pool = _pool.ReadPool(db_target, keep=2)
    assert [pool.read(status_of(run_id)) for _ in range(3)] == ["completed"] * 3
    with pytest.raises(RunNotFound):
        pool.read(status_of("00000000-0000-4000-8000-000000000000"))
    assert pool.read(status_of(run_id)) == "completed"
    if kept(db_target):
        assert len(opened.conns) == 1 and opened.closed == []
    else:
        assert len(opened.conns) == 5 and opened.closed == opened.conns
    pool.close()
    assert opened.closed == opened.conns


async def test_a_connection_is_dropped_after_a_storage_error(
    db_target: str, run_id: str, opened: Opened
) -> None:
    pool = _pool.ReadPool(db_target, keep=2)

    def broken(conn: q.Reader) -> None:
        raise StorageError("the disk went away")

    with pytest.raises(StorageError, match="went away"):
        pool.read(broken)
    assert opened.closed == opened.conns[:1]
    assert pool.read(status_of(run_id)) == "completed"
    assert len(opened.conns) == 2 and (opened.closed == opened.conns[:1]) is kept(db_target)
    pool.close()


async def test_old_connections_retire_and_keep_zero_keeps_none(
    postgres_admin_url: str, opened: Opened, monkeypatch: pytest.MonkeyPatch
) -> None:
    with fresh_database(postgres_admin_url) as pg_url:
        async with zincir.open_database(pg_url) as db, zincir.open_run(db, role="pooled") as run:
            await run.complete()
        _retire_and_keep_none(pg_url, run.id, opened, monkeypatch)


def _retire_and_keep_none(
    db_target: str, run_id: str, opened: Opened, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_pool, "MAX_AGE", 0.0)
    aging = _pool.ReadPool(db_target, keep=2)
    aging.read(status_of(run_id))
    aging.read(status_of(run_id))
    assert len(opened.conns) == 2 and opened.closed == opened.conns[:1]
    aging.close()
    fresh = _pool.ReadPool(db_target, keep=0)
    fresh.read(status_of(run_id))
    assert len(opened.conns) == 3 and opened.closed == opened.conns


async def test_a_read_ending_after_close_closes_its_connection(
    db_target: str, run_id: str, opened: Opened
) -> None:
    pool = _pool.ReadPool(db_target, keep=2)

    def closing_midway(conn: q.Reader) -> str:
        pool.close()
        return str(q.get_run(conn, run_id).status)

    assert pool.read(closing_midway) == "completed"
    assert opened.closed == opened.conns


async def test_a_connection_the_server_ended_is_replaced_without_an_error(
    postgres_admin_url: str, opened: Opened
) -> None:
    with fresh_database(postgres_admin_url) as pg_url:
        await _replaced_after_termination(pg_url, opened)


async def _replaced_after_termination(pg_url: str, opened: Opened) -> None:
    async with zincir.open_database(pg_url) as db, zincir.open_run(db, role="pooled", provider="test") as run:
        await run.complete()
    pool = _pool.ReadPool(pg_url, keep=2)
    assert pool.read(status_of(run.id)) == "completed"
    assert terminate(pg_url, "zincir inspect") == 1
    assert pool.read(status_of(run.id)) == "completed"
    assert len(opened.conns) == 2 and opened.closed == opened.conns[:1]
    pool.close()


async def test_a_served_inspector_reuses_its_connections(db_target: str, run_id: str, opened: Opened) -> None:
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve, db_target, "127.0.0.1:0")
        host, port = url.removeprefix("http://").rstrip("/").split(":")
        before = len(opened.conns)  # serve checks the database once before it binds

        def get_pages() -> list[int]:
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            statuses = []
            for path in ["/", f"/runs/{run_id}", "/api/runs", f"/api/runs/{run_id}", "/"]:
                conn.request("GET", path)
                response = conn.getresponse()
                response.read()
                statuses.append(response.status)
            conn.close()
            return statuses

        assert await trio.to_thread.run_sync(get_pages) == [200] * 5
        assert len(opened.conns) - before == (1 if kept(db_target) else 5)
        nursery.cancel_scope.cancel()
    assert set(opened.closed) == set(opened.conns)
