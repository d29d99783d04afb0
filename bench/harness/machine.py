"""What a report says about the machine and the code it measured."""

from __future__ import annotations

import datetime
import os
import platform
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from .processes import REPO

WATCHED = ("zincir", "migrations")  # what the children import: a change there changes the figures


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def filesystem(path: Path) -> str:
    """The mount (device, type) that holds ``path``, from /proc/mounts."""
    best, answer = "", "unknown filesystem"
    target = str(path.resolve())
    try:
        with open("/proc/mounts") as f:
            for line in f:
                device, mount, fstype = line.split()[:3]
                if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) > len(best):
                    best, answer = mount, f"{fstype} ({device} on {mount})"
    except OSError:
        pass
    return answer


def git(*args: str) -> str:
    """What ``git ARGS`` prints in the checkout ("" if git fails)."""
    try:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    except OSError:
        return ""
    return proc.stdout.strip()


def changed(*paths: str) -> bool:
    """Whether the checkout has uncommitted changes under ``paths``."""
    return bool(git("status", "--porcelain", "--", *paths))


def zincir_commit() -> str:
    """The checkout's commit (hash and subject), and whether what the children import differs."""
    head = git("log", "-1", "--format=%h %s") or "unknown"
    return head + (" (with uncommitted changes in zincir/ or migrations/)" if changed(*WATCHED) else "")


def describe(workdir: Path) -> dict[str, Any]:
    """The machine, the interpreter, the disk of ``workdir`` and zincir's commit."""
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "python_impl": f"{platform.python_implementation()}, {sys.executable}",
        "sqlite": sqlite3.sqlite_version,
        "workdir": str(workdir),
        "filesystem": filesystem(workdir),
        "zincir_commit": zincir_commit(),
    }


def brief(*watched: str) -> dict[str, Any]:
    """A shorter description: the commit, whether ``watched`` paths have uncommitted changes, the
    date, Python, the CPUs and the platform."""
    return {
        "commit": git("rev-parse", "--short", "HEAD") or "unknown",
        "dirty": changed(*watched),
        "date": now(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }


def source_changes(since: float, commit_at_start: str) -> dict[str, Any]:
    """What changed in zincir/ and migrations/ while a run went on (a shared checkout): files
    written since ``since`` (a ``time.time()``), and a new commit. Empty if nothing did."""
    written = sorted(
        str(path.relative_to(REPO))
        for folder in WATCHED
        for path in (REPO / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.stat().st_mtime >= since
    )
    out: dict[str, Any] = {}
    if written:
        out["files_written"] = written
    commit_at_end = git("log", "-1", "--format=%h %s") or "unknown"
    if commit_at_end.split(" ", 1)[0] != commit_at_start.split(" ", 1)[0]:
        out["commit_at_end"] = commit_at_end
    return out
