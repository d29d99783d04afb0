"""Who owns a lease, as the host sees it: enough to tell, on the same host, a dead owner from a
live one without waiting for the lease to expire (Linux: /proc). docs/crashes.md tells the rule.

An owner is (host, PID, process start time). The host is the boot id, the user and the PID
namespace: two containers, or two boots, are different hosts, whose PIDs mean nothing to each
other; and a process may look at what another user's processes are doing only as root, so an
owner of another user is never taken over early either. A PID alone is not enough: the kernel
reuses them, so a live process with the owner's PID but another start time is someone else, and
the owner is gone.

A dead owner is *provably gone* only when nothing it started on this host can still act: a tool
it ran as a subprocess (``git commit``, ``pytest``) outlives a SIGKILL of its owner and may apply
its effect after a new owner's reconcile probe looked. Orphans are re-parented, so their parent
PID no longer tells; what they inherit does. Every process that opens a database puts its mark
(its PID and start time) in its environment (``ZINCIR_OWNERS``), so every process it starts from
then on carries it, readable under /proc/PID/environ by the same user; and a process in the
process group or the session that the owner led was started by it too.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

__all__ = [
    "MARK",
    "Owner",
    "Survivor",
    "Verdict",
    "gone_holders",
    "judge",
    "mark_this_process",
    "this_process",
]

logger = logging.getLogger("zincir")

MARK: Final = "ZINCIR_OWNERS"
"""The environment variable that names, by ``PID.start``, every owner a process descends from."""


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
    return None if boot is None else f"{boot.strip()}/uid:{os.geteuid()}/{namespace}"


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


def _token(pid: int, started: int) -> str:
    return f"{pid}.{started}"


def mark_this_process() -> None:
    """Add this process's mark to ``ZINCIR_OWNERS`` in its environment (once), so that every
    process it starts from now on can be told from a stranger after it dies. Called when a
    database opens: before this process can own a lease, and in the thread that opens it, not
    in a database thread (a process should change its environment while few threads read it)."""
    me = this_process()
    if me.pid is None or me.process_start is None:
        return  # nobody could tell this owner gone anyway: its leases expire
    token = _token(me.pid, me.process_start)
    marks = os.environ.get(MARK, "").split()
    if token not in marks:  # a forked child carries its parent's marks, and adds its own
        os.environ[MARK] = " ".join([*marks, token])


@attrs.frozen
class Survivor:
    """A live process of this host that a dead owner may have started."""

    pid: int
    process_start: int
    name: str
    how: str
    """Why it counts as the owner's: it carries its mark, is in its group, or hides."""

    def still_runs(self) -> bool:
        return process_start(self.pid) == self.process_start

    def __str__(self) -> str:
        return f"process {self.pid} ({self.name}) that it started ({self.how})"


@attrs.frozen
class Verdict:
    """What this host can say of a lease's holder."""

    owner: Owner
    gone: bool
    """Its process no longer runs (on this host; False when it cannot be known)."""
    survivor: Survivor | None = None
    """When gone: a live process it started, which keeps its leases until they expire."""

    @property
    def at_once(self) -> bool:
        """Whether its leases may be taken over now: it is gone, and all it started too."""
        return self.gone and self.survivor is None

    @property
    def reason(self) -> str:
        who = f"its owner, process {self.owner.pid} of this host"
        if not self.gone:
            return f"{who}, may still run" if self.owner.host == _host() else "its owner is on another host"
        if self.survivor is None:
            return f"{who}, is gone, and no process it started is alive"
        return f"{who}, is gone, but {self.survivor} still runs"


_all_gone: set[tuple[int, int]] = set()
"""Dead owners none of whose processes remain: no process can start one again, so it is final."""
_survivors: dict[tuple[int, int], Survivor] = {}
"""The live process last found for a dead owner: looked at first, before a scan of /proc."""
_CACHE_LIMIT: Final = 4096


def judge(owner: Owner) -> Verdict:
    """Whether ``owner`` is gone, and if so whether a process it started still runs.

    /proc is scanned once per dead owner while nothing it started runs (then the answer is
    final), and again only when the survivor found before has ended. The caches are shared by
    the database threads; a race between two of them costs one scan more, never a wrong answer.
    """
    if owner.pid is None or owner.process_start is None or not _is_gone(owner):
        return Verdict(owner, gone=False)
    key = (owner.pid, owner.process_start)
    if key in _all_gone:
        return Verdict(owner, gone=True)
    known = _survivors.get(key)
    if known is not None and known.still_runs():
        return Verdict(owner, gone=True, survivor=known)
    survivor = find_survivor(owner.pid, owner.process_start)
    if survivor is None:
        _survivors.pop(key, None)
        if len(_all_gone) >= _CACHE_LIMIT:
            _all_gone.clear()
        _all_gone.add(key)
        return Verdict(owner, gone=True)
    if len(_survivors) >= _CACHE_LIMIT:
        _survivors.clear()
    _survivors[key] = survivor
    verdict = Verdict(owner, gone=True, survivor=survivor)
    logger.warning("not taken over at once; its leases wait for their expiry: %s", verdict.reason)
    return verdict


def _is_gone(owner: Owner) -> bool:
    """True only when the owner's own process provably no longer runs: it is on this host (same
    boot, same user, same PID namespace) and its PID is free or belongs to a process started at
    another time."""
    me = _host()
    if me is None or owner.host != me or owner.pid is None or owner.process_start is None:
        return False  # another host, or not enough to know: its lease must expire
    started = process_start(owner.pid)
    return started is not None and started != owner.process_start  # GONE, or the PID reused


def find_survivor(pid: int, started: int) -> Survivor | None:
    """A live process of this host that the process (``pid``, ``started``), now dead, started:
    a member of the process group or session it led, a process that carries its mark in its
    environment, or one of this user that started after it and hides its environment (nobody
    can tell).

    Each process costs two system calls (its group and session) and one read of its
    environment; only a process that may be a survivor has its stat read too. /proc is listed
    twice: a process that a survivor forks while the first list is read, just before the
    survivor ends, is in the second. (Only a chain that forks and exits again while the second
    list is read could slip through.) The owner is dead, so nothing else can start a process
    that carries its mark.
    """
    needle = _token(pid, started).encode()
    uid = os.geteuid()
    seen: set[str] = set()
    for _ in range(2):
        for name in _listing(seen):
            survivor = _started_by(int(name), pid, started, needle, uid)
            if survivor is not None:
                return survivor
    return None


@attrs.frozen
class _Stat:
    state: bytes
    started: int
    name: str


def _stat_fields(pid: int) -> _Stat | None:
    """What /proc/PID/stat says of a process: its state, start and name; None if it ended."""
    stat = _read_bytes(f"/proc/{pid}/stat")
    if stat is None:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        state, started = fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None
    name = stat[stat.find(b"(") + 1 : stat.rfind(b")")].decode(errors="replace")
    return _Stat(state, started, name)


def _listing(seen: set[str]) -> list[str]:
    """The PIDs in /proc not in ``seen``, which they are added to."""
    try:
        listing = [name for name in os.listdir("/proc") if name.isdigit() and name not in seen]
    except OSError:
        return []
    seen.update(listing)
    return listing


def _started_by(pid: int, owner: int, owner_start: int, needle: bytes, uid: int) -> Survivor | None:
    try:  # two system calls, no file: the group and session of every process are looked at
        group, session = os.getpgid(pid), os.getsid(pid)
    except OSError:
        return None  # it ended meanwhile
    # A group or session keeps its leader's PID as its id after the leader died, and the kernel
    # gives that PID to no new process while it lives: the id is the owner's (or that of a later
    # process that got its PID once the owner's group was gone: then waiting is only cautious).
    if group == owner:
        how = f"in the process group {owner} it led"
    elif session == owner:
        how = f"in the session {owner} it led"
    else:
        try:
            environ = _read_bytes(f"/proc/{pid}/environ", strict=True)
        except PermissionError:  # another user's process, or one that is not dumpable (setuid, ssh)
            if _real_uid(pid) != uid:
                return None  # the owner was of this user (the host says so), and so are its children
            how = "of its user, its environment unreadable"
        else:
            if environ is None or not _carries(environ, needle):
                return None  # a stranger, a kernel thread, a zombie (no environment left)
            how = f"it carries {MARK}"
    stat = _stat_fields(pid)
    # A zombie cannot act; a process older than the owner is not its child.
    if stat is None or stat.state in (b"Z", b"X") or stat.started < owner_start:
        return None
    return Survivor(pid, stat.started, stat.name, how)


def _carries(environ: bytes, needle: bytes) -> bool:
    if needle not in environ:  # the common case, for a process that is no owner's child
        return False
    prefix = MARK.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return needle in entry[len(prefix) :].split()
    return False


_READ_SIZE: Final = 128 * 1024


def _read_bytes(path: str, *, strict: bool = False) -> bytes | None:
    """A /proc file's bytes; None if it cannot be read (the process ended, a kernel thread).
    ``strict``: a PermissionError is raised, not taken for None."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            return _read_all(fd)
        finally:
            os.close(fd)
    except PermissionError:
        if strict:
            raise
        return None
    except OSError:
        return None


def _read_all(fd: int) -> bytes:
    # /proc hands out as much as asked in one read: one more only for a longer file.
    chunks = [os.read(fd, _READ_SIZE)]
    while len(chunks[-1]) == _READ_SIZE:
        chunks.append(os.read(fd, _READ_SIZE))
    return b"".join(chunks)


def _real_uid(pid: int) -> int | None:
    status = _read_bytes(f"/proc/{pid}/status")
    for line in (status or b"").splitlines():
        if line.startswith(b"Uid:"):
            try:
                return int(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def gone_holders(holders: Iterable[Sequence[Any]]) -> list[tuple[int, int, Verdict]]:
    """Of the (pid, process start) of each lease held on this host, the distinct processes
    that are provably gone, with the verdict: (pid, process start, verdict); the verdict says
    whether their leases may be taken at once. This process is never one."""
    me = this_process()
    gone = []
    for pid, started in dict.fromkeys(tuple(holder) for holder in holders):
        if (pid, started) == (me.pid, me.process_start):
            continue
        verdict = judge(Owner(me.host, pid, started))
        if verdict.gone:
            gone.append((pid, started, verdict))
    return gone
