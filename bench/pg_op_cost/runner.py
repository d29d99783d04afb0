"""``python -m bench.pg_op_cost``: the client CPU of one fenced PostgreSQL write, four ways.

Issue 16's fan-out on PostgreSQL follows the worker process's CPU (``bench/reports/fanout.md``),
and most of zincir's goes to its writer threads. This isolates what one write costs the client,
side by side in one process, interleaved in rotated order, on one connection each, with nothing
else running:

* **zincir's session**: zincir's own ``PostgresSession`` (libpq's pipeline mode, driven by
  ``zincir._postgres._pipe``), running a write shaped like zincir's (lock the run's row; an UPDATE +
  INSERT in one statement, sent behind the lock; the lock's row read; the commit): two round trips;
* **psycopg's pipeline**: the same statements through ``conn.pipeline()`` and cursors, as zincir's
  session did before its own pipe (psycopg flushes and polls after every statement);
* **libpq, two round trips**: the same statements, prepared, on ``psycopg.pq`` directly, with one
  flush per round trip (no cursors, no per-statement flush and poll);
* **libpq, one round trip**: the same, with the commit (the pipeline's sync) sent along with the
  statements: an operation whose fence is decided by the server could commit so.

Client CPU is the process's user + system time per write (the server's is not counted); wall
time is per write, commit (fsync) included. Writes ``bench/reports/pg-op-cost.md``.
"""

from __future__ import annotations

import contextlib
import select
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import pq

from zincir._postgres._connection import PostgresSession

from ..harness import study
from ..harness.machine import now
from ..harness.reports import shown_command, write_outputs
from ..harness.server import postgres_server, scratch_database, server_settings
from .report import ZINCIR, render

LOCK = "SELECT epoch FROM bench_runs WHERE id = %s FOR NO KEY UPDATE"
APPEND = (
    "WITH allocated AS (UPDATE bench_runs SET last_seq = last_seq + 1 WHERE id = %s RETURNING last_seq)"
    " INSERT INTO bench_events (run_id, seq, payload) SELECT %s, last_seq, %s FROM allocated"
)
Write = Callable[[], None]


def prepare_tables(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_runs (id text PRIMARY KEY, epoch bigint, last_seq bigint)")
        conn.execute(
            "CREATE TABLE bench_events (run_id text, seq bigint, payload text, PRIMARY KEY (run_id, seq))"
        )
        conn.execute("INSERT INTO bench_runs VALUES ('run', 1, 0)")


class ZincirSession:
    """zincir's own writer session (one connection, in libpq's pipeline mode through its pipe)."""

    def __init__(self, url: str) -> None:
        self._session = PostgresSession(url, "bench", read_only=False, clock=None)

    def write(self) -> None:
        self._session.begin()
        tx = self._session.tx()
        lock = tx.send(LOCK, ("run",))
        tx.execute(APPEND, ("run", "run", "{}"))
        assert lock.one() == (1,)
        self._session.commit()

    def close(self) -> None:
        self._session.close()


class PsycopgPipeline:
    """psycopg's pipeline mode and cursors: how zincir's session sent statements before its pipe."""

    def __init__(self, url: str) -> None:
        self._conn = psycopg.connect(url, autocommit=True)
        self._pipeline_mode = contextlib.ExitStack()
        self._pipeline = self._pipeline_mode.enter_context(self._conn.pipeline())

    def write(self) -> None:
        lock = self._conn.execute(LOCK, ("run",))
        self._conn.execute(APPEND, ("run", "run", "{}"))
        assert lock.fetchone() == (1,)
        self._pipeline.sync()

    def close(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self._pipeline_mode.close()
        self._conn.close()


class Libpq:
    """One connection in libpq's pipeline mode, driven by hand: statements prepared once, sent
    into libpq's buffer, flushed once per round trip."""

    def __init__(self, url: str) -> None:
        self._conn = psycopg.connect(url, autocommit=True)
        self._pg = pg = self._conn.pgconn
        pg.prepare(b"lock", LOCK.replace("%s", "$1").encode())
        pg.prepare(
            b"append", APPEND.replace("%s", "$1", 1).replace("%s", "$2", 1).replace("%s", "$3").encode()
        )
        pg.nonblocking = 1
        pg.enter_pipeline_mode()

    def close(self) -> None:
        self._conn.close()

    def _flush(self) -> None:
        while self._pg.flush():
            select.select([self._pg.socket], [self._pg.socket], [])

    def _results(self, count: int) -> list[pq.abc.PGresult]:
        """The next ``count`` results (a statement's, or a sync's), skipping the ends of results."""
        out: list[pq.abc.PGresult] = []
        while len(out) < count:
            while self._pg.is_busy():
                select.select([self._pg.socket], [], [])
                self._pg.consume_input()
            result = self._pg.get_result()
            if result is None:
                continue
            if result.status == pq.ExecStatus.FATAL_ERROR:
                raise RuntimeError(result.error_message.decode())
            out.append(result)
        return out

    def _send(self) -> None:
        self._pg.send_query_prepared(b"lock", [b"run"])
        self._pg.send_query_prepared(b"append", [b"run", b"run", b"{}"])

    def two_round_trips(self) -> None:
        self._send()
        self._pg.send_flush_request()
        self._flush()
        lock, _ = self._results(2)
        assert lock.get_value(0, 0) == b"1"
        self._pg.pipeline_sync()
        self._flush()
        self._results(1)

    def one_round_trip(self) -> None:
        self._send()
        self._pg.pipeline_sync()
        self._flush()
        lock, _, _ = self._results(3)
        assert lock.get_value(0, 0) == b"1"


def measure(write: Write, ops: int) -> tuple[float, float]:
    """(client CPU, wall) seconds per write."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(ops):
        write()
    return (time.process_time() - cpu) / ops, (time.perf_counter() - wall) / ops


def run(url: str, ops: int, rounds: int, log: Callable[[str], None]) -> dict[str, Any]:
    prepare_tables(url)
    session, psycopg_pipeline, libpq = ZincirSession(url), PsycopgPipeline(url), Libpq(url)
    try:
        return _compare(
            {
                ZINCIR: session.write,
                "psycopg's pipeline (zincir's session before)": psycopg_pipeline.write,
                "libpq, two round trips": libpq.two_round_trips,
                "libpq, one round trip": libpq.one_round_trip,
            },
            ops,
            rounds,
            log,
        )
    finally:
        session.close()
        psycopg_pipeline.close()
        libpq.close()


def _compare(variants: dict[str, Write], ops: int, rounds: int, log: Callable[[str], None]) -> dict[str, Any]:
    for write in variants.values():  # warm-up: connections, prepared statements, caches
        measure(write, 200)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for r in range(rounds):
        for name in study.rotated(list(variants), r):
            samples[name].append(measure(variants[name], ops))
        log(
            f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {samples[n][-1][0] * 1e6:.0f} us" for n in variants)
        )
    return {
        name: {
            "cpu_us": statistics.median(s[0] for s in rows) * 1e6,
            "cpu_min_us": min(s[0] for s in rows) * 1e6,
            "cpu_max_us": max(s[0] for s in rows) * 1e6,
            "wall_us": statistics.median(s[1] for s in rows) * 1e6,
        }
        for name, rows in samples.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = study.parser(
        "python -m bench.pg_op_cost", __doc__.split("\n")[0], "pg-op-cost.md", quick=False, server=True
    )
    parser.add_argument("--ops", type=int, default=2000, help="writes per variant per round (2,000)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (5)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if study.redraw(args, render):
        return 0
    log = study.progress(args.quiet)
    saved: dict[str, Any] = {
        "command": shown_command("python -m bench.pg_op_cost", sys.argv[1:] if argv is None else argv),
        "date": now(),
        "ops": args.ops,
        "rounds": args.rounds,
        "python": sys.version.split()[0],
        "psycopg": psycopg.__version__,
    }
    with (
        study.scratch(args.dir, "zincir-op-cost-", keep=args.keep, log=log) as workdir,
        postgres_server(args.url, workdir, log) as admin,
        scratch_database(admin, "bench_op_cost") as url,
    ):
        saved["variants"] = run(url, args.ops, args.rounds, log)
        saved["settings"] = server_settings(url)
    write_outputs(out, saved, render)
    log(f"wrote {out}")
    return 0
