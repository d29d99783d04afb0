"""The HTML pages: the runs list, a run, one checkpoint, and the stylesheet.

Each page reads in a worker thread, in one snapshot, and renders there too (:func:`run_read`),
so the Trio loop never waits on the database or on a template.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from typing import Any

import attrs
from quart import Response, request

from .. import _queries as q
from .._errors import RunNotFound
from . import _views as v
from ._charts import CHART_BUCKETS, status_chart
from ._http import extra_context, html_response, now_ms, render_page, run_read
from ._params import EventsQuery, RunsQuery
from ._reads import activity, neighbour_rounds
from ._render import STATIC
from ._runpage import PAYLOAD_PREVIEW_CHARS, REFRESH_SECONDS, RunPageData, run_context
from ._security import InspectorApp
from ._views import BLOCK_CHARS

__all__ = ["checkpoint_page", "diff_page", "run_page", "runs_page", "stylesheet"]


#: The runs page's chart counts the most recently active this many runs.
CHART_SAMPLE = 2000
#: A diff page lists this many events per side, reads at most DIFF_EVENTS of each side after
#: the common prefix, and compares at most DIFF_EVENTS beyond what the lineage shares.
DIFF_ITEMS = 100
DIFF_EVENTS = 20_000


async def stylesheet() -> Response:
    response = Response(_stylesheet_bytes(), content_type="text/css; charset=utf-8")
    response.headers["Cache-Control"] = "max-age=300"
    return response


async def runs_page(app: InspectorApp) -> Response:
    query = RunsQuery.from_request()
    now = now_ms()

    extra = extra_context(app)

    def render(conn: Any) -> str:
        page = query.fetch(conn)
        awaiting = q.list_awaiting(conn, [r.id for r in page.runs if r.status in ("running", "waiting")])
        budgets = q.budgets_of(conn, [r.id for r in page.runs], now)
        chart = status_chart(activity(conn, CHART_SAMPLE, CHART_BUCKETS), q.RUN_STATUSES, page.total)
        context = _runs_context(query, page, awaiting, budgets, q.display_target(app.database_path), now)
        versions = _versions_panel(query, q.draining_versions(conn))
        return render_page(
            app, "runs.html", "Runs", {**context, "chart": chart, "versions": versions, **extra}
        )

    return html_response(await run_read(app, render))


async def run_page(app: InspectorApp, run_id: str) -> Response:
    run_id = q.parse_run_id(run_id)
    query = EventsQuery.from_request(q.DEFAULT_PAGE, PAYLOAD_PREVIEW_CHARS)
    now = now_ms()

    extra = extra_context(app)

    def render(conn: Any) -> str:
        view = RunPageData.fetch(run_id, query, conn)
        context = run_context(view, query, now)
        refresh = REFRESH_SECONDS if context["view"].refresh.on else None
        return render_page(app, "run.html", f"Run {run_id}", {**context, **extra}, refresh=refresh)

    return html_response(await run_read(app, render))


async def checkpoint_page(app: InspectorApp, run_id: str, round: str) -> Response:
    """One checkpoint: its round and id, status, lineage, verdict, evidence and whole state."""
    run_id = q.parse_run_id(run_id)
    value = q.decode_key(round, "checkpoint round")
    now = now_ms()
    extra = extra_context(app)

    def render(conn: Any) -> str:
        run = q.get_run(conn, run_id, children_limit=0)
        row = q.get_checkpoint(conn, run_id, value)
        if row is None:
            raise RunNotFound(f"run {run_id} has no checkpoint round {q.encode_key(value)}")
        row = _cut_checkpoint(row)
        builds_on, previous, following = neighbour_rounds(conn, run_id, row.round)
        context = {
            "run": run,
            "run_url": v.path("runs", run_id),
            "card": v.with_interruption(run, v.checkpoint_view(run_id, row, builds_on), now),
            "previous_url": None if previous is None else v.checkpoint_page_url(run_id, previous),
            "next_url": None if following is None else v.checkpoint_page_url(run_id, following),
            "now": now,
        }
        title = f"Checkpoint round {q.encode_key(row.round)} of run {run_id}"
        return render_page(app, "checkpoint.html", title, {**context, **extra})

    return html_response(await run_read(app, render))


async def diff_page(app: InspectorApp) -> Response:
    """Two runs side by side (``?a=RUN&b=RUN``): their common prefix, the first divergence, each
    side's events after it, and what each spent (bounded reads)."""
    a = q.parse_run_id(request.args.get("a", ""))
    b = q.parse_run_id(request.args.get("b", ""))
    extra = extra_context(app)

    def render(conn: Any) -> str:
        diff = q.diff_runs(conn, a, b, limit=DIFF_ITEMS, max_events=DIFF_EVENTS, max_compare=DIFF_EVENTS)
        sides = [
            ("A", diff.a, v.run_ref(a, diff.a.run.status)),
            ("B", diff.b, v.run_ref(b, diff.b.run.status)),
        ]
        rows = list(itertools.zip_longest(diff.a.items, diff.b.items))
        context = {"diff": diff, "sides": sides, "rows": rows, "max_events": DIFF_EVENTS}
        return render_page(app, "diff.html", f"Runs {a[:8]} and {b[:8]} compared", {**context, **extra})

    return html_response(await run_read(app, render))


def _cut_checkpoint(row: q.CheckpointRow) -> q.CheckpointRow:
    """A checkpoint's state and verification cut to BLOCK_CHARS for the page (the API has all)."""
    return attrs.evolve(
        row,
        state=row.state[:BLOCK_CHARS],
        state_truncated=len(row.state) > BLOCK_CHARS,
        state_size=len(row.state),
        verification=None if row.verification is None else row.verification[:BLOCK_CHARS],
        verification_truncated=row.verification is not None and len(row.verification) > BLOCK_CHARS,
        verification_size=len(row.verification or ""),
    )


@functools.cache
def _stylesheet_bytes() -> bytes:
    return (STATIC / "inspector.css").read_bytes()


def _versions_panel(query: RunsQuery, draining: list[q.Draining]) -> list[v.Tab] | None:
    """The versions still draining, each a link to its runs; None (no panel) unless a live run
    has a version or the page is filtered by one."""
    if query.version is None and all(found.version is None for found in draining):
        return None
    return [
        v.Tab(
            "(none)" if found.version is None else found.version,
            "running",
            found.live,
            found.capped,
            query.url(version=q.NO_VERSION if found.version is None else found.version),
            (q.NO_VERSION if found.version is None else found.version) == query.version,
        )
        for found in draining
    ]


def _runs_context(
    query: RunsQuery,
    page: q.RunPage,
    awaiting: Mapping[str, tuple[q.Awaiting, ...]],
    budgets: Mapping[str, q.Usage],
    database: str,
    now: int,
) -> dict[str, Any]:
    tabs = [v.Tab("all", "all", page.total, bool(page.capped), query.url(status=None), query.status is None)]
    tabs += [
        v.Tab(s, s, page.counts[s], s in page.capped, query.url(status=s), s == query.status)
        for s in q.RUN_STATUSES
    ]
    nav = []
    if page.has_newer:
        nav.append(v.Link("⇤ Newest", query.url()))
        nav.append(v.Link("← Newer", query.url(after=page.runs[0].cursor.encode())))
    if page.has_older:
        nav.append(v.Link("Older →", query.url(before=page.runs[-1].cursor.encode())))
    return {
        "database": database,
        "tabs": tabs,
        "statuses": q.RUN_STATUSES,
        "query": query,
        "rows": v.run_rows(page.runs, awaiting, budgets, now),
        "empty_database": page.total == 0 and query.role is None and query.version is None,
        "show_version": any(run.version is not None for run in page.runs),
        "nav": nav,
        "now": now,
        "chart": None,
        "versions": None,
    }
