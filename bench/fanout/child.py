"""The processes of ``python -m bench.fanout``: one long-lived child per system and backend.

    python -m bench._fanout_child SYSTEM TARGET [OPTIONS_JSON]

SYSTEM is ``zincir`` or ``dbos``; TARGET is a SQLite path or a PostgreSQL URL. The parent sends
one JSON object per line on stdin, ``{"cmd": name, ...arguments}``, and reads exactly one JSON
line back per command: ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": ...,
"traceback": ...}``. The child's real stdout carries nothing else; anything a system prints or
logs is sent to stderr, which the parent points at a log file.

The system modules (``_fanout_zincir``, ``_fanout_dbos``) are imported only in the child that
hosts them, so the parent, which imports this module for :class:`Child`, never loads a peer.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import IO, Any, TextIO

REPO = Path(__file__).resolve().parents[2]


# -- in the child -----------------------------------------------------------------------------------


def _reply(out: TextIO, message: dict[str, Any]) -> None:
    out.write(json.dumps(message, default=str) + "\n")
    out.flush()


def _failure(exc: BaseException) -> dict[str, Any]:
    return {"ok": False, "error": repr(exc), "traceback": traceback.format_exc()}


def _serve_blocking(side: Any, out: TextIO) -> None:
    try:
        for line in sys.stdin:
            command = json.loads(line)
            name = command.pop("cmd")
            if name == "exit":
                break
            try:
                _reply(out, {"ok": True, "result": getattr(side, name)(**command)})
            except Exception as exc:
                _reply(out, _failure(exc))
    finally:
        side.close()
    _reply(out, {"ok": True, "result": "bye"})


async def _serve_trio(side: Any, out: TextIO) -> None:
    import trio

    async with side.running():
        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            if not line:
                break
            command = json.loads(line)
            name = command.pop("cmd")
            if name == "exit":
                break
            try:
                _reply(out, {"ok": True, "result": await getattr(side, name)(**command)})
            except Exception as exc:
                _reply(out, _failure(exc))
    _reply(out, {"ok": True, "result": "bye"})


def main() -> None:
    system, target = sys.argv[1:3]
    options = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the systems print goes to the log, not into the protocol
    sys.stdout = sys.stderr
    if system == "zincir":
        from . import zincir as _fanout_zincir

        side: Any = _fanout_zincir.ZincirSide(target, options)
    elif system == "dbos":
        from . import dbos as _fanout_dbos

        side = _fanout_dbos.DbosSide(target, options)
    else:
        raise SystemExit(f"unknown system {system!r}")
    _reply(out, {"ok": True, "result": "ready"})
    if side.is_async:
        import trio

        trio.run(_serve_trio, side, out)
    else:
        _serve_blocking(side, out)


# -- in the parent ----------------------------------------------------------------------------------


class ChildFailed(RuntimeError):
    pass


class Child:
    """One child process and its command channel."""

    def __init__(self, system: str, target: str, log_path: Path, options: dict[str, Any]) -> None:
        self.name = f"{system} ({Path(target).name if '://' not in target else 'PostgreSQL'})"
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.fanout.child", system, target, json.dumps(options)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=REPO,
            env=env,
            text=True,
            bufsize=1,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def answer(self, timeout: float) -> Any:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(
                f"{self.name}: no answer within {timeout:.0f} s; see {self.log_path}"
            ) from None
        if line is None:
            self._lines.put(None)
            raise ChildFailed(f"{self.name}: the process exited; see {self.log_path}\n{self.tail()}")
        message = json.loads(line)
        if not message.get("ok"):
            raise ChildFailed(f"{self.name}: {message.get('error')}\n{message.get('traceback', '')}")
        return message["result"]

    def call(self, cmd: str, timeout: float = 120, **arguments: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **arguments}) + "\n")
        self.proc.stdin.flush()
        return self.answer(timeout)

    def ready(self, timeout: float = 120) -> None:
        if self.answer(timeout) != "ready":
            raise ChildFailed(f"{self.name}: did not start; see {self.log_path}")

    def close(self, timeout: float = 60) -> None:
        try:
            if self.proc.poll() is None:
                self.call("exit", timeout=timeout)
        except (ChildFailed, TimeoutError, OSError):
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

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


if __name__ == "__main__":
    main()
