"""The embedded backend: one SQLite file in WAL mode, one writer thread (whose writes run inline
on the Trio thread while it is idle, see ``_threads``), one reader thread, and (once something
waits) a thread watching for other processes' commits."""

from __future__ import annotations

from typing import Final

import trio

from .._backend import Backend, Clock, wall_clock_ms
from .._payloads import Payloads
from .._threads import DatabaseThread
from ._bulk import BulkSession
from ._connection import SQLiteSession, open_connections
from ._store import SQLiteStore
from ._watcher import Watcher

__all__ = ["open_backend"]

_SYNCHRONOUS_LEVELS: Final = {"full": "FULL", "normal": "NORMAL"}


async def open_backend(
    path: str, *, token: trio.lowlevel.TrioToken, clock: Clock | None, synchronous: str, payloads: Payloads
) -> Backend:
    clock = clock or wall_clock_ms
    writer, reader = await trio.to_thread.run_sync(
        open_connections, path, _SYNCHRONOUS_LEVELS[synchronous], clock()
    )
    # The file as SQLite resolved it (absolute, through symlinks): where its -wal is, and what a
    # later connection opens whatever the working directory is by then.
    file = writer.execute("PRAGMA database_list").fetchone()[2] or path

    def thread(role: str, session: SQLiteSession) -> DatabaseThread:
        writes = role == "writer"
        session.payloads = payloads
        return DatabaseThread(
            name=f"zincir-{role}:{path}", session=session, token=token, group_commit=writes, inline=writes
        )

    return Backend(
        name="sqlite",
        target=path,
        store=SQLiteStore(),
        writers=[thread("writer", SQLiteSession(writer, path, clock, writer=True))],
        reader=thread("reader", SQLiteSession(reader, path, clock, writer=False)),
        clock=clock,
        listen=lambda wake, awaited_ends: Watcher(path, clock, token, wake, awaited_ends),
        open_bulk=lambda sealer: BulkSession(file, clock, payloads, sealer),
    )
