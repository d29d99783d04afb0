"""What a new user and a security review of the inspector found (issue 31), each against a
real served inspector over HTTP or raw sockets, and in a real Chromium where what is drawn
matters; on both backends where the data path matters."""

from __future__ import annotations

import contextlib
import functools
import html
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import unicodedata
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import pytest
import trio
from click.testing import CliRunner, Result

import zincir
from zincir import _owner
from zincir import _queries as q
from zincir._cli import main
from zincir._inspector import CONTENT_SECURITY_POLICY, serve
from zincir._inspector._render import TEMPLATES
from zincir._inspector._views import BOUND_ARGS_CHARS
from zincir._json import encode

from . import cdp
from .helpers import rows
from .test_inspector_actions import (
    Answer,
    Server,
    _request,
    actions_server,
    forms,
    get,
    log_in,
    login_token,
    post,
)


@contextlib.asynccontextmanager
async def read_only_server(target: str) -> AsyncIterator[Server]:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(functools.partial(serve, target, "127.0.0.1:0", shutdown_trigger=stop.wait))
        try:
            yield Server(url, "")
        finally:
            stop.set()


def cli(*args: str) -> Result:
    env = {"ZINCIR_DATABASE_PATH": None, "ZINCIR_UI_ADDRESS": None}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def section(body: str, name: str) -> str:
    start = body.index(f'<section id="{name}">')
    return body[start : body.index("</section>", start)]


# -- item 4: a run's result is shown wherever the run is -----------------------------------------

RESULT = {"summary": "<b>fixed</b> the flaky test", "files": ["a.py", "b.py"], "passed": 12}


async def test_a_runs_result_is_shown_by_show_export_the_api_and_the_page(db: zincir.Database) -> None:
    async with zincir.open_run(db, role="coder") as run:
        await run.complete(RESULT)
    done = run.id
    async with zincir.open_run(db) as run:
        await run.complete()
    bare = run.id
    async with zincir.open_run(db) as run:
        live = run.id
    shown = await trio.to_thread.run_sync(cli, "show", "--db", db.path, done)
    assert shown.exit_code == 0, shown.output
    text = shown.stdout
    block = text[text.index("\nresult\n") :]
    assert '"summary": "<b>fixed</b> the flaky test"' in block and '"passed": 12' in block
    as_json = json.loads((await trio.to_thread.run_sync(cli, "show", "--db", db.path, done, "--json")).stdout)
    assert as_json["run"]["result"] == RESULT
    exported = (await trio.to_thread.run_sync(cli, "export", "--db", db.path, done)).stdout.splitlines()
    assert json.loads(exported[0])["kind"] == "run" and json.loads(exported[0])["result"] == RESULT
    none_shown = (await trio.to_thread.run_sync(cli, "show", "--db", db.path, bare)).stdout
    assert "result       none (completed without a result)" in none_shown
    assert "\nresult" not in (await trio.to_thread.run_sync(cli, "show", "--db", db.path, live)).stdout
    async with read_only_server(db.path) as server:
        api = json.loads((await get(server, f"/api/runs/{done}")).body)
        assert api["run"]["result"] == RESULT
        assert json.loads((await get(server, f"/api/runs/{bare}")).body)["run"]["result"] is None
        page = await get(server, f"/runs/{done}")
        shown_html = section(page.body, "result")
        assert "&lt;b&gt;fixed&lt;/b&gt; the flaky test" in shown_html and "<b>" not in shown_html
        assert "&#34;passed&#34;: 12" in shown_html
        assert "Completed without a result" in section((await get(server, f"/runs/{bare}")).body, "result")
        assert 'id="result"' not in (await get(server, f"/runs/{live}")).body


# -- item 7: the approve form shows every argument a decision binds -------------------------------

PADDED = {
    "amount": 900,
    "memo": "see below " + "x" * 5000,  # an early key (sorted) padded past the old 2,000 cut
    "pay_to": "DE89 3704 0044 0532 0130 00",
}


async def ask_approval(db: zincir.Database, calls: list[zincir.ToolCall]) -> str:
    async with zincir.open_run(db, role="payer") as run:
        await run.record_response("Paying.", calls, "tool_use")
        for call in calls:
            with trio.move_on_after(0.02):
                await run.wait_for_approval(call.id)  # the request is recorded; stop waiting
        return run.id


def blocks(body: str) -> list[str]:
    """The text of each ``<pre>`` block, unescaped."""
    return [html.unescape(m) for m in re.findall(r"<pre[^>]*>(.*?)</pre>", body, re.S)]


async def test_the_approve_form_shows_every_argument_it_binds(db: zincir.Database) -> None:
    huge = {"blob": "y" * (BOUND_ARGS_CHARS + 10), "pay_to": "attacker"}
    run_id = await ask_approval(
        db, [zincir.ToolCall("pay", "transfer", PADDED), zincir.ToolCall("big", "transfer", huge)]
    )
    async with actions_server(db.path) as server:
        cookie = await log_in(server)
        page = await get(server, f"/runs/{run_id}?refresh=off", Cookie=cookie)
        panel = section(page.body, "actions")
        shown = blocks(panel)
        assert json.loads(shown[0]) == PADDED  # every argument, whole, pay_to included
        assert len(shown) == 1  # the huge one is not shown: see below
        assert "<code>pay_to</code>" in panel  # and named above the block
        # Past the page's limit no form is offered: the person could not read what it binds.
        found = await forms(server, run_id, cookie)
        assert ("approve", "pay") in found and ("deny", "pay") in found
        assert ("approve", "big") not in found and ("deny", "big") not in found
        assert "too long to show here in full" in panel and "zincir approve" in panel
        # The conversation shows the whole arguments of a call that waits for a decision too.
        conversation = (await get(server, f"/runs/{run_id}", Cookie=cookie)).body
        block = re.search(r'data-call="pay".*?<pre>(.*?)</pre>', conversation, re.S)
        assert block is not None and json.loads(html.unescape(block[1])) == PADDED
        answer = await post(
            server,
            f"/runs/{run_id}/actions/approve",
            found[("approve", "pay")],
            Cookie=cookie,
            Origin=server.origin,
        )
        assert answer.status == 303, answer.body
    assert rows(db, "SELECT call_id, approved FROM approvals WHERE approved IS NOT NULL") == [("pay", 1)]


# -- item 9: logging in is a deliberate act; a HEAD or a GET spends nothing -----------------------


async def head(server: Server, path: str) -> Answer:
    return await trio.to_thread.run_sync(_request, server, "HEAD", path, {}, "")


async def test_only_the_login_pages_post_spends_the_token(db: zincir.Database) -> None:
    async with actions_server(db.path) as server:
        path = server.login_url.removeprefix(server.origin)
        token = login_token(server)
        # What a link unfurler or `curl -I` does: refused, and nothing spent.
        probe = await head(server, path)
        assert probe.status == 405 and probe.cookies == [] and "POST" in probe.headers["allow"]
        for _ in range(2):  # a GET shows the button, again and again
            page = await get(server, path)
            assert page.status == 200 and page.cookies == []
            assert '<form method="post" action="/login" class="login">' in page.body
        # The POST is checked like every write: Host and Origin, and the token itself.
        for headers, status in (
            ({}, 403),  # no Origin
            ({"Origin": "null"}, 403),
            ({"Origin": "http://evil.example"}, 403),
            ({"Origin": server.origin, "Host": "evil.example"}, 421),
            ({"Origin": server.origin, "Sec-Fetch-Site": "cross-site"}, 403),
        ):
            refused = await post(server, "/login", {"token": token}, **headers)
            assert (refused.status, refused.cookies) == (status, []), (headers, refused.body[:300])
        wrong = await post(server, "/login", {"token": token[:-1] + "x"}, Origin=server.origin)
        assert wrong.status == 403 and wrong.cookies == []
        cookie = await log_in(server)  # still unspent: the page, then its button's POST
        assert (await get(server, "/", Cookie=cookie)).body.count('action="/logout"') == 1
        # Now it is spent, for every method.
        assert (await get(server, path)).status == 403
        assert (await post(server, "/login", {"token": token}, Origin=server.origin)).status == 403
        assert (await head(server, path)).status == 405


# -- item 8: bidi and other format characters are shown escaped, on every page --------------------

SPOOFED = "acct \u202e7777-4321\u202c"  # Chromium draws it as "acct 1234-7777"
FORMAT_CHARS = "\u202a\u202b\u202d\u2066\u2067\u2068\u2069\u200e\u200f\u061c\u200b\u2060\ufeff\U000e0001"
BIDI_CALL = "call\u2067x\u2069"


def hidden_characters(text: str) -> set[str]:
    """The characters of a response a browser would not draw as themselves."""
    return {c for c in text if not (c.isprintable() or c in "\n\t" or unicodedata.category(c) == "Zs")}


# The values a form sends back unseen (a hidden field, a choice's value) are the values themselves.
_UNSEEN = re.compile(r'<input type="hidden" [^>]*>|<option value="[^"]*"')


def drawn(body: str) -> str:
    """A page without the values its forms send back unseen."""
    return _UNSEEN.sub("", body)


def test_only_unseen_form_fields_print_a_value_as_it_is() -> None:
    for template in TEMPLATES.rglob("*.html"):
        for line in template.read_text("utf-8").splitlines():
            for use in re.finditer(r"\|\s*form_value", line):
                before = line[: use.start()]
                field = before[before.rfind("<") :]
                assert field.startswith(('<input type="hidden" ', "<option value=")), (template.name, line)


async def spoofing_run(db: zincir.Database) -> str:
    """A run with format characters in every field a model, a tool or a person fills."""
    async with zincir.open_run(db, role=f"role {FORMAT_CHARS}", config={"goal": SPOOFED}) as run:
        calls = [
            zincir.ToolCall("read", "read_file", {"path": SPOOFED}),
            zincir.ToolCall("s1", "submit_checkpoint", {}),
        ]
        await run.record_response(f"text {SPOOFED}", calls, "tool_use")
        await run.record_tool_result("read", {"content": SPOOFED})
        await run.step(f"step {FORMAT_CHARS}", _echo, SPOOFED)
        await zincir.send_signal(db, run.id, f"sig{FORMAT_CHARS}", {"note": SPOOFED}, by=SPOOFED)
        await run.wait_for_signal("w", f"sig{FORMAT_CHARS}")
        state = {
            "completed": [SPOOFED],
            "remaining": [],
            "artifacts": [],
            "failed_attempts": [],
            "evidence": [],
        }
        await run.checkpoint("s1", state, _verdict)
        args = {"amount": 5, "memo": FORMAT_CHARS, "pay_to": SPOOFED}
        await run.record_response(
            "Paying.", [zincir.ToolCall(BIDI_CALL, f"pay{FORMAT_CHARS}", args)], "tool_use"
        )
        with trio.move_on_after(0.02):
            await run.wait_for_approval(BIDI_CALL)
        return run.id


async def _echo(value: str) -> str:
    return value


async def _verdict(_: object) -> zincir.Verification:
    return zincir.Verification(True, [f"evidence {SPOOFED}"])


async def test_format_characters_are_escaped_on_every_page_and_the_form_still_binds(
    db: zincir.Database,
) -> None:
    run_id = await spoofing_run(db)
    async with actions_server(db.path) as server:
        cookie = await log_in(server)
        pages = [
            "/", f"/?role={FORMAT_CHARS}", f"/runs/{run_id}?refresh=off", f"/runs/{run_id}?view=events",
            f"/runs/{run_id}/checkpoints/1", "/api/runs", f"/api/runs/{run_id}", f"/api/runs/{run_id}/events",
            f"/api/runs/{run_id}/events/1", f"/api/runs/{run_id}/checkpoints/1",
            f"/runs/{run_id}/checkpoints/{SPOOFED}",  # an error page quoting what it was given
        ]  # fmt: skip
        for path in pages:
            answer = await get(server, urllib.parse.quote(path, safe="/?=&"), Cookie=cookie)
            assert answer.status in (200, 400), (path, answer.status)
            assert hidden_characters(drawn(answer.body)) == set(), path
        page = (await get(server, f"/runs/{run_id}?refresh=off", Cookie=cookie)).body
        [shown] = blocks(section(page, "actions"))
        assert '"pay_to": "acct \\u202e7777-4321\\u202c"' in shown  # visibly escaped, still JSON
        assert json.loads(shown)["pay_to"] == SPOOFED
        assert "text acct \\u202e7777-4321\\u202c" in html.unescape(page)  # the model's own words
        for api in (f"/api/runs/{run_id}", f"/api/runs/{run_id}/events"):
            assert SPOOFED in (await get(server, api)).body.encode().decode("unicode_escape")
            assert json.loads((await get(server, api)).body)  # the same JSON, escapes and all
        events = json.loads((await get(server, f"/api/runs/{run_id}/events")).body)["events"]
        assert events[1]["payload"]["content"] == f"text {SPOOFED}"
        # The form sends the call id itself back, not its escaped picture: the decision binds.
        found = await forms(server, run_id, cookie)
        assert found[("approve", BIDI_CALL)]["call_id"] == BIDI_CALL
        answer = await post(
            server,
            f"/runs/{run_id}/actions/approve",
            found[("approve", BIDI_CALL)],
            Cookie=cookie,
            Origin=server.origin,
        )
        assert answer.status == 303, answer.body
    assert rows(db, "SELECT call_id, approved FROM approvals") == [(BIDI_CALL, 1)]


@pytest.mark.sqlite_only  # what Chromium draws does not depend on the backend
@pytest.mark.skipif(not cdp.CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")
async def test_chromium_shows_the_approved_text_not_a_reordered_picture(
    db: zincir.Database, tmp_path: Path
) -> None:
    run_id = await spoofing_run(db)
    async with actions_server(db.path) as server, cdp.chromium(tmp_path / "profile") as browser:
        page = await browser.new_page()
        await page.goto(server.login_url)
        await page.evaluate("document.querySelector('form.login button').click()")
        await page.wait_for("location.pathname === '/' && document.readyState === 'complete'")
        await page.goto(f"{server.url}runs/{run_id}?refresh=off")
        drawn = await page.evaluate("document.querySelector('#actions table pre').innerText")
        assert '"pay_to": "acct \\u202e7777-4321\\u202c"' in drawn, drawn
        seen = await page.evaluate("document.body.innerText")
        assert hidden_characters(seen) == set()
        assert "text acct \\u202e7777-4321\\u202c" in seen
        for url in (
            server.url,
            f"{server.url}runs/{run_id}?view=events",
            f"{server.url}runs/{run_id}/checkpoints/1",
        ):
            await page.goto(url)
            assert hidden_characters(await page.evaluate("document.body.innerText")) == set(), url


# -- item 10: Hypercorn's own answers carry the headers; a doubled Sec-Fetch-Site is hostile ------


def exchange(server: Server, data: bytes, *, upto: bytes = b"\r\n\r\n") -> bytes:
    """Send raw bytes; read until ``upto`` arrives (or the server closes)."""
    address, _, port = server.host.rpartition(":")
    with socket.create_connection((address, int(port)), timeout=10) as conn:
        conn.sendall(data)
        answer = b""
        while upto not in answer and (chunk := conn.recv(65536)):
            answer += chunk
    return answer


def head_fields(answer: bytes) -> list[tuple[str, str]]:
    lines = answer.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")[1:]
    return [
        (name.strip().lower(), value.strip()) for name, _, value in (line.partition(":") for line in lines)
    ]


def assert_secured(fields: list[tuple[str, str]], referrer: str = "no-referrer") -> None:
    expected = {
        "content-security-policy": CONTENT_SECURITY_POLICY,
        "x-content-type-options": "nosniff",
        "referrer-policy": referrer,
        "x-frame-options": "DENY",
        "cross-origin-opener-policy": "same-origin",
        "cross-origin-resource-policy": "same-origin",
    }
    for name, value in expected.items():
        assert [v for n, v in fields if n == name] == [value], (name, fields)  # exactly once


def upgraded_response(server: Server) -> tuple[bytes, list[tuple[str, str]]]:
    """An h2c upgrade of ``GET /``: the 101, and the headers of the HTTP/2 answer that follows."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    settings = client.initiate_upgrade_connection().decode()
    address, _, port = server.host.rpartition(":")
    with socket.create_connection((address, int(port)), timeout=10) as conn:
        conn.sendall(
            f"GET / HTTP/1.1\r\nHost: {server.host}\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            f"Upgrade: h2c\r\nHTTP2-Settings: {settings}\r\n\r\n".encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += conn.recv(65536)
        switching, _, frames = answer.partition(b"\r\n\r\n")
        conn.sendall(client.data_to_send())
        while True:
            for event in client.receive_data(frames):
                if isinstance(event, h2.events.ResponseReceived):
                    fields = [(bytes(n).decode().lower(), bytes(v).decode()) for n, v in event.headers]
                    return switching + b"\r\n\r\n", fields
            conn.sendall(client.data_to_send())
            frames = conn.recv(65536)
            assert frames, "the server closed the HTTP/2 connection"


async def test_hypercorns_own_answers_carry_the_security_headers(db: zincir.Database) -> None:
    async with zincir.open_run(db):
        pass
    async with read_only_server(db.path) as server:
        host = server.host
        cases = {
            "malformed request line": (b"NOT HTTP AT ALL\r\n\r\n", b"HTTP/1.1 400"),
            "headers too large": (  # never ends: h11 gives up past 16 KiB
                f"GET / HTTP/1.1\r\nHost: {host}\r\nX-Pad: {'a' * 100_000}".encode(),
                b"HTTP/1.1 431",
            ),
            "websocket": (
                f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode(),
                b"HTTP/1.1 403",
            ),
            "a page": (f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode(), b"HTTP/1.1 200"),
        }
        for what, (request, status) in cases.items():
            answer = await trio.to_thread.run_sync(exchange, server, request)
            assert answer.startswith(status), (what, answer[:200])
            assert_secured(head_fields(answer))
        switching, upgraded = await trio.to_thread.run_sync(upgraded_response, server)
        assert switching.startswith(b"HTTP/1.1 101")
        assert_secured(head_fields(switching))
        assert ("content-type", "text/html; charset=utf-8") in upgraded
        assert_secured(upgraded)  # the page served over HTTP/2 after the upgrade
    async with actions_server(db.path) as server:  # its Referrer-Policy, on Hypercorn's answers too
        answer = await trio.to_thread.run_sync(exchange, server, b"NOT HTTP AT ALL\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400")
        assert_secured(head_fields(answer), referrer="same-origin")


async def test_a_repeated_or_listed_sec_fetch_site_is_refused(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        pass
    async with read_only_server(db.path) as server:

        def status(*sites: str) -> bytes:
            fields = "".join(f"Sec-Fetch-Site: {site}\r\n" for site in sites)
            request = (
                f"GET /runs/{run.id} HTTP/1.1\r\nHost: {server.host}\r\n{fields}Connection: close\r\n\r\n"
            )
            return exchange(server, request.encode())[:12]

        for sites, expected in (
            ((), b"HTTP/1.1 200"),
            (("same-origin",), b"HTTP/1.1 200"),
            (("none",), b"HTTP/1.1 200"),
            (("cross-site",), b"HTTP/1.1 403"),
            (("same-origin", "cross-site"), b"HTTP/1.1 403"),  # was read as absent
            (("cross-site", "same-origin"), b"HTTP/1.1 403"),
            (("same-origin", "same-origin"), b"HTTP/1.1 403"),
            (("same-origin, cross-site",), b"HTTP/1.1 403"),
        ):
            assert await trio.to_thread.run_sync(lambda s=sites: status(*s)) == expected, sites


# -- item 10: --allow-actions serves on a loopback address of its own -----------------------------


@contextlib.asynccontextmanager
async def capturing_server() -> AsyncIterator[tuple[int, list[bytes]]]:
    """Another local server on 127.0.0.1: it records each request's head and answers "ok"."""
    seen: list[bytes] = []

    async def answer(stream: trio.SocketStream) -> None:
        head = b""
        while b"\r\n\r\n" not in head and (chunk := await stream.receive_some(65536)):
            head += chunk
        seen.append(head)
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, answer, 0, host="127.0.0.1"))
        yield listeners[0].socket.getsockname()[1], seen
        nursery.cancel_scope.cancel()


def cookie_names(head: bytes) -> list[str]:
    lines = head.decode("latin-1").split("\r\n")
    cookies = [line.partition(":")[2] for line in lines if line.lower().startswith("cookie:")]
    return [part.strip().partition("=")[0] for line in cookies for part in line.split(";")]


async def test_allow_actions_serves_on_a_random_loopback_address_by_default(db: zincir.Database) -> None:
    async with (
        actions_server(db.path, address=None) as first,
        actions_server(db.path, address=None) as second,
    ):
        ips = [server.host.rpartition(":")[0] for server in (first, second)]
        for ip in ips:
            assert ipaddress.ip_address(ip) in ipaddress.ip_network("127.0.0.0/8") and ip != "127.0.0.1"
        assert ips[0] != ips[1]  # 1 in 16 million to fail by chance
        await log_in(first)  # it works there as anywhere
    async with actions_server(db.path, address="127.0.0.1:0") as explicit:  # --address still holds
        assert explicit.host.startswith("127.0.0.1:")


@pytest.mark.sqlite_only  # what a browser sends where does not depend on the backend
@pytest.mark.skipif(not cdp.CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")
async def test_another_local_server_does_not_receive_the_session_cookie(
    db: zincir.Database, tmp_path: Path
) -> None:
    async with capturing_server() as (port, seen):
        sent = {}
        for name, address in (("own address", None), ("on 127.0.0.1", "127.0.0.1:0")):
            async with (
                actions_server(db.path, address=address) as server,
                cdp.chromium(tmp_path / name.replace(" ", "-")) as browser,
            ):
                page = await browser.new_page()
                await page.goto(server.login_url)
                await page.evaluate("document.querySelector('form.login button').click()")
                await page.wait_for("document.querySelector('form.logout') !== null")
                seen.clear()
                await page.goto(f"http://127.0.0.1:{port}/")
                [head] = [h for h in seen if h.startswith(b"GET / ")]  # (then /favicon.ico, maybe)
                sent[name] = [c for c in cookie_names(head) if c.startswith("zincir_session_")]
        # The oracle: an inspector on 127.0.0.1 does leak its cookie to the other server there.
        assert len(sent["on 127.0.0.1"]) == 1
        assert sent["own address"] == []


def test_zincir_ui_allow_actions_prints_an_address_of_its_own(tmp_path: Path) -> None:
    target = str(tmp_path / "zincir.db")
    trio.run(_one_run, target)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZINCIR_")}
    command = [sys.executable, "-m", "zincir", "ui", "--db", target, "--allow-actions", "--as", "ada"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout is not None
        first, second = process.stdout.readline(), process.stdout.readline()
        found = re.search(
            r" at http://(127\.[0-9]+\.[0-9]+\.[0-9]+):([0-9]+)/, actions allowed as ada", first
        )
        assert found is not None and found[1] != "127.0.0.1", first
        assert second.startswith(
            f"zincir inspector: log in once with http://{found[1]}:{found[2]}/login?token="
        )
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0, err
    assert "receive the session cookie" not in out


async def _one_run(target: str) -> None:
    async with zincir.open_database(target) as db, zincir.open_run(db):
        pass


# -- what an agent needs: log order, interrupted verifications, probes' finds, whole evidence ----


async def left_by_a_dead_owner(db: zincir.Database, run_id: str) -> None:
    """Make the run look held, for a minute more, by a process of this host that is gone (what
    a SIGKILLed owner leaves): the next open_run takes it over at once, and logs it."""
    gone = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    started = _owner.process_start(gone.pid)  # its real start: processes started before it are no child
    gone.kill()
    gone.communicate()  # reaped: its PID names no process now
    now = db.clock()
    rows(
        db,
        "UPDATE agent_runs SET lease_owner = 'killed', lease_epoch = lease_epoch + 1, lease_expires_at = ?,"
        " lease_host = ?, lease_pid = ?, lease_process_start = ? WHERE id = ?",
        (now + 60_000, _owner.this_process().host, gone.pid, started, run_id),
    )


async def record_found_by_a_probe(run: zincir.Run, call_id: str, content: object) -> None:
    """Record a tool result as the write path records one a reconcile probe found: the same
    payload, with ``"reconciled": true`` (zincir's own encoding: compact, sorted keys)."""
    payload = encode(
        {"call_id": call_id, "content": content, "reconciled": True}, what="a result", limit=1 << 20
    )
    await run._write(run._store.record_tool_result, call_id, payload)


async def test_a_result_after_a_takeover_is_shown_after_it(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with zincir.open_run(db, role="coder") as run:
        calls = [zincir.ToolCall("commit", "git_commit", {"message": "fix"})]
        await run.record_response("Committing.", calls, "tool_use")
        await run.start_tool("commit")
        await run.record_response("And reading.", [zincir.ToolCall("read", "read_file", {})], "tool_use")
        await run.record_tool_result("read", "contents")  # answered in its own turn: folded
        run_id = run.id
    await left_by_a_dead_owner(db, run_id)
    async with zincir.open_run(db, run_id) as run:  # taken over, logged
        await record_found_by_a_probe(run, "commit", {"sha": "abc123"})
    kinds = {e.seq: e.type.value for e in await db.events(run_id)}
    [response] = [s for s, k in kinds.items() if k == "llm_call"][:1]
    [takeover] = [s for s, k in kinds.items() if k == "lease_taken_over"]
    [result] = [s for s, k in kinds.items() if k == "tool_result" and s > takeover]
    async with read_only_server(db.path) as server:
        page = (await get(server, f"/runs/{run_id}")).body
        order = re.findall(r'<li class="entry [^"]*" id="c([0-9]+)" data-kind="([a-z-]+)"', page)
        shown = [(int(seq), kind) for seq, kind in order]
        assert [k for s, k in shown if s in (response, takeover, result)] == ["response", "restart", "result"]
        call = re.search(r'data-call="commit".*?</details>(.*?)</li>', page, re.S)
        assert call is not None and '<div class="result">' not in call[1]  # not folded back
        assert f'href="/runs/{run_id}?after={result - 1}#e{result}">#{result}</a>' in call[1]
        assert "result found by a probe" in page
        assert re.search(rf'id="c{result}" data-kind="result">.*?found by a probe', page, re.S)
        read = re.search(r'data-call="read".*?</li>', page, re.S)
        assert read is not None and '<div class="result">' in read[0]  # no restart between: folded
        assert "Its result was recorded after a restart, at <a" in call[1]
        # The same when the result is on a later page: the restart is looked up beyond it...
        first = (await get(server, f"/runs/{run_id}?after={response - 1}&limit=1")).body
        assert f'href="/runs/{run_id}?after={result - 1}#e{result}">#{result}</a>' in first
        assert "recorded after a restart" in first
        # ...by a bounded scan: past it, a result is not paired either, and the page says why.
        monkeypatch.setattr(q, "SCAN_WINDOW", 1)
        far = (await get(server, f"/runs/{run_id}?after={response - 1}&limit=1")).body
        assert "Its result was recorded further down the log, at <a" in far
    shown_cli = await trio.to_thread.run_sync(cli, "show", "--db", db.path, run_id)
    [line] = [line for line in shown_cli.stdout.splitlines() if line.strip().startswith("commit")]
    assert "done, found by a probe" in line
    data = json.loads((await trio.to_thread.run_sync(cli, "show", "--db", db.path, run_id, "--json")).stdout)
    assert {c["call_id"]: c["reconciled"] for c in data["tool_calls"]} == {"commit": True, "read": False}


async def test_a_candidate_under_verification_is_not_called_interrupted(db: zincir.Database) -> None:
    verifying, release = trio.Event(), trio.Event()

    async def slow(_: object) -> zincir.Verification:
        verifying.set()
        await release.wait()
        return zincir.Verification(True, ["ok"])

    async with read_only_server(db.path) as server, zincir.open_run(db) as run:
        await run.record_response("", [zincir.ToolCall("s1", zincir.SUBMIT_CHECKPOINT, {})], "tool_use")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run.checkpoint, "s1", zincir.CheckpointState(completed=["a"]), slow)
            await verifying.wait()
            page = (await get(server, f"/runs/{run.id}")).body
            assert 'data-call="s1" data-state="verifying"' in page
            assert "checkpoint round 1 proposed, being verified" in page and "never started" not in page
            assert "may be verifying it now" in (await get(server, f"/runs/{run.id}/checkpoints/1")).body
            shown = await trio.to_thread.run_sync(cli, "show", "--db", db.path, run.id)
            assert "checkpoint candidate, undecided" in shown.stdout
            release.set()
        assert 'data-state="done"' in (await get(server, f"/runs/{run.id}")).body


async def test_zincir_checkpoints_prints_the_whole_evidence(db: zincir.Database) -> None:
    lines = [f"test_{i}: passed " + "." * 200 for i in range(3)]

    async def verify(_: object) -> zincir.Verification:
        return zincir.Verification(True, lines)

    async with zincir.open_run(db) as run:
        await run.record_response("", [zincir.ToolCall("s1", zincir.SUBMIT_CHECKPOINT, {})], "tool_use")
        await run.checkpoint("s1", zincir.CheckpointState(completed=["a"]), verify)
    for command in ("checkpoints", "show"):
        output = (await trio.to_thread.run_sync(cli, command, "--db", db.path, run.id)).stdout
        for line in lines:
            assert f'"{line}"' in output, command  # whole, never cut to the table's width
