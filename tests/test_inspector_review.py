"""What a new user and a security review of the inspector found (issue 31), each against a
real served inspector over HTTP or raw sockets, and in a real Chromium where what is drawn
matters; on both backends where the data path matters."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator

import trio
from click.testing import CliRunner, Result

import zincir
from zincir._cli import main
from zincir._inspector import serve

from .test_inspector_actions import Server, get


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
