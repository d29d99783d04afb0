"""Who owns a lease, as the host sees it: enough to tell, on the same host, a dead owner from a
live one without waiting for the lease to expire (Linux: /proc).

An owner is (host, PID, process start time). The host is the boot id and the PID namespace:
two containers, or two boots, are different hosts, whose PIDs mean nothing to each other. A PID
alone is not enough: the kernel reuses them, so a live process with the owner's PID but another
start time is someone else, and the owner is gone.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

__all__ = ["Owner", "gone_holders", "gone_reason", "is_gone", "this_process"]


@attrs.frozen
class Owner:
    host: str | None
    pid: int | None
    process_start: int | None
    """Clock ticks after boot (field 22 of /proc/PID/stat)."""

    def as_row(self) -> tuple[str | None, int | None, int | None]:
        """The lease columns that store it: lease_host, lease_pid, lease_process_start."""
        return self.host, self.pid, self.process_start


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


@functools.cache
def _host() -> str | None:
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return None if boot is None else f"{boot.strip()}/{namespace}"


GONE = -1
"""What process_start says of a PID that no process has (or only a zombie)."""


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (ticks after boot); GONE if no process has the PID (or only
    a zombie, which has exited); None if this process may not look (then nobody knows)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return GONE
    except OSError:  # hidden from us (hidepid), say: alive as far as we can tell
        return None
    # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return GONE
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def this_process() -> Owner:
    """This process as a lease's owner (fields None where the host cannot say)."""
    return _owner_of(os.getpid())  # by PID: a forked child is another owner


@functools.cache
def _owner_of(pid: int) -> Owner:
    # Read once: every lease taken (a claim, a create, an acquire) stores it.
    started = process_start(pid)
    return Owner(_host(), pid, None if started == GONE else started)


def is_gone(owner: Owner) -> bool:
    """True only when the owner provably no longer runs: it is on this host (same boot, same PID
    namespace) and its PID is free or belongs to a process started at another time."""
    me = _host()
    if me is None or owner.host != me or owner.pid is None or owner.process_start is None:
        return False  # another host, or not enough to know: its lease must expire
    started = process_start(owner.pid)
    return started is not None and started != owner.process_start  # GONE, or the PID reused


def gone_reason(owner: Owner) -> str | None:
    """Why a lease holder is provably gone (the reason a takeover logs), or None: it may live."""
    return f"its owner, process {owner.pid} of this host, is gone" if is_gone(owner) else None


def gone_holders(holders: Iterable[Sequence[Any]]) -> list[tuple[int, int, str]]:
    """Of the (pid, process start) of each lease held on this host, the distinct processes
    that are provably gone, with why: (pid, process start, reason). This process is never one."""
    me = this_process()
    gone = []
    for pid, started in dict.fromkeys(tuple(holder) for holder in holders):
        if (pid, started) == (me.pid, me.process_start):
            continue
        why = gone_reason(Owner(me.host, pid, started))
        if why is not None:
            gone.append((pid, started, why))
    return gone
