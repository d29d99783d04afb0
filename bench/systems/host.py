"""A child process hosting ONE system under test, driven by the parent over stdin/stdout.

    python -m bench._child SYSTEM VARIANT DB_PATH [OPTIONS_JSON]

Each line on stdin is a JSON command ``{"cmd": name, ...arguments}``; each answer is one JSON
line ``{"ok": true, "result": ...}`` (or ``{"ok": false, "error": ...}``). The crash workflow also
emits ``{"event": "started"}`` the moment it starts the workflow, so that the parent can time
its SIGKILL. Whatever the systems print goes to stderr: the protocol owns the real stdout.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any, TextIO


def load(system: str, variant: str, path: str, options: dict[str, Any]) -> Any:
    # Lazy imports: a peer's package is imported only in the child that hosts it.
    if system == "zincir":
        from .zincir import ZincirSystem

        return ZincirSystem(variant, path, options)
    if system == "raw":
        from .raw import RawSystem

        return RawSystem(variant, path, options)
    if system == "dbos":
        from .dbos import DbosSystem

        return DbosSystem(variant, path, options)
    if system == "langgraph":
        from .langgraph import LanggraphSystem

        return LanggraphSystem(variant, path, options)
    raise SystemExit(f"unknown system {system!r}")


class Channel:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def send(self, message: dict[str, Any]) -> None:
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    def started(self) -> None:
        self.send({"event": "started"})


def arguments(command: dict[str, Any], channel: Channel) -> tuple[str, dict[str, Any]]:
    name = command.pop("cmd")
    if name == "crash_run":
        command["started"] = channel.started
    return name, command


def serve_sync(system: Any, channel: Channel) -> None:
    for line in sys.stdin:
        name, kwargs = arguments(json.loads(line), channel)
        if name == "exit":
            break
        try:
            channel.send({"ok": True, "result": getattr(system, name)(**kwargs)})
        except Exception as exc:
            channel.send({"ok": False, "error": repr(exc), "traceback": traceback.format_exc()})
    system.close()
    channel.send({"ok": True, "result": "bye"})


async def serve_async(system: Any, channel: Channel) -> None:
    import trio

    while True:
        line = await trio.to_thread.run_sync(sys.stdin.readline)
        if not line:
            break
        name, kwargs = arguments(json.loads(line), channel)
        if name == "exit":
            break
        try:
            channel.send({"ok": True, "result": await getattr(system, name)(**kwargs)})
        except Exception as exc:
            channel.send({"ok": False, "error": repr(exc), "traceback": traceback.format_exc()})
    await system.close()
    channel.send({"ok": True, "result": "bye"})


def main() -> None:
    system_name, variant, path = sys.argv[1:4]
    options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything the systems print lands on stderr
    sys.stdout = sys.stderr
    channel = Channel(protocol)
    system = load(system_name, variant, path, options)
    channel.send({"ok": True, "result": "ready"})
    if system.is_async:
        import trio

        trio.run(serve_async, system, channel)
    else:
        serve_sync(system, channel)


if __name__ == "__main__":
    main()
