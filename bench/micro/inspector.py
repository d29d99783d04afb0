"""Latency of the read-only inspector (issue 7, "Performance").

1. Fills a fresh database with ``--runs`` runs and ``--events`` events (bulk ``executemany``
   in large transactions, ``synchronous=OFF`` for the fill only). One "big" run holds
   ``--big-run-events`` of them; the rest are spread over the other runs.
2. Starts ``zincir ui`` on a free loopback port in its own process (as a user would).
3. Starts a writer thread that keeps appending events (one durable transaction each, WAL,
   ``synchronous=FULL``) to the big run and to random runs, moving their activity time.
4. Sends ``--requests`` sequential GETs (keep-alive, after a short warm-up) to each page and
   prints p50/p95/p99/max. Target: p95 < 100 ms for ``/`` and for the big run's page.

    .venv/bin/python -m bench.micro.inspector                                  # full size
    .venv/bin/python -m bench.micro.inspector --runs 2000 --events 20000 --requests 30  # smoke
    .venv/bin/python -m bench.micro.inspector --postgres    # the same data on PostgreSQL too

With ``--postgres`` the filled tables are copied (COPY) into a throwaway PostgreSQL server
(``tests/postgres_server.py``, as the test suite starts it) and measured the same way, with a
writer appending there.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from zincir._sqlite._migrations import migrate

REPO = Path(__file__).resolve().parents[2]
ROLES = ("coder", "researcher", "reviewer", "planner", "batch-eval")
PROVIDERS = ("openai", "anthropic", "local")
STATUSES = ("completed",) * 6 + ("failed",) * 1 + ("running",) * 2 + ("pending",) * 1
BATCH = 50_000


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--big-run-events", type=int, default=None, help="default: events // 10")
    parser.add_argument("--requests", type=int, default=200, help="measured requests per page")
    parser.add_argument("--writer-interval", type=float, default=0.002, help="seconds between appends")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to put the database (default: a temp dir)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument(
        "--postgres", action="store_true", help="also measure a copy on a throwaway PostgreSQL server"
    )
    return parser.parse_args()


# --------------------------------------------------------------------------- fill


def create(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")  # the fill only; the writer thread uses FULL
    migrate(conn, str(path), 0)  # zincir's own migrations: the schema stays current by itself
    return conn


def payload(rng: random.Random, seq: int, kind: str) -> str:
    if kind == "llm_call":
        text = "x" * rng.choice((80, 200, 600, 2000))
        calls = [{"id": f"call_{seq}", "name": "read_file", "args": {"path": f"src/m{seq % 97}.py"}}]
        return json.dumps(
            {"content": text, "stop_reason": "tool_use", "tool_calls": calls}, separators=(",", ":")
        )
    if kind == "tool_call":
        body = {"args": {"path": f"src/m{seq % 97}.py"}, "call_id": f"call_{seq - 1}", "name": "read_file"}
        return json.dumps({**body, "response_tool_count": 1}, separators=(",", ":"))
    return json.dumps({"call_id": f"call_{seq - 2}", "content": "y" * rng.choice((50, 300, 1500))})


KINDS = ("llm_call", "tool_call", "tool_result")


def event_rows(rng: random.Random, run_id: str, count: int, start: int) -> Iterator[tuple[object, ...]]:
    for seq in range(count):
        kind = "state_transition" if seq == 0 else KINDS[(seq - 1) % 3]
        body = '{"from":"pending","to":"running"}' if seq == 0 else payload(rng, seq, kind)
        key = f"{kind}:call_{seq}" if kind != "state_transition" and kind != "llm_call" else None
        yield (run_id, seq, kind, body, key, start + seq * 250)


def fill(conn: sqlite3.Connection, args: argparse.Namespace) -> tuple[str, int]:
    rng = random.Random(7)
    now = time.time_ns() // 1_000_000
    big_events = args.big_run_events if args.big_run_events is not None else args.events // 10
    rest = args.events - big_events
    per_run, extra = divmod(rest, max(1, args.runs - 1))
    run_ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(args.runs)]
    big = run_ids[0]
    counts = [big_events] + [per_run + (1 if i < extra else 0) for i in range(args.runs - 1)]
    starts = [now - rng.randrange(1, 30 * 86_400_000) for _ in run_ids]
    starts[0] = now - big_events * 250 - 60_000

    conn.execute("BEGIN")
    run_rows = []
    for run_id, count, start in zip(run_ids, counts, starts, strict=True):
        status = "running" if run_id == big else rng.choice(STATUSES)
        leased = status == "running"
        run_rows.append(
            (
                run_id,
                rng.choice(ROLES),
                rng.choice(PROVIDERS),
                status,
                json.dumps({"goal": f"task {rng.randrange(10**6)}", "max_rounds": 8}),
                start,
                start + max(0, count - 1) * 250,
                count - 1,
                f"worker-{rng.randrange(16)}" if leased else None,
                rng.randrange(1, 4),
                now + 30_000 if leased else None,
                rng.randrange(0, 3),
            )
        )
    conn.executemany(
        "INSERT INTO agent_runs (id, role, provider, status, config, created_at, updated_at, last_seq,"
        " lease_owner, lease_epoch, lease_expires_at, attempts) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
        run_rows,
    )
    conn.execute("COMMIT")

    buffer: list[tuple[object, ...]] = []
    for run_id, count, start in zip(run_ids, counts, starts, strict=True):
        for row in event_rows(rng, run_id, count, start):
            buffer.append(row)
            if len(buffer) >= BATCH:
                insert_events(conn, buffer)
                buffer.clear()
    insert_events(conn, buffer)

    conn.execute("BEGIN")
    for round in range(1, 41):
        status = "accepted" if round % 3 else "rejected"
        based = round * (big_events // 42)
        conn.execute(
            "INSERT INTO checkpoints (run_id, round, tool_call_id, based_on_event_seq, decision_event_seq,"
            " status, state, verification, created_at, decided_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (big, round, f"submit_{round}", based, based + 2, status, '{"completed":["a"],"remaining":[]}',
             '{"passed":true,"evidence":["ok"]}', now, now),
        )  # fmt: skip
    for i in range(30):
        conn.execute(
            "INSERT INTO steps (run_id, name, status, epoch, result, started_at, completed_at)"
            " VALUES (?, ?, 'completed', 1, '{\"ok\":true}', ?, ?)",
            (big, f"step-{i}", now - 1000, now),
        )
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return big, big_events


def insert_events(conn: sqlite3.Connection, rows: list[tuple[object, ...]]) -> None:
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at) VALUES (?,?,?,?,?,?)",
        rows,
    )
    conn.execute("COMMIT")


# --------------------------------------------------------------------------- writer


class PostgresWriter(threading.Thread):
    """The same appends as :class:`Writer`, on PostgreSQL (one committed transaction each)."""

    def __init__(self, url: str, big: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.url, self.big, self.interval = url, big, interval
        self.stop = threading.Event()
        self.appended = 0
        self.errors = 0

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self.url) as conn:
            others = [row[0] for row in conn.execute("SELECT id FROM agent_runs ORDER BY random() LIMIT 200")]
            conn.commit()
            rng = random.Random(3)
            while not self.stop.is_set():
                run_id = self.big if rng.random() < 0.7 else rng.choice(others)
                now = time.time_ns() // 1_000_000
                try:
                    with conn.transaction():
                        row = conn.execute(
                            "UPDATE agent_runs SET last_seq = last_seq + 1, updated_at = %s"
                            " WHERE id = %s RETURNING last_seq",
                            (now, run_id),
                        ).fetchone()
                        assert row is not None
                        conn.execute(
                            "INSERT INTO events (run_id, seq, type, payload, created_at)"
                            " VALUES (%s, %s, 'llm_call', %s, %s)",
                            (
                                run_id,
                                row[0],
                                '{"content":"live","stop_reason":"end_turn","tool_calls":[]}',
                                now,
                            ),
                        )
                    self.appended += 1
                except psycopg.Error:
                    self.errors += 1
                time.sleep(self.interval)


def copy_to_postgres(path: Path, url: str) -> None:
    """Migrate ``url`` with zincir, then COPY the SQLite file's rows into it, table by table."""
    import psycopg
    import trio

    import zincir

    async def migrate_it() -> None:
        async with zincir.open_database(url):
            pass

    trio.run(migrate_it)
    source = sqlite3.connect(path)
    with psycopg.connect(url) as conn:
        for table in ("agent_runs", "events", "checkpoints", "steps", "timers"):
            theirs = {
                row[0]
                for row in conn.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = %s"
                    " AND is_generated = 'NEVER' AND identity_generation IS NULL",
                    (table,),
                )
            }
            ours = [row[1] for row in source.execute(f"PRAGMA table_info({table})")]
            columns = [c for c in ours if c in theirs]
            listed = ", ".join(columns)
            with conn.cursor().copy(f"COPY {table} ({listed}) FROM STDIN") as copy:
                for row in source.execute(f"SELECT {listed} FROM {table}"):
                    copy.write_row(row)
        conn.commit()
        # As autovacuum leaves a table of this age: visibility map set, statistics current.
        conn.autocommit = True
        conn.execute("VACUUM (ANALYZE)")
    source.close()


class Writer(threading.Thread):
    """Appends one event per durable transaction, mostly to the big run."""

    def __init__(self, path: Path, big: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.path, self.big, self.interval = path, big, interval
        self.stop = threading.Event()
        self.appended = 0
        self.errors = 0

    def run(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=5)
        conn.execute("PRAGMA synchronous=FULL")
        others = [row[0] for row in conn.execute("SELECT id FROM agent_runs ORDER BY random() LIMIT 200")]
        rng = random.Random(3)
        while not self.stop.is_set():
            run_id = self.big if rng.random() < 0.7 else rng.choice(others)
            try:
                self.append(conn, run_id)
                self.appended += 1
            except sqlite3.OperationalError:
                self.errors += 1
            time.sleep(self.interval)
        conn.close()

    def append(self, conn: sqlite3.Connection, run_id: str) -> None:
        now = time.time_ns() // 1_000_000
        conn.execute("BEGIN IMMEDIATE")
        try:
            (seq,) = conn.execute(
                "UPDATE agent_runs SET last_seq = last_seq + 1, updated_at = ?"
                " WHERE id = ? RETURNING last_seq",
                (now, run_id),
            ).fetchone()
            conn.execute(
                "INSERT INTO events (run_id, seq, type, payload, created_at) VALUES (?, ?, 'llm_call', ?, ?)",
                (run_id, seq, '{"content":"live","stop_reason":"end_turn","tool_calls":[]}', now),
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise


# --------------------------------------------------------------------------- server and client


def start_server(target: Path | str) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, "-c", "import sys; from zincir._cli import main; sys.exit(main())"]
    command += ["ui", "--db", str(target), "--address", "127.0.0.1:0"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert server.stdout is not None
    line = server.stdout.readline()
    match = re.search(r"at http://(127\.0\.0\.1:[0-9]+)/", line)
    if match is None:
        server.kill()
        raise SystemExit(
            f"the inspector did not start: {line!r} {server.stderr.read() if server.stderr else ''}"
        )
    return server, match.group(1)


def measure(host: str, path: str, count: int) -> tuple[list[float], int]:
    address, port = host.rsplit(":", 1)
    conn = http.client.HTTPConnection(address, int(port), timeout=30)
    timings, size = [], 0
    try:
        for i in range(count + 10):
            started = time.perf_counter()
            conn.request("GET", path, headers={"Host": host})
            response = conn.getresponse()
            body = response.read()
            elapsed = time.perf_counter() - started
            if response.status != 200:
                raise SystemExit(f"GET {path}: HTTP {response.status}: {body[:300]!r}")
            if i >= 10:  # warm-up
                timings.append(elapsed * 1000)
                size = len(body)
    finally:
        conn.close()
    return timings, size


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def measure_all(
    backend: str,
    target: Path | str,
    writer: Writer | PostgresWriter,
    big: str,
    big_events: int,
    args: argparse.Namespace,
) -> float:
    """Serve ``target``, start ``writer``, measure every page; print the table; the worst p95."""
    server, host = start_server(target)
    writer.start()
    try:
        pages = [
            ("runs page /", "/"),
            ("runs page, status=running", "/?status=running"),
            ("runs page, role filter", "/?role=reviewer"),
            ("big run page (first events)", f"/runs/{big}"),
            ("big run page, raw events", f"/runs/{big}?view=events"),
            ("big run, one checkpoint page", f"/runs/{big}/checkpoints/1"),
            ("big run page (latest events)", f"/runs/{big}?before={big_events + 10**9}"),
            ("big run page, type filter, deep", f"/runs/{big}?type=tool_result&after={big_events // 2}"),
            ("API events page (deep)", f"/api/runs/{big}/events?after={big_events // 2}"),
        ]
        writer_start = time.perf_counter()
        appended_before = writer.appended
        results = []
        for label, url in pages:
            timings, size = measure(host, url, args.requests)
            results.append((label, timings, size))
        elapsed = time.perf_counter() - writer_start
        appended = writer.appended - appended_before
    finally:
        writer.stop.set()
        writer.join(timeout=10)
        server.terminate()
        server.wait(timeout=10)
    rate = appended / elapsed
    print(f"\n{backend}: writer meanwhile: {appended:,} durable appends ({rate:.0f}/s), {writer.errors} busy")
    print(f"{args.requests} sequential keep-alive requests per page after 10 warm-up requests\n")
    print(f"{'page':<34} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} {'bytes':>9}")
    for label, timings, size in results:
        print(
            f"{label:<34} {statistics.median(timings):8.1f} {percentile(timings, 0.95):8.1f} "
            f"{percentile(timings, 0.99):8.1f} {max(timings):8.1f} {size:9,}"
        )
    worst = max(
        percentile(t, 0.95)
        for label, t, _ in results
        if label.startswith(("runs page /", "big run page (first"))
    )
    verdict = "OK" if worst < 100 else "OVER TARGET"
    print(f"\ntarget p95 < 100 ms for / and the big run's page: {verdict} (worst p95 {worst:.1f} ms)")
    return worst


def main() -> int:
    args = parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="zincir-bench-ui-", dir=args.dir))
    path = workdir / "bench.db"
    try:
        started = time.perf_counter()
        conn = create(path)
        big, big_events = fill(conn, args)
        conn.close()
        size_mb = path.stat().st_size / 1e6
        print(
            f"filled {args.runs:,} runs and {args.events:,} events ({big_events:,} in the big run) "
            f"in {time.perf_counter() - started:.1f} s; file {size_mb:.0f} MB"
        )
        worst = measure_all("SQLite", path, Writer(path, big, args.writer_interval), big, big_events, args)
        if args.postgres:
            from tests.postgres_server import fresh_database, throwaway_server

            with throwaway_server() as admin, fresh_database(admin) as url:
                started = time.perf_counter()
                copy_to_postgres(path, url)
                print(f"\ncopied into PostgreSQL in {time.perf_counter() - started:.1f} s")
                writer = PostgresWriter(url, big, args.writer_interval)
                worst = max(worst, measure_all("PostgreSQL", url, writer, big, big_events, args))
        return 0 if worst < 100 else 1
    finally:
        if args.keep:
            print(f"kept {path}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
