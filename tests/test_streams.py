"""Durable streams (docs/streams.md): chunks written in fenced flushes by a run's lease holder,
read live by anyone, in this process or another, across crashes and lost leases."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner

import zincir
from zincir import _streams
from zincir._cli import main

from .helpers import ZINCIR_CLI, hearing_others, reap, rows, start_python, trace_operations, until
from .test_inspector import fetch
from .test_suspension import working

# Follows a stream and prints each chunk as a JSON line, "idle" whenever it found nothing new
# and waits (for a wake-up: the fallback read is a minute apart), and "end" once it stops.
FOLLOWER = """
    import json, sys, trio, zincir
    from zincir import _streams
    _streams._POLL_S = 60.0
    read_page = _streams._Reader._page
    async def page(self):
        found = await read_page(self)
        if not found.chunks and not zincir.RunStatus(found.status).is_terminal:
            print("idle", flush=True)
        return found
    _streams._Reader._page = page
    async def main():
        async with zincir.open_database(sys.argv[1]) as db:
            chunks = zincir.read_stream(db, sys.argv[2], sys.argv[3], after=int(sys.argv[4]), follow=True)
            async for chunk in chunks:
                print(json.dumps([chunk.offset, chunk.attempt, chunk.data, chunk.restarted]), flush=True)
            print("end", flush=True)
    trio.run(main)
"""

# Owns the run, streams five chunks and stores them, says so, sends a sixth, and waits to be killed.
KILLED_WRITER = """
    import sys, trio, zincir
    async def main():
        async with zincir.open_database(sys.argv[1]) as db:
            async with zincir.open_run(db, sys.argv[2], lease_ttl=30.0) as run:
                async with run.stream("answer", flush_interval=0.01) as out:
                    for i in range(5):
                        await out.send(f"first-{i}")
                    await out.flush()
                    print("flushed", flush=True)
                    await out.send("first-5")
                    await trio.sleep_forever()
    trio.run(main)
"""


async def released_run(db: zincir.Database) -> str:
    async with zincir.open_run(db) as run:
        return run.id


async def stored(db: zincir.Database, run_id: str, name: str, after: int = -1) -> list[zincir.StreamChunk]:
    return [chunk async for chunk in zincir.read_stream(db, run_id, name, after=after)]


async def attempts(db: zincir.Database, run_id: str, name: str) -> list[tuple[int, int, int, str]]:
    found = await db._read(db._store.stream_attempts, run_id, name)
    return [(a.attempt, a.first_offset, a.next_offset, a.state) for a in found]


def follower(db: zincir.Database, run_id: str, name: str, after: int = -1) -> subprocess.Popen[str]:
    return start_python(FOLLOWER, db.path, run_id, name, str(after))


async def line_of(proc: subprocess.Popen[str], *, idle: bool = False) -> str:
    """The process's next line; a follower's next chunk or end, unless ``idle`` (then the
    next line, "idle" included)."""
    assert proc.stdout is not None
    with trio.fail_after(30):  # far less than the follower's fallback read (a minute)
        while True:
            line = await trio.to_thread.run_sync(proc.stdout.readline, abandon_on_cancel=True)
            if idle or line != "idle\n":
                return line


async def idle(proc: subprocess.Popen[str]) -> None:
    """Until the follower has found nothing new and waits: what comes now must wake it."""
    while await line_of(proc, idle=True) != "idle\n":
        pass


def as_chunk(line: str) -> zincir.StreamChunk:
    offset, attempt, data, restarted = json.loads(line)
    return zincir.StreamChunk(offset, attempt, data, restarted)


@asynccontextmanager
async def only_wake_ups(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    monkeypatch.setattr(_streams, "_POLL_S", 60.0)  # a follower here is woken, or a minute late
    yield


# -- writing and reading ---------------------------------------------------------------------


async def test_chunks_come_back_in_order_at_gap_free_offsets_in_few_commits(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushes = trace_operations(monkeypatch, db._store, "flush_stream")
    values: list[Any] = ["text", 1, 2.5, None, True, {"b": [1, {"c": None}], "a": "é"}, [], ""]
    async with zincir.open_run(db) as run:
        started = trio.current_time()
        async with run.stream("answer", flush_interval=0.05) as out:
            for i in range(1000):
                await out.send(values[i % len(values)])
        elapsed = trio.current_time() - started
        await run.complete()
    chunks = await stored(db, run.id, "answer")
    assert [c.offset for c in chunks] == list(range(1000))
    assert [c.data for c in chunks] == [values[i % len(values)] for i in range(1000)]
    assert {(c.attempt, c.restarted) for c in chunks} == {(1, False)}
    # One commit per interval at most (and one at the end), however many chunks were sent.
    assert 1 <= len(flushes) <= math.ceil(elapsed / 0.05) + 2
    assert flushes == [("flush_stream", None)] * len(flushes)
    assert await attempts(db, run.id, "answer") == [(1, 0, 1000, "closed")]
    # Pages of the reader: any offset to resume from.
    assert [c.offset for c in await stored(db, run.id, "answer", after=996)] == [997, 998, 999]
    assert await stored(db, run.id, "answer", after=999) == []
    assert await stored(db, run.id, "never written") == []


async def test_flush_bytes_stores_at_once_and_flush_stores_now(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        async with run.stream("big", flush_interval=60.0, flush_bytes=10) as out:
            await out.send("0123456789")  # 12 bytes of JSON: stored before send returns
            assert [c.data for c in await stored(db, run.id, "big")] == ["0123456789"]
            await out.send("a")
            assert len(await stored(db, run.id, "big")) == 1  # waiting for its interval (a minute)
            await out.flush()
            assert [c.data for c in await stored(db, run.id, "big")] == ["0123456789", "a"]
            await out.send("b")
        # The block's end stores what is left.
        assert [c.data for c in await stored(db, run.id, "big")] == ["0123456789", "a", "b"]


async def test_a_stream_reopened_by_the_same_owner_goes_on_and_complete_stores_what_is_open(
    db: zincir.Database,
) -> None:
    async with zincir.open_run(db) as run:
        async with run.stream("log", flush_interval=60.0) as out:
            await out.send("one")
        async with run.stream("log", flush_interval=60.0) as out:
            with pytest.raises(zincir.InvalidArgument, match="stream 'log' is already open"):
                async with run.stream("log"):
                    pass
            await out.send("two")
            await run.complete()  # inside the block: the chunk waiting for its minute is stored first
            with pytest.raises(zincir.RunTerminal):
                await out.send("three")
    chunks = await stored(db, run.id, "log")
    assert [(c.offset, c.attempt, c.data, c.restarted) for c in chunks] == [
        (0, 1, "one", False),
        (1, 1, "two", False),
    ]
    assert await attempts(db, run.id, "log") == [(1, 0, 2, "closed")]


async def test_bad_chunks_are_refused_and_nothing_is_written(db_target: str) -> None:
    async with zincir.open_database(db_target, max_payload_bytes=100) as db:
        async with zincir.open_run(db) as run:
            async with run.stream("answer") as out:
                for bad, why in [
                    (object(), "not a JSON value"),
                    (math.nan, "not a JSON value"),
                    ({1, 2}, "not a JSON value"),
                    ({"k": b"bytes"}, "not a JSON value"),
                    ("x" * 200, "202 bytes of JSON, over the limit of 100 bytes"),
                ]:
                    with pytest.raises(
                        zincir.InvalidArgument, match=f"run {run.id}: a chunk of stream 'answer' is {why}"
                    ):
                        await out.send(bad)
                await out.flush()
                assert await stored(db, run.id, "answer") == []
                assert await attempts(db, run.id, "answer") == []
                await out.send("fine")  # the stream goes on, from offset 0
            assert [(c.offset, c.data) for c in await stored(db, run.id, "answer")] == [(0, "fine")]
            for name, options, message in [
                ("", {}, "the stream name"),
                (7, {}, "the stream name"),
                ("s", {"flush_interval": -1}, "flush_interval"),
                ("s", {"flush_interval": 3600}, "flush_interval must be at most 60 s"),
                ("s", {"flush_bytes": 0}, "flush_bytes"),
            ]:
                with pytest.raises(zincir.InvalidArgument, match=message):
                    async with run.stream(name, **options):  # type: ignore[arg-type]
                        pass
        with pytest.raises(zincir.InvalidArgument, match="after"):
            zincir.read_stream(db, run.id, "answer", after=-2)
        with pytest.raises(zincir.InvalidArgument, match="not a UUID"):
            zincir.read_stream(db, "run-1", "answer")
        with pytest.raises(zincir.RunNotFound):
            await stored(db, "00000000-0000-4000-8000-000000000000", "answer")


async def test_a_retried_flush_is_stored_once(db: zincir.Database) -> None:
    """A flush whose commit's outcome was unknown (the connection lost during COMMIT) is sent
    again with the same token: stored once, at the same offsets."""
    async with zincir.open_run(db) as run:
        lease = run._lease
        first = await db._write(
            db._store.flush_stream, lease, "s", "w:0", ['"a"', '"b"'], False, route=run.id
        )
        again = await db._write(
            db._store.flush_stream, lease, "s", "w:0", ['"a"', '"b"'], False, route=run.id
        )
        assert first == again == (1, 2)
        await db._write(db._store.flush_stream, lease, "s", "w:1", ['"c"'], True, route=run.id)
        await run.complete()
    assert [(c.offset, c.data) for c in await stored(db, run.id, "s")] == [(0, "a"), (1, "b"), (2, "c")]


# -- fencing, interruptions and restarts ---------------------------------------------------


async def test_a_fenced_writers_flush_raises_lease_lost_and_stores_nothing_and_the_next_attempt_restarts(
    db: zincir.Database,
) -> None:
    fenced = trio.Event()
    with pytest.raises(zincir.LeaseLost):
        async with (
            zincir.open_run(db, lease_ttl=30.0) as run,
            run.stream("answer", flush_interval=60.0) as out,
        ):
            await out.send("old-0")
            await out.flush()
            async with zincir.open_run(db, run.id, force=True):  # another owner fences this one
                fenced.set()
            await out.send("old-1")
            with pytest.raises(zincir.LeaseLost, match="fenced by a newer owner"):
                await out.flush()
            with pytest.raises(zincir.LeaseLost):
                await out.send("old-2")
    assert fenced.is_set()
    assert [c.data for c in await stored(db, run.id, "answer")] == ["old-0"]
    assert await attempts(db, run.id, "answer") == [(1, 0, 1, "open")]  # its writer never closed it
    async with zincir.open_run(db, run.id) as again:
        async with again.stream("answer") as out:
            await out.send("new-0")
            await out.send("new-1")
        await again.complete()
    chunks = await stored(db, run.id, "answer")
    assert [(c.offset, c.attempt, c.data, c.restarted) for c in chunks] == [
        (0, 1, "old-0", False),
        (1, 2, "new-0", True),
        (2, 2, "new-1", False),
    ]
    assert await attempts(db, run.id, "answer") == [(1, 0, 1, "interrupted"), (2, 1, 3, "closed")]
    # A reader that had shown the first attempt and resumes after it is told of the restart.
    [first_of_second, _] = await stored(db, run.id, "answer", after=0)
    assert first_of_second.restarted


async def test_a_suspended_run_writes_its_stream_again_as_a_restart(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = await released_run(db)

    async def handler(run: zincir.Run) -> None:
        async with run.stream("progress") as out:
            await out.send("looking")
        go = await run.wait_for_signal("w", "go")  # suspends (suspend_after=0); replayed after
        async with run.stream("progress") as out:
            await out.send(f"told {go}")
        await run.complete()

    async with working(db, handler, suspend_after=0):
        await until(lambda: _status_is(db, run_id, zincir.RunStatus.WAITING))
        await zincir.send_signal(db, run_id, "go", "now")
        with trio.fail_after(30):
            await zincir.wait_for_end(db, run_id)
    chunks = await stored(db, run_id, "progress")
    assert [(c.offset, c.attempt, c.data, c.restarted) for c in chunks] == [
        (0, 1, "looking", False),
        (1, 2, "looking", True),
        (2, 2, "told now", False),
    ]
    assert await attempts(db, run_id, "progress") == [(1, 0, 1, "closed"), (2, 1, 3, "closed")]


async def test_a_stream_open_when_its_run_is_suspended_is_interrupted_and_written_again(
    db: zincir.Database,
) -> None:
    run_id = await released_run(db)

    async def handler(run: zincir.Run) -> None:
        async with run.stream("progress", flush_interval=60.0) as out:
            await out.send("before")
            await out.flush()
            go = await run.wait_for_signal("w", "go")  # suspends with the stream open; replayed after
            await out.send(f"told {go}")
        await run.complete()

    async with working(db, handler, suspend_after=0):
        await until(lambda: _status_is(db, run_id, zincir.RunStatus.WAITING))
        # Its writer is gone: the open attempt is shown interrupted before anyone writes again.
        assert await attempts(db, run_id, "progress") == [(1, 0, 1, "open")]
        await zincir.send_signal(db, run_id, "go", "now")
        with trio.fail_after(30):
            await zincir.wait_for_end(db, run_id)
    chunks = await stored(db, run_id, "progress")
    assert [(c.offset, c.attempt, c.data, c.restarted) for c in chunks] == [
        (0, 1, "before", False),
        (1, 2, "before", True),
        (2, 2, "told now", False),
    ]
    assert await attempts(db, run_id, "progress") == [(1, 0, 1, "interrupted"), (2, 1, 3, "closed")]


async def test_a_block_that_raises_stores_what_it_sent_and_raises_its_own_error(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        with pytest.raises(KeyError, match="the model failed"):  # not wrapped in an ExceptionGroup
            async with run.stream("answer", flush_interval=60.0) as out:
                await out.send("partial")
                raise KeyError("the model failed")
        with trio.move_on_after(0.01):  # a Trio cancellation of the block stores it too
            async with run.stream("other", flush_interval=60.0) as out:
                await out.send("cut short")
                await trio.sleep_forever()
        await run.complete()
    assert [c.data for c in await stored(db, run.id, "answer")] == ["partial"]
    assert await attempts(db, run.id, "answer") == [(1, 0, 1, "closed")]
    assert [c.data for c in await stored(db, run.id, "other")] == ["cut short"]
    assert await attempts(db, run.id, "other") == [(1, 0, 1, "closed")]


async def _status_is(db: zincir.Database, run_id: str, status: zincir.RunStatus) -> bool:
    return (await db.state(run_id)).run.status is status


# -- following, in this process and in others ------------------------------------------------


async def test_a_reader_in_another_process_sees_every_chunk_once_in_order_while_the_writer_runs(
    db: zincir.Database,
) -> None:
    run_id = await released_run(db)
    reader = follower(db, run_id, "answer")
    try:
        async with zincir.open_run(db, run_id) as run:
            async with run.stream("answer", flush_interval=0.01) as out:
                for i in range(20):
                    await out.send({"i": i})
                    # Each chunk reaches the other process before the next is sent: it follows live.
                    assert as_chunk(await line_of(reader)) == zincir.StreamChunk(i, 1, {"i": i}, False)
            await idle(reader)
            await run.complete()
        assert await line_of(reader) == "end\n"  # the run's end wakes the follower, and stops it
        assert await trio.to_thread.run_sync(reader.wait) == 0
    finally:
        reap(reader)


async def test_a_writer_killed_mid_stream_keeps_what_it_committed_and_a_follower_sees_the_restart(
    db: zincir.Database,
) -> None:
    run_id = await released_run(db)
    reader = follower(db, run_id, "answer")
    writer = start_python(KILLED_WRITER, db.path, run_id)
    seen: list[zincir.StreamChunk] = []
    try:
        assert await line_of(writer) == "flushed\n"
        for _ in range(5):
            seen.append(as_chunk(await line_of(reader)))
        writer.send_signal(signal.SIGKILL)
        await trio.to_thread.run_sync(writer.wait)
        kept = await stored(db, run_id, "answer")
        # What was committed stays: the five it stored, and the sixth if its flush got in first.
        assert [c.data for c in kept] in (
            [f"first-{i}" for i in range(5)],
            [f"first-{i}" for i in range(6)],
        )
        async with _taken_over(db, run_id) as run:
            async with run.stream("answer") as out:
                await out.send("second-0")
                await out.send("second-1")
            await run.complete()
        while (line := await line_of(reader)) != "end\n":
            seen.append(as_chunk(line))
        assert await trio.to_thread.run_sync(reader.wait) == 0
    finally:
        reap(writer)
        reap(reader)
    n = len(kept)
    assert seen == [
        *kept,
        zincir.StreamChunk(n, 2, "second-0", True),
        zincir.StreamChunk(n + 1, 2, "second-1", False),
    ]
    assert seen == await stored(db, run_id, "answer")
    assert await attempts(db, run_id, "answer") == [(1, 0, n, "interrupted"), (2, n, n + 2, "closed")]


@asynccontextmanager
async def _taken_over(db: zincir.Database, run_id: str) -> AsyncIterator[zincir.Run]:
    """The run of a killed owner, taken as soon as its lease is free (instant takeover of a
    dead owner on this host, or expiry)."""
    with trio.fail_after(60):
        while True:
            try:
                async with zincir.open_run(db, run_id) as run:
                    yield run
                    return
            except zincir.RunLeased:
                await trio.sleep(0.1)


async def test_a_reader_that_reconnects_with_after_misses_and_repeats_nothing(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with only_wake_ups(monkeypatch), zincir.open_run(db) as run:
        got: list[zincir.StreamChunk] = []
        async with run.stream("answer", flush_interval=0.005) as out:
            for i in range(10):
                await out.send(i)
            # A reader that disconnects after five chunks ...
            async for chunk in zincir.read_stream(db, run.id, "answer", follow=True):
                got.append(chunk)
                if chunk.offset == 4:
                    break
            for i in range(10, 20):  # ... while more are written
                await out.send(i)
        await run.complete()
    # ... and reconnects after the last offset it saw.
    with trio.fail_after(30):
        async for chunk in zincir.read_stream(db, run.id, "answer", after=got[-1].offset, follow=True):
            got.append(chunk)
    assert [(c.offset, c.data) for c in got] == [(i, i) for i in range(20)]


async def test_a_hundred_streams_in_one_process_each_followed_here(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunks_each = 20
    ids = [await released_run(db) for _ in range(100)]
    followed: dict[str, list[Any]] = {run_id: [] for run_id in ids}
    following = trio.Semaphore(0)

    async def follow(run_id: str) -> None:
        chunks = zincir.read_stream(db, run_id, "tokens", follow=True)
        following.release()
        async for chunk in chunks:
            followed[run_id].append((chunk.offset, chunk.data))

    async def write(run_id: str) -> None:
        async with zincir.open_run(db, run_id) as run:
            async with run.stream("tokens") as out:
                for i in range(chunks_each):
                    await out.send(f"{run_id[:8]}-{i}")
                    await trio.sleep(0.001)
            await run.complete()

    flushes = trace_operations(monkeypatch, db._store, "flush_stream")
    async with only_wake_ups(monkeypatch):
        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                for run_id in ids:
                    nursery.start_soon(follow, run_id)
                for run_id in ids:
                    nursery.start_soon(write, run_id)
    for run_id in ids:
        assert followed[run_id] == [(i, f"{run_id[:8]}-{i}") for i in range(chunks_each)]
    assert all(error is None for _, error in flushes)
    assert len(flushes) < 100 * chunks_each  # buffered: fewer writes than chunks


async def test_a_follower_here_is_woken_by_this_processes_flushes_not_by_polling(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    await hearing_others(db, monkeypatch)
    async with only_wake_ups(monkeypatch), zincir.open_run(db) as run:
        got: list[Any] = []
        async with trio.open_nursery() as nursery:

            async def follow() -> None:
                async for chunk in zincir.read_stream(db, run.id, "s", follow=True):
                    got.append(chunk.data)

            nursery.start_soon(follow)
            async with run.stream("s", flush_interval=0) as out:
                for i in range(5):
                    await out.send(i)
                    with trio.fail_after(30):  # far less than the fallback read (a minute)
                        await until(lambda i=i: _true(len(got) == i + 1), every=0.001)  # type: ignore[misc]
            await run.complete()
    assert got == list(range(5))


async def _true(value: bool) -> bool:
    return value


async def test_follow_on_an_ended_run_gives_what_is_stored_and_stops(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        async with run.stream("s") as out:
            await out.send("only")
        await run.fail("done")
    with trio.fail_after(30):
        got = [c.data async for c in zincir.read_stream(db, run.id, "s", follow=True)]
        assert got == ["only"]
        assert [c async for c in zincir.read_stream(db, run.id, "other", follow=True)] == []
    with pytest.raises(zincir.RunNotFound):
        async for _ in zincir.read_stream(db, "00000000-0000-4000-8000-000000000000", "s", follow=True):
            pass
    if db.backend == "postgresql":
        assert rows(db, "SELECT * FROM run_waiters") == []


# -- the command line --------------------------------------------------------------------------


def _stream_command(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [*ZINCIR_CLI, "stream", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


async def test_zincir_stream_follow_prints_each_chunk_as_it_is_stored_and_stops_at_the_end(
    db: zincir.Database,
) -> None:
    run_id = await released_run(db)
    command = _stream_command(run_id[:8], "answer", "--follow", "--db", db.path)
    try:
        async with zincir.open_run(db, run_id) as run:
            async with run.stream("answer", flush_interval=0.01) as out:
                for i, text in enumerate(["Hel", "lo"]):
                    await out.send(text)
                    line = json.loads(await line_of(command))
                    assert line == {"offset": i, "attempt": 1, "restarted": False, "data": text}
            await run.complete()
        with trio.fail_after(30):
            out, err = await trio.to_thread.run_sync(command.communicate)
    finally:
        reap(command)
    assert (command.returncode, out, err) == (0, "", "")
    # Resumed after an offset; Ctrl+C stops a follower of a run that has not ended.
    resumed = await trio.to_thread.run_sync(
        lambda: subprocess.run(
            [*ZINCIR_CLI, "stream", run_id, "answer", "--after", "0", "--db", db.path],
            capture_output=True,
            text=True,
            check=True,
        )
    )
    assert [json.loads(line)["data"] for line in resumed.stdout.splitlines()] == ["lo"]
    async with zincir.open_run(db) as going_on, going_on.stream("answer") as out:
        await out.send("so far")
    command = _stream_command(going_on.id, "answer", "--follow", "--db", db.path)
    try:
        assert json.loads(await line_of(command))["data"] == "so far"  # it follows now
        command.send_signal(signal.SIGINT)
        with trio.fail_after(30):
            out, err = await trio.to_thread.run_sync(command.communicate)
    finally:
        reap(command)
    assert command.returncode == 130 and "Traceback" not in err, err


def test_zincir_stream_text_and_export(db_target: str) -> None:
    path = db_target

    async def write() -> str:
        async with zincir.open_database(path) as db:
            with pytest.raises(zincir.LeaseLost):
                async with zincir.open_run(db) as run, run.stream("answer") as out:
                    await out.send("Hel")
                    await out.flush()
                    async with zincir.open_run(db, run.id, force=True):
                        pass
            async with zincir.open_run(db, run.id) as again:
                async with again.stream("answer") as out:
                    for chunk in ["Hello,\n", "w\x1b[2Jorld", {"done": True}]:
                        await out.send(chunk)
                await again.complete()
            return run.id

    run_id = trio.run(write)
    text = CliRunner().invoke(main, ["stream", "--db", path, run_id, "answer", "--text"])
    assert text.exit_code == 0, text.output
    # The restart is said, the model's control characters are escaped, the answer is text.
    assert text.output == (
        'Hel\n--- attempt 2 starts over at offset 1 ---\nHello,\nw\\x1b[2Jorld\n{"done": true}\n'
    )
    exported = CliRunner().invoke(main, ["export", "--db", path, run_id])
    assert exported.exit_code == 0, exported.output
    chunks = [
        line for line in map(json.loads, exported.output.splitlines()) if line["kind"] == "stream_chunk"
    ]
    assert [(c["stream"], c["offset"], c["attempt"], c["restarted"], c["data"]) for c in chunks] == [
        ("answer", 0, 1, False, "Hel"),
        ("answer", 1, 2, True, "Hello,\n"),
        ("answer", 2, 2, False, "w\x1b[2Jorld"),
        ("answer", 3, 2, False, {"done": True}),
    ]
    unknown = CliRunner().invoke(main, ["stream", "--db", path, "ffffffff", "answer"])
    assert unknown.exit_code != 0 and "ffffffff" in unknown.output


# -- the inspector -------------------------------------------------------------------------------


async def test_the_run_page_shows_each_stream_its_attempts_and_its_latest_text(db_target: str) -> None:
    path = db_target  # a SQLite file or a PostgreSQL database: the page reads both
    async with zincir.open_database(path) as db:
        with pytest.raises(zincir.LeaseLost):
            async with zincir.open_run(db) as run, run.stream("answer") as out:
                await out.send("The first try")
                await out.flush()
                async with zincir.open_run(db, run.id, force=True):
                    pass
        async with zincir.open_run(db, run.id) as again:
            async with again.stream("answer") as out:
                for chunk in ["Hello <script>alert(1)</script>", " \u202eworld\n", {"tool": "search"}]:
                    await out.send(chunk)
            async with again.stream("progress") as progress:
                await progress.send({"step": 1})
                await progress.flush()
                page = await fetch(path, f"/runs/{run.id}")  # while its writer still holds the run
    assert page.status == 200
    [section] = re.findall(r'<section id="streams">.*?</section>', page.text, re.S)
    assert re.findall(r"<h3><code>(\w+)</code> <span class=\"muted\">\((\d+) chunks\)", section) == [
        ("answer", "4"),
        ("progress", "1"),
    ]
    assert re.findall(r'<span class="stream-(\w+)">', section) == ["interrupted", "closed", "open"]
    # The latest attempt's text, escaped (markup and a right-to-left override shown, not obeyed).
    assert (
        "Hello &lt;script&gt;alert(1)&lt;/script&gt; \\u202eworld\n{&#34;tool&#34;: &#34;search&#34;}\n"
        in section
    )
    assert "The first try" not in section
    assert f"zincir stream {run.id} answer" in section
    # A run without streams says so.
    async with zincir.open_database(path) as db, zincir.open_run(db) as quiet:
        pass
    empty = await fetch(path, f"/runs/{quiet.id}")
    assert "No streams" in empty.text


async def test_flushes_are_no_crash_test_boundaries(db: zincir.Database, tmp_path: Path) -> None:
    """How many flushes a stream makes depends on timing; a crash test's boundaries must be the
    same in every copy of a run (docs/crash-testing.md), so only the run's other writes count."""
    from zincir import _faults

    noted = tmp_path / "boundaries.jsonl"
    _faults.arm(f"count:{noted}")
    try:
        async with zincir.open_run(db) as run:
            async with run.stream("answer", flush_interval=0) as out:
                for i in range(5):
                    await out.send(i)
                    await out.flush()
            await run.complete()
    finally:
        _faults.arm(None)
    operations = [json.loads(line)["operation"] for line in noted.read_text().splitlines()]
    # Before and after the end: the only write counted.
    assert operations == ["finish completed", "finish completed"]
    assert [c.data for c in await stored(db, run.id, "answer")] == list(range(5))
