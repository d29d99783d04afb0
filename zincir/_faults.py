"""Fault points for crash tests: kill this process right before or right after a run's Nth commit.

Off unless the ``ZINCIR_CRASH_AT`` environment variable names a boundary when zincir is imported
(or :func:`arm` is called, as a crash test's forked child does); while off, the only cost is the
``armed`` check in :meth:`Run._write`. docs/crash-testing.md describes the boundaries; in short:

- ``before:N:RUN`` SIGKILLs this process right before the Nth write of run ``RUN``'s owner here is
  submitted (that write never commits), ``after:N:RUN`` right after it committed. Every write of a
  run's body counts (a response, a tool start or result, a checkpoint, a step, a sleep, a wait, a
  spawn, the end), in the order this process makes them; the heartbeat's renewals do not.
- ``count:PATH`` kills nothing: it appends one JSON line per boundary passed to PATH, so that an
  uninterrupted run enumerates the boundaries a crash test then kills at.

``RUN`` is a run's place in its family, the same in every copy of a crash test's database: a run
with no parent is ``root``, a child is its parent's key, ``/``, and the name it was spawned under
(``root/research:leases``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

from ._errors import InvalidArgument

if TYPE_CHECKING:
    from ._database import Database
    from ._run import Run

__all__ = [
    "ENVIRONMENT",
    "ROOT",
    "Count",
    "Kill",
    "arm",
    "armed",
    "around_commit",
    "child_key",
    "operation_detail",
    "parse",
    "run_key",
]

ENVIRONMENT: Final = "ZINCIR_CRASH_AT"
ROOT: Final = "root"

When = Literal["before", "after"]


@attrs.frozen
class Kill:
    """Kill this process ``when`` (before or after) the ``commit``-th write of run ``run``."""

    when: When
    commit: int
    run: str


@attrs.frozen
class Count:
    """Note every boundary passed in the file at ``path``."""

    path: str


armed: bool = False
"""Whether a fault point is set: the one thing a write looks at when none is."""

_plan: Kill | Count | None = None
_commits: dict[str, int] = {}  # writes so far, by run key, in this process
_keys: dict[str, str] = {}  # run id -> run key, once looked up


def parse(spec: str) -> Kill | Count:
    """What ``ZINCIR_CRASH_AT`` says; :class:`InvalidArgument` for anything else."""
    kind, _, rest = spec.partition(":")
    if kind == "count" and rest:
        return Count(rest)
    number, _, run = rest.partition(":")
    if kind in ("before", "after") and number.isdigit() and int(number) >= 1:
        return Kill(kind, int(number), run or ROOT)  # type: ignore[arg-type]
    raise InvalidArgument(
        f"{ENVIRONMENT}={spec!r}: expected before:N[:RUN], after:N[:RUN] (N >= 1) or count:PATH"
    )


def arm(spec: str | None) -> None:
    """Set the fault point (None: none), and start counting commits from zero."""
    global armed, _plan
    _plan = None if not spec else parse(spec)
    armed = _plan is not None
    _commits.clear()
    _keys.clear()


async def around_commit(run: Run, fn: Any, args: tuple[Any, ...], write: Callable[[], Awaitable[Any]]) -> Any:
    """``await write()`` (the owner's write of ``fn(*args)``), killing this process first or
    after it, if that is the fault point; in count mode, note both boundaries."""
    plan = _plan
    key = await run_key(run.database, run.id)
    number = _commits[key] = _commits.get(key, 0) + 1
    operation = operation_detail(fn, args)
    if isinstance(plan, Count):
        _note(plan.path, key, number, "before", operation)
    elif plan is not None and plan.when == "before" and (plan.commit, plan.run) == (number, key):
        _die(plan, operation)
    result = await write()
    if isinstance(plan, Count):
        _note(plan.path, key, number, "after", operation)
    elif plan is not None and plan.when == "after" and (plan.commit, plan.run) == (number, key):
        _die(plan, operation)
    return result


def operation_detail(fn: Any, args: tuple[Any, ...]) -> str:
    """The write, for people: the store operation and what it is about (a call id, a name)."""
    name = getattr(fn, "__name__", repr(fn))
    first = args[0] if args else None
    if isinstance(first, list) and all(isinstance(getattr(item, "name", None), str) for item in first):
        first = ", ".join(item.name for item in first)  # the children a spawn creates
    if isinstance(first, str) and len(first) <= 200 and not first.startswith(("{", "[")):
        return f"{name} {first}"
    return name


async def run_key(db: Database, run_id: str) -> str:
    """``run_id``'s place in its family (see the module's docstring), looked up once."""
    key = _keys.get(run_id)
    if key is not None:
        return key
    record = (await db.state(run_id)).run
    if record.parent_run_id is None:
        key = ROOT
    else:
        spawned = [
            event.payload.get("name")
            for event in await db.events(record.parent_run_id)
            if event.type == "child_spawned" and event.payload.get("child_id") == run_id
        ]
        key = child_key(await run_key(db, record.parent_run_id), spawned[0] if spawned else run_id)
    _keys[run_id] = key
    return key


def child_key(parent_key: str, name: str) -> str:
    return f"{parent_key}/{name}"


def _note(path: str, run: str, commit: int, when: When, operation: str) -> None:
    line = json.dumps({"commit": commit, "operation": operation, "run": run, "when": when}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _die(plan: Kill, operation: str) -> None:
    print(
        f"zincir crash test: SIGKILL {plan.when} commit {plan.commit} of {plan.run} ({operation})",
        file=sys.stderr,
        flush=True,
    )
    os.kill(os.getpid(), signal.SIGKILL)


arm(os.environ.get(ENVIRONMENT))
