"""The effect ledger: where a tool notes each effect it applies, so that a crash test can count them."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Final, final

from .._errors import InvalidArgument

__all__ = ["LEDGER_ENVIRONMENT", "EffectLedger", "effect_ledger"]

LEDGER_ENVIRONMENT: Final = "ZINCIR_EFFECT_LEDGER"
"""The ledger's file in a process that a crash test started (unset elsewhere)."""

_MAX_KEY_CHARS: Final = 1000


@final
class EffectLedger:
    """A small durable ledger of effects, one line per effect applied, keyed by the effect's key.

    A tool calls :meth:`record` right where its effect happens (the payment made, the file
    published), with ``pending.effect_key``; a crash test then reports every key recorded more
    often than once: an effect applied twice. Outside a crash test (:func:`effect_ledger` with no
    ledger file set) recording does nothing.

    Each record is one append to the file, which a SIGKILL cannot tear: an effect recorded before a
    crash is counted after it.
    """

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self._path = None if path is None else os.fspath(path)

    def __repr__(self) -> str:
        return f"<zincir.testing.EffectLedger {self._path or 'inactive'}>"

    @property
    def path(self) -> str | None:
        """The ledger's file (None: recording does nothing)."""
        return self._path

    async def record(self, key: str) -> None:
        """Note that the effect with ``key`` was applied just now, once."""
        self.record_sync(key)  # one small append: no thread worth its cost

    def record_sync(self, key: str) -> None:
        """:meth:`record`, for a tool's synchronous code (or a thread)."""
        if not isinstance(key, str) or not key or len(key) > _MAX_KEY_CHARS:
            raise InvalidArgument(
                f"an effect key must be a non-empty string of at most {_MAX_KEY_CHARS} characters,"
                f" not {key!r}"
            )
        if self._path is None:
            return
        line = json.dumps({"key": key, "pid": os.getpid()}) + "\n"
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def counts(self) -> Counter[str]:
        """How often each key was recorded (empty for an inactive ledger or no file yet)."""
        counts: Counter[str] = Counter()
        if self._path is None:
            return counts
        try:
            with open(self._path, encoding="utf-8") as lines:
                for line in lines:
                    if line.endswith("\n"):  # a line without its end was never written whole
                        counts[json.loads(line)["key"]] += 1
        except FileNotFoundError:
            pass
        return counts


def effect_ledger() -> EffectLedger:
    """The crash test's ledger in a process it started, else an inactive one (a no-op)."""
    return EffectLedger(os.environ.get(LEDGER_ENVIRONMENT) or None)
