"""Shared helpers for tests that look at the file itself or start real processes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing

import zincir
from zincir._database import storage
from zincir._wakes import Wakes

from .postgres_server import fresh_database

REPO = Path(__file__).resolve().parent.parent


def dump(target: Path | zincir.Database) -> str:
    """Every row of every table, through a separate connection: a SQLite file's, or (given a
    Database) its backend's."""
    if isinstance(target, zincir.Database):
        if target.backend == "postgresql":
            return _dump_postgres(target.path)
        target = Path(target.path)
    conn = sqlite3.connect(target)
    try:
        return "\n".join(conn.iterdump())
    finally:
        conn.close()


def _dump_postgres(url: str) -> str:
    import psycopg

    lines = []
    with psycopg.connect(url) as conn:
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename"
        ).fetchall()
        for (table,) in tables:
            lines.append(f"-- {table}")
            rows = conn.execute(f'SELECT t::text FROM "{table}" AS t ORDER BY t::text').fetchall()
            lines.extend(row[0] for row in rows)
    return "\n".join(lines)


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rows(target: Path | zincir.Database, sql: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
    """Every row a statement returns (or changes: then none), through a separate connection
    that commits; ``?`` placeholders on either backend."""
    if isinstance(target, zincir.Database):
        if target.backend == "postgresql":
            import psycopg

            with psycopg.connect(target.path) as conn:
                cursor = conn.execute(sql.replace("?", "%s"), params)
                return [tuple(r) for r in cursor.fetchall()] if cursor.description else []
        target = Path(target.path)
    conn = sqlite3.connect(target)
    try:
        result = [tuple(r) for r in conn.execute(sql, params).fetchall()]
        conn.commit()
        return result
    finally:
        conn.close()


def scalar(target: Path | zincir.Database, sql: str, params: tuple[object, ...] = ()) -> object:
    """The first column of the first row, through a separate connection (``?`` placeholders)."""
    if isinstance(target, zincir.Database):
        if target.backend == "postgresql":
            import psycopg

            with psycopg.connect(target.path) as conn:
                row = conn.execute(sql.replace("?", "%s"), params).fetchone()
            assert row is not None
            return row[0]
        target = Path(target.path)
    conn = sqlite3.connect(target)
    try:
        return conn.execute(sql, params).fetchone()[0]
    finally:
        conn.close()


# A shell starts what it runs in the background (`cmd &`, nohup) with SIGINT ignored, its
# children inherit that, and Python installs its KeyboardInterrupt handler only where SIGINT is
# not ignored. A test that interrupts a Python child starts it through this, so that the child
# takes SIGINT as it would from a terminal however the suite itself was started.
INTERRUPTIBLE = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"

ZINCIR_CLI = (
    sys.executable,
    "-c",
    INTERRUPTIBLE + "import sys; from zincir._cli import main; sys.exit(main())",
)
"""The ``zincir`` command, run by this interpreter (and interruptible, see INTERRUPTIBLE)."""


def reap(proc: subprocess.Popen[str]) -> None:
    """Kill the process (if it still runs) and wait for it, closing its pipes: for a
    ``finally``, so that a failed test neither leaves it running nor lets its unclosed pipes
    warn (an error, under this suite's filterwarnings) in whichever test runs next."""
    proc.kill()
    proc.communicate()


@contextlib.contextmanager
def running_python(code: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """``start_python`` for a block: the process is killed and reaped when the block ends,
    so a failing assertion never leaves it behind (or waits for it)."""
    proc = start_python(code, *args)
    try:
        yield proc
    finally:
        reap(proc)


def start_python(code: str, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    """Start a real Python process running ``code`` (dedented) with ``args`` in sys.argv."""
    return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        **kwargs,
    )


async def read_state(db: zincir.Database, run_id: str) -> zincir.DurableState:
    """A run's durable state, read without owning the run."""
    return await db.state(run_id)


async def status_of(db: zincir.Database, run_id: str) -> zincir.RunStatus:
    return (await db.state(run_id)).run.status


async def has_status(db: zincir.Database, run_id: str, status: zincir.RunStatus) -> bool:
    return await status_of(db, run_id) is status


async def until(predicate: Callable[[], Awaitable[bool]], within: float = 15, every: float = 0.01) -> None:
    """Await a condition that another task, thread or process brings about, looked at every
    ``every`` seconds: for a state in the database (or another process), which has no event
    of its own to await. Fails after ``within`` seconds."""
    with trio.fail_after(within):
        while not await predicate():
            await trio.sleep(every)


def trace_operations(monkeypatch: Any, store: Any, *names: str) -> list[tuple[str, str | None]]:
    """Wrap the named ``zincir._store`` operations so that each records, on the database
    thread, ``(name, None)`` when it returned or ``(name, error class name)`` when it raised,
    in the order the thread ran them."""
    order: list[tuple[str, str | None]] = []
    for name in names:
        real = getattr(store, name)

        def traced(*args: Any, _real: Any = real, _name: str = name) -> Any:
            try:
                result = _real(*args)
            except BaseException as exc:
                order.append((_name, type(exc).__name__))
                raise
            order.append((_name, None))
            return result

        monkeypatch.setattr(store, name, traced)
    return order


def counting_renewals(monkeypatch: Any, store: Any) -> threading.Semaphore:
    """Wrap ``store.renew`` (as it is now) to release the returned semaphore after each lease
    renewal, made or failed, on whichever thread ran it."""
    renew = store.renew
    made = threading.Semaphore(0)

    def counted(*args: Any) -> Any:
        try:
            return renew(*args)
        finally:
            made.release()

    monkeypatch.setattr(store, "renew", counted)
    return made


async def next_renewal(
    db: zincir.Database, run_id: str, renewals: threading.Semaphore, trio_clock: Any, db_clock: Any
) -> float:
    """With both clocks standing still (pytest-trio's ``mock_clock`` and a ``ManualClock`` that
    ``db`` was opened with), move them together to the run's heartbeat's next wake-up; return
    once the renewal it makes (counted by ``counting_renewals``) has been answered, with how far
    time moved. For tests about *when* the heartbeat renews: no busy machine can make it late."""
    await trio.testing.wait_all_tasks_blocked()  # the heartbeat sleeps until its next renewal
    wait: float = trio.lowlevel.current_statistics().seconds_to_next_deadline
    assert wait < math.inf, "nothing is scheduled: the heartbeat stopped"
    trio_clock.jump(wait)
    db_clock.advance(wait)
    assert await trio.to_thread.run_sync(renewals.acquire, True, 10), "the heartbeat did not renew"
    await db._write(_nothing, route=run_id)  # behind the renewal, on its writer: its answer is in
    return wait


def _nothing(tx: Any) -> None:
    pass


class Words:
    """The words delivered to this process, in the order it acted on them: what its listener
    heard of other processes' writes (PostgreSQL notifications, or what SQLite's watcher saw
    other connections commit), and what its own writes woke, after their COMMIT."""

    def __init__(self) -> None:
        self.heard: list[tuple[str | None, str | None]] = []
        self._news = trio.Event()

    def note(self, channel: str | None, payload: str | None) -> None:
        self.heard.append((channel, payload))
        self._news.set()
        self._news = trio.Event()

    async def word(self, channel: str | None, payload: str | None = None) -> None:
        """Wait until a word on a channel whose name ends with ``channel`` (None: the "anything
        may have been missed" word) and with this payload was delivered, and acted on."""
        while not any(self._matches(heard, channel, payload) for heard in self.heard):
            await self._news.wait()  # no deadline of its own: tests on a mock clock use this too

    @staticmethod
    def _matches(heard: tuple[str | None, str | None], channel: str | None, payload: str | None) -> bool:
        if channel is None:
            return heard[0] is None
        return heard[0] is not None and heard[0].endswith(channel) and heard[1] == payload


async def listening(db: zincir.Database, monkeypatch: Any) -> Words:
    """Start ``db`` listening to other processes' writes, noting each word it hears after the
    database has acted on it, and wait for the listener's first word (the "anything may have
    been missed" wake-up after it connects), so that it cannot arrive later, in the middle of a
    race a test sets up."""
    words = Words()
    wakes = storage(db).wakes
    hear = wakes.hear

    def noting(channel: str | None, payload: str | None) -> None:
        hear(channel, payload)
        words.note(channel, payload)

    def noting_own(woken: Wakes) -> None:
        wakes.deliver(woken)
        # As the listener would say it (it skips this process's own PostgreSQL notifications).
        if woken.claimable:
            words.note("claimable", None)
        for channel, runs in (
            ("inbox", woken.inbox),
            ("child_ended", woken.waits),
            ("run_ended", woken.ended),
            ("stream", woken.streams),
        ):
            for run_id in sorted(runs):
                words.note(channel, run_id)

    monkeypatch.setattr(wakes, "hear", noting)
    for thread in (*storage(db).writers, storage(db).reader):
        monkeypatch.setattr(thread, "deliver", noting_own)
    wakes.hear_others()
    await words.word(None)
    return words


async def hearing_others(db: zincir.Database, monkeypatch: Any) -> None:
    """``listening``, for a test that needs only its first word to have come."""
    await listening(db, monkeypatch)


def insert_started_run(target: zincir.Database, run_id: str, *, role: str = "agent") -> None:
    """A run as every schema version stores one, written with SQL (for a database of an old
    schema, which lacks columns this code writes): started, then let go, due at once."""
    now = zincir.wall_clock_ms()
    rows(
        target,
        "INSERT INTO agent_runs (id, role, provider, status, config, created_at, updated_at, last_seq,"
        " next_attempt_at) VALUES (?, ?, '', 'running', '{}', ?, ?, 0, ?)",
        (run_id, role, now, now, now),
    )
    rows(
        target,
        "INSERT INTO events (run_id, seq, type, payload, created_at)"
        ' VALUES (?, 0, \'state_transition\', \'{"from":"pending","to":"running"}\', ?)',
        (run_id, now),
    )


def run_bench_study(
    main: Callable[[list[str]], int], tmp_path: Path, postgres_admin_url: str, out_name: str
) -> tuple[str, dict[str, Any]]:
    """Run a study's ``main`` at ``--quick`` sizes on SQLite and on a fresh database of the
    suite's PostgreSQL server, quietly, writing into ``tmp_path``; its report and its figures."""
    out = tmp_path / out_name
    with fresh_database(postgres_admin_url) as url:
        assert main(["--quick", "--url", url, "--dir", str(tmp_path), "--out", str(out), "-q"]) == 0
    return out.read_text(), json.loads(out.with_suffix(".json").read_text())


def a_dead_pid() -> int:
    """The pid of a process of this host that has exited (and was reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


async def in_one_batch(
    db: zincir.Database, fn: Callable[..., Any], calls: list[tuple[Any, ...]]
) -> list[Any]:
    """``fn`` with each of ``calls`` (its arguments), all in one batch of one writer; each
    call's outcome (its value, or the ZincirError it raised). SQLite's writer runs the writes of
    one scheduler pass together on the Trio thread, in the order Trio runs their tasks;
    PostgreSQL's thread takes what its queue holds, so the calls are queued, in order, while a
    write holds it."""
    entered, gate = threading.Event(), threading.Event()

    def hold(tx: Any) -> None:
        entered.set()
        gate.wait(10)

    write = storage(db).write
    outcomes: list[Any] = [None] * len(calls)

    async def call(i: int, args: tuple[Any, ...]) -> None:
        try:
            outcomes[i] = await write(fn, *args, route="one writer")
        except zincir.ZincirError as exc:
            outcomes[i] = exc

    postgres = db.backend == "postgresql"
    async with trio.open_nursery() as nursery:
        if postgres:
            nursery.start_soon(lambda: write(hold, route="one writer"))
            await trio.to_thread.run_sync(entered.wait)
        for i, args in enumerate(calls):
            nursery.start_soon(call, i, args)
            if postgres:  # queued behind the hold before the next: the batch keeps their order
                await trio.testing.wait_all_tasks_blocked()
        if postgres:
            gate.set()
    return outcomes


@attrs.define
class Batch:
    """One call of a batch form: how many calls it was given, and what it noted to wake (None
    if it raised: the calls then ran each on its own)."""

    size: int
    wakes: Wakes | None = None


def counting_batches(db: zincir.Database, fn: Callable[..., Any]) -> list[Batch]:
    """Make every writer note each call of ``fn``'s batch form."""
    batches: list[Batch] = []
    for writer in storage(db).writers:
        form = writer.batch_forms.get(fn)
        if form is not None:

            def counted(tx: Any, calls: list[Any], form: Any = form) -> list[Any]:
                batch = Batch(len(calls))
                batches.append(batch)
                results = list(form(tx, calls))
                batch.wakes = Wakes() if tx.wakes is None else tx.wakes.copy()
                return results

            writer.batch_forms = {**writer.batch_forms, fn: counted}
    return batches
