"""``zincir ui``: a read-only web inspector (Quart-Trio on Hypercorn's Trio worker).

Safety properties, each enforced here and pinned by tests:

- it binds loopback only (127.0.0.0/8 or ::1, given as a literal IP and port);
- it answers 421 to any request whose ``Host`` is not the exact ``ip:port`` it serves, so a
  DNS-rebinding page cannot read it;
- every response carries a restrictive Content-Security-Policy (no script at all, styles
  only from the inspector itself, no framing), ``nosniff`` and ``no-referrer``;
- it opens the database with SQLite's ``mode=ro`` and never writes, creates or migrates;
- every stored value is HTML-escaped before it reaches a page.

Each request reads through its own read-only connection in a worker thread, inside one read
transaction, and renders there too, so the Trio loop never blocks on SQLite.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import html
import ipaddress
import json
import re
import signal
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import hypercorn.config
import hypercorn.trio
import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, ASGISendEvent, Scope
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from . import _queries as q
from ._errors import DatabaseBusy, InvalidArgument, RunNotFound, StorageError, ZincirError
from ._version import __version__

__all__ = ["DEFAULT_ADDRESS", "create_app", "format_host", "parse_address", "serve"]

DEFAULT_ADDRESS = "127.0.0.1:8787"
RUNS_PAGE = 50
#: Payload characters shown per event on a run page; the JSON API gives whole payloads.
PAYLOAD_PREVIEW_CHARS = 64 * 1024
#: Characters of a configuration, state or step result shown before cutting.
BLOCK_CHARS = 256 * 1024
REFRESH_SECONDS = 5

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)
_SECURITY_NAMES = frozenset(name for name, _ in SECURITY_HEADERS)

T = TypeVar("T")


# --------------------------------------------------------------------------- addresses

_ADDRESS = re.compile(r"(?:\[(?P<v6>[^\]]*)\]|(?P<v4>[^:\[\]]*)):(?P<port>[0-9]{1,5})")


def parse_address(text: str) -> tuple[str, int]:
    """Parse ``IP:PORT`` (IPv6 in brackets) and insist on a loopback address.

    Returns the canonical IP text and the port (0 asks for any free port). Raises
    :class:`InvalidArgument` for hostnames, wildcard or non-loopback addresses.
    """
    match = _ADDRESS.fullmatch(text)
    if match is None:
        raise InvalidArgument(
            f"invalid inspector address {text!r}: expected a literal loopback IP and port, "
            "such as 127.0.0.1:8787 or [::1]:8787"
        )
    literal = match.group("v6") if match.group("v6") is not None else match.group("v4")
    port = int(match.group("port"))
    if port > 65535:
        raise InvalidArgument(f"invalid inspector address {text!r}: port {port} is above 65535")
    try:
        ip = ipaddress.ip_address(literal)
    except ValueError:
        raise InvalidArgument(
            f"invalid inspector address {text!r}: {literal!r} is not a literal IP address "
            "(hostnames such as localhost are not accepted; use 127.0.0.1 or [::1])"
        ) from None
    if (match.group("v6") is None) != (ip.version == 4):
        raise InvalidArgument(
            f"invalid inspector address {text!r}: IPv6 addresses must be bracketed, IPv4 addresses must not"
        )
    if not _is_loopback(ip):
        raise InvalidArgument(
            f"refusing inspector address {text!r}: the inspector binds loopback only "
            "(127.0.0.0/8 or [::1]); it has no authentication"
        )
    return str(ip), port


def _is_loopback(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv4Address):
        return ip in ipaddress.IPv4Network("127.0.0.0/8")
    return ip.scope_id is None and ip == ipaddress.IPv6Address("::1")


def format_host(ip: str, port: int) -> str:
    """The ``Host`` header value (and URL authority) of ``ip:port``."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


# --------------------------------------------------------------------------- app


class InspectorApp(QuartTrio):
    """The inspector's Quart-Trio app: checks ``Host`` and adds security headers."""

    database_path: str
    served_host: str

    async def asgi_app(self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "http":
            await super().asgi_app(scope, receive, send)
            return
        if _host_of(scope["headers"]) not in _accepted_hosts(self.served_host):
            await _send_misdirected(send)
            return
        await super().asgi_app(scope, receive, _secured(send))


def _accepted_hosts(served_host: str) -> tuple[str, ...]:
    # Browsers leave out the default port: http://127.0.0.1:80/ is sent as "Host: 127.0.0.1".
    served = served_host.lower()
    return (served, served.removesuffix(":80")) if served.endswith(":80") else (served,)


def _host_of(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    hosts = [value for name, value in headers if name.lower() == b"host"]
    if len(hosts) != 1:
        return None
    return hosts[0].decode("latin-1").lower()


def _secured(send: ASGISendCallable) -> ASGISendCallable:
    async def send_secured(message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start":
            kept = [(n, v) for n, v in message["headers"] if n.lower() not in _SECURITY_NAMES]
            message = {**message, "headers": [*kept, *SECURITY_HEADERS]}
        await send(message)

    return send_secured


async def _send_misdirected(send: ASGISendCallable) -> None:
    body = _page(
        "Misdirected request",
        _error_body(
            421,
            "Misdirected Request",
            "This inspector only answers requests addressed to the loopback address it serves.",
        ),
    ).encode()
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        *SECURITY_HEADERS,
    ]
    await send({"type": "http.response.start", "status": 421, "headers": headers, "trailers": False})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def create_app(database_path: str, served_host: str) -> QuartTrio:
    """The inspector app for one database, answering only ``Host: <served_host>``."""
    app = InspectorApp(__name__, static_folder=None)
    app.database_path = database_path
    app.served_host = served_host
    app.config["JSON_SORT_KEYS"] = False
    _add_routes(app)
    return app


def _add_routes(app: InspectorApp) -> None:
    app.add_url_rule("/", "runs", functools.partial(_runs_route, app), methods=["GET"])
    app.add_url_rule("/runs/<run_id>", "run", functools.partial(_run_route, app), methods=["GET"])
    app.add_url_rule("/static/inspector.css", "css", _css_route, methods=["GET"])
    app.add_url_rule("/api/runs", "api_runs", functools.partial(_api_runs, app), methods=["GET"])
    app.add_url_rule("/api/runs/<run_id>", "api_run", functools.partial(_api_run, app), methods=["GET"])
    app.add_url_rule(
        "/api/runs/<run_id>/events",
        "api_events",
        functools.partial(_api_events, app),
        methods=["GET"],
    )
    app.add_url_rule(
        "/api/runs/<run_id>/events/<seq>",
        "api_event",
        functools.partial(_api_event, app),
        methods=["GET"],
    )
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(ZincirError, _zincir_error)


# --------------------------------------------------------------------------- plumbing


def _read_with(path: str, read: Callable[[Any], T]) -> T:
    conn = q.open_readonly(path)
    try:
        with q.read_snapshot(conn):
            return read(conn)
    finally:
        conn.close()


async def _read(app: InspectorApp, read: Callable[[Any], T]) -> T:
    """Run ``read(conn)`` in a worker thread on a fresh read-only connection, one snapshot."""
    return await trio.to_thread.run_sync(_read_with, app.database_path, read)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _html(body: str, status: int = 200) -> Response:
    response = Response(body, status=status, content_type="text/html; charset=utf-8")
    response.headers["Cache-Control"] = "no-store"
    return response


def _json(data: Any, status: int = 200) -> Response:
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    response = Response(text, status=status, content_type="application/json; charset=utf-8")
    response.headers["Cache-Control"] = "no-store"
    return response


def _wants_json() -> bool:
    return request.path.startswith("/api/")


def _error_response(status: int, name: str, message: str) -> Response:
    if _wants_json():
        return _json({"error": {"status": status, "name": name, "message": message}}, status)
    return _html(_page(f"{status} {name}", _error_body(status, name, message)), status)


_ERROR_STATUS: tuple[tuple[type[ZincirError], int, str], ...] = (
    (InvalidArgument, 400, "Bad Request"),
    (RunNotFound, 404, "Not Found"),
    (DatabaseBusy, 503, "Service Unavailable"),
    (StorageError, 500, "Internal Server Error"),
)


async def _zincir_error(error: ZincirError) -> Response:
    for kind, status, name in _ERROR_STATUS:
        if isinstance(error, kind):
            return _error_response(status, name, str(error))
    return _error_response(500, "Internal Server Error", str(error))


async def _http_error(error: HTTPException) -> Response:
    status = error.code or 500
    return _error_response(status, error.name, error.description or "")


def _arg(name: str) -> str | None:
    value = request.args.get(name)
    return value if value else None


def _int_arg(name: str, default: int | None, low: int, high: int) -> int | None:
    text = _arg(name)
    if text is None:
        return default
    if not re.fullmatch(r"-?[0-9]{1,19}", text):
        raise InvalidArgument(f"query parameter {name}={text[:40]!r} is not an integer")
    value = int(text)
    if not low <= value <= high:
        raise InvalidArgument(f"query parameter {name}={value} is outside {low}..{high}")
    return value


_MAX_SEQ = 2**63 - 1


def _status_arg() -> str | None:
    status = _arg("status")
    if status is not None and status not in q.RUN_STATUSES:
        raise InvalidArgument(f"unknown status {status[:40]!r}: expected one of {q.RUN_STATUSES}")
    return status


def _cursor_arg(name: str) -> q.RunCursor | None:
    text = _arg(name)
    return None if text is None else q.parse_cursor(text)


# --------------------------------------------------------------------------- routes


async def _css_route() -> Response:
    response = Response(STYLESHEET, content_type="text/css; charset=utf-8")
    response.headers["Cache-Control"] = "max-age=300"
    return response


async def _runs_route(app: InspectorApp) -> Response:
    query = _RunsQuery.from_request()
    page = await _read(app, query.fetch)
    return _html(_page("Runs", _runs_body(query, page, app.database_path, _now_ms())))


async def _run_route(app: InspectorApp, run_id: str) -> Response:
    run_id = q.parse_run_id(run_id)
    query = _EventsQuery.from_request(q.DEFAULT_PAGE, PAYLOAD_PREVIEW_CHARS)
    view = await _read(app, functools.partial(_RunView.fetch, run_id, query))
    refresh = view.run.status in ("pending", "running") and _arg("refresh") != "off"
    body = _run_body(view, query, _now_ms(), refresh)
    return _html(_page(f"Run {run_id}", body, refresh=REFRESH_SECONDS if refresh else None))


async def _api_runs(app: InspectorApp) -> Response:
    query = _RunsQuery.from_request()
    page = await _read(app, query.fetch)
    return _json(
        {
            "runs": [q.run_to_json(run) for run in page.runs],
            "counts": dict(page.counts),
            "total": page.total,
            "newer": page.runs[0].cursor.encode() if page.has_newer else None,
            "older": page.runs[-1].cursor.encode() if page.has_older else None,
        }
    )


def _run_json(run_id: str, conn: Any) -> dict[str, Any]:
    """The run and its first LIST_LIMIT checkpoints, steps and timers (``truncated`` says if cut)."""
    run = q.get_run(conn, run_id)
    checkpoints = q.list_checkpoints(conn, run_id, limit=LIST_LIMIT + 1)
    steps = q.list_steps(conn, run_id, limit=LIST_LIMIT + 1)
    timers = q.list_timers(conn, run_id, limit=LIST_LIMIT + 1)
    return {
        "run": q.run_to_json(run),
        "children_total": run.children_total,
        "checkpoints": [q.checkpoint_to_json(run_id, c) for c in checkpoints[:LIST_LIMIT]],
        "steps": [q.step_to_json(run_id, s) for s in steps[:LIST_LIMIT]],
        "timers": [q.timer_to_json(run_id, t) for t in timers[:LIST_LIMIT]],
        "truncated": {
            "checkpoints": len(checkpoints) > LIST_LIMIT,
            "steps": len(steps) > LIST_LIMIT,
            "timers": len(timers) > LIST_LIMIT,
        },
    }


async def _api_run(app: InspectorApp, run_id: str) -> Response:
    run_id = q.parse_run_id(run_id)
    return _json(await _read(app, functools.partial(_run_json, run_id)))


def _events_json(run_id: str, query: _EventsQuery, conn: Any) -> dict[str, Any]:
    q.get_run(conn, run_id, children_limit=0)
    page = query.fetch(run_id, conn)
    return {
        "events": [q.event_to_json(run_id, e) for e in page.events],
        "has_before": page.has_before,
        "has_after": page.has_after,
        "next_after": page.events[-1].seq if page.has_after else None,
    }


async def _api_events(app: InspectorApp, run_id: str) -> Response:
    run_id = q.parse_run_id(run_id)
    query = _EventsQuery.from_request(q.DEFAULT_PAGE, None)
    return _json(await _read(app, functools.partial(_events_json, run_id, query)))


def _event_json(run_id: str, seq: int, conn: Any) -> dict[str, Any]:
    q.get_run(conn, run_id, children_limit=0)
    event = q.get_event(conn, run_id, seq)
    if event is None:
        raise RunNotFound(f"run {run_id} has no event #{seq}")
    return {"event": q.event_to_json(run_id, event)}


async def _api_event(app: InspectorApp, run_id: str, seq: str) -> Response:
    run_id = q.parse_run_id(run_id)
    if not re.fullmatch(r"[0-9]{1,19}", seq):
        raise InvalidArgument(f"event seq {seq[:40]!r} is not a non-negative integer")
    return _json(await _read(app, functools.partial(_event_json, run_id, int(seq))))


# --------------------------------------------------------------------------- queries


class _RunsQuery:
    def __init__(
        self,
        status: str | None,
        role: str | None,
        limit: int,
        before: q.RunCursor | None,
        after: q.RunCursor | None,
    ) -> None:
        self.status, self.role, self.limit = status, role, limit
        self.before, self.after = before, after

    @classmethod
    def from_request(cls) -> _RunsQuery:
        limit = _int_arg("limit", RUNS_PAGE, 1, q.MAX_PAGE)
        assert limit is not None
        before, after = _cursor_arg("before"), _cursor_arg("after")
        if before is not None and after is not None:
            raise InvalidArgument("give at most one of before= and after=")
        return cls(_status_arg(), _arg("role"), limit, before, after)

    def fetch(self, conn: Any) -> q.RunPage:
        return q.list_runs(
            conn,
            status=self.status,
            role=self.role,
            limit=self.limit,
            before=self.before,
            after=self.after,
        )

    def url(self, **changes: Any) -> str:
        params = {"status": self.status, "role": self.role, "limit": self.limit}
        if params["limit"] == RUNS_PAGE:
            params["limit"] = None
        params.update(changes)
        return _url("/", params)


class _EventsQuery:
    def __init__(
        self,
        after: int | None,
        before: int | None,
        limit: int,
        type: str | None,
        payload_chars: int | None,
    ) -> None:
        self.after, self.before, self.limit, self.type = after, before, limit, type
        self.payload_chars = payload_chars

    @classmethod
    def from_request(cls, default_limit: int, payload_chars: int | None) -> _EventsQuery:
        after = _int_arg("after", None, -1, _MAX_SEQ)
        before = _int_arg("before", None, 0, _MAX_SEQ)
        if after is not None and before is not None:
            raise InvalidArgument("give at most one of after= and before=")
        limit = _int_arg("limit", default_limit, 1, q.MAX_PAGE)
        assert limit is not None
        return cls(after, before, limit, _arg("type"), payload_chars)

    def fetch(self, run_id: str, conn: Any) -> q.EventPage:
        return q.list_events(
            conn,
            run_id,
            after=self.after,
            before=self.before,
            limit=self.limit,
            type=self.type,
            max_payload_chars=self.payload_chars,
        )

    def url(self, run_id: str, **changes: Any) -> str:
        params: dict[str, Any] = {"type": self.type, "after": self.after, "before": self.before}
        params["limit"] = None if self.limit == q.DEFAULT_PAGE else self.limit
        params["refresh"] = _arg("refresh")
        params.update(changes)
        return _url(f"/runs/{run_id}", params)


class _RunView:
    def __init__(
        self,
        run: q.RunDetail,
        checkpoints: tuple[q.CheckpointRow, ...],
        events: q.EventPage,
        types: tuple[str, ...],
        steps: tuple[q.StepRow, ...],
        timers: tuple[q.TimerRow, ...],
    ) -> None:
        self.run, self.checkpoints, self.events, self.types = run, checkpoints, events, types
        self.steps, self.timers = steps, timers

    @classmethod
    def fetch(cls, run_id: str, query: _EventsQuery, conn: Any) -> _RunView:
        return cls(
            q.get_run(conn, run_id),
            q.list_checkpoints(conn, run_id, limit=LIST_LIMIT + 1),
            query.fetch(run_id, conn),
            q.event_types(conn, run_id),
            q.list_steps(conn, run_id, limit=LIST_LIMIT + 1),
            q.list_timers(conn, run_id, limit=LIST_LIMIT + 1),
        )


LIST_LIMIT = 500


def _url(path: str, params: Mapping[str, Any]) -> str:
    kept = {k: str(v) for k, v in params.items() if v is not None}
    return f"{path}?{urllib.parse.urlencode(kept)}" if kept else path


# --------------------------------------------------------------------------- formatting


def _e(value: object) -> str:
    """Escape any value for HTML text or a quoted attribute."""
    return html.escape(str(value), quote=True)


def _time(ms: int | None) -> str:
    if ms is None:
        return '<span class="muted">—</span>'
    try:
        moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return f"<code>{_e(ms)}</code>"
    stamp = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    shown = moment.strftime("%Y-%m-%d %H:%M:%S")
    return f'<time datetime="{_e(stamp)}" title="{_e(stamp)}">{_e(shown)}</time>'


def human_delta(ms: int) -> str:
    """A short human duration: ``in 4.2 s``, ``3 min ago``."""
    seconds = abs(ms) / 1000
    if seconds < 60:
        text = f"{seconds:.1f} s"
    elif seconds < 3600:
        text = f"{seconds / 60:.0f} min"
    elif seconds < 86400:
        text = f"{seconds / 3600:.1f} h"
    elif seconds < 864000:
        text = f"{seconds / 86400:.1f} d"
    else:
        text = f"{seconds / 86400:,.0f} d"
    return f"in {text}" if ms >= 0 else f"{text} ago"


def _relative(ms: int | None, now: int) -> str:
    if ms is None:
        return ""
    return f' <span class="muted">({_e(human_delta(ms - now))})</span>'


_STATUS_CLASSES = frozenset(
    {"pending", "running", "completed", "failed", "candidate", "accepted", "rejected"}
)


def _pill(status: str) -> str:
    kind = status if status in _STATUS_CLASSES else "other"
    return f'<span class="pill s-{kind}">{_e(status)}</span>'


def _run_link(run_id: str) -> str:
    try:
        run_id = q.parse_run_id(run_id)
    except InvalidArgument:
        return f"<code>{_e(run_id)}</code>"
    return f'<a href="/runs/{_e(run_id)}"><code>{_e(run_id)}</code></a>'


def _pretty(text: str | None, limit: int = BLOCK_CHARS) -> str:
    """Pretty-print stored JSON text (or show it raw if it is not JSON), escaped."""
    if text is None:
        return '<span class="muted">—</span>'
    shown = text[:limit]
    with contextlib.suppress(ValueError):
        shown = json.dumps(json.loads(shown), indent=2, ensure_ascii=False)
    note = ""
    if len(text) > limit:
        note = f'<p class="muted">Showing the first {limit:,} of {len(text):,} characters.</p>'
    return f"<pre>{_e(shown)}</pre>{note}"


def _preview(text: str, limit: int = 140) -> str:
    flat = " ".join(text[: limit * 2].split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _table(headers: Iterable[str], rows: Iterable[str], *, cls: str = "") -> str:
    head = "".join(headers)
    klass = f' class="{cls}"' if cls else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _th(*names: str) -> list[str]:
    return [f'<th class="num">{n[1:]}</th>' if n.startswith("#") else f"<th>{n}</th>" for n in names]


def _section(title: str, body: str, *, anchor: str) -> str:
    return f'<section id="{anchor}"><h2>{title}</h2>{body}</section>'


def _empty(text: str) -> str:
    return f'<p class="empty">{text}</p>'


# --------------------------------------------------------------------------- pages


def _page(title: str, body: str, *, refresh: int | None = None) -> str:
    refresh_meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{refresh_meta}<title>{_e(title)} · zincir inspector</title>"
        f'<link rel="stylesheet" href="/static/inspector.css?v={_e(__version__)}">'
        '</head><body><header><a class="brand" href="/">zincir</a>'
        '<span class="label">Inspector</span><span class="readonly">read-only</span></header>'
        f"<main>{body}</main></body></html>"
    )


def _error_body(status: int, name: str, message: str) -> str:
    return (
        f'<div class="error"><h1>{_e(status)} {_e(name)}</h1><p>{_e(message)}</p>'
        '<p><a href="/">← All runs</a></p></div>'
    )


def _runs_body(query: _RunsQuery, page: q.RunPage, database: str, now: int) -> str:
    parts = [
        f'<div class="title"><h1>Runs</h1><span class="muted">{_e(database)}</span></div>',
        _status_tabs(query, page),
        _runs_filter(query),
    ]
    if page.runs:
        parts.append(_runs_table(page.runs, now))
    elif page.total == 0 and query.role is None:
        parts.append(_empty("No durable runs yet."))
    else:
        parts.append(_empty("No runs match these filters."))
    parts.append(_runs_nav(query, page))
    return "".join(parts)


def _status_tabs(query: _RunsQuery, page: q.RunPage) -> str:
    tabs = [(None, "all", page.total)] + [(s, s, page.counts[s]) for s in q.RUN_STATUSES]
    links = []
    for status, label, count in tabs:
        current = ' aria-current="page"' if status == query.status else ""
        href = query.url(status=status)
        links.append(
            f'<a class="tab s-{_e(label)}" href="{_e(href)}"{current}>{_e(label)} '
            f'<span class="count">{count:,}</span></a>'
        )
    return f'<nav class="tabs">{"".join(links)}</nav>'


def _runs_filter(query: _RunsQuery) -> str:
    options = ['<option value="">any status</option>'] + [
        f'<option value="{s}"{" selected" if s == query.status else ""}>{s}</option>' for s in q.RUN_STATUSES
    ]
    return (
        '<form class="filters" method="get" action="/">'
        f'<label>Status <select name="status">{"".join(options)}</select></label>'
        f'<label>Role <input name="role" value="{_e(query.role or "")}" '
        'placeholder="any role"></label><button type="submit">Filter</button>'
        '<a href="/">Reset</a></form>'
    )


def _clipped(text: str, limit: int) -> str:
    """Escaped ``text`` cut to ``limit`` characters; the (bounded) whole in a tooltip."""
    if len(text) <= limit:
        return _e(text)
    return f'<span title="{_e(text[:1000])}">{_e(text[: limit - 1])}…</span>'


def _lease_cell(run: q.RunSummary, now: int) -> str:
    if run.lease_owner is None or run.lease_expires_at is None:
        return '<span class="muted">—</span>'
    left = run.lease_expires_at - now
    state = f"expires {human_delta(left)}" if left > 0 else f"expired {human_delta(left)}"
    kind = "active" if left > 0 else "expired"
    return f'<code>{_clipped(run.lease_owner, 16)}</code><br><span class="lease-{kind}">{_e(state)}</span>'


def _runs_table(runs: Iterable[q.RunSummary], now: int) -> str:
    rows = [
        f"<tr><td>{_run_link(run.id)}</td><td>{_pill(run.status)}</td>"
        f'<td class="text">{_clipped(run.role, 48)}</td><td class="text">{_clipped(run.provider, 32)}</td>'
        f'<td class="num">{run.event_count:,}</td><td class="num">{run.attempts:,}</td>'
        f"<td>{_lease_cell(run, now)}</td><td>{_time(run.updated_at)}<br>"
        f'<span class="muted">{_e(human_delta(run.updated_at - now))}</span></td></tr>'
        for run in runs
    ]
    headers = _th("Run", "Status", "Role", "Provider", "#Events", "#Attempts", "Lease", "Last activity")
    return _table(headers, rows, cls="runs")


def _runs_nav(query: _RunsQuery, page: q.RunPage) -> str:
    links = []
    if page.has_newer:
        links.append(f'<a href="{_e(query.url())}">⇤ Newest</a>')
        newer = query.url(after=page.runs[0].cursor.encode())
        links.append(f'<a href="{_e(newer)}">← Newer</a>')
    if page.has_older:
        older = query.url(before=page.runs[-1].cursor.encode())
        links.append(f'<a href="{_e(older)}">Older →</a>')
    return f'<nav class="pager">{"".join(links)}</nav>' if links else ""


def _run_body(view: _RunView, query: _EventsQuery, now: int, refresh: bool) -> str:
    run = view.run
    return "".join(
        [
            '<p><a href="/">← All runs</a></p>',
            f'<div class="title"><h1>Run <code>{_e(run.id)}</code></h1>{_pill(run.status)}'
            f"{_refresh_note(view, query, refresh)}</div>",
            '<div class="grid">',
            _section("Overview", _overview(run, now), anchor="overview"),
            _section("Lease and attempts", _lease(run, now), anchor="lease"),
            "</div>",
            _section("Family", _family(run), anchor="family"),
            _section("Configuration", _pretty(run.config), anchor="config"),
            _section("Checkpoints", _checkpoints(run.id, view.checkpoints), anchor="checkpoints"),
            _section(
                f'Events <span class="muted">({run.event_count:,})</span>',
                _events(run.id, view, query),
                anchor="events",
            ),
            _section("Steps", _steps(view.steps), anchor="steps"),
            _section("Timers", _timers(view.timers, now), anchor="timers"),
        ]
    )


def _refresh_note(view: _RunView, query: _EventsQuery, refresh: bool) -> str:
    if refresh:
        off = query.url(view.run.id, refresh="off")
        return (
            f'<span class="muted">refreshes every {REFRESH_SECONDS} s · <a href="{_e(off)}">pause</a></span>'
        )
    if view.run.status in ("pending", "running"):
        on = query.url(view.run.id, refresh=None)
        return f'<span class="muted">auto-refresh paused · <a href="{_e(on)}">resume</a></span>'
    return ""


def _dl(items: Iterable[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def _overview(run: q.RunDetail, now: int) -> str:
    return _dl(
        [
            ("Status", _pill(run.status)),
            ("Role", _e(run.role)),
            ("Provider", _e(run.provider) or '<span class="muted">—</span>'),
            ("Created", _time(run.created_at) + _relative(run.created_at, now)),
            ("Last activity", _time(run.updated_at) + _relative(run.updated_at, now)),
            ("Events", f"{run.event_count:,}"),
        ]
    )


def _lease(run: q.RunDetail, now: int) -> str:
    if run.lease_owner is None:
        owner = '<span class="muted">none (free)</span>'
        expires = '<span class="muted">—</span>'
    else:
        owner = f"<code>{_e(run.lease_owner)}</code>"
        left = (run.lease_expires_at or 0) - now
        state = "active" if left > 0 else "expired"
        note = f"({state}, {human_delta(left)})"
        expires = f'{_time(run.lease_expires_at)} <span class="lease-{state}">{_e(note)}</span>'
    if run.next_attempt_at <= 0:
        next_attempt = '<span class="muted">any time</span>'
    else:
        next_attempt = _time(run.next_attempt_at) + _relative(run.next_attempt_at, now)
    return _dl(
        [
            ("Owner", owner),
            ("Epoch", f"{run.lease_epoch:,}"),
            ("Expires", expires),
            ("Attempts", f"{run.attempts:,}"),
            ("Next attempt", next_attempt),
        ]
    )


def _family(run: q.RunDetail) -> str:
    parent = _run_link(run.parent_run_id) if run.parent_run_id else '<span class="muted">none</span>'
    if run.children:
        items = "".join(
            f'<li>{_run_link(c.id)} {_pill(c.status)} <span class="muted">{_e(c.role)}</span></li>'
            for c in run.children
        )
        more = run.children_total - len(run.children)
        extra = f'<li class="muted">and {more:,} more</li>' if more > 0 else ""
        children = f'<ul class="children">{items}{extra}</ul>'
    else:
        children = '<span class="muted">none</span>'
    return _dl([("Parent", parent), (f"Children ({run.children_total:,})", children)])


def _seq_link(run_id: str, seq: int | None) -> str:
    if seq is None:
        return '<span class="muted">—</span>'
    href = _url(f"/runs/{run_id}", {"after": seq - 1 if seq > 0 else None})
    return f'<a href="{_e(href)}#e{seq}">#{seq}</a>'


def _lineage(checkpoints: Iterable[q.CheckpointRow]) -> dict[int, str]:
    """For each round, which accepted round it builds on (the baseline before it)."""
    builds_on: dict[int, str] = {}
    baseline = "original goal"
    for checkpoint in checkpoints:
        builds_on[checkpoint.round] = baseline
        if checkpoint.status == "accepted":
            baseline = f"round {checkpoint.round}"
    return builds_on


def _checkpoints(run_id: str, checkpoints: tuple[q.CheckpointRow, ...]) -> str:
    if not checkpoints:
        return _empty("No checkpoints.")
    lineage = _lineage(checkpoints)
    rows = []
    for c in checkpoints[:LIST_LIMIT]:
        rows.append(
            f'<tr><td class="num">{c.round}</td><td>{_pill(c.status)}</td>'
            f"<td>{_e(lineage[c.round])}</td><td><code>{_e(c.tool_call_id)}</code></td>"
            f'<td class="num">{_seq_link(run_id, c.based_on_event_seq)}</td>'
            f'<td class="num">{_seq_link(run_id, c.decision_event_seq)}</td>'
            f"<td>{_time(c.created_at)}</td><td>{_time(c.decided_at)}</td>"
            f"<td>{_details('verification', c.verification)}"
            f"{_details('state', c.state)}</td></tr>"
        )
    headers = _th(
        "#Round",
        "Status",
        "Builds on",
        "Tool call",
        "#Based on",
        "#Decision",
        "Proposed",
        "Decided",
        "Evidence and state",
    )
    return _table(headers, rows) + _cut_note(len(checkpoints), "checkpoints")


def _details(label: str, text: str | None) -> str:
    if text is None:
        return f'<span class="muted">no {_e(label)}</span>'
    return f"<details><summary>{_e(label)}</summary>{_pretty(text)}</details>"


def _cut_note(count: int, what: str) -> str:
    if count <= LIST_LIMIT:
        return ""
    return (
        f'<p class="muted">Showing the first {LIST_LIMIT} {what}; use the JSON API or '
        "<code>zincir export</code> for all of them.</p>"
    )


def _events(run_id: str, view: _RunView, query: _EventsQuery) -> str:
    parts = [_events_filter(run_id, view.types, query), _events_nav(run_id, view, query)]
    if not view.events.events:
        parts.append(_empty("No events." if query.type is None else "No events of this type."))
    for event in view.events.events:
        parts.append(_event(run_id, event))
    parts.append(_events_nav(run_id, view, query))
    return "".join(parts)


def _events_filter(run_id: str, types: Iterable[str], query: _EventsQuery) -> str:
    options = ['<option value="">all types</option>'] + [
        f'<option value="{_e(t)}"{" selected" if t == query.type else ""}>{_e(t)}</option>' for t in types
    ]
    refresh = _arg("refresh")
    hidden = '<input type="hidden" name="refresh" value="off">' if refresh == "off" else ""
    return (
        f'<form class="filters" method="get" action="/runs/{_e(run_id)}#events">'
        f'<label>Type <select name="type">{"".join(options)}</select></label>{hidden}'
        '<button type="submit">Filter</button></form>'
    )


def _events_nav(run_id: str, view: _RunView, query: _EventsQuery) -> str:
    page = view.events
    links = []
    if page.has_before:
        links.append(f'<a href="{_e(query.url(run_id, after=None, before=None))}#events">⇤ First</a>')
        if page.events:
            prev = query.url(run_id, after=None, before=page.events[0].seq)
            links.append(f'<a href="{_e(prev)}#events">← Previous</a>')
    if page.has_after:
        nxt = query.url(run_id, after=page.events[-1].seq, before=None)
        links.append(f'<a href="{_e(nxt)}#events">Next →</a>')
        last = query.url(run_id, after=None, before=view.run.event_count)
        links.append(f'<a href="{_e(last)}#events">Latest ⇥</a>')
    return f'<nav class="pager">{"".join(links)}</nav>' if links else ""


def _event(run_id: str, event: q.EventRow) -> str:
    api = f"/api/runs/{run_id}/events/{event.seq}"
    if event.truncated:
        body = (
            f'<pre>{_e(event.payload)}</pre><p class="muted">Showing the first '
            f"{len(event.payload):,} of {event.payload_size:,} characters; the whole payload is at "
            f'<a href="{_e(api)}">{_e(api)}</a>.</p>'
        )
    else:
        body = _pretty(event.payload)
    key = (
        f'<p class="muted">idempotency key <code>{_e(event.idempotency_key)}</code></p>'
        if event.idempotency_key is not None
        else ""
    )
    return (
        f'<details class="event" id="e{event.seq}"><summary>'
        f'<span class="seq">#{event.seq}</span> <strong>{_e(event.type)}</strong> '
        f'{_time(event.created_at)} <span class="preview">{_e(_preview(event.payload))}</span>'
        f"</summary>{key}{body}</details>"
    )


def _steps(steps: tuple[q.StepRow, ...]) -> str:
    if not steps:
        return _empty("No named steps.")
    rows = [
        f"<tr><td><code>{_e(s.name)}</code></td><td>{_pill(s.status)}</td>"
        f'<td class="num">{s.epoch}</td><td>{_time(s.started_at)}</td>'
        f"<td>{_time(s.completed_at)}</td><td>{_details('result', s.result)}</td></tr>"
        for s in steps[:LIST_LIMIT]
    ]
    headers = _th("Name", "Status", "#Epoch", "Started", "Completed", "Result")
    return _table(headers, rows) + _cut_note(len(steps), "steps")


def _timers(timers: tuple[q.TimerRow, ...], now: int) -> str:
    if not timers:
        return _empty("No durable timers.")
    rows = [
        f"<tr><td><code>{_e(t.name)}</code></td>"
        f"<td>{_time(t.wake_at)}{_relative(t.wake_at, now) if t.completed_at is None else ''}</td>"
        f"<td>{_time(t.created_at)}</td><td>{_time(t.completed_at)}</td></tr>"
        for t in timers[:LIST_LIMIT]
    ]
    return _table(_th("Name", "Wakes at", "Created", "Completed"), rows) + _cut_note(len(timers), "timers")


STYLESHEET = """\
:root {
  color-scheme: dark;
  --bg: #0e1116; --panel: #161b22; --panel2: #1c222c; --border: #2b3340;
  --text: #d8dee9; --muted: #8b95a7; --link: #7fb4ff;
  --pending: #e3b341; --running: #58a6ff; --completed: #56d364; --failed: #f47067;
}
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--text);
  font: 14px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
a { color: var(--link); text-decoration: none; }
a:hover { text-decoration: underline; }
header { display: flex; gap: .75rem; align-items: baseline; padding: .7rem 1.5rem;
  background: var(--panel); border-bottom: 1px solid var(--border); }
header .brand { color: var(--text); font-weight: 700; font-size: 1.15rem; letter-spacing: .02em; }
header .label { color: var(--muted); }
header .readonly { margin-left: auto; color: var(--muted); font-size: .8rem;
  border: 1px solid var(--border); border-radius: 999px; padding: 0 .6rem; }
main { max-width: 1280px; margin: 0 auto; padding: 1rem 1.5rem 4rem; }
h1 { font-size: 1.35rem; margin: .3rem 0; overflow-wrap: anywhere; }
h2 { font-size: 1.05rem; margin: 1.6rem 0 .6rem; padding-bottom: .3rem;
  border-bottom: 1px solid var(--border); }
.title { display: flex; flex-wrap: wrap; gap: .8rem; align-items: center; }
.muted { color: var(--muted); }
time { white-space: nowrap; }
.empty { color: var(--muted); font-style: italic; }
code, pre { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono",
  monospace; font-size: .85rem; }
pre { background: #0a0d12; border: 1px solid var(--border); border-radius: 6px; padding: .7rem .9rem;
  margin: .4rem 0; max-height: 32rem; overflow: auto; white-space: pre-wrap;
  overflow-wrap: anywhere; }
table { width: 100%; border-collapse: collapse; font-variant-numeric: tabular-nums;
  background: var(--panel); border: 1px solid var(--border); border-radius: 6px; }
th, td { text-align: left; vertical-align: top; padding: .45rem .7rem;
  border-bottom: 1px solid var(--border); overflow-wrap: anywhere; }
th { color: var(--muted); font-size: .75rem; font-weight: 600; text-transform: uppercase;
  letter-spacing: .05em; background: var(--panel2); white-space: nowrap; }
tbody tr:hover { background: var(--panel2); }
th.num, td.num { text-align: right; white-space: nowrap; }
table.runs td:first-child { white-space: nowrap; }
table.runs td.text { min-width: 9rem; }
.pill { display: inline-block; padding: 0 .55rem; border-radius: 999px; font-size: .75rem;
  font-weight: 600; border: 1px solid currentColor; line-height: 1.45rem; white-space: nowrap; }
.s-pending, .s-candidate { color: var(--pending); }
.s-running { color: var(--running); }
.s-completed, .s-accepted { color: var(--completed); }
.s-failed, .s-rejected { color: var(--failed); }
.s-other, .s-all { color: var(--text); }
.tabs { display: flex; flex-wrap: wrap; gap: .5rem; margin: .8rem 0; }
.tab { padding: .25rem .8rem; border: 1px solid var(--border); border-radius: 999px;
  background: var(--panel); }
.tab[aria-current] { border-color: currentColor; background: var(--panel2); }
.tab .count { color: var(--muted); margin-left: .2rem; }
.filters { display: flex; flex-wrap: wrap; gap: .8rem; align-items: center; margin: .6rem 0 1rem; }
.filters label { color: var(--muted); }
input, select, button { background: var(--panel2); color: var(--text); border: 1px solid var(--border);
  border-radius: 4px; padding: .25rem .5rem; font: inherit; }
button { cursor: pointer; }
.pager { display: flex; gap: 1.2rem; margin: .8rem 0; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(22rem, 1fr)); gap: 0 2rem; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .35rem 1.2rem; margin: 0; }
dt { color: var(--muted); }
dd { margin: 0; overflow-wrap: anywhere; }
.children { margin: 0; padding-left: 1.1rem; }
.lease-active { color: var(--completed); white-space: nowrap; }
.lease-expired { color: var(--failed); white-space: nowrap; }
details.event { background: var(--panel); border: 1px solid var(--border); border-radius: 6px;
  margin: .3rem 0; padding: .3rem .7rem; }
details.event summary { cursor: pointer; white-space: nowrap; overflow: hidden;
  text-overflow: ellipsis; }
details.event .seq { color: var(--muted); display: inline-block; min-width: 3.5rem;
  font-variant-numeric: tabular-nums; }
details.event strong { display: inline-block; min-width: 13rem; }
details.event .preview { color: var(--muted); font-family: ui-monospace, Menlo, Consolas,
  "DejaVu Sans Mono", monospace; font-size: .8rem; margin-left: .6rem; }
details.event:target { border-color: var(--link); }
td details summary { cursor: pointer; color: var(--link); }
.error { max-width: 40rem; margin: 3rem auto; padding: 1.5rem 2rem; background: var(--panel);
  border: 1px solid var(--border); border-radius: 8px; }
.error h1 { color: var(--failed); }
"""


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
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the inspector for ``database_path`` on a loopback ``address`` until shutdown.

    Checks the address and the database (read-only) before binding. Reports the served URL
    through ``task_status``. Without ``shutdown_trigger`` it stops gracefully on SIGINT or
    SIGTERM (main thread only; elsewhere it runs until cancelled).
    """
    ip, port = parse_address(address)
    await trio.to_thread.run_sync(_check_database, database_path)
    app = create_app(database_path, format_host(ip, port))
    assert isinstance(app, InspectorApp)
    config = hypercorn.config.Config()
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
