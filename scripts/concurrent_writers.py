"""Twenty runs appending events at once, acknowledging each commit in a file.

Usage: python scripts/concurrent_writers.py DATABASE ACK_FILE

Used by scripts/crash_kill_resume.sh (the ``concurrent-writers`` boundary): it starts this
program, waits until ACK_FILE has enough lines, kills it with SIGKILL while group-commit
batches are in flight, and then checks that every acknowledged event is in the database.

The durability contract under test: once ``await run.record_response(...)`` returns, the
event is committed. Only after that await returns does the task append ``<run_id> <n>`` to
ACK_FILE (one write, then fsync), so every line in ACK_FILE names an event that must survive.
"""

from __future__ import annotations

import os
import sys

import trio

import zincir

RUNS = 20
MAX_EVENTS_PER_RUN = 10_000  # a bound, so a forgotten process cannot run forever


def acknowledge(fd: int, run_id: str, n: int) -> None:
    """Append one line with a single write (O_APPEND keeps concurrent lines whole) and fsync."""
    os.write(fd, f"{run_id} {n}\n".encode())
    os.fsync(fd)


async def writer(db: zincir.Database, ack_fd: int) -> None:
    async with zincir.open_run(db, role="concurrent-writer", provider="crash-script") as run:
        for n in range(MAX_EVENTS_PER_RUN):
            await run.record_response({"n": n}, [], "end_turn")
            # Returned: committed. Only now may the event be acknowledged.
            await trio.to_thread.run_sync(acknowledge, ack_fd, run.id, n)


async def main(db_path: str, ack_path: str) -> None:
    ack_fd = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        async with zincir.open_database(db_path) as db, trio.open_nursery() as nursery:
            for _ in range(RUNS):
                nursery.start_soon(writer, db, ack_fd)
    finally:
        os.close(ack_fd)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} DATABASE ACK_FILE")
    trio.run(main, sys.argv[1], sys.argv[2])
