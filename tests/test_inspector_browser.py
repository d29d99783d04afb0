"""A real browser (headless Debian Chromium) loads pages full of script-injection payloads.

The proof that nothing ran: every payload tries to set ``data-pwned`` on ``<body>``; the
DOM, read after the page has run (as ``chromium --virtual-time-budget=2000 --dump-dom`` would
print it), must not carry it, and the payloads must be visible as text. A control page without
escaping shows the oracle does catch a run script. Screenshots land in ``test-artifacts/`` for
a human to look at. One Chromium serves the session (tests/cdp.py), each test in a browser
context of its own.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

import zincir
from tests.inspect_fixtures import (
    XSS_HREF,
    XSS_IMG,
    XSS_LINK,
    XSS_META,
    XSS_SCRIPT,
    MalformedIds,
    Sample,
    add_malformed_run,
    build_sample,
)
from zincir._inspector import serve

from . import cdp
from .agent_scenarios import family, long_run, over_budget_run
from .test_waiting_views import suspended_and_blocked

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"

pytestmark = pytest.mark.skipif(
    not cdp.CHROMIUM.exists(),
    reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)",
)


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[tuple[Sample, MalformedIds]]:
    # Times near now, so the screenshots show realistic "2 min ago" / "expires in 1.9 h".
    t0 = time.time_ns() // 1_000_000 - 15 * 60_000
    conn, ids = build_sample(tmp_path / "browser.db", plain_runs=30, t0=t0)
    malformed = add_malformed_run(conn, t0)
    yield ids, malformed
    conn.close()


@pytest.fixture
def sample(hostile: tuple[Sample, MalformedIds]) -> Sample:
    return hostile[0]


async def dump_dom(browser: cdp.Browser, url: str, screenshot: str | None = None, height: int = 900) -> str:
    """The DOM of ``url`` in a new tab, once the page has run (its scripts, error handlers and
    timers of up to 2 s, in virtual time); with ``screenshot``, the page is also saved as a
    PNG of that name in test-artifacts/, 1280 pixels wide and ``height`` high."""
    page = await browser.new_page()
    await page.load(url)
    dom = await page.dom()
    if screenshot is not None:
        ARTIFACTS.mkdir(exist_ok=True)
        data = await page.screenshot(1280, height)
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        assert len(data) > 10_000  # a rendered page, not a blank one
        (ARTIFACTS / screenshot).write_bytes(data)
    return dom


def body_tag(dom: str) -> str:
    match = re.search(r"<body[^>]*>", dom)
    assert match is not None, dom[:500]
    return match.group(0)


TEMPLATE_META = '<meta http-equiv="refresh" content="5">'  # a running run's own auto-refresh


def assert_nothing_ran(dom: str) -> None:
    assert "data-pwned" not in body_tag(dom)
    lowered = dom.lower()
    assert "<script" not in lowered
    assert "<img" not in lowered
    assert re.search(r"<a\b[^>]*\bhref\s*=\s*\"?\s*javascript:", lowered) is None  # escaped text is fine
    # No markup from the data: no <meta http-equiv> but the template's, no link off the inspector.
    metas = re.findall(r"<meta\b[^>]*http-equiv[^>]*>", dom, re.IGNORECASE)
    assert metas in ([], [TEMPLATE_META]), metas
    hrefs = re.findall(r"<a\b[^>]*?\bhref\s*=\s*\"([^\"]*)\"", dom, re.IGNORECASE)
    assert hrefs, "no links at all: is this the inspector's page?"
    assert [h for h in hrefs if not h.startswith("/")] == []


async def test_the_oracle_sees_a_script_that_runs(tmp_path: Path) -> None:
    control = tmp_path / "control.html"
    control.write_text(f"<!doctype html><html><body><p>control</p>{XSS_IMG}</body></html>")
    async with cdp.session() as browser:
        dom = await dump_dom(browser, control.as_uri())
    assert 'data-pwned="1"' in body_tag(dom)


async def test_injected_payloads_stay_text_in_a_real_browser(sample: Sample) -> None:
    async with cdp.session() as browser, trio.open_nursery() as nursery:
        start = functools.partial(serve, str(sample.path), "127.0.0.1:0", shutdown_trigger=trio.sleep_forever)
        url: str = await nursery.start(start)

        run_dom = await dump_dom(browser, f"{url}runs/{sample.hostile}", "inspector-run-hostile.png")
        assert_nothing_ran(run_dom)
        assert "&lt;script&gt;document.body.setAttribute('data-pwned','1')&lt;/script&gt;" in run_dom
        assert "&lt;img src=x onerror=\"document.body.setAttribute('data-pwned','1')\"&gt;" in run_dom
        assert "&lt;a href=\"javascript:document.body.setAttribute('data-pwned','1')\"&gt;click me" in run_dom
        assert f"step {XSS_SCRIPT}".replace("<", "&lt;").replace(">", "&gt;") in run_dom
        assert XSS_LINK.replace("<", "&lt;").replace(">", "&gt;") in run_dom

        runs_dom = await dump_dom(browser, url, "inspector-runs.png")
        assert_nothing_ran(runs_dom)
        assert "role &lt;script&gt;" in runs_dom
        assert sample.hostile in runs_dom

        await dump_dom(browser, f"{url}runs/{sample.main}", "inspector-run.png")
        nursery.cancel_scope.cancel()


async def test_a_rebinding_host_is_refused_in_the_browser(sample: Sample) -> None:
    # Chromium resolves the made-up name to the server (as a DNS-rebinding attack would)
    # and sends ``Host: rebind.example:<port>``: the inspector must answer 421, no data.
    async with cdp.session() as browser, trio.open_nursery() as nursery:
        start = functools.partial(serve, str(sample.path), "127.0.0.1:0", shutdown_trigger=trio.sleep_forever)
        url: str = await nursery.start(start)
        port = url.rstrip("/").rsplit(":", 1)[1]
        dom = await dump_dom(browser, f"http://{cdp.REBINDING_HOST}:{port}/")
        assert "Misdirected" in dom
        assert sample.main not in dom
        nursery.cancel_scope.cancel()


async def test_markup_in_integer_columns_stays_text_in_a_real_browser(
    hostile: tuple[Sample, MalformedIds],
) -> None:
    # SQLite stores TEXT in an INTEGER column: a seq of '"><meta http-equiv=refresh ...>' used
    # to end an id="e..." attribute and navigate Chromium away, CSP or not.
    ids, malformed = hostile
    async with cdp.session() as browser, trio.open_nursery() as nursery:
        start = functools.partial(serve, str(ids.path), "127.0.0.1:0", shutdown_trigger=trio.sleep_forever)
        url: str = await nursery.start(start)
        # How Chromium serialises a text node: &, < and > escaped, quotes as they are.
        escaped_meta = XSS_META.replace("<", "&lt;").replace(">", "&gt;")
        escaped_href = XSS_HREF.replace("<", "&lt;").replace(">", "&gt;")
        run_page = f"runs/{malformed.run}"
        doms = {}
        for page in (run_page, f"{run_page}?before=end", f"runs/{malformed.child}", ""):
            shot = "inspector-run-malformed.png" if page == run_page else None
            doms[page] = dom = await dump_dom(browser, f"{url}{page}", shot)
            assert_nothing_ran(dom)
            assert "(malformed text: " in dom, page  # still the inspector's page, not a redirect
        run_dom = doms[run_page]
        assert f"role {escaped_meta}{escaped_href}" in run_dom  # the BLOB role, as text
        assert escaped_href in run_dom
        assert run_dom.count('class="malformed"') >= 10
        runs_dom = doms[""]
        assert malformed.run in runs_dom
        assert ids.main in runs_dom  # one malformed row does not take the list down
        nursery.cancel_scope.cancel()


async def test_the_agent_view_in_a_real_browser(tmp_path: Path) -> None:
    """Screenshots of a run of 300 events, a waiting run, a family of three levels and a run
    over budget (``test-artifacts/inspector-agent-*.png``), each checked by its DOM for the
    marks it must carry (the test client checks the rest, on both backends)."""
    path = tmp_path / "agent.db"
    async with zincir.open_database(str(path)) as db:
        long = await long_run(db, responses=100)
        waiting, _, _ = await suspended_and_blocked(db)
        root, child, grandchild = await family(db)
        spender = await over_budget_run(db)
    checks = {
        f"runs/{long}": ("300-events", ['id="timeline"', 'data-kind="response"', 'data-state="done"']),
        f"runs/{waiting}": ("waiting", ['class="wait-line" data-kind="signal"', 'data-lane="waits"']),
        f"runs/{root}": ("family", [f'href="/runs/{child}"', f'href="/runs/{grandchild}"']),
        f"runs/{spender}": ("over-budget", ['class="budget-row over"', "Over budget"]),
    }
    async with cdp.session() as browser, trio.open_nursery() as nursery:
        start = functools.partial(serve, str(path), "127.0.0.1:0", shutdown_trigger=trio.sleep_forever)
        url: str = await nursery.start(start)
        for page, (name, marks) in checks.items():
            dom = await dump_dom(browser, f"{url}{page}", f"inspector-agent-{name}.png", height=1600)
            assert_nothing_ran(dom)
            for mark in marks:
                assert mark in dom, (page, mark)
        await dump_dom(browser, url, "inspector-agent-runs.png")
        nursery.cancel_scope.cancel()
