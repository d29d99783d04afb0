"""``zincir ui --allow-actions``: guarded outsider writes from the inspector, over real HTTP
against the real server (both backends), and one flow in a real headless Chromium."""

from __future__ import annotations

import base64
import contextlib
import functools
import html
import http.client
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import zincir
from zincir._inspector import serve
from zincir._inspector._actions import ACTIONS, MAX_FORM_BYTES, serve_with_actions

from . import cdp
from .helpers import dump, reap, rows

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"

# -- the scene: a run with two requested approvals, and a run backing off ---------------------


@attrs.frozen
class Scene:
    asking: str  # approvals requested for c1 and c2; pending, due now
    backing_off: str  # released after a failed attempt, due in an hour


async def build_scene(db: zincir.Database) -> Scene:
    async with zincir.open_run(db, role="refunder") as run:
        calls = [
            zincir.ToolCall("c1", "refund", {"amount": 5}),
            zincir.ToolCall("c2", "refund", {"amount": 900}),
        ]
        await run.record_response("Two refunds.", calls, "tool_use")
        for call_id in ("c1", "c2"):
            with trio.move_on_after(0.02):
                await run.wait_for_approval(call_id)  # the request is recorded; stop waiting
        asking = run.id
    async with zincir.open_run(db, role="flaky") as run:
        flaky = run.id
    rows(
        db,
        "UPDATE agent_runs SET status = 'running', attempts = 1, next_attempt_at = next_attempt_at + 3600000"
        " WHERE id = ?",
        (flaky,),
    )
    return Scene(asking, flaky)


def trail(db: zincir.Database) -> list[tuple[str, str, str | None]]:
    return [tuple(r) for r in rows(db, "SELECT run_id, action, done_by FROM outsider_actions ORDER BY id")]  # type: ignore[misc]


# -- a real server, and a plain HTTP client --------------------------------------------------


@attrs.frozen
class Server:
    url: str  # http://127.0.0.1:PORT/
    login_url: str

    @property
    def host(self) -> str:
        return self.url.removeprefix("http://").rstrip("/")

    @property
    def origin(self) -> str:
        return self.url.rstrip("/")


@contextlib.asynccontextmanager
async def actions_server(
    target: str, actor: str = "ada", address: str | None = "127.0.0.1:0"
) -> AsyncIterator[Server]:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        start = functools.partial(
            serve_with_actions, target, address, actor=actor, shutdown_trigger=stop.wait
        )
        url, login_url = await nursery.start(start)
        try:
            yield Server(url, login_url)
        finally:
            stop.set()


@attrs.frozen
class Answer:
    status: int
    headers: dict[str, str]
    cookies: list[str]
    body: str


def _request(server: Server, method: str, path: str, headers: dict[str, str | None], body: str) -> Answer:
    ip, _, port = server.host.rpartition(":")
    conn = http.client.HTTPConnection(ip, int(port), timeout=10)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        sent = {"Host": server.host, **headers}
        for name, value in sent.items():
            if value is not None:
                conn.putheader(name, value)
        if method == "POST":
            conn.putheader("Content-Type", "application/x-www-form-urlencoded")
            conn.putheader("Content-Length", str(len(body.encode())))
        conn.endheaders(body.encode() if method == "POST" else None)
        response = conn.getresponse()
        cookies = [v for k, v in response.getheaders() if k.lower() == "set-cookie"]
        found = {k.lower(): v for k, v in response.getheaders()}
        return Answer(response.status, found, cookies, response.read().decode())
    finally:
        conn.close()


async def get(server: Server, path: str, **headers: str | None) -> Answer:
    return await trio.to_thread.run_sync(_request, server, "GET", path, headers, "")


async def post(server: Server, path: str, form: dict[str, str], **headers: str | None) -> Answer:
    return await trio.to_thread.run_sync(
        _request, server, "POST", path, headers, urllib.parse.urlencode(form)
    )


def login_token(server: Server) -> str:
    query = urllib.parse.urlsplit(server.login_url).query
    [token] = urllib.parse.parse_qs(query)["token"]
    return token


async def log_in(server: Server) -> str:
    """The Cookie header of a session got through the one-time login URL: its page, then the
    POST its button makes."""
    page = await get(server, server.login_url.removeprefix(server.url.rstrip("/")))
    assert page.status == 200 and page.cookies == [], page.body
    assert f'<input type="hidden" name="token" value="{login_token(server)}">' in page.body
    answer = await post(server, "/login", {"token": login_token(server)}, Origin=server.origin)
    assert answer.status == 303 and answer.headers["location"] == "/", answer.body
    [cookie] = answer.cookies
    parts = [p.strip() for p in cookie.split(";")]
    assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= set(parts), cookie
    assert not any(p.lower().startswith(("expires", "max-age", "domain")) for p in parts)
    return parts[0]


_FORM = re.compile(r'<form method="post" action="([^"]+)" class="action-([a-z]+)">(.*?)</form>', re.S)


async def forms(server: Server, run_id: str, cookie: str) -> dict[tuple[str, str], dict[str, str]]:
    """The action forms of a run page: (action, call id or "") -> the form's hidden fields."""
    page = await get(server, f"/runs/{run_id}?refresh=off", Cookie=cookie)
    assert page.status == 200
    found = {}
    for action_url, action, inner in _FORM.findall(page.body):
        assert html.unescape(action_url) == f"/runs/{run_id}/actions/{action}"
        fields = re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)">', inner)
        hidden = {name: html.unescape(value) for name, value in fields}
        found[(action, hidden.get("call_id", ""))] = hidden
    return found


# -- every action, after login ---------------------------------------------------------------


async def test_every_action_works_after_login_and_is_recorded_with_who(db: zincir.Database) -> None:
    scene = await build_scene(db)
    async with actions_server(db.path, actor="ada <ops>") as server:
        front = await get(server, "/")
        assert front.status == 200 and "actions allowed, as ada &lt;ops&gt;" in front.body
        logged_out = await get(server, f"/runs/{scene.asking}?refresh=off")
        assert "one-time login URL" in logged_out.body and 'name="csrf"' not in logged_out.body
        cookie = await log_in(server)
        page = await get(server, f"/runs/{scene.asking}", Cookie=cookie)
        assert "pause reloading to act on this run" in page.body  # a reload would clear a form
        assert page.headers["referrer-policy"] == "same-origin"  # so that forms send Origin
        asking = await forms(server, scene.asking, cookie)
        assert set(asking) == {
            ("approve", "c1"), ("deny", "c1"), ("approve", "c2"), ("deny", "c2"),
            ("signal", ""), ("budget", ""), ("cancel", ""),
        }  # fmt: skip
        flaky = await forms(server, scene.backing_off, cookie)
        assert ("retry", "") in flaky and ("approve", "c1") not in flaky

        async def act(
            run_id: str, which: tuple[str, str], found: dict[Any, dict[str, str]], /, **fields: str
        ) -> str:
            answer = await post(
                server,
                f"/runs/{run_id}/actions/{which[0]}",
                {**found[which], **fields},
                Cookie=cookie,
                Origin=server.origin,
            )
            assert answer.status == 303, answer.body
            location = answer.headers["location"]
            assert location.startswith(f"/runs/{run_id}?refresh=off&done=")
            shown = await get(server, location.partition("#")[0], Cookie=cookie)
            return re.search(r'<p class="done" role="status">([^<]*)</p>', shown.body)[1]  # type: ignore[index]

        assert (await act(scene.asking, ("approve", "c1"), asking, reason="small")).startswith("Approved.")
        assert (await act(scene.asking, ("deny", "c2"), asking, reason="<b>too much</b>")).startswith(
            "Denied."
        )
        said = await act(scene.asking, ("signal", ""), asking, signal="go", payload='{"n": 1}', key="k")
        assert said.startswith("Signal sent")
        assert (await act(scene.asking, ("budget", ""), asking, tokens="5000", cost="1.5")).startswith(
            "Budget"
        )
        assert (await act(scene.backing_off, ("retry", ""), flaky)).startswith("Retried now")
        assert (await act(scene.backing_off, ("retry", ""), flaky)).startswith("Nothing to cut short")
        assert (await act(scene.asking, ("cancel", ""), asking, reason="wrong goal")).startswith("Cancelled")
        after = await get(server, f"/runs/{scene.asking}?refresh=off", Cookie=cookie)
        assert "This run has ended: no action applies" in after.body
        audit = after.body.partition('<section id="audit">')[2].partition("</section>")[0]
        shown = re.findall(r"<tr><td>.*?</td><td>.*?>([a-z_]+)</span></td><td>([^<]*)</td>", audit)
        assert shown == [
            (a, "ada &lt;ops&gt;") for a in ("cancel", "raise_budget", "signal", "deny", "approve")
        ]
        api = await get(server, f"/api/runs/{scene.asking}")
        assert [(a["action"], a["by"]) for a in json.loads(api.body)["outsider_actions"]] == [
            (a, "ada <ops>") for a in ("cancel", "raise_budget", "signal", "deny", "approve")
        ]
    who = "ada <ops>"
    assert trail(db) == [
        (scene.asking, "approve", who), (scene.asking, "deny", who), (scene.asking, "signal", who),
        (scene.asking, "raise_budget", who), (scene.backing_off, "retry_now", who),
        (scene.asking, "cancel", who),
    ]  # fmt: skip
    decided = rows(db, "SELECT call_id, approved, decided_by, reason FROM approvals ORDER BY call_id")
    assert decided == [("c1", 1, who, "small"), ("c2", 0, who, "<b>too much</b>")]
    assert rows(db, "SELECT topic, payload, key FROM signals") == [("go", '{"n":1}', "k")]
    assert rows(db, "SELECT max_tokens, max_cost FROM budgets") == [(5000, 1.5)]
    [(due, now_ish)] = rows(
        db, "SELECT next_attempt_at, created_at FROM agent_runs WHERE id = ?", (scene.backing_off,)
    )
    assert due - now_ish < 3_600_000  # the hour's backoff was cut short
    state = await db.state(scene.asking)
    assert state.run.status is zincir.RunStatus.CANCELLED
    assert state.events[-1].payload["reason"] == "wrong goal"


_LOGOUT = re.compile(
    r'<form method="post" action="/logout" class="logout"><input type="hidden" name="csrf" value="([^"]+)">'
)


async def test_logging_out_ends_the_session_for_good(db: zincir.Database) -> None:
    scene = await build_scene(db)
    async with actions_server(db.path) as server:
        cookie = await log_in(server)
        token = _LOGOUT.search((await get(server, "/", Cookie=cookie)).body)[1]  # type: ignore[index]
        cancel = (await forms(server, scene.asking, cookie))[("cancel", "")]
        headers = {"Cookie": cookie, "Origin": server.origin}
        for refused in (
            await post(server, "/logout", {}, **headers),
            await post(server, "/logout", {"csrf": cancel["csrf"]}, **headers),  # another form's token
            await post(server, "/logout", {"csrf": token}, Cookie=cookie, Origin="http://evil.example"),
            await post(server, "/logout", {"csrf": token}, Origin=server.origin),  # no session
        ):
            assert refused.status == 403, refused.body
        assert _LOGOUT.search((await get(server, "/", Cookie=cookie)).body)  # still logged in
        out = await post(server, "/logout", {"csrf": token}, **headers)
        assert out.status == 303 and out.headers["location"] == "/"
        [expired] = out.cookies
        assert expired.startswith(cookie.partition("=")[0] + "=;") and "Max-Age=0" in expired
        before = dump(db)
        again = await post(server, f"/runs/{scene.asking}/actions/cancel", cancel, **headers)
        assert again.status == 403 and "Log in first" in again.body
        assert dump(db) == before
        assert not _LOGOUT.search((await get(server, "/", Cookie=cookie)).body)
        relogin = await get(server, server.login_url.removeprefix(server.url.rstrip("/")))
        assert relogin.status == 403 and "used already" in relogin.body


async def test_a_write_zincir_refuses_is_a_409_and_bad_input_a_400(db: zincir.Database) -> None:
    scene = await build_scene(db)
    async with actions_server(db.path) as server:
        cookie = await log_in(server)
        found = await forms(server, scene.asking, cookie)
        headers = {"Cookie": cookie, "Origin": server.origin}
        base = f"/runs/{scene.asking}/actions"
        assert (await post(server, f"{base}/approve", found[("approve", "c1")], **headers)).status == 303
        before = dump(db)
        conflict = await post(server, f"{base}/deny", found[("deny", "c1")], **headers)
        assert conflict.status == 409 and "already approved by ada" in conflict.body
        for fields, message in (
            ({"payload": "{not json"}, "not JSON"),
            ({"signal": "", "payload": "1"}, "signal name"),
            ({"payload": "[" * 100_000 + "]" * 100_000}, "deeper than 100 levels"),  # not a 500
        ):
            answer = await post(server, f"{base}/signal", {**found[("signal", "")], **fields}, **headers)
            assert answer.status == 400 and message in answer.body, answer.body
        for fields in ({}, {"tokens": "-5"}, {"cost": "nan"}, {"tokens": "1e3"}):
            answer = await post(server, f"{base}/budget", {**found[("budget", "")], **fields}, **headers)
            assert answer.status == 400, (fields, answer.body)
        hostile = await post(
            server,
            f"{base}/signal",
            {**found[("signal", "")], "signal": "<script>x</script>" * 20},
            **headers,
        )
        assert hostile.status == 400 and "<script>" not in hostile.body
        too_big = {**found[("signal", "")], "payload": '"' + "x" * MAX_FORM_BYTES + '"'}
        assert (await post(server, f"{base}/signal", too_big, **headers)).status == 413
        assert dump(db) == before


async def test_a_decision_is_bound_to_the_arguments_the_page_showed(db: zincir.Database) -> None:
    scene = await build_scene(db)
    async with actions_server(db.path) as server:
        cookie = await log_in(server)
        page = await get(server, f"/runs/{scene.asking}?refresh=off", Cookie=cookie)
        found = await forms(server, scene.asking, cookie)
        shown = found[("approve", "c2")]["args_hash"]
        assert shown and shown in page.body  # the hash is on the page, beside the arguments
        headers = {"Cookie": cookie, "Origin": server.origin}
        base = f"/runs/{scene.asking}/actions"
        before = dump(db)
        other = await post(
            server, f"{base}/approve", {**found[("approve", "c2")], "args_hash": "0" * 64}, **headers
        )
        assert other.status == 409 and "hash" in other.body, other.body
        missing = await post(
            server, f"{base}/approve", {**found[("approve", "c2")], "args_hash": ""}, **headers
        )
        assert missing.status == 400 and "arguments hash" in missing.body, missing.body
        assert dump(db) == before
        assert (await post(server, f"{base}/approve", found[("approve", "c2")], **headers)).status == 303
    [(approved, args_hash)] = rows(
        db, "SELECT approved, args_hash FROM approvals WHERE run_id = ? AND call_id = 'c2'", (scene.asking,)
    )
    assert approved == 1 and args_hash == shown


# -- refusals ---------------------------------------------------------------------------------


async def test_every_action_is_refused_without_each_guard_and_writes_nothing(db: zincir.Database) -> None:
    scene = await build_scene(db)
    async with actions_server(db.path) as server, actions_server(db.path, actor="mallory") as other:
        cookie = await log_in(server)
        found = {
            **await forms(server, scene.asking, cookie),
            **await forms(server, scene.backing_off, cookie),
        }
        other_cookie = await log_in(other)
        other_forms = await forms(other, scene.asking, other_cookie)
        reused = await get(server, server.login_url.removeprefix(server.origin))
        assert reused.status == 403 and reused.cookies == [] and "used already" in reused.body
        assert (await get(other, server.login_url.removeprefix(server.origin))).status == 403
        own_name = cookie.partition("=")[0]
        other_value = other_cookie.partition("=")[2]
        before = dump(db)
        for (action, call_id), fields in found.items():
            run_id = scene.backing_off if action == "retry" else scene.asking
            path = f"/runs/{run_id}/actions/{action}"
            good = {"Cookie": cookie, "Origin": server.origin}
            wrong_token = {**fields, "csrf": "0" * 64}
            no_token = {k: v for k, v in fields.items() if k != "csrf"}
            borrowed = (
                {**fields, "csrf": found[("cancel", "")]["csrf"]}
                if action != "cancel"
                else {**fields, "csrf": found[("budget", "")]["csrf"]}
            )
            attempts: list[tuple[str, dict[str, str], dict[str, str | None], int]] = [
                ("no session", fields, {"Origin": server.origin}, 403),
                ("wrong CSRF", wrong_token, good, 403),
                ("no CSRF", no_token, good, 403),
                ("another form's CSRF", borrowed, good, 403),
                ("foreign Host", fields, {**good, "Host": "evil.example"}, 421),
                ("foreign Origin", fields, {**good, "Origin": "http://evil.example"}, 403),
                ("another port's Origin", fields, {**good, "Origin": other.origin}, 403),
                ("no Origin", fields, {**good, "Origin": None}, 403),
                ("Origin null", fields, {**good, "Origin": "null"}, 403),
                ("cross-site fetch", fields, {**good, "Sec-Fetch-Site": "cross-site"}, 403),
                ("another instance's cookie", fields, {**good, "Cookie": f"{own_name}={other_value}"}, 403),
                ("another instance's cookie and form", other_forms.get((action, call_id), fields),
                 {**good, "Cookie": f"{own_name}={other_value}"}, 403),
            ]  # fmt: skip
            if action in ("approve", "deny"):  # a token is for its own call
                swapped = {**fields, "call_id": "c2" if call_id == "c1" else "c1"}
                attempts.append(("another call's token", swapped, good, 403))
            for what, form, headers, status in attempts:
                answer = await post(server, path, form, **headers)
                assert answer.status == status, (action, call_id, what, answer.status, answer.body[:300])
                assert answer.cookies == []
        # The same session's cookie on the other instance is refused there too.
        answer = await post(
            other,
            f"/runs/{scene.asking}/actions/cancel",
            {"csrf": found[("cancel", "")]["csrf"]},
            Cookie=f"{other_cookie.partition('=')[0]}={cookie.partition('=')[2]}",
            Origin=other.origin,
        )
        assert answer.status == 403
        assert dump(db) == before
        assert trail(db) == []


async def test_without_allow_actions_no_post_route_exists_and_no_write_connection_opens(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zincir import _postgres, _sqlite

    scene = await build_scene(db)
    before = dump(db)
    opened: list[str] = []

    async def no_writer(*args: Any, **kwargs: Any) -> Any:
        opened.append(str(args[:1]))
        raise AssertionError("the read-only inspector opened a write connection")

    monkeypatch.setattr(_sqlite, "open_backend", no_writer)
    monkeypatch.setattr(_postgres, "open_backend", no_writer)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            functools.partial(serve, db.path, "127.0.0.1:0", shutdown_trigger=stop.wait)
        )
        server = Server(url, "")
        page = await get(server, f"/runs/{scene.asking}")
        assert page.status == 200 and 'method="post"' not in page.body and "Actions" not in page.body
        assert page.headers["referrer-policy"] == "no-referrer"
        assert (await get(server, "/login?token=x")).status == 404
        for action in ACTIONS:
            answer = await post(
                server, f"/runs/{scene.asking}/actions/{action}", {"call_id": "c1"}, Origin=server.origin
            )
            assert answer.status in (404, 405), (action, answer.status)
        for path in ("/", f"/runs/{scene.asking}", "/api/runs"):
            assert (await post(server, path, {}, Origin=server.origin)).status == 405
        stop.set()
    assert opened == []
    assert dump(db) == before


async def test_allow_actions_refuses_a_missing_or_foreign_database(tmp_path: Path) -> None:
    with pytest.raises(zincir.StorageError, match="does not exist"):
        await serve_with_actions(str(tmp_path / "missing.db"), "127.0.0.1:0", actor="ada")
    assert not (tmp_path / "missing.db").exists()
    foreign = tmp_path / "notes.db"  # an SQLite file of another program: never migrated into zincir's
    with contextlib.closing(sqlite3.connect(foreign)) as conn, conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    before = foreign.read_bytes()
    with pytest.raises(zincir.SchemaError, match="not a zincir database"):
        await serve_with_actions(str(foreign), "127.0.0.1:0", actor="ada")
    assert foreign.read_bytes() == before
    with pytest.raises(zincir.InvalidArgument, match="loopback only"):
        await serve_with_actions(str(tmp_path / "missing.db"), "0.0.0.0:0", actor="ada")
    with pytest.raises(zincir.InvalidArgument, match="--as"):
        await serve_with_actions(str(tmp_path / "missing.db"), "127.0.0.1:0", actor="")


# -- a real browser: log in, then approve ----------------------------------------------------


@pytest.mark.sqlite_only  # the HTTP tests above cover both backends; one browser run is enough
@pytest.mark.skipif(not cdp.CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")
async def test_a_browser_logs_in_once_and_approves_a_tool_call(db: zincir.Database) -> None:
    scene = await build_scene(db)
    async with actions_server(db.path, actor="ada") as server, cdp.session() as browser:
        page = await browser.new_page()
        await page.goto(server.login_url)  # a page with a button: opening the link spends nothing
        await page.evaluate("document.querySelector('form.login button').click()")  # 303 to the runs page
        await page.wait_for("location.pathname === '/' && document.readyState === 'complete'")
        assert await page.evaluate("document.cookie") == ""  # HttpOnly: no script can read it
        run_url = f"{server.url}runs/{scene.asking}?refresh=off"
        await page.goto(run_url)
        assert await page.evaluate("document.querySelectorAll('form.action-approve').length") == 2
        await page.evaluate(
            "document.querySelector('form.action-approve input[name=reason]').value = 'fine by me';"
            "document.querySelector('form.action-approve button').click()"
        )
        await page.wait_for("document.querySelector('p.done') !== null")
        assert (await page.evaluate("document.querySelector('p.done').textContent")).startswith("Approved.")
        assert await page.evaluate("location.search") == "?refresh=off&done=approve"
        assert await page.evaluate("document.querySelectorAll('form.action-approve').length") == 1
        await page.send(
            "Emulation.setDeviceMetricsOverride", width=1280, height=2400, deviceScaleFactor=1, mobile=False
        )
        shot = await page.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        ARTIFACTS.mkdir(exist_ok=True)  # for a human to look at the panel after an approval
        (ARTIFACTS / "inspector-actions.png").write_bytes(base64.b64decode(shot["data"]))
        # The login URL was for one browser, once: another (a context of its own) gets a refusal.
        async with cdp.session() as second_browser:
            second = await second_browser.new_page()
            await second.send("Page.navigate", url=server.login_url)
            await second.wait_for("document.body && document.body.textContent.includes('used already')")
    assert rows(
        db, "SELECT call_id, approved, decided_by, reason FROM approvals WHERE approved IS NOT NULL"
    ) == [("c1", 1, "ada", "fine by me")]
    assert trail(db) == [(scene.asking, "approve", "ada")]


# -- the command line -------------------------------------------------------------------------


def test_zincir_ui_allow_actions_prints_a_one_time_login_url_and_stops_cleanly(tmp_path: Path) -> None:
    target = str(tmp_path / "zincir.db")
    trio.run(_one_run, target)
    command = [sys.executable, "-c", "import sys; from zincir._cli import main; sys.exit(main())"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    refused = subprocess.run(
        [*command, "ui", "--db", target, "--as", "ada"], capture_output=True, text=True, env=env
    )
    assert refused.returncode == 2 and "--as names who acts: it needs --allow-actions" in refused.stderr
    serving = [*command, "ui", "--db", target, "--address", "127.0.0.1:0", "--allow-actions", "--as", "ada"]
    process = subprocess.Popen(serving, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout is not None
        first, second = process.stdout.readline(), process.stdout.readline()
        assert re.fullmatch(r"zincir inspector: serving \S+ at http://127\.0\.0\.1:[0-9]+/, actions allowed"
                            r" as ada \(Ctrl\+C to stop\)\n", first), first  # fmt: skip
        found = re.fullmatch(
            r"zincir inspector: log in once with (http://127\.0\.0\.1:([0-9]+)/login\?token=[A-Za-z0-9_-]{43})\n",
            second,
        )
        assert found is not None, second
        server = Server(f"http://127.0.0.1:{found[2]}/", found[1])
        path = found[1].removeprefix(server.origin)
        body = urllib.parse.urlencode({"token": login_token(server)})
        answers = [
            _request(server, "GET", path, {}, ""),  # the page with the button: nothing spent
            _request(server, "POST", "/login", {"Origin": server.origin}, body),
            _request(server, "GET", path, {}, ""),
        ]
        assert [a.status for a in answers] == [200, 303, 403]
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=10)
    finally:
        reap(process)
    assert process.returncode == 0, err
    assert "stopped" in out and "Traceback" not in err


async def _one_run(target: str) -> None:
    async with zincir.open_database(target) as db, zincir.open_run(db):
        pass


HOSTILE = (
    '"><img src=x onerror="document.body.dataset.pwned=1"><script>document.body.dataset.pwned=1</script>'
)


async def test_hostile_call_ids_tools_and_signal_names_stay_inert_in_the_panel(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await run.record_response("", [zincir.ToolCall(HOSTILE, f"<b>{HOSTILE}</b>", {})], "tool_use")
        with trio.move_on_after(0.02):
            await run.wait_for_approval(HOSTILE)
        with trio.move_on_after(0.02):
            await run.wait_for_signal("w", HOSTILE)
        run_id = run.id
    async with actions_server(db.path, actor=HOSTILE) as server:
        cookie = await log_in(server)
        page = await get(server, f"/runs/{run_id}?refresh=off", Cookie=cookie)
        assert page.status == 200
        panel = page.body[page.body.index('<section id="actions">') :]
        panel = panel[: panel.index("</section>")]
        assert "<script" not in panel and "<img" not in panel and "<b>" not in panel
        assert html.escape(HOSTILE).replace("&quot;", "&#34;") in panel  # as markupsafe writes it
        found = await forms(server, run_id, cookie)
        assert found[("approve", HOSTILE)]["call_id"] == HOSTILE
        answer = await post(
            server,
            f"/runs/{run_id}/actions/approve",
            found[("approve", HOSTILE)],
            Cookie=cookie,
            Origin=server.origin,
        )
        assert answer.status == 303
        await zincir.send_signal(db, run_id, HOSTILE, {HOSTILE: HOSTILE}, by=HOSTILE)
        after = await get(server, f"/runs/{run_id}?refresh=off", Cookie=cookie)
        audit = after.body[after.body.index('<section id="audit">') :]
        audit = audit[: audit.index("</section>")]
        assert audit.count(html.escape(HOSTILE).replace("&quot;", "&#34;")) == 2  # approve's by, signal's by
        assert "<script" not in audit and "<img" not in audit and "<b>" not in audit
    assert rows(db, "SELECT call_id, decided_by FROM approvals") == [(HOSTILE, HOSTILE)]
