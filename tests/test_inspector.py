"""The read-only inspector: queries, routes, headers, escaping, and never writing."""

from __future__ import annotations

import functools
import hashlib
import http.client
import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import zincir
from tests.inspect_fixtures import (
    T0,
    XSS_SCRIPT,
    Sample,
    add_event,
    add_run,
    build_sample,
    create_database,
    file_digests,
)
from zincir import _queries as q
from zincir._errors import InvalidArgument, RunNotFound, SchemaError, StorageError
from zincir._inspector import CONTENT_SECURITY_POLICY, create_app, format_host, parse_address, serve

HOST = "127.0.0.1:8787"
UNKNOWN = "00000000-0000-4000-8000-000000000000"


@pytest.fixture
def sample(tmp_path: Path) -> Iterator[tuple[sqlite3.Connection, Sample]]:
    conn, ids = build_sample(tmp_path / "inspect.db")
    yield conn, ids
    conn.close()


@pytest.fixture
def ids(sample: tuple[sqlite3.Connection, Sample]) -> Sample:
    return sample[1]


class Page:
    def __init__(self, status: int, headers: Any, text: str) -> None:
        self.status, self.headers, self.text = status, headers, text

    def json(self) -> Any:
        return json.loads(self.text)


async def fetch(path: Path, url: str, *, host: str | None = HOST, method: str = "GET") -> Page:
    app = create_app(str(path), HOST)
    client = app.test_client()
    headers = {} if host is None else {"Host": host}
    response = await client.open(url, method=method, headers=headers)
    return Page(response.status_code, response.headers, await response.get_data(as_text=True))


# --------------------------------------------------------------------------- addresses


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8787", ("127.0.0.1", 8787)),
        ("127.10.20.30:1", ("127.10.20.30", 1)),
        ("[::1]:8787", ("::1", 8787)),
        ("[0:0:0:0:0:0:0:1]:9000", ("::1", 9000)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
    ],
)
def test_parse_address_accepts_loopback(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0.0.0.0:8787", "loopback only"),
        ("[::]:8787", "loopback only"),
        ("10.0.0.1:8787", "loopback only"),
        ("192.168.1.10:80", "loopback only"),
        ("[::ffff:127.0.0.1]:80", "loopback only"),
        ("[fe80::1%lo]:80", "loopback only"),
        ("localhost:8787", "hostnames"),
        ("evil.example:8787", "hostnames"),
        ("127.1:8787", "not a literal IP"),
        ("::1:8787", "expected a literal loopback IP"),
        ("[127.0.0.1]:8787", "must not"),
        ("127.0.0.1", "expected a literal loopback IP"),
        ("127.0.0.1:", "expected a literal loopback IP"),
        ("127.0.0.1:99999", "above 65535"),
        ("127.0.0.1:+80", "expected a literal loopback IP"),
        (" 127.0.0.1:80", "not a literal IP"),
        ("", "expected a literal loopback IP"),
    ],
)
def test_parse_address_refuses(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        parse_address(text)


def test_format_host() -> None:
    assert format_host("127.0.0.1", 80) == "127.0.0.1:80"
    assert format_host("::1", 80) == "[::1]:80"


# --------------------------------------------------------------------------- opening


def test_open_readonly_missing_file_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nope.db"
    with pytest.raises(StorageError, match="does not exist"):
        q.open_readonly(missing)
    assert list(tmp_path.iterdir()) == []


def test_open_readonly_refuses_foreign_files(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_bytes(b"hello, this is not SQLite" * 100)
    with pytest.raises(SchemaError, match="not a zincir database"):
        q.open_readonly(text)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE agent_runs (id TEXT)")
    conn.close()
    with pytest.raises(SchemaError, match=r"missing tables: .*events"):
        q.open_readonly(other)
    empty = tmp_path / "empty.db"
    empty.touch()
    with pytest.raises(SchemaError):
        q.open_readonly(empty)
    assert empty.read_bytes() == b""


def test_open_readonly_refuses_newer_schema(tmp_path: Path) -> None:
    conn = create_database(tmp_path / "new.db")
    conn.execute("INSERT INTO zincir_schema_migrations VALUES (2, '0002_future', 0)")
    conn.close()
    with pytest.raises(SchemaError, match="newer than this zincir"):
        q.open_readonly(tmp_path / "new.db")


def test_open_readonly_cannot_write(sample: tuple[sqlite3.Connection, Sample]) -> None:
    conn = q.open_readonly(sample[1].path)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        conn.execute("DELETE FROM agent_runs")
    conn.close()


def test_path_with_uri_characters(tmp_path: Path) -> None:
    folder = tmp_path / "odd ?#% name"
    folder.mkdir()
    create_database(folder / "a?b#c.db").close()
    q.open_readonly(folder / "a?b#c.db").close()
    assert sorted(p.name for p in folder.iterdir())[0] == "a?b#c.db"


# --------------------------------------------------------------------------- queries


def test_runs_keyset_pagination_with_ties(tmp_path: Path) -> None:
    writer = create_database(tmp_path / "ties.db")
    made = [
        add_run(writer, created_at=T0 + i % 3, status="running" if i % 2 else "failed") for i in range(23)
    ]
    writer.close()
    conn = q.open_readonly(tmp_path / "ties.db")
    expected = [r[0] for r in conn.execute("SELECT id FROM agent_runs ORDER BY updated_at DESC, id DESC")]
    seen, cursor, pages = [], None, []
    while True:
        page = q.list_runs(conn, limit=4, before=cursor)
        pages.append(page)
        seen += [run.id for run in page.runs]
        if not page.has_older:
            break
        cursor = page.runs[-1].cursor
    assert seen == expected
    assert sorted(seen) == sorted(made)
    assert not pages[0].has_newer
    assert all(p.has_newer for p in pages[1:])
    back = q.list_runs(conn, limit=4, after=pages[2].runs[0].cursor)
    assert back.runs == pages[1].runs
    assert back.has_newer
    assert back.has_older
    assert q.list_runs(conn, status="failed").counts == {
        "pending": 0,
        "running": 11,
        "completed": 0,
        "failed": 12,
    }
    assert all(run.status == "failed" for run in q.list_runs(conn, status="failed").runs)
    conn.close()


def test_run_detail_and_lineage(sample: tuple[sqlite3.Connection, Sample]) -> None:
    ids = sample[1]
    conn = q.open_readonly(ids.path)
    run = q.get_run(conn, ids.main.upper())
    assert (run.lease_owner, run.lease_epoch, run.attempts) == ("worker-7f3a", 3, 2)
    assert run.next_attempt_at == T0 + 60_000
    assert {c.id for c in run.children} == set(ids.children)
    assert run.children_total == 2
    assert q.get_run(conn, ids.children[0]).parent_run_id == ids.main
    rounds = [(c.round, c.status, c.decision_event_seq is None) for c in q.list_checkpoints(conn, ids.main)]
    assert rounds == [(1, "rejected", False), (2, "accepted", False), (3, "candidate", True)]
    assert [s.name for s in q.list_steps(conn, ids.main)] == ["fetch-dataset", "train"]
    assert [t.name for t in q.list_timers(conn, ids.main)] == ["backoff", "cooldown"]
    with pytest.raises(RunNotFound):
        q.get_run(conn, UNKNOWN)
    with pytest.raises(InvalidArgument, match="malformed run id"):
        q.get_run(conn, "run-1")
    conn.close()


def test_events_pages_and_filters(sample: tuple[sqlite3.Connection, Sample]) -> None:
    ids = sample[1]
    conn = q.open_readonly(ids.path)
    first = q.list_events(conn, ids.long)
    assert [e.seq for e in first.events] == list(range(100))
    assert first.has_after
    assert not first.has_before
    last = q.list_events(conn, ids.long, before=250, limit=30)
    assert [e.seq for e in last.events] == list(range(220, 250))
    assert last.has_before
    assert not last.has_after
    typed = q.list_events(conn, ids.long, type="tool_result", after=10, limit=5)
    assert [e.seq for e in typed.events] == [11, 13, 15, 17, 19]
    assert typed.has_before
    assert typed.has_after
    assert [e.seq for e in q.iter_events(conn, ids.long, page=7)] == list(range(250))
    cut = q.list_events(conn, ids.long, limit=1, max_payload_chars=4).events[0]
    assert cut.payload == '{"ca'
    assert cut.truncated
    assert cut.payload_size > 4
    assert {"tool_call", "tool_result", "checkpoint_accepted"} <= set(q.event_types(conn, ids.long))
    assert q.list_events(conn, ids.long, after=249).events == ()
    with pytest.raises(InvalidArgument):
        q.list_events(conn, ids.long, limit=0)
    conn.close()


# --------------------------------------------------------------------------- routes


async def test_host_header_is_checked(ids: Sample) -> None:
    for host in ("evil.example:8787", "localhost:8787", "127.0.0.1", "127.0.0.1:8788", "[::1]:8787", None):
        page = await fetch(ids.path, "/", host=host)
        assert page.status == 421, host
        assert "Misdirected" in page.text
        assert ids.main not in page.text
        assert page.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    api = await fetch(ids.path, f"/api/runs/{ids.main}", host="evil.example:8787")
    assert api.status == 421
    assert "worker-7f3a" not in api.text
    assert (await fetch(ids.path, "/")).status == 200


async def test_default_port_may_be_left_out_of_host(ids: Sample) -> None:
    app = create_app(str(ids.path), "127.0.0.1:80")
    client = app.test_client()
    for host, status in [("127.0.0.1", 200), ("127.0.0.1:80", 200), ("127.0.0.1:8787", 421)]:
        response = await client.get("/", headers={"Host": host})
        assert response.status_code == status, host
    served_elsewhere = await fetch(ids.path, "/", host="127.0.0.1")
    assert served_elsewhere.status == 421


async def test_security_headers_on_every_response(ids: Sample) -> None:
    urls = [
        "/",
        f"/runs/{ids.main}",
        "/runs/nope",
        f"/runs/{UNKNOWN}",
        "/missing",
        "/api/runs",
        "/api/runs/nope",
        "/static/inspector.css",
    ]
    for url in urls:
        page = await fetch(ids.path, url)
        assert page.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY, url
        assert "script-src" not in page.headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
        assert page.headers["X-Content-Type-Options"] == "nosniff"
        assert page.headers["Referrer-Policy"] == "no-referrer"
    post = await fetch(ids.path, "/", method="POST")
    assert post.status == 405
    assert post.headers["X-Content-Type-Options"] == "nosniff"


async def test_runs_page(ids: Sample) -> None:
    page = await fetch(ids.path, "/")
    assert page.status == 200
    ordered = [m for m in re.findall(r'href="/runs/([0-9a-f-]{36})"', page.text)]
    assert ordered[:5] == [ids.hostile, ids.main, ids.children[1], ids.children[0], ids.long]
    assert len(ordered) == 50
    assert 'href="/?before=' in page.text
    assert re.search(r"pending <span class=\"count\">60</span>", page.text)
    assert "&lt;script&gt;" in page.text
    assert XSS_SCRIPT not in page.text
    older = re.search(r'href="(/\?before=[^"]+)"', page.text)
    assert older is not None
    second = await fetch(ids.path, older.group(1).replace("&amp;", "&"))
    assert len(re.findall(r'href="/runs/([0-9a-f-]{36})"', second.text)) == 15
    assert "Newer" in second.text
    assert "Older" not in second.text
    filtered = await fetch(ids.path, "/?status=failed")
    assert re.findall(r'href="/runs/([0-9a-f-]{36})"', filtered.text) == [ids.children[1]]
    by_role = await fetch(ids.path, "/?role=researcher")
    assert re.findall(r'href="/runs/([0-9a-f-]{36})"', by_role.text) == [ids.children[0]]
    assert "No runs match" in (await fetch(ids.path, "/?role=nobody")).text
    bad = await fetch(ids.path, "/?status=bogus")
    assert bad.status == 400
    assert "unknown status" in bad.text


async def test_empty_database(tmp_path: Path) -> None:
    create_database(tmp_path / "empty.db").close()
    page = await fetch(tmp_path / "empty.db", "/")
    assert page.status == 200
    assert "No durable runs yet." in page.text


async def test_run_page(ids: Sample) -> None:
    page = await fetch(ids.path, f"/runs/{ids.main}")
    text = page.text
    assert page.status == 200
    for expected in (
        "worker-7f3a",
        "coder",
        "anthropic",
        "fix the flaky test",
        "fetch-dataset",
        "cooldown",
        "backoff",
        "Builds on",
        "round 2",
        "original goal",
        "pytest exit 1",
        "idempotency key <code>tool_call:call_1</code>",
        "Next attempt",
    ):
        assert expected in text, expected
    assert f'href="/runs/{ids.children[0]}"' in text
    assert f'href="/runs/{ids.children[1]}"' in text
    assert '<meta http-equiv="refresh" content="5">' in text
    assert text.count('<details class="event"') == 14
    child = await fetch(ids.path, f"/runs/{ids.children[0]}")
    assert f'href="/runs/{ids.main}"' in child.text
    assert 'http-equiv="refresh"' not in child.text
    paused = await fetch(ids.path, f"/runs/{ids.main}?refresh=off")
    assert 'http-equiv="refresh"' not in paused.text
    assert "resume" in paused.text


async def test_run_page_paginates_events(ids: Sample) -> None:
    first = await fetch(ids.path, f"/runs/{ids.long}")
    assert first.text.count('<details class="event"') == 100
    assert 'id="e99"' in first.text
    assert 'id="e100"' not in first.text
    assert f'href="/runs/{ids.long}?after=99#events"' in first.text
    latest = await fetch(ids.path, f"/runs/{ids.long}?before=250&limit=20")
    assert latest.text.count('<details class="event"') == 20
    assert 'id="e249"' in latest.text
    typed = await fetch(ids.path, f"/runs/{ids.long}?type=tool_result&after=200")
    assert typed.text.count('<details class="event"') == 25
    assert "tool_call</strong>" not in typed.text
    for bad in ("?after=x", "?limit=0", "?limit=100000", "?after=1&before=5", "?before=-3"):
        page = await fetch(ids.path, f"/runs/{ids.long}{bad}")
        assert page.status == 400, bad
        assert '<div class="error">' in page.text


async def test_large_payload_is_cut_on_the_page(sample: tuple[sqlite3.Connection, Sample]) -> None:
    writer, ids = sample
    big = "x" * 300_000
    seq = add_event(writer, ids.long, "llm_call", {"content": big})
    page = await fetch(ids.path, f"/runs/{ids.long}?after={seq - 1}")
    assert "Showing the first 65,536 of 300,014 characters" in page.text
    assert len(page.text) < 120_000
    full = await fetch(ids.path, f"/api/runs/{ids.long}/events/{seq}")
    assert full.json()["event"]["payload"]["content"] == big


async def test_error_pages_are_styled(ids: Sample) -> None:
    bad = await fetch(ids.path, "/runs/not-a-uuid")
    assert bad.status == 400
    assert '<div class="error">' in bad.text
    assert "malformed run id" in bad.text
    assert 'rel="stylesheet"' in bad.text
    hostile = await fetch(ids.path, "/runs/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")
    assert hostile.status == 400
    assert "<img" not in hostile.text
    assert "&lt;img src=x" in hostile.text
    unknown = await fetch(ids.path, f"/runs/{UNKNOWN}")
    assert unknown.status == 404
    assert '<div class="error">' in unknown.text
    assert "not found" in unknown.text
    route = await fetch(ids.path, "/nothing/here")
    assert route.status == 404
    assert '<div class="error">' in route.text


async def test_missing_database_after_start(tmp_path: Path) -> None:
    page = await fetch(tmp_path / "gone.db", "/")
    assert page.status == 500
    assert "does not exist" in page.text
    assert not (tmp_path / "gone.db").exists()


async def test_hostile_values_are_escaped(ids: Sample) -> None:
    page = await fetch(ids.path, f"/runs/{ids.hostile}")
    assert page.status == 200
    lowered = page.text.lower()
    assert "<script" not in lowered
    assert "<img" not in lowered
    assert 'href="javascript:' not in lowered
    assert page.text.count("&lt;script&gt;") >= 6


async def test_json_api(ids: Sample) -> None:
    runs = (await fetch(ids.path, "/api/runs?limit=3")).json()
    assert [r["id"] for r in runs["runs"]] == [ids.hostile, ids.main, ids.children[1]]
    assert runs["counts"]["pending"] == 60
    assert runs["total"] == 65
    assert runs["newer"] is None
    older = (await fetch(ids.path, f"/api/runs?limit=3&before={runs['older']}")).json()
    assert older["runs"][0]["id"] == ids.children[0]
    one = (await fetch(ids.path, f"/api/runs/{ids.main}")).json()
    assert one["run"]["lease_owner"] == "worker-7f3a"
    assert one["run"]["config"]["max_rounds"] == 5
    assert one["run"]["children"] == list(ids.children)
    assert one["children_total"] == 2
    assert [c["status"] for c in one["checkpoints"]] == ["rejected", "accepted", "candidate"]
    assert one["checkpoints"][0]["verification"] == {"passed": False, "evidence": ["pytest exit 0"]}
    assert one["steps"][0]["result"] == {"rows": 1200}
    assert len(one["timers"]) == 2
    events = (await fetch(ids.path, f"/api/runs/{ids.long}/events?after=9&limit=5&type=tool_call")).json()
    assert [e["seq"] for e in events["events"]] == [10, 12, 14, 16, 18]
    assert events["events"][0]["payload"] == {"call_id": "c5", "i": 10}
    assert events["next_after"] == 18
    default = (await fetch(ids.path, f"/api/runs/{ids.long}/events")).json()
    assert len(default["events"]) == 100
    assert default["has_after"]
    for url, status in [
        ("/api/runs/nope", 400),
        (f"/api/runs/{UNKNOWN}", 404),
        (f"/api/runs/{UNKNOWN}/events", 404),
        (f"/api/runs/{ids.long}/events/999", 404),
        (f"/api/runs/{ids.long}/events/x", 400),
        ("/api/runs?before=garbage", 400),
        (f"/api/runs/{ids.long}/events?limit=5000", 400),
    ]:
        page = await fetch(ids.path, url)
        assert page.status == status, url
        assert page.json()["error"]["status"] == status
        assert page.headers["Content-Type"].startswith("application/json")


def every_url(ids: Sample) -> list[str]:
    urls = [
        "/",
        "/?status=running",
        "/?role=coder",
        "/?limit=5",
        "/api/runs",
        "/static/inspector.css",
        "/runs/bad",
        f"/runs/{UNKNOWN}",
        "/nowhere",
    ]
    for run in [ids.main, ids.long, ids.hostile, *ids.children, *ids.plain[:3]]:
        urls += [
            f"/runs/{run}",
            f"/runs/{run}?type=tool_call",
            f"/runs/{run}?after=100",
            f"/api/runs/{run}",
            f"/api/runs/{run}/events",
            f"/api/runs/{run}/events/0",
        ]
    return urls


async def test_browsing_leaves_file_and_wal_byte_identical(sample: tuple[sqlite3.Connection, Sample]) -> None:
    writer, ids = sample
    before = file_digests(ids.path)
    assert before["-wal"] is not None  # the writer is still open: the data lives in the WAL
    for url in every_url(ids):
        await fetch(ids.path, url)
    assert file_digests(ids.path) == before
    writer.close()  # checkpoints and removes the WAL
    closed = file_digests(ids.path)
    assert closed["-wal"] is None
    for url in every_url(ids)[:12]:
        assert (await fetch(ids.path, url)).status in (200, 400, 404)
    after = file_digests(ids.path)
    assert after["db"] == closed["db"]
    # SQLite may leave an empty -wal behind a read-only reader; never any content.
    assert after["-wal"] in (None, hashlib.sha256(b"").hexdigest())


async def test_reads_while_a_writer_holds_the_lock(sample: tuple[sqlite3.Connection, Sample]) -> None:
    writer, ids = sample
    writer.execute("BEGIN IMMEDIATE")
    add_event(writer, ids.main, "llm_call", {"content": "uncommitted"})
    with trio.fail_after(5):
        page = await fetch(ids.path, f"/runs/{ids.main}")
    assert page.status == 200
    assert "uncommitted" not in page.text
    writer.execute("COMMIT")
    assert "uncommitted" in (await fetch(ids.path, f"/runs/{ids.main}?after=10")).text


# --------------------------------------------------------------------------- real server


def http_get(url: str, host: str | None = None) -> tuple[int, dict[str, str], str]:
    parsed = url.removeprefix("http://").rstrip("/")
    address, _, port = parsed.rpartition(":")
    conn = http.client.HTTPConnection(address.strip("[]"), int(port), timeout=5)
    try:
        conn.putrequest("GET", "/", skip_host=True)
        conn.putheader("Host", host or parsed)
        conn.endheaders()
        response = conn.getresponse()
        headers = {name.lower(): value for name, value in response.getheaders()}
        return response.status, headers, response.read().decode()
    finally:
        conn.close()


async def test_serve_over_real_sockets(ids: Sample) -> None:
    stop = trio.Event()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            start = functools.partial(serve, str(ids.path), "127.0.0.1:0", shutdown_trigger=stop.wait)
            url = await nursery.start(start)
            assert re.fullmatch(r"http://127\.0\.0\.1:[0-9]+/", url)
            status, headers, body = await trio.to_thread.run_sync(http_get, url)
            assert status == 200
            assert ids.main in body
            assert headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            assert "server" not in headers
            status, _, body = await trio.to_thread.run_sync(http_get, url, "evil.example:8787")
            assert status == 421
            assert ids.main not in body
            stop.set()  # a graceful shutdown ends serve(), so the nursery exits


async def test_serve_refuses_bad_address_and_missing_file(tmp_path: Path, ids: Sample) -> None:
    with pytest.raises(InvalidArgument, match="loopback only"):
        await serve(str(ids.path), "0.0.0.0:0")
    with pytest.raises(StorageError, match="does not exist"):
        await serve(str(tmp_path / "missing.db"), "127.0.0.1:0")
    assert not (tmp_path / "missing.db").exists()


async def test_reads_a_database_written_by_the_core_library(tmp_path: Path) -> None:
    # The fixtures above build files by hand; this pins that the real writer's files pass too.
    path = tmp_path / "core.db"
    async with zincir.open_database(path) as db, zincir.open_run(db, role="coder", provider="p") as run:
        await run.record_response("thinking", [{"id": "c1", "name": "read", "args": {}}], "tool_use")
        await run.record_tool_result("c1", {"ok": True})
        before = file_digests(path)
        page = await fetch(path, f"/runs/{run.id}")
        assert page.status == 200
        assert "tool_result" in page.text
        assert run.id in (await fetch(path, "/")).text
        assert file_digests(path) == before
