"""Forks in the inspector: the family panel, the diff page, and "fork here" with
``--allow-actions`` (real HTTP against the real server, both backends)."""

from __future__ import annotations

import functools
import html
import json
import re
import urllib.parse

import trio

import zincir
from zincir._inspector import serve

from .helpers import dump, rows
from .test_forks import research_run
from .test_inspector_actions import Server, actions_server, get, log_in, post

_FORK_FORM = re.compile(r'<form method="post" action="([^"]+)" class="action-fork">(.*?)</form>', re.S)


async def test_the_family_panel_and_the_diff_page_show_a_fork(db: zincir.Database) -> None:
    source, seqs = await research_run(db)
    at = seqs["second_end"]
    fork = await zincir.fork_run(db, source, at, config={"prompt": "v2"})
    async with zincir.open_run(db, fork) as run:
        await run.record_response("<b>v2</b> says", [], "end_turn", usage={"input_tokens": 9})
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            functools.partial(serve, db.path, "127.0.0.1:0", shutdown_trigger=stop.wait)
        )
        server = Server(url, "")
        compare = f"/diff?a={source}&amp;b={fork}"
        page = (await get(server, f"/runs/{source}")).body
        family = page.partition('<section id="family">')[2].partition("</section>")[0]
        assert "Forks (1)" in family and f'href="/runs/{fork}"' in family
        assert f'<a href="/runs/{source}?after={at - 1}#e{at}">#{at}</a>' in family
        assert f'href="{compare}">compare' in family
        forked = (await get(server, f"/runs/{fork}")).body.partition('<section id="family">')[2]
        assert "Forked from" in forked.partition("</section>")[0] and f'href="{compare}"' in forked

        diff = await get(server, f"/diff?a={source}&b={fork}")
        assert diff.status == 200, diff.body
        assert f"{at + 1} events (seq 0 to {at})" in diff.body
        assert "pay (inherited)" in diff.body
        assert "&lt;b&gt;v2&lt;/b&gt; says" in diff.body and "<b>v2</b>" not in diff.body
        assert "<th>B</th><td>1</td><td>0</td><td>9</td>" in diff.body
        assert (await get(server, f"/diff?a={source}&b=nope")).status == 400
        missing = await get(server, f"/diff?a={source}&b=00000000-0000-4000-8000-000000000000")
        assert missing.status == 404
        stop.set()


async def test_fork_here_forks_at_the_event_as_the_person_logged_in(db: zincir.Database) -> None:
    source, seqs = await research_run(db)
    at = seqs["second_end"]
    async with actions_server(db.path, actor="ada") as server:
        cookie = await log_in(server)
        page = await get(server, f"/runs/{source}?view=events&refresh=off", Cookie=cookie)
        found = {}
        for action_url, inner in _FORK_FORM.findall(page.body):
            assert html.unescape(action_url) == f"/runs/{source}/actions/fork"
            fields = dict(re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)">', inner))
            found[int(fields["at_seq"])] = fields
        assert sorted(found) == list(range(len(await db.events(source))))
        good = {"Cookie": cookie, "Origin": server.origin}
        before = dump(db)
        # The token is bound to its seq, and the usual guards hold: nothing is written.
        swapped = {**found[at], "at_seq": str(at - 1)}
        assert (await post(server, f"/runs/{source}/actions/fork", swapped, **good)).status == 403
        no_origin = await post(server, f"/runs/{source}/actions/fork", found[at], Cookie=cookie)
        assert no_origin.status == 403
        inside = await post(server, f"/runs/{source}/actions/fork", found[seqs["second"]], **good)
        assert inside.status == 400 and "recorded together" in html.unescape(inside.body)
        assert dump(db) == before

        form = {**found[at], "config": '{"prompt": "v2"}', "reason": "try"}
        answer = await post(server, f"/runs/{source}/actions/fork", form, **good)
        assert answer.status == 303, answer.body
        location = urllib.parse.urlsplit(answer.headers["location"])
        fork = location.path.removeprefix("/runs/")
        assert location.query == "refresh=off&done=fork"
        shown = await get(server, f"/runs/{fork}?refresh=off&done=fork", Cookie=cookie)
        assert "Forked: this is the new run." in shown.body
    record = (await db.state(fork)).run
    assert (record.forked_from, record.fork_seq, record.config) == (source, at, {"prompt": "v2"})
    [(by, detail)] = rows(db, "SELECT done_by, detail FROM outsider_actions WHERE run_id = ?", (fork,))
    assert by == "ada" and json.loads(detail)["reason"] == "try"
