"""The PostgreSQL backend: a small pool of writer threads, a reader thread and a listener, each
with its own psycopg connection. Time is the server's; workers on several machines share it."""

from __future__ import annotations

import time

import psycopg
import trio

from .._backend import Backend, Clock
from .._errors import StorageError
from .._payloads import Payloads
from .._threads import DatabaseThread
from . import _migrations
from ._connection import Echo, PostgresSession, connect, redact, server_clock_offset, storage_error
from ._listener import Listener
from ._store import PostgresStore

__all__ = ["open_backend"]


def _prepare(url: str) -> int:
    """Migrate (or validate) the database; the server clock's offset from this machine's."""
    where = redact(url)
    try:
        conn = connect(url, application_name="zincir migrate")
    except psycopg.Error as exc:
        raise StorageError(f"cannot connect to {where}: {exc}") from exc
    try:
        _migrations.migrate(conn, where)
        return server_clock_offset(conn)
    except psycopg.Error as exc:
        raise storage_error(exc, where) from exc
    finally:
        conn.close()


async def open_backend(
    url: str, *, token: trio.lowlevel.TrioToken, clock: Clock | None, writers: int, payloads: Payloads
) -> Backend:
    offset = await trio.to_thread.run_sync(_prepare, url)
    where = redact(url)
    echo = Echo()

    def thread(name: str, *, read_only: bool) -> DatabaseThread:
        session = PostgresSession(url, name, read_only=read_only, clock=clock, echo=echo)
        session.payloads = payloads
        return DatabaseThread(
            name=f"zincir-{name}:{where}", session=session, token=token, group_commit=not read_only
        )

    def estimated_server_clock() -> int:
        return time.time_ns() // 1_000_000 + offset

    return Backend(
        name="postgresql",
        target=where,
        store=PostgresStore(),
        writers=[thread(f"writer{i}", read_only=False) for i in range(writers)],
        reader=thread("reader", read_only=True),
        clock=clock or estimated_server_clock,
        # Ends are notified by the server to whoever waits (see run_waiters): no list needed here.
        listen=lambda wake, awaited_ends: Listener(url, token, wake, echo),
    )
