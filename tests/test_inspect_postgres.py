"""The read-only CLI and the inspector on PostgreSQL: what SQLite shows, read-only, never migrating.

The same runs are written by zincir itself into a SQLite file and into a PostgreSQL database,
with the same fake clock and the same ids, so every command's output must be the same on both
backends, byte for byte (only the database's name differs, where a page shows it).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import types
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
import trio
import trio.testing

import zincir
from tests.conftest import ManualClock
from tests.helpers import _dump_postgres, reap
from tests.inspect_fixtures import XSS_ALL, XSS_NAV
from zincir import _ownership, _run
from zincir import _queries as q
from zincir._cli import main
from zincir._errors import InvalidArgument, RunNotFound, SchemaError, StorageError
from zincir._inspector import create_app, serve
from zincir._postgres._readonly import PostgresReadOnly
from zincir._queries import _runs

from .test_cli_inspect import _zincir_command, assert_clean_failure
from .test_cli_inspect import zincir as cli
from .test_inspector import HOST, Page

XSS = f"{XSS_ALL}{XSS_NAV}\x1b[2J\u202e"  # escaped alike on both backends (the pages are compared)
STATE = zincir.CheckpointState(completed=["parse"], remaining=["write"], artifacts=["notes.md"])


@attrs.frozen
class Runs:
    main: str
    child: str
    failed: str
    pending: str


async def _pass(state: zincir.CheckpointState) -> zincir.Verification:
    return zincir.Verification(passed=True, evidence={"tests": "3 passed", "quote": "<b>'\"%?"})


async def _fail(state: zincir.CheckpointState) -> zincir.Verification:
    return zincir.Verification(passed=False, evidence="missing write")


async def _fetch() -> dict[str, Any]:
    return {"rows": 3, "text": "100% sure? yes"}


async def populate(target: str, monkeypatch: pytest.MonkeyPatch) -> Runs:
    """Write a small family of runs through zincir's public API, deterministically."""
    counter = itertools.count(1)
    fake_uuid = types.SimpleNamespace(uuid4=lambda: uuid.UUID(int=next(counter), version=4))
    monkeypatch.setattr(_ownership, "uuid", fake_uuid)  # new runs and their owners
    monkeypatch.setattr(_run, "uuid", fake_uuid)  # children
    clock = ManualClock()
    async with zincir.open_database(target, clock=clock) as db:
        async with zincir.open_run(
            db,
            role="coder",
            provider="openai",
            config={"model": "gpt", "limits": {"steps": [1, 2]}, "note": XSS},
        ) as run:
            main_id = run.id
            clock.advance(1)
            calls = [{"id": "call-1", "name": "search", "args": {"q": "zincir % ?", "html": XSS}}]
            await run.record_response({"text": "looking"}, calls, "tool_use", usage={"input_tokens": 7})
            clock.advance(1)
            await run.record_tool_result("call-1", {"hits": ["a", "b"]})
            for round_, verify in ((1, _fail), (2, _pass)):
                clock.advance(1)
                call = {"id": f"cp-{round_}", "name": "submit_checkpoint", "args": STATE.to_json()}
                await run.record_response("", [call], "tool_use")
                await run.checkpoint(f"cp-{round_}", STATE, verify)
            clock.advance(1)
            await run.step("fetch-dataset", _fetch)
            await run.sleep("cooldown", 0)
            async with zincir.open_run(db, role="reviewer", parent_run_id=main_id) as child:
                child_id = child.id
                await child.record_response("ok", [], "end_turn")
                await child.complete()
            clock.advance(1)
            await run.complete()
        async with zincir.open_run(db, role="coder", provider="anthropic") as run:
            failed_id = run.id
            await run.record_response({"text": "ünïcode ✓"}, [], "end_turn")
            await run.fail("gave up")
        clock.advance(1)
        async with zincir.open_run(db, role="planner") as run:
            pending_id = run.id  # left running, unowned: the block ends without complete() or fail()
    monkeypatch.undo()
    return Runs(main_id, child_id, failed_id, pending_id)


@pytest.fixture
async def both(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> tuple[str, str, Runs]:
    """(SQLite path, PostgreSQL URL, run ids): the same runs in both.

    Trio's clock stands still (``mock_clock``), so that a step's measured duration, which
    dates its start, is the same on both.
    """
    path = str(tmp_path / "same.db")
    runs = await populate(path, monkeypatch)
    assert await populate(pg_url, monkeypatch) == runs
    return path, pg_url, runs


async def _dump(url: str) -> str:
    return await trio.to_thread.run_sync(_dump_postgres, url)


def run_cli(*args: str) -> str:
    result = cli(*args)
    assert result.exit_code == 0, result.output
    return result.stdout


# --------------------------------------------------------------------------- the CLI


COMMANDS = [
    ("runs",),
    ("runs", "--status", "completed"),
    ("runs", "--role", "coder", "--limit", "1"),
    ("show", "{main}"),
    ("show", "{main}", "--json"),
    ("show", "{child}"),
    ("show", "{failed}", "--json"),
    ("events", "{main}"),
    ("events", "{main}", "--json"),
    ("events", "{main}", "--type", "tool_result"),
    ("events", "{main}", "--after", "3", "--full"),
    ("checkpoints", "{main}"),
    ("export", "{main}"),
    ("export", "{pending}"),
]


async def test_cli_prints_the_same_on_both_backends(both: tuple[str, str, Runs]) -> None:
    path, url, runs = both
    before = await _dump(url)
    ids = attrs.asdict(runs)
    for command in COMMANDS:
        args = [arg.format(**ids) for arg in command]
        on_sqlite = await trio.to_thread.run_sync(run_cli, *args, "--db", path)
        on_postgres = await trio.to_thread.run_sync(run_cli, *args, "--db", url)
        assert on_postgres == on_sqlite, args
        assert on_postgres.strip(), args
    assert await _dump(url) == before


async def test_cli_on_postgres_reads_what_zincir_wrote(both: tuple[str, str, Runs]) -> None:
    _, url, runs = both
    listing = await trio.to_thread.run_sync(run_cli, "runs", "--db", url)
    assert [line.split()[0] for line in listing.splitlines()[1:5]] == [
        runs.pending,
        runs.failed,
        runs.main,
        runs.child,
    ]
    counts = "pending 0, running 1, waiting 0, completed 2, failed 1, cancelled 0"
    assert f"4 shown; 4 in all ({counts})" in listing
    shown = json.loads(await trio.to_thread.run_sync(run_cli, "show", runs.main, "--json", "--db", url))
    assert shown["run"]["config"] == {"model": "gpt", "limits": {"steps": [1, 2]}, "note": XSS}
    assert shown["run"]["children"] == [runs.child]
    assert [(c["round"], c["status"]) for c in shown["checkpoints"]] == [(1, "rejected"), (2, "accepted")]
    assert shown["steps"][0]["result"] == {"rows": 3, "text": "100% sure? yes"}
    assert [t["name"] for t in shown["timers"]] == ["cooldown"]
    exported = [
        json.loads(line)
        for line in (await trio.to_thread.run_sync(run_cli, "export", runs.main, "--db", url)).splitlines()
    ]
    kinds = [line["kind"] for line in exported]
    assert kinds[0] == "run" and kinds.count("checkpoint") == 2 and kinds[-1] == "timer"
    seqs = [line["seq"] for line in exported if line["kind"] == "event"]
    assert seqs == list(range(len(seqs))) and len(seqs) == shown["run"]["event_count"]
    typed = await trio.to_thread.run_sync(run_cli, "events", runs.main, "--type", "tool_call", "--db", url)
    assert "zincir % ?" in typed and typed.count("tool_call") == 3


async def test_cli_accepts_the_url_from_the_environment(both: tuple[str, str, Runs]) -> None:
    _, url, runs = both
    from click.testing import CliRunner

    def invoke() -> Any:
        env = {"ZINCIR_DATABASE_PATH": url, "ZINCIR_UI_ADDRESS": None}
        return CliRunner().invoke(main, ["show", runs.failed], env=env, catch_exceptions=False)

    result = await trio.to_thread.run_sync(invoke)
    assert result.exit_code == 0, result.output
    assert "anthropic" in result.stdout and "failed" in result.stdout


def test_sqlite_url_names_a_file(tmp_path: Path) -> None:
    missing = cli("runs", "--db", f"sqlite:///{tmp_path}/nope.db")
    assert_clean_failure(missing, "does not exist")
    assert list(tmp_path.iterdir()) == []
    assert_clean_failure(cli("runs", "--db", "mysql://host/db"), "unknown database URL scheme 'mysql'")


async def test_cli_never_migrates_an_empty_postgres_database(pg_url: str) -> None:
    assert await _dump(pg_url) == ""
    for command in (("runs",), ("show", str(uuid.UUID(int=1, version=4))), ("export", "x")):
        result = await trio.to_thread.run_sync(lambda c=command: cli(*c, "--db", pg_url))
        assert_clean_failure(result, "is not a zincir database")
        assert "password" not in result.stderr
    assert await _dump(pg_url) == ""
    with pytest.raises(SchemaError, match="is not a zincir database"):
        q.open_readonly(pg_url)
    with pytest.raises(SchemaError):
        await serve(pg_url, "127.0.0.1:0")
    assert await _dump(pg_url) == ""


async def test_cli_refuses_a_newer_postgres_schema(pg_url: str) -> None:
    async with zincir.open_database(pg_url):
        pass
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO zincir_schema_migrations VALUES (99, '0099_future', 0)")
    before = await _dump(pg_url)
    result = await trio.to_thread.run_sync(lambda: cli("runs", "--db", pg_url))
    assert_clean_failure(result, "newer than this zincir")
    assert await _dump(pg_url) == before


def test_cli_reports_an_unreachable_server() -> None:
    with socket_free_port() as port:
        url = f"postgresql://nobody:secret@127.0.0.1:{port}/nothing?connect_timeout=2"
        result = cli("runs", "--db", url)
    assert_clean_failure(result, "cannot connect to postgresql://nobody@127.0.0.1")
    assert "secret" not in result.stderr
    with pytest.raises(zincir.DatabaseUnavailable):
        q.open_readonly(url)


class socket_free_port:
    """A TCP port on 127.0.0.1 that nothing listens on (bound, not listening, while in use)."""

    def __enter__(self) -> int:
        import socket

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        port: int = self._sock.getsockname()[1]
        return port

    def __exit__(self, *exc: object) -> None:
        self._sock.close()


# --------------------------------------------------------------------------- queries


async def test_queries_on_postgres(both: tuple[str, str, Runs]) -> None:
    _, url, runs = both

    def read() -> None:
        conn = q.open_readonly(url)
        try:
            assert isinstance(conn, q.ReadOnly) and conn.dialect.name == "postgresql"
            with q.read_snapshot(conn):
                page = q.list_runs(conn, limit=2)
                assert [r.id for r in page.runs] == [runs.pending, runs.failed] and page.has_older
                older = q.list_runs(conn, limit=2, before=page.runs[-1].cursor)
                assert [r.id for r in older.runs] == [runs.main, runs.child]
                newer = q.list_runs(conn, limit=2, after=older.runs[0].cursor)
                assert [r.id for r in newer.runs] == [runs.pending, runs.failed]
                assert q.list_runs(conn, role="coder").counts["failed"] == 1
                run = q.get_run(conn, runs.main.upper(), max_config_chars=5)
                assert run.config_truncated and run.config == '{"lim' and run.children_total == 1
                events = q.list_events(conn, runs.main, limit=3)
                assert [e.seq for e in events.events] == [0, 1, 2] and events.next_after == 2
                last = q.list_events(conn, runs.main, before=q.LATEST, limit=2)
                assert last.has_before and not last.has_after
                assert [e.seq for e in q.iter_events(conn, runs.main, page=2)] == list(range(run.event_count))
                assert q.get_event(conn, runs.main, 0) is not None
                assert q.get_event(conn, runs.main, "t41") is None  # a text key names no row
                assert q.get_checkpoint(conn, runs.main, 2) is not None
                assert q.get_checkpoint(conn, runs.main, b"x") is None
                assert q.get_step(conn, runs.main, "fetch-dataset") is not None
                with pytest.raises(InvalidArgument, match="cannot name a row"):
                    q.list_events(conn, runs.main, after="abc")
                with pytest.raises(InvalidArgument, match="cannot name a row"):
                    q.list_runs(conn, before=q.RunCursor(1, 5))
                with pytest.raises(RunNotFound):
                    q.get_run(conn, str(uuid.UUID(int=999, version=4)))
            with pytest.raises(StorageError, match="read-only transaction"), q.read_snapshot(conn):
                conn.execute("DELETE FROM agent_runs")
        finally:
            conn.close()

    before = await _dump(url)
    await trio.to_thread.run_sync(read)
    assert await _dump(url) == before


# --------------------------------------------------------------------------- the inspector


async def fetch(target: str, url: str) -> Page:
    app = create_app(target, HOST)
    response = await app.test_client().open(url, method="GET", headers={"Host": HOST})
    return Page(response.status_code, response.headers, await response.get_data(as_text=True))


async def test_inspector_shows_the_same_on_both_backends(both: tuple[str, str, Runs]) -> None:
    path, url, runs = both
    before = await _dump(url)
    pages = [
        "/",
        "/?status=completed",
        f"/runs/{runs.main}",
        f"/runs/{runs.main}?type=tool_result",
        f"/runs/{runs.child}",
        "/api/runs",
        "/api/runs?role=coder&limit=1",
        f"/api/runs/{runs.main}",
        f"/api/runs/{runs.main}/events?limit=2",
        f"/api/runs/{runs.main}/events/1",
        f"/api/runs/{runs.main}/steps/fetch-dataset",
        f"/api/runs/{runs.main}/checkpoints/2",
        f"/api/runs/{runs.main}/events/junk",
        f"/api/runs/{runs.main}/checkpoints/t41",
        f"/api/runs/{uuid.UUID(int=999, version=4)!s}",
    ]
    for page in pages:
        on_sqlite, on_postgres = await fetch(path, page), await fetch(url, page)
        assert on_postgres.status == on_sqlite.status, page
        assert on_postgres.text.replace(q.display_target(url), path) == on_sqlite.text, page
    assert (await fetch(url, "/")).status == 200
    api = (await fetch(url, f"/api/runs/{runs.main}")).json()
    assert api["run"]["children"] == [runs.child]
    assert [c["status"] for c in api["checkpoints"]] == ["rejected", "accepted"]
    run_page = (await fetch(url, f"/runs/{runs.main}")).text
    assert "&lt;script&gt;" in run_page and "<script" not in run_page and "<meta http-equiv" not in run_page
    runs_page = await fetch(url, "/")
    assert runs.main in runs_page.text and q.display_target(url) in runs_page.text
    assert await _dump(url) == before


async def test_inspector_answers_503_when_the_server_is_unreachable() -> None:
    with socket_free_port() as port:
        url = f"postgresql://nobody:secret@127.0.0.1:{port}/nothing?connect_timeout=2"
        for page in ("/", "/api/runs"):
            response = await fetch(url, page)
            assert response.status == 503, response.text
            assert "cannot connect to postgresql://nobody@127.0.0.1" in response.text
            assert "secret" not in response.text


async def test_inspector_never_migrates_an_empty_postgres_database(pg_url: str) -> None:
    for page in ("/", "/api/runs"):
        response = await fetch(pg_url, page)
        assert response.status == 500 and "is not a zincir database" in response.text
    assert await _dump(pg_url) == ""


async def test_ui_serves_postgres(both: tuple[str, str, Runs]) -> None:
    _, url, runs = both

    def get(address: str) -> tuple[int, Any]:
        with urllib.request.urlopen(address, timeout=10) as response:
            return response.status, json.loads(response.read())

    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            served = await nursery.start(serve, url, "127.0.0.1:0")
            status, body = await trio.to_thread.run_sync(get, f"{served}api/runs/{runs.main}")
            scope.cancel()
    assert status == 200
    assert body["run"]["role"] == "coder"


# --------------------------------------------------------------------------- processes, roles


def test_ui_command_serves_postgres_and_hides_the_password(pg_url: str) -> None:
    trio.run(_one_run, pg_url)
    with_password = pg_url.replace("postgres@", "postgres:hunter2@", 1)  # trust auth ignores it
    command = [*_zincir_command(), "ui", "--db", with_password, "--address", "127.0.0.1:0"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"serving (\S+) read-only at (http://127\.0\.0\.1:[0-9]+/) ", line)
        assert match is not None, line
        assert match.group(1) == q.display_target(pg_url) and "hunter2" not in line
        with urllib.request.urlopen(match.group(2), timeout=10) as response:
            page = response.read().decode()
        assert response.status == 200 and "planner" in page and "hunter2" not in page
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=10)
    finally:
        reap(process)
    assert process.returncode == 0, err
    assert "stopped" in out


async def _one_run(url: str) -> str:
    async with zincir.open_database(url) as db, zincir.open_run(db, role="planner") as run:
        await run.record_response("hello", [], "end_turn")
        return run.id


async def test_events_follow_on_postgres(pg_url: str) -> None:
    async with zincir.open_database(pg_url) as db, zincir.open_run(db) as run:
        await run.record_response("first", [], "end_turn")
        async with trio.open_nursery() as nursery:
            done = trio.Event()

            async def follow() -> None:
                result = await trio.to_thread.run_sync(
                    lambda: cli("events", run.id, "--follow", "--db", pg_url)
                )
                assert result.exit_code == 0, result.output
                lines = result.stdout.splitlines()
                assert [line.split()[0] for line in lines] == [f"#{seq}" for seq in range(6)]
                assert "late 2" in result.stdout
                done.set()

            nursery.start_soon(follow)
            for i in range(3):
                await trio.sleep(0.2)
                await run.record_response(f"late {i}", [], "end_turn")
            await run.complete()  # seq 5, a state transition: then the follower stops
            with trio.fail_after(10):
                await done.wait()


def test_a_select_only_role_can_inspect(pg_url: str) -> None:
    run_id = trio.run(_one_run, pg_url)
    role = f"zincir_reader_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    try:
        reader_url = pg_url.replace("postgres@", f"{role}@", 1)
        shown = cli("show", run_id, "--db", reader_url)
        assert shown.exit_code == 0, shown.output
        assert "planner" in shown.stdout
        exported = cli("export", run_id, "--db", reader_url)
        assert exported.exit_code == 0 and exported.stdout.count('"kind":"event"') == 2
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
            admin.execute(f"DROP ROLE {role}")


# --------------------------------------------------------------------------- bounded reads


async def test_postgres_pages_read_through_indexes(pg_url: str) -> None:
    """Every event and child query a page makes is an index range scan, never a scan of the
    log or a sort of it; the runs list walks the activity index (one run of 60,000 events
    among 400 runs of 1,000 events, the children among 20,000 runs; vacuumed and analysed)."""
    run_id = await _one_run(pg_url)
    busy = "00000019-0000-4000-8000-000000000000"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(
            "INSERT INTO agent_runs (id, parent_run_id, role, provider, status, created_at, updated_at,"
            " last_seq) SELECT lpad(to_hex(r), 8, '0') || '-0000-4000-8000-000000000000', %s, 'bulk', '',"
            " 'completed', r, r, 999 FROM generate_series(1, 400) AS r",
            (run_id,),
        )
        admin.execute(
            "INSERT INTO events (run_id, seq, type, payload, created_at)"
            " SELECT lpad(to_hex(r), 8, '0') || '-0000-4000-8000-000000000000', s,"
            " CASE WHEN s % 7 = 0 THEN 'tool_call' ELSE 'llm_call' END, '{}', s"
            " FROM generate_series(1, 400) AS r, generate_series(0, 999) AS s"
        )
        admin.execute(
            "INSERT INTO events (run_id, seq, type, payload, created_at) SELECT %s, s,"
            " CASE WHEN s %% 7 = 0 THEN 'tool_call' ELSE 'llm_call' END, '{}', s"
            " FROM generate_series(1000, 59999) AS s",
            (busy,),
        )
        admin.execute("UPDATE agent_runs SET last_seq = 59999 WHERE id = %s", (busy,))
        admin.execute(
            "INSERT INTO agent_runs (id, role, provider, status, created_at, updated_at)"
            " SELECT lpad(to_hex(r), 8, '0') || '-0000-4000-8000-000000000001', 'root', '', 'pending', r, r"
            " FROM generate_series(1, 20000) AS r"
        )
        admin.execute("VACUUM ANALYZE")  # as autovacuum keeps an append-only table

    def reads() -> list[tuple[str, list[Any]]]:
        conn = q.open_readonly(pg_url)
        assert isinstance(conn, PostgresReadOnly)
        seen: list[tuple[str, list[Any]]] = []
        real = conn._conn.execute

        def traced(sql: Any, params: Any = None, **kwargs: Any) -> Any:
            if params:
                seen.append((sql, list(params)))
            return real(sql, params, **kwargs)

        conn._conn.execute = traced  # type: ignore[method-assign]
        try:
            with q.read_snapshot(conn):
                q.list_events(conn, busy, after=30_000, limit=50)
                q.list_events(conn, busy, before=q.LATEST, limit=50)
                q.list_events(conn, busy, before=50_000, limit=50, type="tool_call")
                q.list_events(conn, busy, after=10_000, limit=50, type="tool_call")
                q.get_event(conn, busy, 12_345)
                q.list_events(conn, busy, limit=50)  # the first page: nothing before seq 0
                q.list_events(conn, busy, after=59_990, limit=50)  # the last: nothing after it
                q.get_run(conn, run_id, children_limit=10)
                q.get_run(conn, run_id, children_limit=10, children_after=q.RunCursor(20, busy))
                page = q.list_runs(conn, limit=50, before=q.RunCursor(10_000, busy))
                q.list_runs(conn, limit=50, after=page.runs[0].cursor)
                q.list_runs(conn, status="pending", limit=50, before=page.runs[-1].cursor)
        finally:
            conn.close()
        return seen

    statements = await trio.to_thread.run_sync(reads)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        plans = {sql: _plan(admin, sql, params) for sql, params in statements}
    assert len(plans) >= 8, list(plans)
    for sql, plan in plans.items():
        if "FROM events" in sql or "parent_run_id = " in sql:  # the family of one run too
            assert "Seq Scan" not in plan and "Sort" not in plan, (sql, plan)
            assert "Index" in plan, (sql, plan)
        elif "ORDER BY updated_at" in sql:
            assert "Seq Scan" not in plan and "idx_agent_runs_" in plan, (sql, plan)


def _plan(conn: psycopg.Connection[Any], sql: str, params: list[Any]) -> str:
    rows = conn.execute(f"EXPLAIN {sql}", params).fetchall()
    return "\n".join(row[0] for row in rows)


async def test_capped_status_counts_are_the_same_on_both_backends(
    both: tuple[str, str, Runs], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, url, _ = both

    def counts(target: str) -> tuple[dict[str, int], frozenset[str]]:
        conn = q.open_readonly(target)
        try:
            with q.read_snapshot(conn):
                return q.count_runs(conn)
        finally:
            conn.close()

    exact, _ = await trio.to_thread.run_sync(counts, url)
    monkeypatch.setattr(_runs, "STATUS_COUNT_CAP", 1)
    capped = await trio.to_thread.run_sync(counts, url)
    assert capped == await trio.to_thread.run_sync(counts, path)
    assert capped[0] == {status: min(n, 1) for status, n in exact.items()}
    assert capped[1] == {status for status, n in exact.items() if n > 1} != set()
