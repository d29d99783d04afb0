"""The parent's end of the child processes (``bench/harness/child.py`` is the child's), and the
CPU time of processes, read from /proc.

A study starts each system it measures in a child process of its own, so that the parent never
imports a peer, a crash is a real SIGKILL, and each process's CPU is its own.
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
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class ChildError(RuntimeError):
    """A child process answered with an error, or exited before it answered."""


def child_env() -> dict[str, str]:
    """The environment of a child: this one, with the repository importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ChildProcess:
    """One child process running ``FUNCTION(channel, args)`` of ``entry`` (``MODULE:FUNCTION``).

    Its commands' answers and its events arrive on separate queues (a reader thread sorts its
    lines); its stderr goes to ``log_path``."""

    def __init__(self, entry: str, args: dict[str, Any], log_path: Path, name: str) -> None:
        self.name = name
        self.log_path = log_path
        self.seen: dict[str, dict[str, Any]] = {}  # the latest event of each name that expect() read
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.harness.child", entry, json.dumps(args)],
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
        self._closed = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                message = json.loads(line)
                (self._events if "event" in message else self._answers).put(message)
        self._answers.put(None)
        self._events.put(None)

    def _exited(self, before: str) -> ChildError:
        return ChildError(f"{self.name}: exited before {before}; see {self.log_path}\n{self.tail()}")

    # -- commands and their answers --------------------------------------------------------------

    def send(self, cmd: str, **arguments: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **arguments}) + "\n")
        self.proc.stdin.flush()

    def result(self, timeout: float) -> Any:
        """The next answer's result: TimeoutError if none comes in time, ChildError if the child
        failed the command or exited."""
        try:
            message = self._answers.get(timeout=max(0.0, timeout))
        except queue.Empty:
            raise TimeoutError(f"{self.name}: no answer in {timeout:.0f} s; see {self.log_path}") from None
        if message is None:
            self._answers.put(None)
            raise self._exited("it answered")
        if not message.get("ok"):
            raise ChildError(f"{self.name}: {message.get('error')}\n{message.get('traceback', '')}")
        return message["result"]

    def call(self, cmd: str, timeout: float = 300, **arguments: Any) -> Any:
        self.send(cmd, **arguments)
        return self.result(timeout)

    def ready(self, timeout: float = 120) -> None:
        """Wait until a served side is up (built, its imports done)."""
        if self.result(timeout) != "ready":
            raise ChildError(f"{self.name}: did not start; see {self.log_path}")

    def has_answer(self) -> bool:
        return not self._answers.empty()

    # -- events ----------------------------------------------------------------------------------

    def event(self, timeout: float, waiting_for: str = "an event") -> dict[str, Any]:
        """The next event: TimeoutError if none comes in time, ChildError if the child exited."""
        try:
            message = self._events.get(timeout=max(0.0, timeout))
        except queue.Empty:
            raise TimeoutError(
                f"{self.name}: no {waiting_for} in {timeout:.1f} s; see {self.log_path}"
            ) from None
        if message is None:
            self._events.put(None)
            raise self._exited(waiting_for)
        return message

    def expect(self, event: str, timeout: float = 120.0, **match: Any) -> dict[str, Any]:
        """The next ``event`` whose fields match ``match``; the events before it are dropped, the
        latest of each name kept in :attr:`seen`."""
        stop = time.monotonic() + timeout
        while True:
            message = self.event(stop - time.monotonic(), f"{event!r}")
            self.seen[message["event"]] = message
            if message["event"] == event and all(message.get(k) == v for k, v in match.items()):
                return message

    def has_pending(self, event: str) -> bool:
        """Whether ``event`` already waits in the queue (looked at, not taken)."""
        with self._events.mutex:
            return any(m is not None and m.get("event") == event for m in self._events.queue)

    def unread_events(self) -> list[dict[str, Any]]:
        """What the (reaped) child said that nobody has read yet."""
        self._reader.join(timeout=10)
        found: list[dict[str, Any]] = []
        while True:
            try:
                message = self._events.get_nowait()
            except queue.Empty:
                return found
            if message is not None:
                found.append(message)

    # -- the end ---------------------------------------------------------------------------------

    def kill(self) -> float:
        """SIGKILL and reap; the moment the signal was sent (monotonic). From then on the process
        is dead to its host (a zombie counts as gone), so a takeover may come before the reaping.
        Popen.kill signals only a process not reaped yet: this may run again for one whose pid
        another process has now."""
        sent = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        return sent

    def close(self, timeout: float = 60.0) -> None:
        """Close its stdin (a served side then closes and exits), wait, SIGKILL if it lingers."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(BrokenPipeError, OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self._reader.join(timeout=10)
        with contextlib.suppress(OSError):
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        self._log.close()

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def run_module(module: str, *args: str, out: Path, timeout: float) -> dict[str, Any]:
    """Run ``python -m module args...`` to its end; the JSON it wrote to ``out``, with what it
    printed under ``"output"``."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise ChildError(f"{module} failed:\n{proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    result["output"] = proc.stdout
    return result


# -- CPU time, from /proc ------------------------------------------------------------------------


def proc_stat(path: str) -> list[str] | None:
    """The fields of a ``/proc/.../stat`` file after the process's name (None if unreadable)."""
    try:
        with open(path) as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(fields: list[str]) -> float:
    """User + system CPU seconds in :func:`proc_stat`'s fields."""
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def process_cpu(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (None if it cannot be read)."""
    fields = proc_stat(f"/proc/{pid}/stat")
    return None if fields is None else cpu_seconds(fields)
