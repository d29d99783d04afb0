"""A real browser (headless Debian Chromium) loads pages full of script-injection payloads.

The proof that nothing ran: every payload tries to set ``data-pwned`` on ``<body>``; the
DOM Chromium dumps after running the page must not carry it, and the payloads must be
visible as text. A control page without escaping shows the oracle does catch a run script.
Screenshots land in ``test-artifacts/`` for a human to look at.
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

from .agent_scenarios import family, long_run, over_budget_run
from .test_waiting_views import suspended_and_blocked

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
BROWSER_TIMEOUT = 30

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)"
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


def chromium(profile: Path, *args: str) -> list[str]:
    return [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=2000",
        *args,
    ]


async def run_browser(command: list[str]) -> str:
    with trio.fail_after(BROWSER_TIMEOUT):
        done = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode()


async def dump_dom(profile: Path, url: str) -> str:
    return await run_browser(chromium(profile, "--dump-dom", url))


async def screenshot(profile: Path, url: str, name: str, height: int = 900) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    target = ARTIFACTS / name
    target.unlink(missing_ok=True)
    await run_browser(chromium(profile, f"--screenshot={target}", f"--window-size=1280,{height}", url))
    data = target.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 10_000  # a rendered page, not a blank one
    return target


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
    dom = await dump_dom(tmp_path / "profile", control.as_uri())
    assert 'data-pwned="1"' in body_tag(dom)


async def test_injected_payloads_stay_text_in_a_real_browser(tmp_path: Path, sample: Sample) -> None:
    profile = tmp_path / "profile"
    async with trio.open_nursery() as nursery:
        start = functools.partial(serve, str(sample.path), "127.0.0.1:0", shutdown_trigger=trio.sleep_forever)
        url: str = await nursery.start(start)

        run_dom = await dump_dom(profile, f"{url}runs/{sample.hostile}")
        assert_nothing_ran(run_dom)
        assert "&lt;script&gt;document.body.setAttribute('data-pwned','1')&lt;/script&gt;" in run_dom
        assert "&lt;img src=x onerror=\"document.body.setAttribute('data-pwned','1')\"&gt;" in run_dom
        assert "&lt;a href=\"javascript:document.body.setAttribute('data-pwned','1')\"&gt;click me" in run_dom
        assert f"step {XSS_SCRIPT}".replace("<", "&lt;").replace(">", "&gt;") in run_dom
        assert XSS_LINK.replace("<", "&lt;").replace(">", "&gt;") in run_dom

        runs_dom = await dump_dom(profile, url)
        assert_nothing_ran(runs_dom)
        assert "role &lt;script&gt;" in runs_dom
        assert sample.hostile in runs_dom

        await screenshot(profile, url, "inspector-runs.png")
        await screenshot(profile, f"{url}runs/{sample.main}", "inspector-run.png")
        await screenshot(profile, f"{url}runs/{sample.hostile}", "inspector-run-hostile.png")
        nursery.cancel_scope.cancel()


async def test_a_rebinding_host_is_refused_in_the_browser(tmp_path: Path, sample: Sample) -> None:
    # Chromium resolves the made-up name to the server (as a DNS-rebinding attack would)
    # and sends ``Host: rebind.example:<port>``: the inspector must answer 421, no data.
    async with trio.open_nursery() as nursery:
        start = functools.partial(serve, str(sample.path), "127.0.0.1:0", shutdown_trigger=trio.sleep_forever)
        url: str = await nursery.start(start)
        port = url.rstrip("/").rsplit(":", 1)[1]
        rules = "--host-resolver-rules=MAP rebind.example 127.0.0.1"
        dom = await run_browser(
            chromium(tmp_path / "profile", rules, "--dump-dom", f"http://rebind.example:{port}/")
        )
        assert "Misdirected" in dom
        assert sample.main not in dom
        nursery.cancel_scope.cancel()


async def test_markup_in_integer_columns_stays_text_in_a_real_browser(
    tmp_path: Path, hostile: tuple[Sample, MalformedIds]
) -> None:
    # SQLite stores TEXT in an INTEGER column: a seq of '"><meta http-equiv=refresh ...>' used
    # to end an id="e..." attribute and navigate Chromium away, CSP or not.
    ids, malformed = hostile
    profile = tmp_path / "profile"
    async with trio.open_nursery() as nursery:
        start = functools.partial(serve, str(ids.path), "127.0.0.1:0", shutdown_trigger=trio.sleep_forever)
        url: str = await nursery.start(start)
        # How Chromium serialises a text node: &, < and > escaped, quotes as they are.
        escaped_meta = XSS_META.replace("<", "&lt;").replace(">", "&gt;")
        escaped_href = XSS_HREF.replace("<", "&lt;").replace(">", "&gt;")
        for page in (
            f"runs/{malformed.run}",
            f"runs/{malformed.run}?before=end",
            f"runs/{malformed.child}",
            "",
        ):
            dom = await dump_dom(profile, f"{url}{page}")
            assert_nothing_ran(dom)
            assert "(malformed text: " in dom, page  # still the inspector's page, not a redirect
        run_dom = await dump_dom(profile, f"{url}runs/{malformed.run}")
        assert f"role {escaped_meta}{escaped_href}" in run_dom  # the BLOB role, as text
        assert escaped_href in run_dom
        assert run_dom.count('class="malformed"') >= 10
        runs_dom = await dump_dom(profile, url)
        assert malformed.run in runs_dom
        assert ids.main in runs_dom  # one malformed row does not take the list down
        await screenshot(profile, f"{url}runs/{malformed.run}", "inspector-run-malformed.png")
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
    profile = tmp_path / "profile"
    checks = {
        f"runs/{long}": ("300-events", ['id="timeline"', 'data-kind="response"', 'data-state="done"']),
        f"runs/{waiting}": ("waiting", ['class="wait-line" data-kind="signal"', 'data-lane="waits"']),
        f"runs/{root}": ("family", [f'href="/runs/{child}"', f'href="/runs/{grandchild}"']),
        f"runs/{spender}": ("over-budget", ['class="budget-row over"', "Over budget"]),
    }
    async with trio.open_nursery() as nursery:
        start = functools.partial(serve, str(path), "127.0.0.1:0", shutdown_trigger=trio.sleep_forever)
        url: str = await nursery.start(start)
        for page, (name, marks) in checks.items():
            dom = await dump_dom(profile, f"{url}{page}")
            assert_nothing_ran(dom)
            for mark in marks:
                assert mark in dom, (page, mark)
            await screenshot(profile, f"{url}{page}", f"inspector-agent-{name}.png", height=1600)
        await screenshot(profile, url, "inspector-agent-runs.png")
        nursery.cancel_scope.cancel()
