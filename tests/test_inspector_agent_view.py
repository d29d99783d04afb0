"""The inspector's agent view (docs/inspector.md): a run as a conversation, what it waits for, its
family, its timeline and spend as SVG, and the runs page's chart, on both backends.

Pages are checked by their markup (the elements and classes that carry each mark), and the
same marks again in a real Chromium's DOM in ``test_inspector_browser.py``.
"""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser

import pytest

import zincir
from zincir._inspector import create_app

from .agent_scenarios import conversation_run, family, long_run, over_budget_run
from .helpers import rows
from .inspect_fixtures import XSS_HREF, XSS_META
from .test_waiting_views import suspended_and_blocked

HOST = "127.0.0.1:8787"


async def page(db: zincir.Database, url: str, status: int = 200) -> str:
    app = create_app(db.path, HOST)
    response = await app.test_client().open(url, method="GET", headers={"Host": HOST})
    text = await response.get_data(as_text=True)
    assert response.status_code == status, text[:2000]
    return text


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text inside each element with an id."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def having(self, **wanted: str) -> list[dict[str, str]]:
        """Tags whose attributes contain each wanted value (``cls`` for a class name)."""
        found = []
        for _, attrs in self.tags:
            ok = True
            for name, value in wanted.items():
                if name == "cls":
                    ok = ok and value in attrs.get("class", "").split()
                else:
                    ok = ok and attrs.get(name.replace("_", "-")) == value
            if ok:
                found.append(attrs)
        return found


def calls_block(text: str, call_id: str) -> str:
    """The markup of the conversation's block for one tool call."""
    match = re.search(
        rf'<div class="call [^"]*" data-call="{re.escape(call_id)}".*?</div>\s*</div>', text, re.S
    )
    assert match is not None, call_id
    return match.group(0)


async def test_a_run_reads_as_a_conversation_with_what_is_open_marked(db: zincir.Database) -> None:
    run_id = await conversation_run(db)
    text = await page(db, f"/runs/{run_id}")
    dom = Elements(text)
    kinds = [a["data-kind"] for a in dom.having(cls="entry")]
    # In seq order: responses, the signal, the approval asked and decided, checkpoint cards...
    assert kinds[:4] == ["transition", "response", "signal", "response"]
    assert kinds.count("checkpoint") == 2 and "verdict" in kinds and "decision" in kinds
    assert kinds[-1] == "open-wait"  # ...and, at the log's end, what it waits for now
    # Each call paired with its result, or marked for what is known of it.
    assert [a["data-state"] for a in dom.having(cls="call")][:3] == [
        "done",
        "outcome-unknown",
        "never-started",
    ]
    assert "def test_x(): assert flaky()" in html.unescape(calls_block(text, "c1"))
    assert "outcome unknown" in calls_block(text, "c2")
    assert "never started" in calls_block(text, "c3")
    assert dom.having(cls="call", data_call="a2")[0]["class"].split()[-1] == "approval-unanswered"
    assert "approval-approved" in dom.having(data_call="a1")[0]["class"]
    assert len(dom.having(cls="mark-unanswered")) >= 2  # the response asking and the request itself
    assert len(dom.having(cls="mark-undecided")) == 1  # the candidate the verifier never judged
    # The checkpoint card: state, verdict, evidence, lineage (both names: round and id).
    assert "Verdict: passed" in text and "pytest: 12 passed" in text
    assert "checkpoint id 1" in text and "builds on original goal" in text
    assert f'href="/runs/{run_id}/checkpoints/1"' in text
    # The candidate whose verifier crashed (s2) is not a call that "never started": its
    # verification was interrupted, and the card says so too.
    [s2] = dom.having(cls="call", data_call="s2")
    assert s2["data-state"] == "verification-interrupted"
    head = re.search(r'data-call="s2".*?<div class="call-head">(.*?)</div>', text, re.S)
    assert head is not None
    assert "checkpoint round 2 proposed, verification interrupted: never decided" in head[1]
    assert "never started" not in head[1]
    assert "Undecided: its verification was interrupted" in text
    assert "Now waiting for approval of tool call &#39;a2&#39; (deploy)" in text
    # The raw event list is one click away, and every entry links to its raw event.
    assert f'href="/runs/{run_id}?view=events#views"' in text
    assert f'href="/runs/{run_id}?after=0&amp;view=events#e1"' in text
    raw = await page(db, f"/runs/{run_id}?view=events")
    assert raw.count('<details class="event"') == 25 and 'data-kind="response"' not in raw


async def test_waiting_for_says_what_and_until_when(db: zincir.Database) -> None:
    suspended, _, deadline = await suspended_and_blocked(db)
    text = await page(db, f"/runs/{suspended}")
    lines = Elements(text).having(cls="wait-line")
    assert [a["data-kind"] for a in lines] == ["signal"]
    flat = html.unescape(re.sub(r"<[^>]+>", "", text))
    assert "Waiting for signal 'go' (wait 'w'), until " in flat
    assert "Suspended: no process holds this run." in text
    stamp = re.search(r'<p class="wait-line"[^>]*>.*?<time datetime="([^"]+)"', text, re.S)
    assert stamp is not None and stamp.group(1).startswith("20")
    # The timeline draws the open wait and its deadline.
    dom = Elements(text)
    assert dom.having(cls="open", data_lane="waits") and dom.having(cls="deadline", data_lane="waits")
    assert deadline > 0


async def test_a_family_of_three_levels_is_a_tree_with_statuses(db: zincir.Database) -> None:
    root, child, grandchild = await family(db)
    text = await page(db, f"/runs/{root}")
    nested = re.search(
        rf'<li><a href="/runs/{child}">.*?<ul class="children"><li><a href="/runs/{grandchild}">', text, re.S
    )
    assert nested is not None
    for run, status in ((child, "running"), (grandchild, "pending")):  # each with its status
        assert re.search(rf'href="/runs/{run}"><code>{run}</code></a> <span class="pill s-{status}">', text)
    below = await page(db, f"/runs/{grandchild}")
    chain = re.search(r'<span class="ancestors">(.*?)</span>\s*</dd>', below, re.S)
    assert chain is not None and chain.group(1).index(root) < chain.group(1).index(child)
    middle = await page(db, f"/runs/{child}")
    assert 'data-kind="child"' in middle and f'href="/runs/{grandchild}"' in middle


async def test_spend_against_the_budget_is_a_bar_and_over_budget_stands_out(db: zincir.Database) -> None:
    run_id = await over_budget_run(db)
    text = await page(db, f"/runs/{run_id}")
    dom = Elements(text)
    rows = {a["data-limit"]: a["class"] for a in dom.having(cls="budget-row")}
    assert set(rows) == {"tokens", "cost", "model calls"}
    assert "over" in rows["tokens"].split() and "over" not in rows["model calls"].split()
    assert "Over budget" in text
    assert "1,400 / 1,000" in text
    fills = re.findall(r'<rect class="bar-fill" x="200" y="\d+" width="([0-9.]+)"', text)
    assert [float(f) for f in fills] == [420.0, 0.0, 84.0]  # capped at the track; cost unspent; 2/10


async def test_the_timeline_draws_each_kind_of_activity(db: zincir.Database) -> None:
    run_id = await conversation_run(db)
    text = await page(db, f"/runs/{run_id}")
    dom = Elements(text)
    lanes = {a["data-lane"] for a in dom.having() if "data-lane" in a}
    assert {"model", "tools", "steps", "sleeps", "waits", "checkpoints"} <= lanes
    assert dom.having(cls="tool", data_lane="tools") and dom.having(cls="open", data_lane="tools")
    assert dom.having(cls="s-accepted", data_lane="checkpoints") and dom.having(cls="s-candidate")
    assert "<svg" in text and "<script" not in text
    titles = re.findall(r"<title>([^<]*)</title>", text)
    assert any(t.startswith("read_file (c1): ") for t in titles)
    assert any(t.startswith("approval of call a2 (deploy): open") for t in titles)
    # Pages after the first leave the overview and the pictures out: events come first.
    later = await page(db, f"/runs/{run_id}?after=10")
    assert 'id="timeline"' not in later and 'id="overview"' not in later and 'id="conversation"' in later
    assert "↑ the run's overview" in later


async def test_a_run_of_300_events_pages_its_conversation(db: zincir.Database) -> None:
    run_id = await long_run(db, responses=100)
    text = await page(db, f"/runs/{run_id}")
    dom = Elements(text)
    entries = dom.having(cls="entry")
    assert len([e for e in entries if e["data-kind"] == "response"]) == 33  # 100 events: 1 + 3 x 33
    assert {a["data-state"] for a in dom.having(cls="call")} == {"done"}
    assert f'href="/runs/{run_id}?after=99#events"' in text  # Next keeps to the conversation
    last = await page(db, f"/runs/{run_id}?before=end")
    assert 'data-kind="open-wait"' not in last  # a completed run waits for nothing
    assert "Next attempt" not in last  # later pages have no overview
    first = await page(db, f"/runs/{run_id}")
    assert "none: the run has ended" in first


async def test_hostile_payloads_in_every_agent_field_stay_inert(db: zincir.Database) -> None:
    run_id = await conversation_run(db, hostile=True)
    for url in (f"/runs/{run_id}", f"/runs/{run_id}?view=events", f"/runs/{run_id}/checkpoints/1", "/"):
        text = await page(db, url)
        assert XSS_META not in text and XSS_HREF not in text
        lowered = text.lower()
        assert (
            "<script" not in lowered
            and "<img" not in lowered
            and "javascript:" not in lowered.replace("&#34;javascript:", "")
        )
        metas = re.findall(r"<meta\b[^>]*http-equiv[^>]*>", text, re.IGNORECASE)
        assert metas in ([], ['<meta http-equiv="refresh" content="5">'])
        for href in re.findall(r"<(?:a|link)\b[^>]*\bhref=\"([^\"]*)\"", text):
            assert href.startswith("/"), href
    text = await page(db, f"/runs/{run_id}")
    assert "&lt;script&gt;" in text and "&lt;img src=x" in text
    titles = re.findall(r"<title>([^<]*)</title>", text)
    assert any("&lt;img" in t for t in titles)  # SVG text is escaped too


async def test_the_runs_page_charts_runs_by_status_over_time(db: zincir.Database) -> None:
    await long_run(db, responses=2)
    await family(db)
    text = await page(db, "/")
    dom = Elements(text)
    assert dom.having(id="status-chart")
    segments = {a["class"] for a in dom.having(cls="seg")}
    assert {"seg s-completed", "seg s-pending", "seg s-running"} <= segments
    assert "all 4 runs, by status" in text


@pytest.mark.parametrize("far", [2**63 - 1, -(2**63)])
async def test_a_last_activity_no_date_can_show_is_left_out_of_the_chart(
    db: zincir.Database, far: int
) -> None:
    # A row written with a huge timestamp: before, the runs page answered 500 (OverflowError on
    # SQLite, "bigint out of range" on PostgreSQL) computing where the runs fall on the chart.
    ids = []
    for _ in range(3):
        async with zincir.open_run(db) as run:
            ids.append(run.id)
    rows(db, "UPDATE agent_runs SET updated_at = ? WHERE id = ?", (far, ids[0]))
    rows(db, "UPDATE agent_runs SET updated_at = 0 WHERE id = ?", (ids[1],))  # 1970: a date still
    text = await page(db, "/")
    assert Elements(text).having(id="status-chart")  # the others are charted
    assert "since 1970-01-01T00:00:00.000Z" in text  # from the oldest that is a date
    assert ids[0] in text  # and the run is listed, as every run is
    await page(db, f"/runs/{ids[0]}")
    listed = json.loads(await page(db, "/api/runs"))["runs"]
    assert {r["id"]: r["updated_at"] for r in listed}[ids[0]] == far


async def test_the_json_api_is_unchanged_by_the_agent_view(db: zincir.Database) -> None:
    run_id = await conversation_run(db)
    data = json.loads(await page(db, f"/api/runs/{run_id}"))
    assert set(data) == {
        "run", "children_total", "children_capped", "children_next", "checkpoints", "steps", "timers",
        "awaiting", "outsider_actions", "truncated",
    }  # fmt: skip
    assert (await page(db, f"/runs/{run_id}?view=nonsense", 400)).count("unknown view") == 1
