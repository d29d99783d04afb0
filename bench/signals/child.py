"""The processes of ``python -m bench.signals``: one waiting side and one sending side per system.

    python -m bench._signals_child SYSTEM ROLE TARGET [OPTIONS_JSON]

SYSTEM is ``zincir``, ``dbos`` or ``langgraph``; ROLE is what the process does (see the system's
module, ``bench/_signals_<system>.py``); TARGET is a SQLite path or a PostgreSQL URL. The parent
writes one JSON command per line on stdin (``{"cmd": name, ...arguments}``). Each command gets one
answer line, ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": ...}``; besides the
answers, a waiting process writes event lines (``{"event": "resumed", "id": ..., "t": ...}``) at
any moment, from whichever task or thread saw the wait return. The real stdout belongs to this
protocol; whatever a system prints goes to stderr, which the parent sends to a log file.

Timestamps are ``time.monotonic()``: CLOCK_MONOTONIC on Linux, one clock for every process of the
machine, so the parent may subtract a sender's instant from a waiter's.

This module also holds the parent's side (:class:`Proc`). A peer's package is imported only in
the child that hosts it (``load``), never here at the top, so the parent imports no peer.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TextIO

Emit = Callable[[dict[str, Any]], None]
REPO = Path(__file__).resolve().parents[2]


# -- the child's side -------------------------------------------------------------------------------


class Channel:
    """Writes whole JSON lines; safe from any thread (DBOS runs workflows in its own threads)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message) + "\n"
        with self._lock:
            self._out.write(line)
            self._out.flush()


def load(system: str, role: str, target: str, options: dict[str, Any], emit: Emit) -> Any:
    # Lazy imports: each system's packages only in the process that hosts it.
    if system == "zincir":
        from . import zincir as module
    elif system == "dbos":
        from . import dbos as module  # type: ignore[no-redef]
    elif system == "langgraph":
        from . import langgraph as module  # type: ignore[no-redef]
    else:
        raise SystemExit(f"unknown system {system!r}")
    return module.make(role, target, options, emit)


def _answer(channel: Channel, call: Callable[[], Any]) -> None:
    try:
        channel.send({"ok": True, "result": call()})
    except Exception as exc:
        channel.send({"ok": False, "error": repr(exc), "traceback": traceback.format_exc()})


def serve_sync(side: Any, channel: Channel) -> None:
    try:
        for line in sys.stdin:
            command = json.loads(line)
            name = command.pop("cmd")
            if name == "exit":
                break
            _answer(channel, lambda name=name, command=command: getattr(side, name)(**command))
    finally:
        side.close()
    channel.send({"ok": True, "result": "bye"})


async def serve_async(side: Any, channel: Channel) -> None:
    import trio

    async with side.opened():
        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            if not line:
                break
            command = json.loads(line)
            name = command.pop("cmd")
            if name == "exit":
                break
            try:
                channel.send({"ok": True, "result": await getattr(side, name)(**command)})
            except Exception as exc:
                channel.send({"ok": False, "error": repr(exc), "traceback": traceback.format_exc()})
    channel.send({"ok": True, "result": "bye"})


def main() -> None:
    system, role, target = sys.argv[1:4]
    options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything the systems print lands on stderr
    sys.stdout = sys.stderr
    channel = Channel(protocol)
    side = load(system, role, target, options, channel.send)
    channel.send({"ok": True, "result": "ready"})
    if side.is_async:
        import trio

        trio.run(serve_async, side, channel)
    else:
        serve_sync(side, channel)


# -- the parent's side ------------------------------------------------------------------------------


class ChildError(RuntimeError):
    pass


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class Proc:
    """One child process: commands and their answers, and the events it writes in between."""

    def __init__(
        self, system: str, role: str, target: str, log_path: Path, options: dict[str, Any] | None = None
    ) -> None:
        self.name = f"{system} {role}"
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.signals.child", system, role, target, json.dumps(options or {})],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=REPO,
            env=child_env(),
            text=True,
            bufsize=1,
        )
        self._answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            (self._events if "event" in message else self._answers).put(message)
        self._answers.put(None)
        self._events.put(None)

    def _gone(self) -> ChildError:
        return ChildError(f"{self.name}: the process exited; see {self.log_path}\n{self.tail()}")

    def result(self, timeout: float) -> Any:
        try:
            message = self._answers.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.name}: no answer in {timeout:.0f} s; see {self.log_path}") from None
        if message is None:
            self._answers.put(None)
            raise self._gone()
        if not message.get("ok"):
            raise ChildError(f"{self.name}: {message.get('error')}\n{message.get('traceback', '')}")
        return message["result"]

    def call(self, cmd: str, timeout: float = 120, **kwargs: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kwargs}) + "\n")
        self.proc.stdin.flush()
        return self.result(timeout)

    def ready(self, timeout: float = 120) -> None:
        if self.result(timeout) != "ready":
            raise ChildError(f"{self.name}: did not start")

    def event(self, timeout: float) -> dict[str, Any]:
        try:
            message = self._events.get(timeout=max(0.0, timeout))
        except queue.Empty:
            raise TimeoutError(f"{self.name}: no event in {timeout:.0f} s; see {self.log_path}") from None
        if message is None:
            self._events.put(None)
            raise self._gone()
        return message

    def resumed(self, ids: list[str], timeout: float) -> dict[str, float]:
        """Wait for a ``resumed`` event of every id; their instants by id."""
        deadline = time.monotonic() + timeout
        seen: dict[str, float] = {}
        want = set(ids)
        while not want <= seen.keys():
            message = self.event(deadline - time.monotonic())
            if message["event"] == "resumed" and message["id"] in want:
                seen[message["id"]] = float(message["t"])
        return seen

    def close(self, timeout: float = 60) -> None:
        try:
            if self.proc.poll() is None:
                self.call("exit", timeout=timeout)
        except (ChildError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._log.close()

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


if __name__ == "__main__":
    main()
