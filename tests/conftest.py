from __future__ import annotations

import shutil
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import trio

import zincir

from .postgres_server import fresh_database, migrated_template, postgres_admin_url

__all__ = ["ManualClock", "postgres_admin_url"]

# zincir's own pytest plugin (docs/crash-testing.md), as a user's conftest loads it: its fixtures
# (zincir_db, zincir_clock, scripted_model) are tested in tests/test_testing_plugin.py.
pytest_plugins = ["pytester", "zincir.testing"]

BACKENDS = ("sqlite", "postgresql")


class ManualClock:
    """An injected database clock (integer ms) that moves only when a test says so.

    On SQLite it is the database's clock; on PostgreSQL it fakes the server's (every operation
    sets ``zincir.now_ms``, which the server's ``zincir_now_ms()`` reads).
    """

    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += round(seconds * 1000)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test that also asks for the SQLite file's path (db_path), or is marked sqlite_only, looks
    # at the file itself: it is about the SQLite backend, so its PostgreSQL variant is not run.
    # One marked postgresql_only is about what PostgreSQL alone has (row locks): no SQLite variant.
    keep, drop = [], []
    for item in items:
        params = getattr(item, "callspec", None)
        backend = params.params.get("backend") if params is not None else None
        sqlite_only = "db_path" in item.fixturenames or item.get_closest_marker("sqlite_only")
        postgresql_only = item.get_closest_marker("postgresql_only")
        wrong = (backend == "postgresql" and sqlite_only) or (backend == "sqlite" and postgresql_only)
        (drop if wrong else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# Fixtures that open the test's database with zincir before the test begins: their database
# may as well start out migrated, so it is a copy of one migrated once per session.
_OPENED_BEFORE_THE_TEST = frozenset({"db", "clocked_db"})


@pytest.fixture
def db_target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """Where the test's database lives: a new SQLite file, or a new PostgreSQL database.

    Empty, unless the test asks for ``db`` or ``clocked_db``: then it is a copy of a database
    that zincir created and migrated (the same schema and rows as migrating it here, at a
    fraction of the cost: applying every migration takes ~100 ms a database).
    """
    migrated = not _OPENED_BEFORE_THE_TEST.isdisjoint(request.fixturenames)
    if backend == "sqlite":
        path = tmp_path / "zincir.db"
        if migrated:
            shutil.copyfile(request.getfixturevalue("migrated_sqlite_file"), path)
        yield str(path)
        return
    admin_url = request.getfixturevalue("postgres_admin_url")
    template = request.getfixturevalue("migrated_postgres_template") if migrated else None
    with fresh_database(admin_url, template=template) as url:
        yield url


def open_and_close(target: str) -> None:
    """Create and migrate a zincir database, from outside any Trio run (a thread of its own)."""

    async def main() -> None:
        async with zincir.open_database(target):
            pass

    with ThreadPoolExecutor(1) as thread:
        thread.submit(trio.run, main).result()


@pytest.fixture(scope="session")
def migrated_sqlite_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file zincir created and migrated, closed (so without -wal and -shm files)."""
    path = tmp_path_factory.mktemp("migrated") / "zincir.db"
    open_and_close(str(path))
    assert sorted(p.name for p in path.parent.iterdir()) == ["zincir.db"]
    return path


@pytest.fixture(scope="session")
def migrated_postgres_template(postgres_admin_url: str) -> Iterator[str]:
    """The name of a PostgreSQL database zincir created and migrated, to copy (TEMPLATE)."""
    with migrated_template(postgres_admin_url, open_and_close) as name:
        yield name


@pytest.fixture
def pg_url(postgres_admin_url: str) -> Iterator[str]:
    """A new PostgreSQL database, for a test about that backend alone."""
    with fresh_database(postgres_admin_url) as url:
        yield url


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "zincir.db"


@pytest.fixture
async def db(db_target: str) -> AsyncIterator[zincir.Database]:
    async with zincir.open_database(db_target) as database:
        yield database


@pytest.fixture(scope="session")
def zincir_postgres_url(postgres_admin_url: str) -> str:
    """The plugin's PostgreSQL server is the suite's (instead of one more embedded server)."""
    return postgres_admin_url


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def clocked_db(db_target: str, clock: ManualClock) -> AsyncIterator[zincir.Database]:
    async with zincir.open_database(db_target, clock=clock) as database:
        yield database
