"""The child's end of the protocol that every benchmark's child processes speak.

    python -m bench.harness.child MODULE:FUNCTION ARGS_JSON

The parent (:class:`bench.harness.processes.ChildProcess`) starts this. It takes the real stdout
for the protocol (whatever the code under test prints goes to stderr, which the parent sends to
a log file), says ``boot``, imports MODULE, says ``imported`` and calls ``FUNCTION(channel,
args)``. A peer's package is imported in MODULE, so only in the child that hosts it; the parent
never imports one. ``boot`` comes before any benchmark code is imported, so that the parent can
tell the interpreter's start-up from the imports (``python -m bench.recovery`` times both).

One JSON object per line. From the parent: commands, ``{"cmd": name, ...arguments}``. From the
child: exactly one answer per command, in order, ``{"ok": true, "result": ...}`` or ``{"ok":
false, "error": ..., "traceback": ...}``; and events, ``{"event": name, ...}``, at any moment
and from any thread. :meth:`Channel.emit` stamps an event with ``at``, ``time.monotonic()``:
CLOCK_MONOTONIC on Linux, one clock for every process of the machine, so the parent may subtract
one process's instant from another's.

A child either *serves* a side (:func:`serve`: each command calls the side's method of that
name, until the parent closes the child's stdin), or runs a script of its own that reports
events and waits for the parent's commands (:meth:`Channel.next_command`).

Only a few modules of the standard library are imported here, before ``boot``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, TextIO

    Emit = Callable[[dict[str, Any]], None]  # sends one message line: Channel.send


class Channel:
    """The child's side of the pipes: whole JSON lines out, safe from any thread (DBOS runs
    workflows in threads of its own), commands in."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()

    @classmethod
    def over_stdout(cls) -> Channel:
        """The protocol takes the real stdout; file descriptor 1 becomes stderr."""
        out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        return cls(out)

    def send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, default=str) + "\n"
        with self._lock:
            self._out.write(line)
            self._out.flush()

    def emit(self, event: str, **fields: Any) -> None:
        self.send({"event": event, "at": time.monotonic(), **fields})

    def next_command(self) -> dict[str, Any] | None:
        """Block until the parent's next command; None once it closed our stdin."""
        line = sys.stdin.readline()
        return json.loads(line) if line.strip() else None


def serve(side: Any, channel: Channel) -> None:
    """Answer commands with ``side``'s methods until the parent closes stdin.

    A side with ``is_async`` runs under Trio, its methods awaited inside ``side.opened()`` (which
    may run background tasks meanwhile); any other side is closed with ``side.close()``."""
    channel.send({"ok": True, "result": "ready"})
    if side.is_async:
        import trio

        trio.run(_serve_async, side, channel)
    else:
        try:
            while (command := channel.next_command()) is not None:
                _answer(channel, partial(_call, side, command))
        finally:
            side.close()


async def _serve_async(side: Any, channel: Channel) -> None:
    import trio

    async with side.opened():
        while (command := await trio.to_thread.run_sync(channel.next_command)) is not None:
            try:
                result = await _call(side, command)
            except Exception as exc:
                channel.send(_failure(exc))
            else:
                channel.send({"ok": True, "result": result})


def _call(side: Any, command: dict[str, Any]) -> Any:
    """The side's method that ``command`` names, called with the command's arguments."""
    name = command.pop("cmd")
    return getattr(side, name)(**command)


def _answer(channel: Channel, call: Callable[[], Any]) -> None:
    try:
        result = call()
    except Exception as exc:
        channel.send(_failure(exc))
    else:
        channel.send({"ok": True, "result": result})


def _failure(exc: BaseException) -> dict[str, Any]:
    import traceback  # here, not before boot: bench.recovery counts what precedes boot as start-up

    return {"ok": False, "error": repr(exc), "traceback": traceback.format_exc()}


def main() -> None:
    entry, raw = sys.argv[1:3]
    channel = Channel.over_stdout()
    channel.emit("boot")
    module, _, function = entry.partition(":")
    run = getattr(importlib.import_module(module), function)
    channel.emit("imported")
    run(channel, json.loads(raw))


if __name__ == "__main__":
    main()
