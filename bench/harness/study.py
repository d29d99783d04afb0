"""What every study's runner shares: its progress on stderr, its list options, its scratch
directory, the order of a repetition, and which peers are installed."""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

Log = Callable[[str], None]
T = TypeVar("T")

# The module each system needs; zincir and raw sqlite3 are always there.
_PEER_MODULES = {"dbos": "dbos", "langgraph": "langgraph.checkpoint.sqlite"}


def progress(quiet: bool) -> Log:
    """A log of the run's progress on stderr, each line with the seconds since it started."""
    started = time.perf_counter()

    def log(message: str) -> None:
        if not quiet:
            print(f"[{time.perf_counter() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

    return log


def choices(text: str, allowed: Sequence[str], what: str) -> list[str]:
    """The items of a comma-separated option; SystemExit on one not ``allowed``."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(items) - set(allowed))
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (choose from {', '.join(allowed)})")
    return items


def installed(system: str) -> bool:
    """Whether ``system`` can run here (a peer lives in its own virtualenv, see bench/README.md)."""
    module = _PEER_MODULES.get(system)
    if module is None:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@contextlib.contextmanager
def scratch(where: str | None, prefix: str, *, keep: bool, log: Log) -> Iterator[Path]:
    """A new directory under ``where`` (default: the current one, so that the disk is the one
    the reader cares about, not a tmpfs) for a run's databases and logs; deleted afterwards
    unless ``keep``."""
    base = Path(where or ".")
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=base)).resolve()
    try:
        yield workdir
    finally:
        if keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def rotated(items: Sequence[T], k: int) -> list[T]:
    """Repetition ``k``'s order: rotated by ``k``, so that drift in the disk or the machine hits
    every configuration alike."""
    k %= len(items)
    return [*items[k:], *items[:k]]
