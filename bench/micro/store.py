"""Storage benchmarks for zincir (issues 2 and 3, "Performance").

Everything runs side by side in ONE process, on the same disk (a fresh temporary directory
under the current directory, or ``--dir``), every file in WAL mode at ``synchronous=FULL``:

1. Durable single-row appends of small JSON rows:
   (a) raw ``sqlite3``, one INSERT per transaction (what a naive durable layer gets);
   (b) raw ``sqlite3``, 100 INSERTs per transaction (the ceiling);
   (c) zincir through its public API: 1, 10 and 100 runs at once (one Trio task each, the runs
       opened beforehand), each appending rows as durable steps (``run.step`` returning the row:
       stored, fenced by the lease, before the call returns; one writer thread, group commit).
   Targets: with 100 writers c/a >= 5; with 1 writer c/a >= 0.6.
2. Events/s for 100 concurrent runs, each looping ``record_response`` with one tool call +
   ``record_tool_result`` (3 events per iteration), against the rows/s of (a). The target is
   "several times" one transaction per append (docs/performance.md); the script checks >= 3.
   For reference it also runs zincir's own SQL (``zincir._store``) straight through ``sqlite3``
   on files of the same schema, 1 and 100 operations per transaction: the cost of the schema
   itself.
3. ``state()`` and ``pending_tools()`` on a run of 100,000 events with 10 pending tool calls,
   against the same calls on a run of 100 events. Both runs have the same shape at the end: an
   accepted checkpoint, then one response with 10 tool calls that have no result, so both
   calls return the same amount of data. Target: the big run within 2x of the small one.
   (The history is filled at ``synchronous=NORMAL`` to save time, then measured at FULL.)

Figures are medians of ``--reps`` repetitions (latencies: medians of ``--samples`` calls).

    .venv/bin/python -m bench.micro.store            # full run, under ~2 minutes
    .venv/bin/python -m bench.micro.store --quick    # smoke run, a few seconds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import trio

import zincir
from zincir._budget import CountedCall, debit_of
from zincir._database import wall_clock_ms
from zincir._sqlite._connection import Tx
from zincir._store import IntentRow, Lease, Store, args_hash

SCRATCH_TABLE = "CREATE TABLE IF NOT EXISTS bench_rows (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)"
INSERT_ROW = "INSERT INTO bench_rows (payload) VALUES (?)"
CONCURRENCIES = (1, 10, 100)
RAW_RUNS_PER_TX = (1, 100)
PENDING = 10
# Events a benchmark run holds besides its filler: the first state_transition (1), the
# checkpoint block (response + submit_checkpoint intent + proposed + accepted + tool_result = 5)
# and the tail (response + PENDING intents without results).
FIXED_EVENTS = 1 + 5 + 1 + PENDING


@dataclass
class Sizes:
    reps: int
    rounds: int  # slices each rep of benchmark 1 is interleaved in
    raw_a_rows: int
    raw_b_rows: int
    zincir_rows: dict[int, int]  # concurrency -> rows per task
    runs: int
    run_iterations: int
    big_events: int
    small_events: int
    max_calls: int
    samples: int


def sizes_for(args: argparse.Namespace) -> Sizes:
    if args.quick:
        sizes = Sizes(
            reps=1,
            rounds=1,
            raw_a_rows=300,
            raw_b_rows=3000,
            zincir_rows={1: 300, 10: 50, 100: 10},
            runs=100,
            run_iterations=3,
            big_events=10_000,
            small_events=100,
            max_calls=999,
            samples=10,
        )
    else:
        sizes = Sizes(
            reps=3,
            rounds=5,
            raw_a_rows=5000,
            raw_b_rows=100_000,
            zincir_rows={1: 5000, 10: 1000, 100: 500},
            runs=100,
            run_iterations=100,
            big_events=100_000,
            small_events=100,
            max_calls=999,
            samples=50,
        )
    if args.reps is not None:
        sizes.reps = args.reps
    if args.samples is not None:
        sizes.samples = args.samples
    if args.big_events is not None:
        sizes.big_events = args.big_events
    if sizes.small_events < FIXED_EVENTS or sizes.big_events < sizes.small_events:
        raise SystemExit(f"--big-events must be at least {sizes.small_events}")
    return sizes


def row_payload(task: int, i: int) -> str:
    return json.dumps({"task": task, "i": i, "kind": "note", "text": "a small JSON row"})


# -- 1 (a), (b): raw sqlite3 --------------------------------------------------------------------


def raw_connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    assert mode.lower() == "wal", mode
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute(SCRATCH_TABLE)
    return conn


def raw_append(conn: sqlite3.Connection, rows: int, per_tx: int) -> float:
    """Append ``rows`` rows, ``per_tx`` per BEGIN IMMEDIATE/COMMIT; returns the seconds taken."""
    start = time.perf_counter()
    i = 0
    while i < rows:
        conn.execute("BEGIN IMMEDIATE")
        for _ in range(min(per_tx, rows - i)):
            conn.execute(INSERT_ROW, (row_payload(0, i),))
            i += 1
        conn.execute("COMMIT")
    return time.perf_counter() - start


# -- 1 (c): zincir, through the public API -----------------------------------------------------


async def make_row(task: int, i: int) -> dict[str, object]:
    return json.loads(row_payload(task, i))


async def zincir_append(runs: Sequence[zincir.Run], rows_per_task: int, prefix: str) -> float:
    """One Trio task per run, each appending ``rows_per_task`` rows as durable steps
    (``run.step``: the row is stored, fenced, before the call returns); returns the seconds."""

    async def writer(task: int, run: zincir.Run) -> None:
        for i in range(rows_per_task):
            await run.step(f"{prefix}-row-{i}", make_row, task, i)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for task, run in enumerate(runs):
            nursery.start_soon(writer, task, run)
    return time.perf_counter() - start


# -- 2: runs ----------------------------------------------------------------------------------


async def runs_loop(runs: Sequence[zincir.Run], iterations: int, rep: int) -> float:
    """Each run loops response-with-one-tool-call + its result; returns events/s."""

    async def loop(run: zincir.Run) -> None:
        for i in range(iterations):
            call_id = f"rep{rep}-call{i}"
            await run.record_response(
                {"text": f"let me look that up ({i})"},
                [{"id": call_id, "name": "search", "args": {"query": "zincir", "page": i}}],
                "tool_use",
            )
            await run.record_tool_result(call_id, {"hits": 3, "top": "a small JSON result"})

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for run in runs:
            nursery.start_soon(loop, run)
    return 3 * len(runs) * iterations / (time.perf_counter() - start)


def _response_json(call_id: str, i: int) -> tuple[str, IntentRow]:
    """The payloads Run.record_response would store for ``runs_loop``'s response."""
    args = {"query": "zincir", "page": i}
    response = {
        "content": {"text": f"let me look that up ({i})"},
        "stop_reason": "tool_use",
        "tool_calls": [{"args": args, "id": call_id, "name": "search"}],
    }
    intent = {"args": args, "call_id": call_id, "name": "search", "response_tool_count": 1}
    return _dump(response), IntentRow(call_id, "search", _dump(intent))


def _dump(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def raw_runs_setup(path: str, runs: int) -> tuple[sqlite3.Connection, list[Lease]]:
    """A connection to a migrated zincir file with ``runs`` leased, running runs."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("BEGIN IMMEDIATE")
    tx = Tx(conn, wall_clock_ms())
    leases = [
        Store.create_run(tx, str(uuid.uuid4()), None, "agent", "", "{}", "bench", 3_600_000)
        for _ in range(runs)
    ]
    conn.execute("COMMIT")
    return conn, leases


def raw_runs_loop(
    conn: sqlite3.Connection, leases: list[Lease], iterations: int, rep: int, per_tx: int
) -> float:
    """What ``runs_loop`` does, on the caller's thread with zincir's own SQL (``_store``) and
    no Trio: each iteration writes every run's response, then every run's result, ``per_tx``
    operations per transaction (each in a SAVEPOINT when there are several). Returns events/s.
    """
    start = time.perf_counter()
    for i in range(iterations):
        call_id = f"rep{rep}-call{i}"
        for phase in range(2):
            for first in range(0, len(leases), per_tx):
                conn.execute("BEGIN IMMEDIATE")
                tx = Tx(conn, wall_clock_ms())
                for lease in leases[first : first + per_tx]:
                    if per_tx > 1:
                        conn.execute("SAVEPOINT operation")
                    if phase == 0:
                        llm_json, intent = _response_json(call_id, i)
                        args = {"query": "zincir", "page": i}
                        call = zincir.ToolCall(call_id, intent.name, args)
                        debit = debit_of(None, (CountedCall(call, args_hash(call.name, args)),), "bench")
                        Store.record_response(tx, lease, llm_json, [intent], debit)
                    else:
                        result = _dump(
                            {"call_id": call_id, "content": {"hits": 3, "top": "a small JSON result"}}
                        )
                        Store.record_tool_result(tx, lease, call_id, result)
                    if per_tx > 1:
                        conn.execute("RELEASE operation")
                conn.execute("COMMIT")
    return 3 * len(leases) * iterations / (time.perf_counter() - start)


# -- 3: reads on a long history ------------------------------------------------------------


async def _approve(state: zincir.CheckpointState) -> zincir.Verification:
    return zincir.Verification(True, {"checked_by": "bench_store"})


async def build_run(db: zincir.Database, total_events: int, max_calls: int) -> tuple[str, float, int]:
    """Create a run of exactly ``total_events`` events through the public API, ending in an
    accepted checkpoint and one response whose PENDING tool calls have no result.

    Returns (run id, seconds a state() took just before the checkpoint, events it returned).
    """
    async with zincir.open_run(db, lease_ttl=120) as run:
        remaining = total_events - FIXED_EVENTS
        block = 0
        while remaining >= 3:
            k = min(max_calls, (remaining - 1) // 2)
            ids = [f"fill{block}-{j}" for j in range(k)]
            await run.record_response(
                {"text": f"response {block}"},
                [{"id": cid, "name": "fetch", "args": {"n": j}} for j, cid in enumerate(ids)],
                "tool_use",
            )

            async def results(chunk: list[str], run: zincir.Run = run) -> None:
                for cid in chunk:
                    await run.record_tool_result(cid, {"ok": True, "call": cid})

            # A run records one response at a time, but its results can be written by many
            # tasks at once, so the writer thread can batch them.
            async with trio.open_nursery() as nursery:
                for t in range(64):
                    nursery.start_soon(results, ids[t::64])
            remaining -= 1 + 2 * k
            block += 1
        while remaining > 0:
            await run.record_response({"text": "thinking"}, [], "end_turn")
            remaining -= 1

        # Informational: without a checkpoint, state() returns (and decodes) the whole history.
        start = time.perf_counter()
        history = await run.state()
        history_seconds = time.perf_counter() - start

        state = zincir.CheckpointState(completed=["fill"], remaining=["answer"])
        await run.record_response(
            {"text": "checkpoint"},
            [{"id": "checkpoint-1", "name": zincir.SUBMIT_CHECKPOINT, "args": state.to_json()}],
            "tool_use",
        )
        checkpoint = await run.checkpoint("checkpoint-1", state, _approve)
        assert checkpoint.status == "accepted", checkpoint
        await run.record_response(
            {"text": "tail"},
            [{"id": f"pending-{j}", "name": "fetch", "args": {"n": j}} for j in range(PENDING)],
            "tool_use",
        )
        run_id = run.id
    # Seqs are gap-free from 0: the run has exactly total_events events if its last is total_events - 1.
    last = await db.events(run_id, after=total_events - 2)
    assert [e.seq for e in last] == [total_events - 1], (last, total_events)
    return run_id, history_seconds, len(history.events)


async def median_latency(call: Callable[[], Awaitable[object]], samples: int) -> float:
    for _ in range(3):  # warm the page cache and the statement cache
        await call()
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        await call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclass
class ReadFigures:
    state: float
    pending: float
    events_returned: int
    history_state: float  # state() before the checkpoint (whole history), informational
    history_events: int


# -- the whole run ----------------------------------------------------------------------------


@dataclass
class Results:
    raw_a: list[float] = field(default_factory=list)
    raw_b: list[float] = field(default_factory=list)
    zincir_c: dict[int, list[float]] = field(default_factory=dict)
    runs: list[float] = field(default_factory=list)
    raw_runs: dict[int, list[float]] = field(default_factory=dict)  # ops per transaction -> events/s
    reads: dict[str, ReadFigures] = field(default_factory=dict)
    fill_seconds: float = 0.0


async def run_all(workdir: str, sizes: Sizes, log: Callable[[str], None]) -> Results:
    res = Results()

    # 1. Each rep runs every case in ``rounds`` slices, interleaved, so that drift in the disk
    # or load from other processes on the machine hits all of them alike.
    raw_a = raw_connect(os.path.join(workdir, "raw_a.db"))
    raw_b = raw_connect(os.path.join(workdir, "raw_b.db"))
    rounds = sizes.rounds
    try:
        async with (
            zincir.open_database(os.path.join(workdir, "zincir_c.db"), synchronous="full") as db,
            AsyncExitStack() as stack,
        ):
            # Each writer is a run of its own, opened before the clock starts.
            writers = {
                tasks: [
                    await stack.enter_async_context(zincir.open_run(db, lease_ttl=120)) for _ in range(tasks)
                ]
                for tasks in sizes.zincir_rows
            }
            for rep in range(sizes.reps):
                log(f"1. appends, rep {rep + 1}/{sizes.reps}")
                seconds = {"a": 0.0, "b": 0.0} | {f"c{tasks}": 0.0 for tasks in sizes.zincir_rows}
                for slice_ in range(rounds):
                    seconds["a"] += raw_append(raw_a, sizes.raw_a_rows // rounds, 1)
                    for tasks, per_task in sizes.zincir_rows.items():
                        prefix = f"rep{rep}-slice{slice_}"
                        seconds[f"c{tasks}"] += await zincir_append(
                            writers[tasks], per_task // rounds, prefix
                        )
                    seconds["b"] += raw_append(raw_b, sizes.raw_b_rows // rounds, 100)
                res.raw_a.append(sizes.raw_a_rows // rounds * rounds / seconds["a"])
                res.raw_b.append(sizes.raw_b_rows // rounds * rounds / seconds["b"])
                for tasks, per_task in sizes.zincir_rows.items():
                    rows = tasks * (per_task // rounds) * rounds
                    res.zincir_c.setdefault(tasks, []).append(rows / seconds[f"c{tasks}"])
                log(
                    f"   (a) {res.raw_a[-1]:,.0f}/s  (b) {res.raw_b[-1]:,.0f}/s  "
                    + "  ".join(f"(c) {t} tasks {res.zincir_c[t][-1]:,.0f}/s" for t in sizes.zincir_rows)
                )
    finally:
        raw_a.close()
        raw_b.close()

    # 2. 100 concurrent runs, held open across the repetitions; beside them, two files of the
    # same schema written with zincir's SQL straight through sqlite3 (a reference, not a target).
    raw_files = {per_tx: os.path.join(workdir, f"raw_runs_{per_tx}.db") for per_tx in RAW_RUNS_PER_TX}
    for raw_path in raw_files.values():
        async with zincir.open_database(raw_path):  # create and migrate the file
            pass
    raw_runs = {per_tx: raw_runs_setup(raw_path, sizes.runs) for per_tx, raw_path in raw_files.items()}
    runs_path = os.path.join(workdir, "runs.db")
    try:
        async with zincir.open_database(runs_path, synchronous="full") as db, AsyncExitStack() as stack:
            runs = [
                await stack.enter_async_context(zincir.open_run(db, lease_ttl=120)) for _ in range(sizes.runs)
            ]
            for rep in range(sizes.reps):
                log(f"2. runs, rep {rep + 1}/{sizes.reps}")
                res.runs.append(await runs_loop(runs, sizes.run_iterations, rep))
                log(f"   zincir {res.runs[-1]:,.0f} events/s")
                for per_tx, (conn, leases) in raw_runs.items():
                    rate = raw_runs_loop(conn, leases, sizes.run_iterations, rep, per_tx)
                    res.raw_runs.setdefault(per_tx, []).append(rate)
                    log(f"   raw, {per_tx} op(s) per transaction: {rate:,.0f} events/s")
    finally:
        for conn, _ in raw_runs.values():
            conn.close()

    # 3. Fill two runs at NORMAL, then reopen at FULL and measure the reads.
    path = os.path.join(workdir, "history.db")
    built: dict[str, tuple[str, float, int]] = {}
    log(f"3. building runs of {sizes.small_events} and {sizes.big_events} events")
    start = time.perf_counter()
    async with zincir.open_database(path, synchronous="normal") as db:
        for name, events in (("small", sizes.small_events), ("big", sizes.big_events)):
            built[name] = await build_run(db, events, sizes.max_calls)
    res.fill_seconds = time.perf_counter() - start
    async with zincir.open_database(path, synchronous="full") as db:
        for name, (run_id, history_seconds, history_events) in built.items():
            log(f"3. reads on the {name} run")
            async with zincir.open_run(db, run_id, lease_ttl=120) as run:
                state = await run.state()
                pending = await run.pending_tools()
                assert state.checkpoint is not None
                assert state.checkpoint.status == "accepted"
                assert len(state.events) == 1 + PENDING, len(state.events)
                assert [p.call.id for p in pending] == [f"pending-{j}" for j in range(PENDING)], pending
                res.reads[name] = ReadFigures(
                    state=await median_latency(run.state, sizes.samples),
                    pending=await median_latency(run.pending_tools, sizes.samples),
                    events_returned=len(state.events),
                    history_state=history_seconds,
                    history_events=history_events,
                )
    return res


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def report(res: Results, sizes: Sizes, workdir: str, wall: float) -> None:
    a = median(res.raw_a)
    b = median(res.raw_b)
    print()
    print("zincir storage benchmark")
    print(
        f"  python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, trio {trio.__version__},"
        f" zincir {zincir.__version__}, {os.cpu_count()} CPUs"
    )
    print(f"  dir {workdir}: WAL, synchronous=FULL; medians of {sizes.reps} rep(s)")
    print()
    print("1. durable appends of small JSON rows")
    print(f"  {'case':<44} {'rows/s':>10} {'c/a':>7} {'c/b':>7}")
    print(f"  {'(a) raw sqlite3, 1 INSERT per transaction':<44} {a:>10,.0f}")
    print(f"  {'(b) raw sqlite3, 100 INSERTs per transaction':<44} {b:>10,.0f}")
    for tasks in CONCURRENCIES:
        c = median(res.zincir_c[tasks])
        label = f"(c) zincir run.step, {tasks} run{'s' if tasks > 1 else ''} at once"
        print(f"  {label:<44} {c:>10,.0f} {c / a:>7.2f} {c / b:>7.2f}")
    print()
    events = median(res.runs)
    print(f"2. {sizes.runs} concurrent runs: record_response (1 tool call) + record_tool_result")
    print(f"  {'case':<44} {'events/s':>10} {'/ (a)':>7}")
    print(f"  {'zincir runs (3 events per iteration)':<44} {events:>10,.0f} {events / a:>7.2f}")
    print(f"  {'(a) raw sqlite3, 1 row per transaction':<44} {a:>10,.0f} {1:>7.2f}")
    for per_tx in RAW_RUNS_PER_TX:
        raw = median(res.raw_runs[per_tx])
        label = f"ref: zincir's SQL via sqlite3, {per_tx} op{'s' if per_tx > 1 else ''}/tx"
        print(f"  {label:<44} {raw:>10,.0f} {raw / a:>7.2f}")
    print()
    small, big = res.reads["small"], res.reads["big"]
    print(
        f"3. reads: run of {sizes.big_events:,} events vs run of {sizes.small_events} events,"
        f" each with an accepted checkpoint and {PENDING} pending tool calls"
    )
    print(f"   (filled at synchronous=NORMAL in {res.fill_seconds:.1f} s; median of {sizes.samples} calls)")
    print(f"  {'call':<44} {'small ms':>10} {'big ms':>10} {'big/small':>10}")
    for label, s, g in (
        (f"state()  ({small.events_returned} events returned)", small.state, big.state),
        (f"pending_tools()  ({PENDING} returned)", small.pending, big.pending),
    ):
        print(f"  {label:<44} {s * 1e3:>10.3f} {g * 1e3:>10.3f} {g / s:>10.2f}")
    label = f"info: state() with no checkpoint ({small.history_events}/{big.history_events} ev)"
    print(
        f"  {label:<44} {small.history_state * 1e3:>10.3f} {big.history_state * 1e3:>10.3f}"
        f" {big.history_state / small.history_state:>10.2f}"
    )
    print()
    c100 = median(res.zincir_c[100]) / a
    c1 = median(res.zincir_c[1]) / a
    state_ratio = big.state / small.state
    pending_ratio = big.pending / small.pending
    targets = [
        ("1. 100 writers: c/a >= 5", c100 >= 5, f"{c100:.2f}"),
        ("1. 1 writer: c/a >= 0.6", c1 >= 0.6, f"{c1:.2f}"),
        (
            "2. 100 runs: events/s / (a) >= 3 (target: 'several times')",
            events / a >= 3,
            f"{events / a:.2f}",
        ),
        ("3. state(): big/small <= 2", state_ratio <= 2, f"{state_ratio:.2f}"),
        ("3. pending_tools(): big/small <= 2", pending_ratio <= 2, f"{pending_ratio:.2f}"),
    ]
    print("targets:")
    for name, met, value in targets:
        print(f"  {name:<66} {value:>7}  {'met' if met else 'MISSED'}")
    print(f"(total {wall:.1f} s)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, one rep: a smoke run")
    parser.add_argument("--dir", help="directory to create the temporary databases in (default: .)")
    parser.add_argument("--keep", action="store_true", help="keep the database files afterwards")
    parser.add_argument("--reps", type=int, help="repetitions per throughput figure")
    parser.add_argument("--samples", type=int, help="calls per latency median")
    parser.add_argument("--big-events", type=int, help="events in the long run (default 100000)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print progress to stderr")
    args = parser.parse_args(argv)
    sizes = sizes_for(args)

    def log(message: str) -> None:
        if args.verbose:
            print(f"[{time.perf_counter() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

    workdir = tempfile.mkdtemp(prefix="bench_store-", dir=args.dir or ".")
    started = time.perf_counter()
    try:
        results = trio.run(run_all, workdir, sizes, log)
        report(results, sizes, workdir, time.perf_counter() - started)
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
