"""The read-only inspector: queries, routes, headers, escaping, and never writing."""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import http.client
import json
import re
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner

import zincir
from tests.inspect_fixtures import (
    T0,
    XSS_HREF,
    XSS_META,
    XSS_NAV,
    XSS_SCRIPT,
    MalformedIds,
    Sample,
    add_event,
    add_malformed_run,
    add_run,
    build_sample,
    create_database,
    file_digests,
)
from zincir import _queries as q
from zincir._cli import main as cli
from zincir._errors import InvalidArgument, RunNotFound, SchemaError, StorageError
from zincir._inspector import CONTENT_SECURITY_POLICY, create_app, format_host, parse_address, serve
from zincir._queries import _runs
from zincir._sqlite._readonly import SQLiteReadOnly

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
    conn.execute("INSERT INTO zincir_schema_migrations VALUES (999, '0999_future', 0)")
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
        "waiting": 0,
        "completed": 0,
        "failed": 12,
        "cancelled": 0,
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
        "Next attempt",
    ):
        assert expected in text, expected
    assert f'href="/runs/{ids.children[0]}"' in text
    assert f'href="/runs/{ids.children[1]}"' in text
    assert '<meta http-equiv="refresh" content="5">' in text
    raw = (await fetch(ids.path, f"/runs/{ids.main}?view=events")).text  # the raw list, one click away
    assert "idempotency key <code>tool_call:call_1</code>" in raw
    assert raw.count('<details class="event"') == 14
    assert f'href="/runs/{ids.main}?view=events#views"' in text
    child = await fetch(ids.path, f"/runs/{ids.children[0]}")
    assert f'href="/runs/{ids.main}"' in child.text
    assert 'http-equiv="refresh"' not in child.text
    paused = await fetch(ids.path, f"/runs/{ids.main}?refresh=off")
    assert 'http-equiv="refresh"' not in paused.text
    assert "resume" in paused.text


async def test_run_page_paginates_events(ids: Sample) -> None:
    first = await fetch(ids.path, f"/runs/{ids.long}?view=events")
    assert first.text.count('<details class="event"') == 100
    assert 'id="e99"' in first.text
    assert 'id="e100"' not in first.text
    assert f'href="/runs/{ids.long}?after=99&amp;view=events#events"' in first.text
    latest = await fetch(ids.path, f"/runs/{ids.long}?before=250&limit=20&view=events")
    assert latest.text.count('<details class="event"') == 20
    assert 'id="e249"' in latest.text
    typed = await fetch(ids.path, f"/runs/{ids.long}?type=tool_result&after=200")
    assert typed.text.count('<details class="event"') == 25
    assert "tool_call</strong>" not in typed.text
    for bad in ("?after=x", "?limit=0", "?limit=100000", "?after=1&before=5", "?before=1e3"):
        page = await fetch(ids.path, f"/runs/{ids.long}{bad}")
        assert page.status == 400, bad
        assert '<div class="error">' in page.text


async def test_large_payload_is_cut_on_the_page(sample: tuple[sqlite3.Connection, Sample]) -> None:
    writer, ids = sample
    big = "x" * 300_000
    seq = add_event(writer, ids.long, "llm_call", {"content": big})
    page = await fetch(ids.path, f"/runs/{ids.long}?after={seq - 1}&view=events")
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
        page = await fetch(path, f"/runs/{run.id}?view=events")
        assert page.status == 200
        assert "tool_result" in page.text
        assert run.id in (await fetch(path, "/")).text
        assert file_digests(path) == before


# --------------------------------------------------------------------------- malformed rows

MALFORMED_VALUES = [
    pytest.param(XSS_META, id="text"),
    pytest.param(XSS_HREF.encode(), id="blob"),
    pytest.param(2.5, id="real"),
]


def malformed_sample(sample: tuple[sqlite3.Connection, Sample]) -> tuple[Sample, MalformedIds]:
    writer, ids = sample
    return ids, add_malformed_run(writer)


def assert_clean_html(page: Page) -> None:
    assert page.status == 200, page.text[:2000]
    assert page.headers["Content-Type"].startswith("text/html")
    assert XSS_META not in page.text
    assert XSS_HREF not in page.text
    metas = re.findall(r"<meta\b[^>]*http-equiv[^>]*>", page.text, re.IGNORECASE)
    assert metas in ([], ['<meta http-equiv="refresh" content="5">'])
    for href in re.findall(r"<a\b[^>]*\bhref=\"([^\"]*)\"", page.text):
        assert href.startswith("/"), href


def assert_clean_json(page: Page) -> Any:
    assert page.status == 200, page.text[:2000]
    assert page.headers["Content-Type"].startswith("application/json")
    return json.loads(page.text, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))


async def test_malformed_rows_render_as_escaped_placeholders(
    sample: tuple[sqlite3.Connection, Sample],
) -> None:
    ids, bad = malformed_sample(sample)
    for url in ("/", f"/runs/{bad.run}", f"/runs/{bad.run}?before=end", f"/runs/{bad.child}"):
        assert_clean_html(await fetch(ids.path, url))
    page = await fetch(ids.path, f"/runs/{bad.run}?view=events")
    # Text in an integer column: a placeholder naming it, escaped (seq, round, epoch, attempts, times).
    assert page.text.count('<code class="malformed">(malformed text: ') >= 8
    assert "(malformed blob: x&#39;3c61" in page.text  # the BLOB lease expiry, as hex
    assert "(malformed real: 2.5)" in page.text  # next_attempt_at
    assert 'id="er3ff8000000000000"' in page.text  # the REAL seq 1.5, in seq order
    assert page.text.index('id="e1"') < page.text.index('id="er3ff8') < page.text.index('id="e2"')
    assert "role &#34;&gt;&lt;meta http-equiv" in page.text  # the BLOB role, decoded
    assert "&#34;NaN&#34;" in page.text  # NaN in the config shows as the string "NaN"
    runs = await fetch(ids.path, "/")
    # A TEXT updated_at sorts after every number: the malformed run comes first, and the rest
    # of the list is still there.
    listed = re.findall(r'href="/runs/([0-9a-f-]{36})"', runs.text)
    assert listed[:3] == [bad.run, ids.hostile, ids.main]
    assert len(listed) == 50


@pytest.mark.parametrize("value", MALFORMED_VALUES)
@pytest.mark.parametrize(
    ("table", "column"),
    [
        ("agent_runs", "attempts"),
        ("agent_runs", "created_at"),
        ("agent_runs", "updated_at"),
        ("agent_runs", "last_seq"),
        ("agent_runs", "lease_epoch"),
        ("agent_runs", "lease_expires_at"),
        ("agent_runs", "next_attempt_at"),
        ("events", "seq"),
        ("events", "created_at"),
        ("checkpoints", "round"),
        ("checkpoints", "based_on_event_seq"),
        ("checkpoints", "decision_event_seq"),
        ("checkpoints", "decided_at"),
        ("steps", "epoch"),
        ("steps", "started_at"),
        ("steps", "completed_at"),
        ("timers", "wake_at"),
        ("timers", "created_at"),
    ],
)
async def test_one_malformed_integer_breaks_no_page(
    sample: tuple[sqlite3.Connection, Sample], table: str, column: str, value: object
) -> None:
    writer, ids = sample
    where = {
        "agent_runs": ("id = ?", ids.main),
        "events": ("run_id = ? AND seq = 3", ids.main),
        "checkpoints": ("run_id = ? AND round = 2", ids.main),
        "steps": ("run_id = ? AND name = 'fetch-dataset'", ids.main),
        "timers": ("run_id = ? AND name = 'cooldown'", ids.main),
    }[table]
    writer.execute(f"UPDATE {table} SET {column} = ? WHERE {where[0]}", (value, where[1]))
    for url in (
        "/",
        f"/runs/{ids.main}",
        f"/runs/{ids.main}?before=end",
        f"/runs/{ids.main}?after=2&limit=1",
    ):
        assert_clean_html(await fetch(ids.path, url))
    for url in ("/api/runs", f"/api/runs/{ids.main}", f"/api/runs/{ids.main}/events?before=end"):
        assert_clean_json(await fetch(ids.path, url))


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(XSS_NAV.encode(), id="blob"),
        pytest.param('{"x": NaN, "y": [Infinity, -Infinity], "z": 1e999}', id="nan"),
        pytest.param("[" * 5000 + "]" * 5000, id="deep-5000"),
        pytest.param('{"a":' * 300 + "1" + "}" * 300, id="deep-300"),
        pytest.param('{"lone": "\\ud800"}', id="lone-surrogate"),
        pytest.param('{"cut": ', id="not-json"),
        pytest.param(b"\xff\xfe not utf-8", id="bad-utf8-blob"),
        pytest.param(12345, id="integer"),
    ],
)
async def test_one_malformed_payload_breaks_no_page(
    sample: tuple[sqlite3.Connection, Sample], payload: object
) -> None:
    writer, ids = sample
    writer.execute("UPDATE events SET payload = ? WHERE run_id = ? AND seq = 3", (payload, ids.main))
    writer.execute("UPDATE steps SET result = ? WHERE run_id = ?", (payload, ids.main))
    writer.execute(
        "UPDATE checkpoints SET state = ?, verification = ? WHERE run_id = ?", (payload, payload, ids.main)
    )
    writer.execute("UPDATE agent_runs SET config = ? WHERE id = ?", (payload, ids.main))
    assert_clean_html(await fetch(ids.path, f"/runs/{ids.main}"))
    for url in (
        f"/api/runs/{ids.main}",
        f"/api/runs/{ids.main}/events",
        f"/api/runs/{ids.main}/events/3",
        f"/api/runs/{ids.main}/steps/fetch-dataset",
        f"/api/runs/{ids.main}/checkpoints/2",
    ):
        data = assert_clean_json(await fetch(ids.path, url))
        assert data


async def test_malformed_run_in_the_json_api(sample: tuple[sqlite3.Connection, Sample]) -> None:
    ids, bad = malformed_sample(sample)
    runs = assert_clean_json(await fetch(ids.path, "/api/runs?limit=2"))
    first = runs["runs"][0]
    assert first["id"] == bad.run
    assert first["attempts"] == {"malformed": "text", "value": repr(XSS_META[:60] + "…")}
    assert first["role"].startswith("role ")  # the BLOB, decoded
    # The cursor of a TEXT updated_at still pages exactly: the next page starts right after.
    older = assert_clean_json(await fetch(ids.path, f"/api/runs?limit=2&before={runs['older']}"))
    assert [r["id"] for r in older["runs"]] == [ids.main, ids.children[1]]
    one = assert_clean_json(await fetch(ids.path, f"/api/runs/{bad.run}"))
    assert one["run"]["config"] == {"goal": "NaN", "x": ["Infinity", "-Infinity", "1e999"]}
    assert one["run"]["next_attempt_at"] == {"malformed": "real", "value": "2.5"}
    events = assert_clean_json(await fetch(ids.path, f"/api/runs/{bad.run}/events"))
    seqs = [e["seq"] for e in events["events"]]
    assert seqs[:3] == [0, 1, {"malformed": "real", "value": "1.5"}]
    assert [s["malformed"] for s in seqs[-2:]] == ["text", "blob"]
    assert events["events"][3]["payload"] == {"content": "NaN", "n": "Infinity", "big": "1e999"}
    assert events["events"][4]["payload"] == "[" * 5000 + "]" * 5000  # too deep: kept as text
    # A malformed seq or round is reached through its token (see q.encode_key).
    text_token = q.encode_key(XSS_META)
    alone = assert_clean_json(await fetch(ids.path, f"/api/runs/{bad.run}/events/{text_token}"))
    assert alone["event"]["payload"] == {"content": "text seq"}
    round_token = q.encode_key(XSS_META)
    checkpoint = assert_clean_json(await fetch(ids.path, f"/api/runs/{bad.run}/checkpoints/{round_token}"))
    assert checkpoint["checkpoint"]["verification"] == {"passed": "NaN"}


async def test_status_counts_stop_at_the_cap_and_say_so(
    sample: tuple[sqlite3.Connection, Sample], monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, ids = sample
    monkeypatch.setattr(_runs, "STATUS_COUNT_CAP", 5)
    # A hostile writer can store statuses zincir never writes, of any type, length or encoding:
    # they count as "other", and none hides or miscounts a real status.
    writer.execute("PRAGMA ignore_check_constraints = ON")
    hostile: list[object] = ["zombie", "a-first", "pending\x00", "x" * 100_000, b"running", 7, 2.5]
    hostile += list(range(40))  # more distinct values than any walk over them would look at
    for run_id, status in zip(ids.plain, hostile, strict=False):
        writer.execute("UPDATE agent_runs SET status = ? WHERE id = ?", (status, run_id))
    writer.execute("UPDATE agent_runs SET status = CAST(x'61ff' AS TEXT) WHERE id = ?", (ids.plain[-1],))
    writer.commit()
    real = {
        status: writer.execute(
            "SELECT count(*) FROM agent_runs WHERE status = ? AND typeof(status) = 'text'", (status,)
        ).fetchone()[0]
        for status in q.RUN_STATUSES
    }
    assert real["pending"] == 60 - len(hostile) - 1 > 5 and 0 < real["failed"] < 5
    conn = q.open_readonly(ids.path)
    try:
        with q.read_snapshot(conn):
            page = q.list_runs(conn)
            by_role, unbounded = q.count_runs(conn, role="filler")
    finally:
        conn.close()
    assert page.counts == {**{s: min(n, 5) for s, n in real.items()}, "other": 5}
    assert page.capped == {"pending", "other"}
    assert by_role == {
        **dict.fromkeys(q.RUN_STATUSES, 0),
        "pending": real["pending"],
        "other": len(hostile) + 1,
    }
    assert unbounded == frozenset()
    html = (await fetch(ids.path, "/")).text
    assert re.search(r"pending <span class=\"count\">5\+</span>", html)
    assert re.search(r"failed <span class=\"count\">1</span>", html)
    assert re.search(r"all <span class=\"count\">\d+\+</span>", html)
    api = (await fetch(ids.path, "/api/runs")).json()
    assert api["capped"] == ["other", "pending"] and api["counts"]["pending"] == 5
    printed = CliRunner().invoke(cli, ["runs", "--db", str(ids.path)], catch_exceptions=False).stdout
    assert "+ in all (pending 5+, running" in printed and "failed 1," in printed


def test_runs_keyset_pagination_over_malformed_sort_keys(tmp_path: Path) -> None:
    writer = create_database(tmp_path / "mixed.db")
    made = [add_run(writer, created_at=T0 + i % 4) for i in range(12)]
    odd = [2.5, "text <b>", b"\x00blob", "text <a>", 2**63 - 1, -(2**63)]
    for run_id, value in zip(made, odd, strict=False):
        writer.execute("UPDATE agent_runs SET updated_at = ? WHERE id = ?", (value, run_id))
    writer.execute("UPDATE agent_runs SET id = 'not-a-uuid <x>' WHERE id = ?", (made[-1],))
    writer.close()
    conn = q.open_readonly(tmp_path / "mixed.db")
    expected = [r[0] for r in conn.execute("SELECT id FROM agent_runs ORDER BY updated_at DESC, id DESC")]
    seen, cursor = [], None
    while True:
        page = q.list_runs(conn, limit=3, before=cursor)
        seen += [run.id for run in page.runs]
        if not page.has_older:
            break
        cursor = q.parse_cursor(page.runs[-1].cursor.encode())  # through its text form
    assert seen == expected
    assert len(seen) == 12
    conn.close()


def test_cursor_tokens_round_trip() -> None:
    for value in [0, -1, 2**63 - 1, -(2**63), 1.5, float("inf"), "", "a_b <c>", b"\x00\xff", None, UNKNOWN]:
        token = q.encode_key(value)
        assert re.fullmatch(r"[0-9a-z-]*", token), token
        assert "_" not in token
        assert q.decode_key(token, "key") == value
    assert q.encode_key(7) == "7"
    assert q.encode_key(UNKNOWN) == UNKNOWN
    for bad in ("2" * 20, str(2**63), str(-(2**63) - 1), "x", "t0", "r12", "1e3", "", "end"):
        with pytest.raises(InvalidArgument):
            q.decode_key(bad, "key")


def test_stored_json_never_fails_to_decode() -> None:
    assert q.parse_json('{"a": NaN, "b": [Infinity, -Infinity, 1e400, 1.5]}') == (
        True,
        {"a": "NaN", "b": ["Infinity", "-Infinity", "1e400", 1.5]},
    )
    deep = "[" * 5000 + "]" * 5000
    assert q.parse_json(deep) == (False, deep)  # RecursionError inside json.loads
    deep_but_loadable = "[" * (q.MAX_JSON_DEPTH + 1) + "]" * (q.MAX_JSON_DEPTH + 1)
    assert q.parse_json(deep_but_loadable) == (False, deep_but_loadable)
    fine = "[" * q.MAX_JSON_DEPTH + "]" * q.MAX_JSON_DEPTH
    assert q.parse_json(fine)[0]
    assert q.parse_json("1" * 5000) == (False, "1" * 5000)  # over Python's int digit limit
    assert q.parse_json("{") == (False, "{")


# --------------------------------------------------------------------------- escaping, statically


TEMPLATES = Path(zincir.__file__).parent / "_inspector" / "templates"
INSPECTOR = Path(zincir.__file__).parent / "_inspector"


def test_templates_never_mark_data_safe() -> None:
    """Jinja2 escapes every ``{{ }}`` on every page: nothing may switch that off.

    No template uses ``|safe``, turns autoescape off, or builds markup from strings; no Python
    module of the inspector makes :class:`markupsafe.Markup` (the only way around escaping),
    and the environment escapes whatever the template name.
    """
    templates = sorted(TEMPLATES.rglob("*.html")) + sorted(TEMPLATES.rglob("*.svg"))
    assert {"base.html", "runs.html", "run.html", "error.html", "macros.html"} <= {t.name for t in templates}
    problems = []
    for template in templates:
        text = template.read_text("utf-8")
        for pattern in (r"\|\s*safe\b", r"autoescape\s+false", r"\bMarkup\b", r"\|\s*forceescape\b"):
            if re.search(pattern, text, re.IGNORECASE):
                problems.append(f"{template.name}: {pattern}")
    for module in sorted(INSPECTOR.rglob("*.py")):
        tree = ast.parse(module.read_text("utf-8"))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import | ast.ImportFrom) else []
            if any(n.split(".")[0] == "markupsafe" or n == "Markup" for n in names):
                problems.append(f"{module.name}:{node.lineno} imports markupsafe")
            if isinstance(node, ast.Attribute) and node.attr in ("Markup", "__html__"):
                problems.append(f"{module.name}:{node.lineno} uses {node.attr}")
            if isinstance(node, ast.FunctionDef) and node.name == "__html__":
                problems.append(f"{module.name}:{node.lineno} defines __html__")
    assert problems == []

    from markupsafe import Markup

    from zincir._inspector._render import environment

    env = environment()
    assert env.autoescape is True
    assert env.from_string("{{ x }}").render(x=XSS_NAV) == str(Markup.escape(XSS_NAV))
    # Every filter hands back plain data, which Jinja2 then escapes.
    hostile = [XSS_NAV, XSS_SCRIPT, 12, None, q.Malformed(XSS_META)]
    for name in sorted(set(env.filters) - set(jinja2_builtin_filters())):
        for value in hostile:
            try:
                result = env.filters[name](value)
            except (TypeError, ValueError, AttributeError, KeyError):
                continue
            assert not hasattr(result, "__html__"), (name, value)


def jinja2_builtin_filters() -> set[str]:
    import jinja2

    return set(jinja2.Environment().filters)


# --------------------------------------------------------------------------- bounded reads


def traced(conn: q.Reader) -> list[str]:
    """Every statement the reader sends from now on (through its sqlite3 connection)."""
    assert isinstance(conn, SQLiteReadOnly)
    statements: list[str] = []
    conn._conn.set_trace_callback(statements.append)
    return statements


def test_steps_and_checkpoints_are_cut_in_sql(sample: tuple[sqlite3.Connection, Sample]) -> None:
    writer, ids = sample
    big = {"log": "z" * 300_000}
    writer.execute("UPDATE steps SET result = ? WHERE run_id = ?", (json.dumps(big), ids.main))
    writer.execute(
        "UPDATE checkpoints SET state = ?, verification = ? WHERE run_id = ?",
        (json.dumps(big),) * 2 + (ids.main,),
    )
    conn = q.open_readonly(ids.path)
    statements = traced(conn)
    step = q.list_steps(conn, ids.main, max_chars=100)[0]
    checkpoint = q.list_checkpoints(conn, ids.main, max_chars=100)[0]
    assert (len(step.result or ""), step.result_size, step.truncated) == (100, 300_011, True)
    assert (len(checkpoint.state), checkpoint.state_size, checkpoint.truncated) == (100, 300_011, True)
    assert len(checkpoint.verification or "") == 100
    assert "substr(result, 1, 100)" in statements[0]
    assert "substr(state, 1, 100)" in statements[1]
    assert "substr(verification, 1, 100)" in statements[1]
    whole = q.get_step(conn, ids.main, "fetch-dataset")
    assert whole is not None
    assert json.loads(whole.result or "") == big
    conn.close()


async def test_long_values_are_previews_with_a_link(sample: tuple[sqlite3.Connection, Sample]) -> None:
    writer, ids = sample
    big = {"log": "z" * 300_000}
    name = "fetch/data set?#%"
    writer.execute(
        "UPDATE steps SET result = ?, name = ? WHERE run_id = ? AND name = 'fetch-dataset'",
        (json.dumps(big), name, ids.main),
    )
    writer.execute(
        "UPDATE checkpoints SET state = ? WHERE run_id = ? AND round = 2", (json.dumps(big), ids.main)
    )
    page = await fetch(ids.path, f"/runs/{ids.main}?view=events")
    assert page.status == 200
    assert len(page.text) < 80_000
    assert page.text.count("Showing the first 8,192 of 300,011 characters.") == 1  # the step's result
    step_url = f"/api/runs/{ids.main}/steps/fetch%2Fdata%20set%3F%23%25"
    assert f'<a href="{step_url}">' in page.text
    # The checkpoints table links each round's page; the conversation's card shows the cut state.
    assert f'<a href="/runs/{ids.main}/checkpoints/2#state">' in page.text
    talk = await fetch(ids.path, f"/runs/{ids.main}")
    assert talk.text.count("Showing the first 8,192 of 300,011 characters.") == 2  # step, card
    assert f'<a href="/api/runs/{ids.main}/checkpoints/2">' in talk.text
    own = await fetch(ids.path, f"/runs/{ids.main}/checkpoints/2")
    assert "Showing the first 262,144 of 300,011 characters." in own.text
    step = (await fetch(ids.path, step_url)).json()["step"]
    assert (step["name"], step["result"]) == (name, big)
    checkpoint = (await fetch(ids.path, f"/api/runs/{ids.main}/checkpoints/2")).json()["checkpoint"]
    assert checkpoint["state"] == big
    assert checkpoint["verification"] == {"passed": True, "evidence": ["pytest exit 1"]}
    one = (await fetch(ids.path, f"/api/runs/{ids.main}")).json()
    cut = next(c for c in one["checkpoints"] if c["round"] == 2)
    assert cut["state"] == json.dumps(big)[:8192]
    assert cut["truncated"] == {"state": 300_011}
    assert cut["url"] == f"/api/runs/{ids.main}/checkpoints/2"
    assert "truncated" not in one["checkpoints"][0]
    assert one["steps"][0]["url"] == step_url
    for url in (
        f"/api/runs/{ids.main}/steps/nope",
        f"/api/runs/{ids.main}/checkpoints/9",
        f"/api/runs/{UNKNOWN}/steps/x",
    ):
        assert (await fetch(ids.path, url)).status == 404, url
    assert (await fetch(ids.path, f"/api/runs/{ids.main}/checkpoints/1e3")).status == 400


async def test_json_api_lists_are_capped_by_size(sample: tuple[sqlite3.Connection, Sample]) -> None:
    writer, ids = sample
    run = add_run(writer)
    chunk = "p" * 1_500_000
    for i in range(6):
        add_event(writer, run, "llm_call", {"content": chunk, "i": i})
    seen, after, pages = [], "-1", 0
    while True:
        data = (await fetch(ids.path, f"/api/runs/{run}/events?limit=1000&after={after}")).json()
        pages += 1
        assert 1 <= len(data["events"]) <= 2  # 4 MiB of payloads at most (and at least one event)
        seen += [e["payload"]["i"] for e in data["events"]]
        if not data["has_after"]:
            break
        after = data["next_after"]
    assert seen == list(range(6))
    assert pages == 3
    backward = (await fetch(ids.path, f"/api/runs/{run}/events?limit=1000&before=end")).json()
    assert [e["payload"]["i"] for e in backward["events"]] == [4, 5]
    assert backward["prev_before"] == 4


async def test_children_are_paged_by_keyset(sample: tuple[sqlite3.Connection, Sample]) -> None:
    writer, ids = sample
    parent = add_run(writer, role="parent")
    kids = [add_run(writer, parent_run_id=parent, created_at=T0 + i // 3) for i in range(230)]
    expected = [
        r[0]
        for r in writer.execute(
            "SELECT id FROM agent_runs WHERE parent_run_id = ? ORDER BY created_at, id", (parent,)
        )
    ]
    assert sorted(expected) == sorted(kids)
    shown, url = [], f"/runs/{parent}"
    for _ in range(3):
        page = await fetch(ids.path, url)
        assert "Children (230)" in page.text
        family = page.text[
            page.text.index('<section id="family">') : page.text.index('<section id="config">')
        ]
        shown += re.findall(r'<li><a href="/runs/([0-9a-f-]{36})">', family)
        more = re.search(r'<a href="([^"]*)">More children →</a>', family)
        if more is None:
            break
        url = more.group(1).replace("&amp;", "&").split("#")[0]
        assert "children_after=" in url
    assert shown == expected
    assert "⇤ First children" in family
    api = (await fetch(ids.path, f"/api/runs/{parent}")).json()
    assert api["run"]["children"] == expected[:100]
    nxt = (await fetch(ids.path, f"/api/runs/{parent}?children_after={api['children_next']}")).json()
    assert nxt["run"]["children"] == expected[100:200]


def test_family_steps_and_timers_read_in_index_order(sample: tuple[sqlite3.Connection, Sample]) -> None:
    _, ids = sample
    conn = q.open_readonly(ids.path)
    statements = traced(conn)
    with q.read_snapshot(conn):
        q.get_run(conn, ids.main, children_limit=1)
        q.get_run(conn, ids.main, children_limit=1, children_after=q.RunCursor(T0, UNKNOWN))
        q.list_steps(conn, ids.main, limit=10, max_chars=10)
        q.list_timers(conn, ids.main, limit=10)
    assert isinstance(conn, SQLiteReadOnly)
    conn._conn.set_trace_callback(None)
    plans = {}
    for sql in statements:
        if "FROM agent_runs WHERE parent_run_id" in sql or "FROM steps" in sql or "FROM timers" in sql:
            plans[sql] = " / ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))
    assert len(plans) == 5, list(plans)
    for sql, plan in plans.items():
        # Schema 8 dropped the steps' start-order index (a page in every step's commit): a run's
        # steps are found by its primary key and sorted; everything else is read in index order.
        if "FROM steps" not in sql:
            assert "TEMP B-TREE" not in plan, (sql, plan)
        assert "SCAN agent_runs" not in plan and "SCAN steps" not in plan and "SCAN timers" not in plan, plan
    joined = " ".join(plans.values())
    assert "idx_agent_runs_parent" in joined
    # Schema 17 made steps WITHOUT ROWID: its primary key is the table itself.
    assert "SEARCH steps USING PRIMARY KEY (run_id=?)" in joined
    assert "idx_timers_wake" in joined
    indexes = {
        r[0]: r[1]
        for r in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")
    }
    assert "(parent_run_id, created_at, id)" in indexes["idx_agent_runs_parent"]
    event_columns = [
        m.group(1) for sql in indexes.values() if (m := re.search(r"ON events \(([^)]*)\)", sql))
    ]
    assert event_columns and not any("type" in columns for columns in event_columns), event_columns
    conn.close()


def test_a_type_filter_scans_a_bounded_window(tmp_path: Path) -> None:
    writer = create_database(tmp_path / "scan.db")
    run = add_run(writer)
    total = 2 * q.SCAN_WINDOW + 5000
    rare = {q.SCAN_WINDOW + 7, 2 * q.SCAN_WINDOW + 100}
    writer.execute("BEGIN")
    writer.executemany(
        "INSERT INTO events (run_id, seq, type, payload, created_at) VALUES (?, ?, ?, '{}', 0)",
        [(run, seq, "checkpoint_proposed" if seq in rare else "llm_call") for seq in range(total)],
    )
    writer.execute("UPDATE agent_runs SET last_seq = ? WHERE id = ?", (total - 1, run))
    writer.execute("COMMIT")
    writer.close()
    conn = q.open_readonly(tmp_path / "scan.db")
    first = q.list_events(conn, run, type="checkpoint_proposed")
    assert first.events == ()
    assert (first.has_after, first.next_after, first.scan_edge) == (
        True,
        q.SCAN_WINDOW - 1,
        q.SCAN_WINDOW - 1,
    )
    second = q.list_events(conn, run, type="checkpoint_proposed", after=first.next_after)
    assert [e.seq for e in second.events] == [q.SCAN_WINDOW + 7]
    assert second.next_after == 2 * q.SCAN_WINDOW - 1
    third = q.list_events(conn, run, type="checkpoint_proposed", after=second.next_after)
    assert [e.seq for e in third.events] == [2 * q.SCAN_WINDOW + 100]
    assert (third.has_after, third.scan_edge) == (False, None)
    latest = q.list_events(conn, run, type="checkpoint_proposed", before=q.LATEST)
    assert [e.seq for e in latest.events] == [2 * q.SCAN_WINDOW + 100]
    assert latest.has_before and latest.prev_before == total - q.SCAN_WINDOW
    # The whole log, type filtered, through the cursors: nothing lost, nothing twice.
    found, after = [], None
    while True:
        page = q.list_events(conn, run, type="checkpoint_proposed", after=after, limit=1)
        found += [e.seq for e in page.events]
        if not page.has_after:
            break
        after = page.next_after
    assert found == sorted(rare)
    conn.close()


async def test_a_type_filter_offers_to_continue_scanning(tmp_path: Path) -> None:
    writer = create_database(tmp_path / "scan.db")
    run = add_run(writer, status="completed")
    writer.execute("BEGIN")
    writer.executemany(
        "INSERT INTO events (run_id, seq, type, payload, created_at) VALUES (?, ?, 'llm_call', '{}', 0)",
        [(run, seq) for seq in range(q.SCAN_WINDOW + 10)],
    )
    writer.execute("COMMIT")
    writer.close()
    page = await fetch(tmp_path / "scan.db", f"/runs/{run}?type=tool_call")
    assert page.status == 200
    assert "No events of this type among the events looked at" in page.text
    assert (
        f'<a href="/runs/{run}?type=tool_call&amp;after={q.SCAN_WINDOW - 1}#events">Continue scanning →</a>'
        in page.text
    )
    rest = await fetch(tmp_path / "scan.db", f"/runs/{run}?type=tool_call&after={q.SCAN_WINDOW - 1}")
    assert "No events of this type." in rest.text
    assert "Continue scanning" not in rest.text


# --------------------------------------------------------------------------- odd parameters


async def test_odd_cursor_parameters_are_answered(sample: tuple[sqlite3.Connection, Sample]) -> None:
    writer, ids = sample
    empty_page = await fetch(ids.path, f"/runs/{ids.long}?before=0")
    assert empty_page.status == 200
    assert f'href="/runs/{ids.long}?after=-1#events">Next →' in empty_page.text
    empty_api = (await fetch(ids.path, f"/api/runs/{ids.long}/events?before=0")).json()
    assert (empty_api["events"], empty_api["has_after"], empty_api["next_after"]) == ([], True, -1)
    huge = "9" * 19  # above 2**63 - 1
    for url in (
        f"/runs/{ids.long}?after={huge}",
        f"/runs/{ids.long}?before={huge}",
        f"/runs/{ids.long}?after={'9' * 40}",
        f"/api/runs/{ids.long}/events?before={huge}",
        f"/api/runs/{ids.long}/events/{huge}",
        f"/api/runs/{ids.long}/events/{'9' * 40}",
        f"/?before={huge}_{ids.main}",
        f"/api/runs?after={'9' * 25}_{ids.main}",
        f"/runs/{ids.main}?children_after={huge}_{ids.main}",
        f"/api/runs/{ids.main}/checkpoints/{huge}",
        f"/runs/{ids.long}?limit={huge}",
    ):
        page = await fetch(ids.path, url)
        assert page.status == 400, url
        assert "outside" in page.text or "malformed" in page.text or "not an integer" in page.text, url
        if not url.startswith("/api/"):
            assert '<div class="error">' in page.text
    top = 2**63 - 1
    assert (await fetch(ids.path, f"/api/runs/{ids.long}/events/{top}")).status == 404
    assert (await fetch(ids.path, f"/runs/{ids.long}?after={top}")).status == 200
    assert (await fetch(ids.path, f"/?before={top}_{ids.main}")).status == 200
    # A stored seq at the top of the range pages without overflowing.
    run = add_run(writer)
    for seq in (top - 1, top):
        writer.execute(
            "INSERT INTO events (run_id, seq, type, payload, created_at) VALUES (?, ?, 'llm_call', '{}', 0)",
            (run, seq),
        )
    for url in (
        f"/runs/{run}?after={top - 2}&limit=1",
        f"/runs/{run}?before=end&limit=1",
        f"/runs/{run}?after={top}",
    ):
        assert (await fetch(ids.path, url)).status == 200, url
    data = (await fetch(ids.path, f"/api/runs/{run}/events?after={top - 1}")).json()
    assert [e["seq"] for e in data["events"]] == [top]
    assert (data["has_before"], data["has_after"]) == (True, False)


# --------------------------------------------------------------------------- the front door


async def test_cross_site_requests_are_refused(ids: Sample) -> None:
    app = create_app(str(ids.path), HOST)
    client = app.test_client()
    for site, status in [
        ("cross-site", 403),
        ("Cross-Site", 403),
        ("same-origin", 200),
        ("none", 200),
        ("same-site", 200),
        (None, 200),
    ]:
        headers = {"Host": HOST} | ({} if site is None else {"Sec-Fetch-Site": site})
        for url in ("/", f"/api/runs/{ids.main}"):
            response = await client.get(url, headers=headers)
            assert response.status_code == status, (site, url)
            assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
            text = await response.get_data(as_text=True)
            if status == 403:
                assert '<div class="error">' in text
                assert "other sites" in text
                assert "worker-7f3a" not in text


class Recorder:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, message: Any) -> None:
        self.sent.append(message)

    async def receive(self) -> Any:
        return {"type": "websocket.connect"}


async def test_websocket_and_other_scopes_are_refused(ids: Sample) -> None:
    app = create_app(str(ids.path), HOST)
    for host in (HOST, "evil.example"):
        recorder = Recorder()
        scope = {
            "type": "websocket",
            "asgi": {"version": "3.0"},
            "path": "/",
            "raw_path": b"/",
            "query_string": b"",
            "root_path": "",
            "scheme": "ws",
            "headers": [(b"host", host.encode())],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 8787),
            "subprotocols": [],
            "extensions": {},
            "http_version": "1.1",
            "state": {},
        }
        await app(scope, recorder.receive, recorder.send)  # type: ignore[arg-type]
        assert recorder.sent == [{"type": "websocket.close", "code": 1008, "reason": "not served here"}]
    recorder = Recorder()
    await app({"type": "webtransport", "headers": []}, recorder.receive, recorder.send)  # type: ignore[arg-type]
    assert recorder.sent == []


def raw_request(url: str, request: bytes) -> bytes:
    parsed = url.removeprefix("http://").rstrip("/")
    address, _, port = parsed.rpartition(":")
    with socket.create_connection((address, int(port)), timeout=5) as conn:
        conn.sendall(request)
        data = b""
        with contextlib.suppress(TimeoutError):
            while chunk := conn.recv(65536):
                data += chunk
    return data


async def test_websocket_upgrade_over_real_sockets_is_refused(ids: Sample) -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            start = functools.partial(
                serve, str(ids.path), "127.0.0.1:0", shutdown_trigger=trio.sleep_forever
            )
            url = await nursery.start(start)
            host = url.removeprefix("http://").rstrip("/")
            for sent_host in (host, "evil.example"):
                upgrade = (
                    f"GET / HTTP/1.1\r\nHost: {sent_host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                    "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
                ).encode()
                answer = await trio.to_thread.run_sync(raw_request, url, upgrade)
                assert answer.startswith(b"HTTP/1.1 403"), answer[:200]
                assert ids.main.encode() not in answer
            nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- sidecar files


async def test_browsing_a_wal_database_without_sidecars(sample: tuple[sqlite3.Connection, Sample]) -> None:
    writer, ids = sample
    writer.close()  # the last connection checkpoints the WAL and deletes -wal and -shm
    wal, shm = Path(f"{ids.path}-wal"), Path(f"{ids.path}-shm")
    assert not wal.exists() and not shm.exists()
    assert (await fetch(ids.path, "/")).status == 200  # a file with no sidecars is readable
    before = hashlib.sha256(ids.path.read_bytes()).hexdigest()
    for url in every_url(ids):
        await fetch(ids.path, url)
    # Exactly this: the database file is byte-identical; SQLite's read-only WAL reader leaves
    # an empty -wal and a 32 KiB -shm (the shared-memory index) behind. Neither holds data.
    assert hashlib.sha256(ids.path.read_bytes()).hexdigest() == before
    assert wal.stat().st_size == 0
    assert shm.stat().st_size == 32768
    assert sorted(p.name for p in ids.path.parent.iterdir()) == sorted([ids.path.name, wal.name, shm.name])


async def test_an_unexpected_failure_is_a_styled_500(ids: Sample, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug <b>here</b>")

    monkeypatch.setattr(q, "list_runs", broken)
    page = await fetch(ids.path, "/")
    assert page.status == 500
    assert '<div class="error">' in page.text
    assert "<b>here" not in page.text and "Traceback" not in page.text
    assert page.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    api = await fetch(ids.path, "/api/runs")
    assert api.status == 500
    assert api.json()["error"]["status"] == 500
