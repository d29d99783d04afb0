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
from collections.abc import Awaitable, Callable, Iterable, Mapping
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
from ._charts import CHART_BUCKETS, LANE_CAP, BudgetBar, Timeline, budget_bars, status_chart, timeline
from ._conversation import Candidate, Context, Entry, call_ids_of, decided_on_page, entries
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
from ._plain import DEFAULT_ADDRESS, format_host, human_delta, parse_address
from ._pool import ReadPool
from ._reads import (
    CallOutcome,
    Intent,
    Mark,
    Restarts,
    WaitSpan,
    activity,
    call_outcomes,
    intents_since,
    latest_events,
    neighbour_rounds,
    restarts_after,
    wait_spans,
)
from ._render import STATIC
from ._security import SECURITY_HEADERS, InspectorApp, SecuredConfig
from ._views import LIST_LIMIT

__all__ = ["DEFAULT_ADDRESS", "create_app", "format_host", "parse_address", "serve"]

#: Payload characters shown per event on a run page; the JSON API gives whole payloads.
PAYLOAD_PREVIEW_CHARS = 64 * 1024
#: Characters of a run's configuration shown before cutting (the JSON API gives it whole).
BLOCK_CHARS = 256 * 1024
#: Characters of each checkpoint state or verification and each step result in a list (page
#: and JSON API alike); the per-item JSON endpoints give the whole value.
ITEM_PREVIEW_CHARS = 8 * 1024
#: A JSON API list stops adding items once their stored values add up to this many characters
#: (at least one item is always given); the response says where to continue.
API_BUDGET_CHARS = 4 * 1024 * 1024
#: Children listed per page of the family section.
CHILDREN_PAGE = 100
# The family tree on a run page: grandchildren and below, this deep and this wide per run.
TREE_DEPTH = 4
TREE_WIDTH = 20
REFRESH_SECONDS = 5
#: The run page's timeline covers the latest this many events (the whole run when shorter).
TIMELINE_EVENTS = 600
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
        view = _RunView.fetch(run_id, query, conn)
        context = _run_context(view, query, now)
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
            "card": _with_interruption(run, v.checkpoint_view(run_id, row, builds_on), now),
            "previous_url": None if previous is None else v.checkpoint_page_url(run_id, previous),
            "next_url": None if following is None else v.checkpoint_page_url(run_id, following),
            "now": now,
        }
        title = f"Checkpoint round {q.encode_key(row.round)} of run {run_id}"
        return render_page(app, "checkpoint.html", title, {**context, **extra})

    return html_response(await run_read(app, render))


def _with_interruption(run: q.RunDetail, card: v.CheckpointView, now: int) -> v.CheckpointView:
    """A candidate's card says whether its verification was interrupted."""
    if card.row.status != "candidate":
        return card
    return attrs.evolve(card, interrupted=q.verification_interrupted(run, card.row, now))


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


_checkpoint_url = v.checkpoint_api_url
_step_url = v.step_api_url


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
            item["url"] = _checkpoint_url(run_id, c)
        checkpoint_items.append(item)
    step_items = []
    for s in steps[:LIST_LIMIT]:
        if not budget.take(len(s.result or "")):
            break
        item = q.step_to_json(run_id, s)
        if s.truncated:
            item["url"] = _step_url(run_id, s)
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


class _RunView:
    def __init__(
        self,
        run: q.RunDetail,
        checkpoints: tuple[q.CheckpointRow, ...],
        events: q.EventPage,
        types: tuple[str, ...],
        steps: tuple[q.StepRow, ...],
        timers: tuple[q.TimerRow, ...],
        awaiting: tuple[q.Awaiting, ...],
        approvals: tuple[q.ApprovalRequest, ...],
        family: tuple[tuple[q.RunSummary, ...], q.FamilyNode],
        budget: q.Usage | None,
        intents: tuple[q.IntentRow, ...],
        outcomes: Mapping[str, CallOutcome],
        marks: tuple[tuple[Mark, ...], bool],
        window_intents: tuple[Intent, ...],
        waits: tuple[WaitSpan, ...],
        outsider_actions: tuple[q.OutsiderAction, ...],
    ) -> None:
        self.run, self.checkpoints, self.events, self.types = run, checkpoints, events, types
        self.steps, self.timers, self.awaiting, self.approvals = steps, timers, awaiting, approvals
        self.ancestors, self.descendants = family
        self.budget, self.intents = budget, intents
        self.outcomes, (self.marks, self.earlier) = outcomes, marks
        self.window_intents, self.waits = window_intents, waits
        self.outsider_actions = outsider_actions
        # What the conversation needs beyond the page (set by fetch in the conversation view).
        self.restarts = Restarts((), -1)
        self.reconciled: frozenset[object] = frozenset()
        self.candidate: q.CheckpointRow | None = None

    @classmethod
    def fetch(cls, run_id: str, query: EventsQuery, conn: Any) -> _RunView:
        events = query.fetch(run_id, conn)
        conversation = query.view != "events"
        outcomes = (
            call_outcomes(conn, run_id, call_ids_of(events.events), max_chars=ITEM_PREVIEW_CHARS)
            if conversation
            else {}
        )
        later = query.after is not None or query.before is not None
        awaiting = q.list_awaiting(conn, [run_id]).get(run_id, ())
        approvals = (  # the calls and arguments a decision binds to
            q.list_open_approvals(conn, run_id, now_ms(), limit=LIST_LIMIT)
            if any(item.kind == "approval" for item in awaiting)
            else ()
        )
        marks: tuple[tuple[Mark, ...], bool] = ((), False)
        window: tuple[Intent, ...] = ()
        waits: tuple[WaitSpan, ...] = ()
        if not later:
            marks = latest_events(conn, run_id, TIMELINE_EVENTS)
            first_seq = marks[0][0].seq if marks[0] else 0
            window = intents_since(conn, run_id, first_seq, LANE_CAP * 2)
            waits = wait_spans(conn, run_id, LIST_LIMIT)
        view = cls(
            q.get_run(
                conn,
                run_id,
                children_limit=CHILDREN_PAGE,
                children_after=query.children_after,
                max_config_chars=BLOCK_CHARS,
                max_result_chars=BLOCK_CHARS,
            ),
            q.list_checkpoints(conn, run_id, limit=LIST_LIMIT + 1, max_chars=ITEM_PREVIEW_CHARS),
            events,
            q.event_types(conn, run_id),
            q.list_steps(conn, run_id, limit=LIST_LIMIT + 1, max_chars=ITEM_PREVIEW_CHARS),
            q.list_timers(conn, run_id, limit=LIST_LIMIT + 1),
            awaiting,
            approvals,
            q.family_tree(conn, run_id, depth=TREE_DEPTH, per_node=TREE_WIDTH),
            q.budgets_of(conn, [run_id], now_ms()).get(run_id),
            q.list_intents(conn, run_id, limit=LIST_LIMIT + 1),
            outcomes,
            marks,
            window,
            waits,
            () if later else q.list_outsider_actions(conn, run_id, limit=LIST_LIMIT + 1),
        )
        if conversation:
            view._fetch_beyond_the_page(conn)
        return view

    def _fetch_beyond_the_page(self, conn: Any) -> None:
        """The restarts between the page's calls and their results (to keep log order), which
        results a reconcile probe found, and the undecided candidate (bounded reads)."""
        run_id = self.run.id
        seqs = [e.seq for e in self.events.events if type(e.seq) is int]
        results = [o.result.seq for o in self.outcomes.values() if o.result is not None]
        if seqs:
            upto = max([seqs[-1], *(r for r in results if type(r) is int)])
            self.restarts = restarts_after(conn, run_id, seqs[0] - 1, upto, q.SCAN_WINDOW)
        on_page = [e.seq for e in self.events.events if e.type == "tool_result"]
        self.reconciled = q.reconciled_results(conn, run_id, [*results, *on_page])
        self.candidate = q.candidate_checkpoint(conn, run_id)


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


@attrs.frozen
class _StepView:
    row: q.StepRow
    result: v.Stored | None


@attrs.frozen
class _EventView:
    row: q.EventRow
    anchor: str
    payload: v.Stored


@attrs.define
class RunPageView:
    """Everything ``run.html`` shows of one run (plain data; see :mod:`._views`)."""

    run: q.RunDetail
    live: bool
    refresh_on: bool
    refresh_seconds: int
    pause_url: str
    resume_url: str
    lease_state: str | None
    lease_delta: str
    next_attempt: str  # "ended", "awaits", "any" or "at"
    awaiting: tuple[q.Awaiting, ...]
    approvals: list[v.ApprovalView]  # the open requests, with all their calls' arguments
    budget: q.Usage | None
    spend: str
    budget_rows: list[v.BudgetRow]
    intents: tuple[q.IntentRow, ...]
    outsider_actions: tuple[q.OutsiderAction, ...]
    ancestors: list[v.RunRef]
    parent: v.RunRef | None
    children: list[v.TreeNode]
    children_nav: list[v.Link]
    children_first_url: str | None
    config: v.Stored
    result: v.Stored | None  # what the run completed with (None: nothing, or not completed)
    checkpoints: list[v.CheckpointView]
    checkpoint_count: int
    events: q.EventPage
    event_items: list[_EventView]
    types: tuple[str, ...]
    type: str | None
    events_action: str
    events_hidden: list[tuple[str, str]]
    events_nav: list[v.Link]
    steps: list[_StepView]
    step_count: int
    timers: tuple[q.TimerRow, ...]
    mode: str  # "conversation" or "events"
    page_url: str  # /runs/<id>, for the section links
    later_page: bool  # paged past the first page: the overview is left out
    top_url: str
    conversation_url: str
    raw_url: str
    entries: list[Entry]
    open_waits_here: bool
    waiting_for: list[WaitLine]
    timeline: Timeline | None
    budget_bars: list[BudgetBar]
    over_budget: bool


@attrs.frozen
class WaitLine:
    """One thing the run waits for, in words: "signal 'go' (wait 'w')"."""

    item: q.Awaiting
    kind: str
    what: str
    url: str | None
    link_label: str


def _wait_lines(awaiting: Iterable[q.Awaiting]) -> list[WaitLine]:
    lines = []
    for a in awaiting:
        if a.kind == "signal":
            lines.append(WaitLine(a, a.kind, f"signal {a.target!r} (wait {a.name!r})", None, ""))
        elif a.kind == "approval":
            lines.append(WaitLine(a, a.kind, f"approval of tool call {a.name!r} ({a.target})", None, ""))
        elif a.kind == "child":
            ref = v.run_ref(a.name)
            lines.append(WaitLine(a, a.kind, f"child run {a.name} to end", ref.url, "open it"))
        elif a.kind == "budget":
            lines.append(WaitLine(a, a.kind, f"its budget to be raised ({a.name} reached)", None, ""))
        else:
            lines.append(WaitLine(a, a.kind, f"sleep {a.name!r} to end", None, ""))
    return lines


def _run_context(view: _RunView, query: EventsQuery, now: int) -> dict[str, Any]:
    run = view.run
    cards = [_with_interruption(run, card, now) for card in v.checkpoint_views(run.id, view.checkpoints)]
    live = run.status in v.LIVE
    lease_state, lease_delta = None, ""
    if run.lease_owner is not None and type(run.lease_expires_at) is int:
        left = run.lease_expires_at - now
        lease_state, lease_delta = ("active" if left > 0 else "expired"), human_delta(left)
    if run.status in v.TERMINAL:
        next_attempt = "ended"
    elif run.next_attempt_at is None:
        next_attempt = "awaits"
    elif type(run.next_attempt_at) is int and run.next_attempt_at <= 0:
        next_attempt = "any"
    else:
        next_attempt = "at"
    page = RunPageView(
        run=run,
        live=live,
        refresh_on=live and query.refresh != "off",
        refresh_seconds=REFRESH_SECONDS,
        pause_url=query.url(run.id, refresh="off"),
        resume_url=query.url(run.id, refresh=None),
        lease_state=lease_state,
        lease_delta=lease_delta,
        next_attempt=next_attempt,
        awaiting=view.awaiting,
        approvals=v.approval_views(view.approvals),
        budget=view.budget,
        spend="" if view.budget is None else q.spend_text(view.budget),
        budget_rows=[] if view.budget is None else v.budget_rows(view.budget),
        intents=view.intents,
        outsider_actions=view.outsider_actions,
        **_family_fields(view, query),
        config=v.Stored(run.config, run.config_truncated, run.config_size, v.path("api", "runs", run.id)),
        result=None
        if run.result is None
        else v.Stored(run.result, run.result_truncated, run.result_size, v.path("api", "runs", run.id)),
        checkpoints=cards,
        checkpoint_count=len(view.checkpoints),
        **_event_fields(view, query),
        steps=[
            _StepView(
                s,
                None
                if s.result is None
                else v.Stored(s.result, s.truncated, s.result_size, _step_url(run.id, s)),
            )
            for s in view.steps[:LIST_LIMIT]
        ],
        step_count=len(view.steps),
        timers=view.timers,
        **_agent_fields(view, query, now, live, cards),
    )
    return {"view": page, "now": now, "limit": LIST_LIMIT, "scan_window": q.SCAN_WINDOW}


def _agent_fields(
    view: _RunView, query: EventsQuery, now: int, live: bool, cards: list[v.CheckpointView]
) -> dict[str, Any]:
    """The conversation, what the run waits for, the timeline and the spend bars."""
    run = view.run
    mode = "events" if query.view == "events" else "conversation"
    later = query.after is not None or query.before is not None
    found: list[Entry] = []
    if mode == "conversation":
        row = view.candidate
        candidate = (
            None
            if row is None
            else Candidate(row.tool_call_id, row.round, q.verification_interrupted(run, row, now))
        )
        ctx = Context(
            run.id,
            view.outcomes,
            {c.row.round: c for c in cards},
            frozenset(a.name for a in view.awaiting if a.kind == "approval"),
            decided_on_page(view.events.events),
            {c.id: c.status for c in run.children},
            view.restarts,
            view.reconciled,
            candidate,
        )
        found = entries(ctx, view.events.events)
    tl = None
    if not later:
        tl = timeline(
            run=run,
            now=now,
            marks=view.marks,
            earlier=view.earlier,
            intents=view.window_intents,
            steps=view.steps[:LIST_LIMIT],
            timers=view.timers[:LIST_LIMIT],
            waits=view.waits,
            checkpoints=view.checkpoints[:LIST_LIMIT],
            live=live,
        )
    bars = [] if view.budget is None else budget_bars(view.budget)
    base = v.path("runs", run.id)
    return {
        "mode": mode,
        "page_url": base,
        "later_page": later,
        "top_url": query.url(run.id, after=None, before=None),
        "conversation_url": v.fragment(v.url(base, {"refresh": query.refresh}), "views"),
        "raw_url": v.fragment(v.url(base, {"view": "events", "refresh": query.refresh}), "views"),
        "entries": found,
        "open_waits_here": mode == "conversation" and not view.events.has_after,
        "waiting_for": _wait_lines(view.awaiting[:LIST_LIMIT]),
        "timeline": tl,
        "budget_bars": bars,
        "over_budget": any(b.over for b in bars),
    }


def _family_fields(view: _RunView, query: EventsQuery) -> dict[str, Any]:
    run = view.run
    below = {node.run.id: node for node in view.descendants.children}
    children = [
        v.TreeNode(v.run_ref(c.id, c.status, c.role), v.tree_nodes(below.get(c.id)), _more(below.get(c.id)))
        for c in run.children
    ]
    nav = []
    first_url = None
    if run.children:
        if query.children_after is not None:
            nav.append(v.Link("⇤ First children", v.fragment(query.url(run.id), "family")))
        if run.children_next is not None:
            more = query.url(run.id, children_after=run.children_next.encode())
            nav.append(v.Link("More children →", v.fragment(more, "family")))
    elif query.children_after is not None:
        first_url = v.fragment(query.url(run.id), "family")
    return {
        "ancestors": [v.run_ref(a.id, a.status, a.role) for a in view.ancestors],
        "parent": v.run_ref(run.parent_run_id) if run.parent_run_id else None,
        "children": children,
        "children_nav": nav,
        "children_first_url": first_url,
    }


def _more(node: q.FamilyNode | None) -> int:
    return 0 if node is None else node.more


def _event_fields(view: _RunView, query: EventsQuery) -> dict[str, Any]:
    run_id = view.run.id
    page = view.events
    scanning = page.scan_edge is not None

    def link(label: str, **changes: Any) -> v.Link:
        return v.Link(label, v.fragment(query.url(run_id, **changes), "events"))

    nav = []
    if page.has_before:
        nav.append(link("⇤ First", after=None, before=None))
        if page.prev_before is not None:
            back = scanning and page.prev_before == page.scan_edge
            nav.append(
                link("← Continue scanning" if back else "← Previous", after=None, before=page.prev_before)
            )
    if page.has_after:
        if page.next_after is not None:
            onward = scanning and page.next_after == page.scan_edge
            nav.append(
                link("Continue scanning →" if onward else "Next →", after=page.next_after, before=None)
            )
        nav.append(link("Latest ⇥", after=None, before=q.LATEST))
    items = []
    for event in page.events:
        api = v.path("api", "runs", run_id, "events", q.encode_key(event.seq)) if event.truncated else None
        items.append(
            _EventView(
                event, v.anchor(event.seq), v.Stored(event.payload, event.truncated, event.payload_size, api)
            )
        )
    return {
        "events": page,
        "event_items": items,
        "types": view.types,
        "type": query.type,
        "events_action": v.fragment(v.path("runs", run_id), "events"),
        "events_hidden": [("refresh", "off")] if query.refresh == "off" else [],
        "events_nav": nav,
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
