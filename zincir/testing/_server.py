"""A crash test's fork server: ``python -m zincir.testing._server MODULE:HANDLER BACKEND``.

It imports zincir, the handler's module and the backend's driver once, then runs each worker a
crash test asks for in a child forked from itself: a child starts in milliseconds instead of the
half second that a new interpreter spends importing. The server itself never opens a database or
starts a thread (a fork copies only the forking thread, so it must be the only one).

One JSON object a line on stdin asks for a worker: ``db`` (where its database is), ``dir`` (its
working directory), ``log`` (its output), ``ledger`` (the effect ledger's file), ``crash_at``
(the fault point, or null) and ``max_attempts``. The server answers on stdout with ``{"pid": N}``
at once and ``{"status": S}`` when the child has ended (its exit code, or minus the signal that
killed it). The first line it writes is ``{"ready": true}``, or ``{"error": "..."}`` when the
handler cannot be loaded.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import trio

from .. import _faults
from .._database import open_database
from .._worker import Backoff, ResumeWorker
from ._ledger import LEDGER_ENVIRONMENT

__all__ = ["load_handler"]

Handler = Callable[..., Awaitable[Any]]


def load_handler(spec: str) -> Handler:
    """``module:function``, imported as ``python -m`` would (the current directory first on the
    path); ValueError says what is wrong."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"expected MODULE:HANDLER, not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load {spec!r}: {exc}") from None
    if not callable(found):
        raise ValueError(f"{spec!r} is not callable")
    handler: Handler = found
    return handler


def _serve(spec: str, backend: str) -> int:
    # Answers go to a private copy of stdout; whatever the handler's module prints goes to stderr.
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    try:
        handler = load_handler(spec)
        if backend == "postgresql":
            from .. import _postgres  # noqa: F401 - imported once here, not in every child
    except Exception as exc:
        _answer(answers, {"error": f"{type(exc).__name__}: {exc}"})
        return 2
    _answer(answers, {"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request, handler, answers)  # never returns
        _answer(answers, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _answer(answers, {"status": os.waitstatus_to_exitcode(status)})
    return 0


def _answer(answers: TextIO, message: dict[str, Any]) -> None:
    answers.write(json.dumps(message) + "\n")
    answers.flush()


def _child(request: dict[str, Any], handler: Handler, answers: TextIO) -> None:
    code = 1
    try:
        os.close(answers.fileno())  # the server's alone
        os.chdir(request["dir"])
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ[LEDGER_ENVIRONMENT] = request["ledger"]
        _faults.arm(request["crash_at"])
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
        )
        trio.run(_work, handler, request)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        _exit_now(code)


async def _work(handler: Handler, request: dict[str, Any]) -> None:
    target = request["db"]
    sqlite = "://" not in target or target.startswith("sqlite://")
    # A crash test kills processes, never the machine: a commit need only reach the OS.
    async with open_database(target, synchronous="normal" if sqlite else "full") as db:
        worker = ResumeWorker(
            db,
            handler,
            until_idle=True,
            poll_interval=0.25,
            max_attempts=request["max_attempts"],
            backoff=Backoff(initial=0.05, factor=2.0, maximum=1.0),
        )
        await worker.run()
        # Everything the worker wrote is committed. Closing would only wait for the database's
        # threads (a PostgreSQL listener looks at its stop flag every half second): end here.
        _exit_now(0)


def _exit_now(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(_serve(sys.argv[1], sys.argv[2]))
