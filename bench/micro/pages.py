"""``python -m bench.micro.pages``: the pages one durable write puts into SQLite's WAL, by b-tree.

A commit's cost on the disk is the pages it writes: every page a transaction changed is one WAL
frame, fsynced at COMMIT. This counts them, reading the WAL's frames back and naming the table or
index each page belongs to (SQLite's ``dbstat``), for:

* a sequential durable step (``run.step``), against the raw loop's one INSERT + COMMIT;
* a model response with one tool call and its result (``record_response`` +
  ``record_tool_result``: events, tool intents and the run's row, with their indexes);
* 50 runs stepping at once (a group commit: pages per step when a commit holds many steps).

Automatic checkpoints are off while it counts (zincir's own come every so many commits: it
waits with them), so the WAL only grows. No timing: the counts are the same on any disk.

    .venv/bin/python -m bench.micro.pages [--steps 200] [--dir DIR]
"""

from __future__ import annotations

import argparse
import collections
import os
import sqlite3
import struct
import sys
import tempfile
from pathlib import Path

import trio

import zincir
import zincir._sqlite._connection as sqlite_connection

_FRAME_HEADER = 24
_WAL_HEADER = 32


async def _noop(i: int) -> int:
    return i


def _frames(path: str, start: int) -> list[tuple[int, bool]]:
    """(page number, ends a commit) of every WAL frame from byte ``start`` on."""
    with sqlite3.connect(path) as conn:
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    data = Path(f"{path}-wal").read_bytes()
    frames, offset = [], max(start, _WAL_HEADER)
    while offset + _FRAME_HEADER + page_size <= len(data):
        page, commit_size = struct.unpack(">II", data[offset : offset + 8])
        frames.append((page, commit_size != 0))
        offset += _FRAME_HEADER + page_size
    return frames


def _owners(path: str) -> dict[int, str]:
    with sqlite3.connect(path) as conn:
        return {int(page): str(name) for name, page in conn.execute("SELECT name, pageno FROM dbstat")}


class Counted:
    """The WAL frames a workload wrote, by b-tree, per unit of work."""

    def __init__(self, path: str, start: int, frames: list[tuple[int, bool]], units: int) -> None:
        owners = _owners(path)
        self.units = units
        self.commits = sum(commit for _, commit in frames)
        self.by_tree = collections.Counter(owners.get(page, "(other)") for page, _ in frames)

    def line(self, title: str) -> str:
        total = sum(self.by_tree.values()) / self.units
        parts = ", ".join(f"{name} {n / self.units:.2f}" for name, n in self.by_tree.most_common())
        per_commit = self.units / max(self.commits, 1)
        return f"{title}: {total:.2f} pages per unit, {per_commit:.1f} per commit ({parts})"


def _wal_size(path: str) -> int:
    try:
        return os.path.getsize(f"{path}-wal")
    except OSError:
        return 0


async def _sequential(path: str, steps: int) -> Counted:
    async with zincir.open_database(path) as db, zincir.open_run(db, role="pages") as run:
        for i in range(10):  # warm: the run's pages exist, the schema is read
            await run.step(f"warm{i}", _noop, i)
        start = _wal_size(path)
        for i in range(steps):
            await run.step(f"s{i}", _noop, i)
        frames = _frames(path, start)  # before the close's checkpoint empties the WAL
    return Counted(path, start, frames, steps)


async def _responses(path: str, rounds: int) -> Counted:
    async with zincir.open_database(path) as db, zincir.open_run(db, role="pages") as run:
        for i in range(5):
            await run.record_response(i, [{"id": f"w{i}", "name": "tool"}], "tool_use")
            await run.record_tool_result(f"w{i}", i)
        start = _wal_size(path)
        for i in range(rounds):
            await run.record_response(i, [{"id": f"t{i}", "name": "tool"}], "tool_use")
            await run.record_tool_result(f"t{i}", i)
        frames = _frames(path, start)
    return Counted(path, start, frames, rounds)


async def _concurrent(path: str, runs: int, steps: int) -> Counted:
    opened, finished, counted = trio.Event(), trio.Event(), trio.Event()
    ready = done = 0
    async with zincir.open_database(path) as db:

        async def stepper() -> None:
            nonlocal ready, done
            async with zincir.open_run(db, role="pages") as run:
                await run.step("warm", _noop, 0)
                ready += 1
                if ready == runs:
                    opened.set()
                await opened.wait()
                for i in range(steps):
                    await run.step(f"s{i}", _noop, i)
                done += 1
                if done == runs:
                    finished.set()
                await counted.wait()  # the runs' releases are not counted

        async with trio.open_nursery() as nursery:
            for _ in range(runs):
                nursery.start_soon(stepper)
            await opened.wait()
            start = _wal_size(path)
            await finished.wait()
            frames = _frames(path, start)
            counted.set()
    return Counted(path, start, frames, runs * steps)


def _raw(path: str, steps: int) -> Counted:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("CREATE TABLE steps (id INTEGER PRIMARY KEY, run_id TEXT, name TEXT, result TEXT)")
    for i in range(10):
        conn.execute("INSERT INTO steps (run_id, name, result) VALUES ('r', ?, '1')", (f"w{i}",))
    start = _wal_size(path)
    for i in range(steps):
        conn.execute("BEGIN")
        conn.execute("INSERT INTO steps (run_id, name, result) VALUES ('r', ?, '1')", (f"s{i}",))
        conn.execute("COMMIT")
    frames = _frames(path, start)
    conn.close()
    return Counted(path, start, frames, steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.pages", description=__doc__)
    parser.add_argument("--steps", type=int, default=200, help="sequential steps (and response rounds)")
    parser.add_argument("--runs", type=int, default=50, help="runs stepping at once")
    parser.add_argument("--dir", default=".", help="where the scratch files go")
    args = parser.parse_args(argv)
    sqlite_connection.CHECKPOINT_EVERY_COMMITS = 10**9  # this process only: the WAL must only grow
    with tempfile.TemporaryDirectory(prefix="zincir-pages-", dir=args.dir) as scratch:
        lines = [
            _raw(f"{scratch}/raw.db", args.steps).line("raw loop, one INSERT + COMMIT"),
            trio.run(_sequential, f"{scratch}/seq.db", args.steps).line("zincir, a sequential run.step"),
            trio.run(_responses, f"{scratch}/resp.db", args.steps).line(
                "zincir, record_response + record_tool_result"
            ),
            trio.run(_concurrent, f"{scratch}/conc.db", args.runs, 20).line(
                f"zincir, {args.runs} runs stepping at once, per step"
            ),
        ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
