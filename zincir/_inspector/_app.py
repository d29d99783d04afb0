"""``zincir ui``: a read-only web inspector (Quart-Trio on Hypercorn's Trio worker).

Safety properties, each enforced here and pinned by tests:

- it binds loopback only (127.0.0.0/8 or ::1, given as a literal IP and port);
- it answers 421 to any request whose ``Host`` is not the exact ``ip:port`` it serves, so a
  DNS-rebinding page cannot read it, and 403 to requests a browser marks
  ``Sec-Fetch-Site: cross-site`` (or that carry that header more than once, or a list in it:
  no browser does); WebSocket connections are refused before the app sees them;
- every response carries a restrictive Content-Security-Policy (no script at all, styles
  only from the inspector itself, no framing), ``nosniff`` and ``no-referrer``: when served,
  Hypercorn itself adds them (:class:`SecuredConfig`), so that the answers it writes on its
  own (a malformed request's 400, a 431, a refused WebSocket's 403, a 101) carry them too;
- it opens the database read-only (SQLite's ``mode=ro``; on PostgreSQL a read-only session and
  ``REPEATABLE READ READ ONLY`` transactions) and never writes, creates or migrates;
- pages are Jinja2 templates (``templates/``) rendered with autoescape always on, from view
  models (:mod:`._views`) of plain data: every value printed is HTML-escaped, whatever its
  type (the queries normalise stored values, but an INTEGER column can hold text, so the
  pages trust no type). No filter returns markup and no template marks data ``|safe``; a
  test scans the templates to keep it so.

Each request reads through its own read-only connection in a worker thread, inside one read
transaction, and renders there too, so the Trio loop never blocks on the database.
"""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import hypercorn.config
import hypercorn.trio
import trio
from quart import Response
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from .. import _queries as q
from .._errors import (
    RunNotFound,
    ZincirError,
)
from . import _views as v
from ._charts import CHART_BUCKETS, status_chart
from ._http import (
    extra_context,
    html_response,
    http_error,
    json_response,
    now_ms,
    render_page,
    run_read,
    unexpected_error,
    zincir_error,
)
from ._params import EventsQuery, RunsQuery, cursor_arg, token_json
from ._plain import DEFAULT_ADDRESS, format_host, parse_address
from ._pool import ReadPool
from ._reads import (
    activity,
    neighbour_rounds,
)
from ._render import STATIC
from ._runpage import PAYLOAD_PREVIEW_CHARS, REFRESH_SECONDS, RunPageData, run_context
from ._security import SECURITY_HEADERS, InspectorApp, SecuredConfig
from ._views import BLOCK_CHARS, CHILDREN_PAGE, ITEM_PREVIEW_CHARS, LIST_LIMIT

__all__ = ["DEFAULT_ADDRESS", "create_app", "format_host", "parse_address", "serve"]

#: A JSON API list stops adding items once their stored values add up to this many characters
#: (at least one item is always given); the response says where to continue.
API_BUDGET_CHARS = 4 * 1024 * 1024
#: Read-only connections a served inspector keeps open between requests.
_KEPT_CONNECTIONS = 4
#: The runs page's chart counts the most recently active this many runs.
CHART_SAMPLE = 2000


# --------------------------------------------------------------------------- app


def create_app(
    database_path: str, served_host: str, *, extend: Callable[[InspectorApp], None] | None = None
) -> QuartTrio:
    """The inspector app for one database, answering only ``Host: <served_host>``.

    ``extend``, when given, is called once with the app after the read-only routes are added:
    the hook for features layered on top (the guarded actions). It may add routes or
    blueprints, set ``app.mode`` (the label in every page's header, ``"read-only"`` by
    default) and append to ``app.page_context``: callables run in each page request's context
    (before the read) returning a mapping merged into the template context. Templates see
    those names directly; ``run.html`` includes ``actions_panel.html`` when that template
    exists (``ignore missing``), with the whole run-page context (``view``: the run, its
    awaits, intents and checkpoints; ``now``) plus those extra names. Everything stays
    autoescaped. Without ``extend`` the app opens no write connection.
    """
    app = InspectorApp(__name__, static_folder=None)
    app.database_path = database_path
    app.served_host = served_host
    app.read_pool = ReadPool(database_path, keep=0)
    app.mode = "read-only"
    app.page_context = []
    app.security_headers = SECURITY_HEADERS
    app.config["JSON_SORT_KEYS"] = False
    _add_routes(app)
    if extend is not None:
        extend(app)
    return app


def _add_routes(app: InspectorApp) -> None:
    routes: list[tuple[str, str, Callable[..., Awaitable[Response]]]] = [
        ("/", "runs", functools.partial(_runs_route, app)),
        ("/runs/<run_id>", "run", functools.partial(_run_route, app)),
        ("/runs/<run_id>/checkpoints/<round>", "checkpoint", functools.partial(_checkpoint_route, app)),
        ("/static/inspector.css", "css", _css_route),
        ("/api/runs", "api_runs", functools.partial(_api_runs, app)),
        ("/api/runs/<run_id>", "api_run", functools.partial(_api_run, app)),
        ("/api/runs/<run_id>/events", "api_events", functools.partial(_api_events, app)),
        ("/api/runs/<run_id>/events/<seq>", "api_event", functools.partial(_api_event, app)),
        ("/api/runs/<run_id>/steps/<path:name>", "api_step", functools.partial(_api_step, app)),
        ("/api/runs/<run_id>/checkpoints/<round>", "api_checkpoint", functools.partial(_api_checkpoint, app)),
    ]
    for rule, endpoint, view in routes:
        app.add_url_rule(rule, endpoint, view, methods=["GET"])
    app.register_error_handler(HTTPException, http_error)
    app.register_error_handler(ZincirError, zincir_error)
    app.register_error_handler(Exception, unexpected_error)


# --------------------------------------------------------------------------- plumbing


# --------------------------------------------------------------------------- routes


async def _css_route() -> Response:
    response = Response(_stylesheet(), content_type="text/css; charset=utf-8")
    response.headers["Cache-Control"] = "max-age=300"
    return response


async def _runs_route(app: InspectorApp) -> Response:
    query = RunsQuery.from_request()
    now = now_ms()

    extra = extra_context(app)

    def render(conn: Any) -> str:
        page = query.fetch(conn)
        awaiting = q.list_awaiting(conn, [r.id for r in page.runs if r.status in ("running", "waiting")])
        budgets = q.budgets_of(conn, [r.id for r in page.runs], now)
        chart = status_chart(activity(conn, CHART_SAMPLE, CHART_BUCKETS), q.RUN_STATUSES, page.total)
        context = _runs_context(query, page, awaiting, budgets, q.display_target(app.database_path), now)
        return render_page(app, "runs.html", "Runs", {**context, "chart": chart, **extra})

    return html_response(await run_read(app, render))


async def _run_route(app: InspectorApp, run_id: str) -> Response:
    run_id = q.parse_run_id(run_id)
    query = EventsQuery.from_request(q.DEFAULT_PAGE, PAYLOAD_PREVIEW_CHARS)
    now = now_ms()

    extra = extra_context(app)

    def render(conn: Any) -> str:
        view = RunPageData.fetch(run_id, query, conn)
        context = run_context(view, query, now)
        refresh = REFRESH_SECONDS if context["view"].refresh_on else None
        return render_page(app, "run.html", f"Run {run_id}", {**context, **extra}, refresh=refresh)

    return html_response(await run_read(app, render))


async def _checkpoint_route(app: InspectorApp, run_id: str, round: str) -> Response:
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


async def _api_runs(app: InspectorApp) -> Response:
    query = RunsQuery.from_request()
    page = await run_read(app, query.fetch)
    return json_response(
        {
            "runs": [q.run_to_json(run) for run in page.runs],
            "counts": dict(page.counts),
            "total": page.total,
            "capped": sorted(page.capped),
            "newer": page.runs[0].cursor.encode() if page.has_newer else None,
            "older": page.runs[-1].cursor.encode() if page.has_older else None,
        }
    )


class _Budget:
    """Characters a JSON list response may still spend; the first item is always allowed."""

    def __init__(self, chars: int) -> None:
        self.left, self.spent_any = chars, False

    def take(self, chars: int) -> bool:
        if self.spent_any and chars > self.left:
            return False
        self.left -= chars
        self.spent_any = True
        return True


def _run_json(run_id: str, children_after: q.RunCursor | None, conn: Any) -> dict[str, Any]:
    """The run and its first checkpoints, steps and timers (``truncated`` says if a list is cut).

    Checkpoint states and verifications and step results longer than ITEM_PREVIEW_CHARS are
    given as their beginning, with the ``url`` of the whole item; the lists stop at LIST_LIMIT
    items or once their values add up to API_BUDGET_CHARS.
    """
    run = q.get_run(conn, run_id, children_limit=CHILDREN_PAGE, children_after=children_after)
    checkpoints = q.list_checkpoints(conn, run_id, limit=LIST_LIMIT + 1, max_chars=ITEM_PREVIEW_CHARS)
    steps = q.list_steps(conn, run_id, limit=LIST_LIMIT + 1, max_chars=ITEM_PREVIEW_CHARS)
    timers = q.list_timers(conn, run_id, limit=LIST_LIMIT + 1)
    awaiting = q.list_awaiting(conn, [run_id]).get(run_id, ())
    outsider_actions = q.list_outsider_actions(conn, run_id, limit=LIST_LIMIT + 1)
    budget = _Budget(API_BUDGET_CHARS)
    checkpoint_items = []
    for c in checkpoints[:LIST_LIMIT]:
        if not budget.take(len(c.state) + len(c.verification or "")):
            break
        item = q.checkpoint_to_json(run_id, c)
        if c.truncated:
            item["url"] = v.checkpoint_api_url(run_id, c)
        checkpoint_items.append(item)
    step_items = []
    for s in steps[:LIST_LIMIT]:
        if not budget.take(len(s.result or "")):
            break
        item = q.step_to_json(run_id, s)
        if s.truncated:
            item["url"] = v.step_api_url(run_id, s)
        step_items.append(item)
    return {
        "run": q.run_to_json(run),
        "children_total": run.children_total,
        "children_capped": run.children_capped,
        "children_next": run.children_next.encode() if run.children_next else None,
        "checkpoints": checkpoint_items,
        "steps": step_items,
        "timers": [q.timer_to_json(run_id, t) for t in timers[:LIST_LIMIT]],
        "awaiting": [q.awaiting_to_json(a) for a in awaiting[:LIST_LIMIT]],
        "outsider_actions": [q.outsider_action_to_json(a) for a in outsider_actions[:LIST_LIMIT]],
        "truncated": {
            "checkpoints": len(checkpoint_items) < len(checkpoints),
            "steps": len(step_items) < len(steps),
            "timers": len(timers) > LIST_LIMIT,
            "outsider_actions": len(outsider_actions) > LIST_LIMIT,
        },
    }


async def _api_run(app: InspectorApp, run_id: str) -> Response:
    run_id = q.parse_run_id(run_id)
    children_after = cursor_arg("children_after")
    return json_response(await run_read(app, functools.partial(_run_json, run_id, children_after)))


def _events_json(run_id: str, query: EventsQuery, conn: Any) -> dict[str, Any]:
    q.get_run(conn, run_id, children_limit=0)
    page = query.fetch(run_id, conn, max_chars_total=API_BUDGET_CHARS)
    return {
        "events": [q.event_to_json(run_id, e) for e in page.events],
        "has_before": page.has_before,
        "has_after": page.has_after,
        "next_after": token_json(page.next_after) if page.has_after else None,
        "prev_before": token_json(page.prev_before) if page.has_before else None,
        "scan_edge": token_json(page.scan_edge) if page.scan_edge is not None else None,
    }


async def _api_events(app: InspectorApp, run_id: str) -> Response:
    run_id = q.parse_run_id(run_id)
    query = EventsQuery.from_request(q.DEFAULT_PAGE, None)
    return json_response(await run_read(app, functools.partial(_events_json, run_id, query)))


def _item_json(
    kind: str,
    run_id: str,
    key: object,
    missing: str,
    fetch: Callable[..., Any],
    to_json: Callable[..., Any],
    conn: Any,
) -> dict[str, Any]:
    """One whole event, step or checkpoint of a run, or a 404 naming ``missing``."""
    q.get_run(conn, run_id, children_limit=0)
    item = fetch(conn, run_id, key)
    if item is None:
        raise RunNotFound(f"run {run_id} has no {missing}")
    return {kind: to_json(run_id, item)}


async def _api_item(
    app: InspectorApp,
    run_id: str,
    kind: str,
    key: object,
    missing: str,
    fetch: Callable[..., Any],
    to_json: Callable[..., Any],
) -> Response:
    run_id = q.parse_run_id(run_id)
    read = functools.partial(_item_json, kind, run_id, key, missing, fetch, to_json)
    return json_response(await run_read(app, read))


async def _api_event(app: InspectorApp, run_id: str, seq: str) -> Response:
    value = q.decode_key(seq, "event seq")
    missing = f"event #{q.encode_key(value)}"
    return await _api_item(app, run_id, "event", value, missing, q.get_event, q.event_to_json)


async def _api_step(app: InspectorApp, run_id: str, name: str) -> Response:
    return await _api_item(app, run_id, "step", name, f"step {name[:80]!r}", q.get_step, q.step_to_json)


async def _api_checkpoint(app: InspectorApp, run_id: str, round: str) -> Response:
    value = q.decode_key(round, "checkpoint round")
    missing = f"checkpoint round {q.encode_key(value)}"
    return await _api_item(app, run_id, "checkpoint", value, missing, q.get_checkpoint, q.checkpoint_to_json)


# --------------------------------------------------------------------------- queries


# --------------------------------------------------------------------------- pages


@functools.cache
def _stylesheet() -> bytes:
    return (STATIC / "inspector.css").read_bytes()


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
        "empty_database": page.total == 0 and query.role is None,
        "nav": nav,
        "now": now,
        "chart": None,
    }


# --------------------------------------------------------------------------- serving


async def _until_signal(signals: Any, stop: trio.Event) -> None:
    async for _ in signals:
        stop.set()
        return


def _check_database(path: str) -> None:
    q.open_readonly(path).close()


async def serve(
    database_path: str,
    address: str = DEFAULT_ADDRESS,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    extend: Callable[[InspectorApp], None] | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the inspector for ``database_path`` on a loopback ``address`` until shutdown.

    Checks the address and the database (read-only) before binding. Reports the served URL
    through ``task_status``. Without ``shutdown_trigger`` it stops gracefully on SIGINT or
    SIGTERM (main thread only; elsewhere it runs until cancelled).
    """
    ip, port = parse_address(address)
    await trio.to_thread.run_sync(_check_database, database_path)
    app = create_app(database_path, format_host(ip, port), extend=extend)
    assert isinstance(app, InspectorApp)
    app.read_pool = ReadPool(database_path, keep=_KEPT_CONNECTIONS)
    try:
        await _serve_app(app, ip, port, shutdown_trigger, task_status)
    finally:
        app.read_pool.close()


async def _serve_app(
    app: InspectorApp,
    ip: str,
    port: int,
    shutdown_trigger: Callable[[], Awaitable[None]] | None,
    task_status: trio.TaskStatus[str],
) -> None:
    config = SecuredConfig(app)
    app.server_adds_headers = True
    config.bind = [format_host(ip, port)]
    config.loglevel = "WARNING"
    config.include_server_header = False
    config.graceful_timeout = 2.0
    async with trio.open_nursery() as nursery:
        if shutdown_trigger is None:
            shutdown_trigger = await _default_trigger(nursery)
        serving = functools.partial(hypercorn.trio.serve, app, config, shutdown_trigger=shutdown_trigger)
        binds: list[str] = await nursery.start(serving)
        app.served_host = binds[0].removeprefix("http://")
        task_status.started(f"http://{app.served_host}/")


async def _default_trigger(nursery: trio.Nursery) -> Callable[[], Awaitable[None]]:
    if threading.current_thread() is not threading.main_thread():
        return trio.sleep_forever
    stop = trio.Event()

    async def watch(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            task_status.started()
            await _until_signal(signals, stop)

    await nursery.start(watch)
    return stop.wait
