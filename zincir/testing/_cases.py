"""Where a crash test's cases live, and the processes that run them.

A case is a copy of the template database (the run under test, not yet claimed) and a directory,
the handler's working directory. Its workers are forked by zincir/testing/_server.py, which this
module drives.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit, urlunsplit

import attrs
import trio

from .. import _faults
from .._database import open_database
from .._errors import CrashTestError
from .._ownership import open_run
from ._ledger import LEDGER_ENVIRONMENT, EffectLedger

if TYPE_CHECKING:
    from ._crash import Plan

__all__ = ["Case", "ForkServer", "Workspace", "tail"]

_MAX_ATTEMPTS: Final = 10  # a handler that keeps raising fails its run instead of hanging the test
_LOG_TAIL: Final = 15


@attrs.define
class Case:
    """One copy of the template: a directory (the handler's working directory) and a database."""

    directory: str
    database: str

    @property
    def ledger(self) -> EffectLedger:
        return EffectLedger(os.path.join(self.directory, "effects.jsonl"))

    def log(self, name: str) -> str:
        return os.path.join(self.directory, f"{name}.log")


class Workspace:
    """Where the cases live: a temporary directory, and on PostgreSQL, databases on a server."""

    def __init__(self, plan: Plan, root: str, admin_url: str | None, kept: dict[str, str]) -> None:
        self.root = root
        self._plan = plan
        self._admin_url = admin_url
        self._template = ""
        self._created: list[str] = []  # PostgreSQL databases to drop
        self._kept = kept
        self.root_run_id = ""

    @classmethod
    @asynccontextmanager
    async def open(cls, plan: Plan, root: str, kept: dict[str, str]) -> AsyncIterator[Workspace]:
        async with _admin_url(plan) as admin_url:
            workspace = cls(plan, root, admin_url, kept)
            try:
                await workspace._make_template()
                yield workspace
            finally:
                with trio.CancelScope(shield=True):
                    await workspace._drop_databases()

    async def _make_template(self) -> None:
        if self._admin_url is None:
            self._template = os.path.join(self.root, "template.db")
        else:
            self._template = await self._create_database(None)
        try:
            async with (
                open_database(self._template) as db,
                open_run(db, role=self._plan.role, config=self._plan.config) as run,
            ):
                self.root_run_id = run.id  # left unfinished: a worker takes it from here
        except Exception as exc:
            raise CrashTestError(
                f"crash test of {self._plan.handler}: cannot make its database: {exc}"
            ) from exc

    async def case(self, name: str) -> Case:
        directory = os.path.join(self.root, name)
        os.mkdir(directory)
        if self._admin_url is None:
            database = os.path.join(directory, "zincir.db")
            await trio.to_thread.run_sync(_copy_sqlite, self._template, database)
        else:
            database = await self._create_database(self._template)
        return Case(directory, database)

    def keep(self, case: Case) -> None:
        self._kept[case.directory] = case.database

    def discard(self, case: Case) -> None:
        shutil.rmtree(case.directory, ignore_errors=True)

    def keep_only(self) -> None:
        """Remove everything but the failed cases' directories (all of it if none failed)."""
        for name in os.listdir(self.root):
            path = os.path.join(self.root, name)
            if path not in self._kept:
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)

    async def _create_database(self, template: str | None) -> str:
        assert self._admin_url is not None
        name = f"zincir_crash_{uuid.uuid4().hex[:16]}"
        source = None if template is None else urlsplit(template).path.lstrip("/")
        await trio.to_thread.run_sync(_pg_admin, self._admin_url, "create", name, source)
        self._created.append(name)
        return urlunsplit(urlsplit(self._admin_url)._replace(path=f"/{name}"))

    async def _drop_databases(self) -> None:
        if self._admin_url is None:
            return
        kept = {urlsplit(url).path.lstrip("/") for url in self._kept.values()}
        for name in reversed(self._created):
            if name not in kept:
                await trio.to_thread.run_sync(_pg_admin, self._admin_url, "drop", name, None)


def _copy_sqlite(source: str, destination: str) -> None:
    """A consistent copy, whatever the template's WAL holds."""
    with sqlite3.connect(source) as src, sqlite3.connect(destination) as dst:
        src.backup(dst)
    src.close()
    dst.close()


def _pg_admin(admin_url: str, action: str, name: str, template: str | None) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True) as admin:
        if action == "drop":
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        elif template is None:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        else:
            # STRATEGY FILE_COPY: a small database is copied file by file, not logged page by page.
            admin.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )


@asynccontextmanager
async def _admin_url(plan: Plan) -> AsyncIterator[str | None]:
    """None on SQLite; on PostgreSQL the given admin URL, or a throwaway embedded server's."""
    if plan.backend == "sqlite":
        yield None
    elif plan.postgres_url is not None:
        yield plan.postgres_url
    else:
        from ._postgres import throwaway_server

        async with throwaway_server() as url:
            yield url


class ForkServer:
    """The client side of zincir/testing/_server.py: one worker process at a time."""

    def __init__(self, plan: Plan, process: trio.Process, log: str) -> None:
        self._plan = plan
        self._process = process
        self._log = log
        self._buffer = b""
        self._ready = False
        self._child: int | None = None  # the worker process running now

    @classmethod
    @asynccontextmanager
    async def open(cls, plan: Plan, root: str) -> AsyncIterator[ForkServer]:
        log_path = os.path.join(root, "server.log")
        environment = {
            k: v for k, v in os.environ.items() if k not in (_faults.ENVIRONMENT, LEDGER_ENVIRONMENT)
        }
        with open(log_path, "ab") as log:  # noqa: ASYNC230 - opening a new file: no wait
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "zincir.testing._server", plan.handler, plan.backend],
                stdin=-1,
                stdout=-1,
                stderr=log,
                env=environment,
            )
        server = cls(plan, process, log_path)
        try:
            yield server  # it imports meanwhile: the first run() waits until it is ready
        finally:
            with trio.CancelScope(shield=True):
                if server._child is not None:  # cancelled while a worker ran: it goes too
                    server._kill_child()
                assert process.stdin is not None
                await process.stdin.aclose()
                with trio.move_on_after(10):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()

    async def run(self, case: Case, log: str, crash_at: str | None) -> int | None:
        """Run a worker on ``case`` until it is idle (or killed at ``crash_at``): its exit code,
        minus a signal's number, or None if it outlived the timeout (it is killed then)."""
        if not self._ready:
            ready = await self._receive()
            if "error" in ready or "ready" not in ready:
                error = ready.get("error", ready)
                raise CrashTestError(f"crash test of {self._plan.handler}: cannot load the handler: {error}")
            self._ready = True
        request = {
            "crash_at": crash_at,
            "db": case.database,
            "dir": case.directory,
            "ledger": case.ledger.path,
            "log": case.log(log),
            "max_attempts": _MAX_ATTEMPTS,
        }
        assert self._process.stdin is not None
        await self._process.stdin.send_all((json.dumps(request) + "\n").encode())
        self._child = int((await self._receive())["pid"])
        with trio.move_on_after(self._plan.timeout):
            status = int((await self._receive())["status"])
            self._child = None
            return status
        self._kill_child()  # the server reaps it and answers
        await self._receive()
        self._child = None
        return None

    def _kill_child(self) -> None:
        assert self._child is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._child, signal.SIGKILL)

    async def _receive(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        while b"\n" not in self._buffer:
            chunk = await self._process.stdout.receive_some()
            if not chunk:
                raise CrashTestError(
                    f"crash test of {self._plan.handler}: its fork server ended unexpectedly:\n"
                    + tail(self._log)
                )
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message


def tail(path: str) -> str:
    try:
        with open(path, errors="replace") as log:
            lines = log.read().splitlines()[-_LOG_TAIL:]
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join([f"--- the last lines of {path} ---", *lines])
