"""Serving the inspector on a loopback address with Hypercorn's Trio worker, until shutdown.

The database is checked (read-only) before anything binds; while served, the app keeps a few
read-only connections between requests and Hypercorn adds the security headers to every
response it writes (:class:`~._security.SecuredConfig`).
"""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import hypercorn.trio
import trio

from .. import _queries as q
from ._app import create_app
from ._plain import DEFAULT_ADDRESS, format_host, parse_address
from ._pool import ReadPool
from ._security import InspectorApp, SecuredConfig

__all__ = ["serve"]


#: Read-only connections a served inspector keeps open between requests.
_KEPT_CONNECTIONS = 4


async def _until_signal(signals: Any, stop: trio.Event) -> None:
    async for _ in signals:
        stop.set()
        return


def _check_database(path: str) -> None:
    q.open_readonly(path).close()


async def serve(
    database_path: str,
    address: str = DEFAULT_ADDRESS,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    extend: Callable[[InspectorApp], None] | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the inspector for ``database_path`` on a loopback ``address`` until shutdown.

    Checks the address and the database (read-only) before binding. Reports the served URL
    through ``task_status``. Without ``shutdown_trigger`` it stops gracefully on SIGINT or
    SIGTERM (main thread only; elsewhere it runs until cancelled).
    """
    ip, port = parse_address(address)
    await trio.to_thread.run_sync(_check_database, database_path)
    app = create_app(database_path, format_host(ip, port), extend=extend)
    assert isinstance(app, InspectorApp)
    app.read_pool = ReadPool(database_path, keep=_KEPT_CONNECTIONS)
    try:
        await _serve_app(app, ip, port, shutdown_trigger, task_status)
    finally:
        app.read_pool.close()


async def _serve_app(
    app: InspectorApp,
    ip: str,
    port: int,
    shutdown_trigger: Callable[[], Awaitable[None]] | None,
    task_status: trio.TaskStatus[str],
) -> None:
    config = SecuredConfig(app)
    app.server_adds_headers = True
    config.bind = [format_host(ip, port)]
    config.loglevel = "WARNING"
    config.include_server_header = False
    config.graceful_timeout = 2.0
    async with trio.open_nursery() as nursery:
        if shutdown_trigger is None:
            shutdown_trigger = await _default_trigger(nursery)
        serving = functools.partial(hypercorn.trio.serve, app, config, shutdown_trigger=shutdown_trigger)
        binds: list[str] = await nursery.start(serving)
        app.served_host = binds[0].removeprefix("http://")
        task_status.started(f"http://{app.served_host}/")


async def _default_trigger(nursery: trio.Nursery) -> Callable[[], Awaitable[None]]:
    if threading.current_thread() is not threading.main_thread():
        return trio.sleep_forever
    stop = trio.Event()

    async def watch(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            task_status.started()
            await _until_signal(signals, stop)

    await nursery.start(watch)
    return stop.wait
