"""``zincir ui``: a read-only web inspector (Quart-Trio on Hypercorn's Trio worker).

Safety properties, each enforced here and pinned by tests:

- it binds loopback only (127.0.0.0/8 or ::1, given as a literal IP and port);
- it answers 421 to any request whose ``Host`` is not the exact ``ip:port`` it serves, so a
  DNS-rebinding page cannot read it, and 403 to requests a browser marks
  ``Sec-Fetch-Site: cross-site``; WebSocket connections are refused before the app sees them;
- every response carries a restrictive Content-Security-Policy (no script at all, styles
  only from the inspector itself, no framing), ``nosniff`` and ``no-referrer``;
- it opens the database read-only (SQLite's ``mode=ro``; on PostgreSQL a read-only session and
  ``REPEATABLE READ READ ONLY`` transactions) and never writes, creates or migrates;
- every value interpolated into a page goes through :func:`_e` (HTML escaping), whatever its
  type: the queries normalise stored values, but an INTEGER column can hold text, so the
  pages trust no type. A test walks this module's syntax tree to keep it so.

Each request reads through its own read-only connection in a worker thread, inside one read
transaction, and renders there too, so the Trio loop never blocks on the database.
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
from typing import Any, NewType, TypeVar

import hypercorn.config
import hypercorn.trio
import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, ASGISendEvent, Scope
from quart import Response, current_app, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from .. import _queries as q
from .._errors import (
    DatabaseBusy,
    DatabaseUnavailable,
    InvalidArgument,
    RunNotFound,
    StorageError,
    ZincirError,
)
from .._version import __version__

__all__ = ["DEFAULT_ADDRESS", "create_app", "format_host", "parse_address", "serve"]

DEFAULT_ADDRESS = "127.0.0.1:8787"
RUNS_PAGE = 50
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
#: Checkpoints, steps and timers listed at most (page and JSON API).
LIST_LIMIT = 500
#: Children listed per page of the family section.
CHILDREN_PAGE = 100
# The family tree on a run page: grandchildren and below, this deep and this wide per run.
TREE_DEPTH = 4
TREE_WIDTH = 20
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

#: Text that is already HTML: built only by :func:`_e` and the ``-> Html`` helpers below.
Html = NewType("Html", str)


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
    """The inspector's Quart-Trio app: checks ``Host`` and adds security headers.

    Only ``http`` and ``lifespan`` scopes reach Quart. A WebSocket handshake is refused (the
    server answers 403) before any route, Host check or header logic could be skipped.
    """

    database_path: str
    served_host: str

    async def asgi_app(self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] == "lifespan":
            await super().asgi_app(scope, receive, send)
            return
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008, "reason": "not served here"})
            return
        headers = scope["headers"]
        if _host_of(headers) not in _accepted_hosts(self.served_host):
            await _send_refusal(
                send,
                421,
                "Misdirected Request",
                "This inspector only answers requests addressed to the loopback address it serves.",
            )
            return
        if _header(headers, b"sec-fetch-site") == "cross-site":
            await _send_refusal(
                send,
                403,
                "Forbidden",
                "This inspector does not answer requests made by other sites. "
                "Open it by typing its address or following a link from the inspector itself.",
            )
            return
        await super().asgi_app(scope, receive, _secured(send))


def _accepted_hosts(served_host: str) -> tuple[str, ...]:
    # Browsers leave out the default port: http://127.0.0.1:80/ is sent as "Host: 127.0.0.1".
    served = served_host.lower()
    return (served, served.removesuffix(":80")) if served.endswith(":80") else (served,)


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    values = [value for key, value in headers if key.lower() == name]
    if len(values) != 1:
        return None
    return values[0].decode("latin-1").strip().lower()


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


async def _send_refusal(send: ASGISendCallable, status: int, name: str, message: str) -> None:
    """A styled error page sent straight through ASGI, before Quart sees the request."""
    body = _page(name, _error_body(status, name, message)).encode()
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        *SECURITY_HEADERS,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers, "trailers": False})
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
    routes: list[tuple[str, str, Callable[..., Awaitable[Response]]]] = [
        ("/", "runs", functools.partial(_runs_route, app)),
        ("/runs/<run_id>", "run", functools.partial(_run_route, app)),
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
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(ZincirError, _zincir_error)
    app.register_error_handler(Exception, _unexpected_error)


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
    # A JSON string escape can decode to a lone surrogate, which UTF-8 cannot encode: show it
    # as the text \udXXX rather than fail the page.
    data = body.encode("utf-8", "backslashreplace")
    response = Response(data, status=status, content_type="text/html; charset=utf-8")
    response.headers["Cache-Control"] = "no-store"
    return response


def _json(data: Any, status: int = 200) -> Response:
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    # Lone surrogates only occur inside JSON strings, where backslashreplace writes exactly the
    # JSON escape (\udXXX): the body stays valid UTF-8 and valid JSON.
    response = Response(
        text.encode("utf-8", "backslashreplace"),
        status=status,
        content_type="application/json; charset=utf-8",
    )
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
    (DatabaseUnavailable, 503, "Service Unavailable"),
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


async def _unexpected_error(error: Exception) -> Response:
    # A bug must still give a styled page with the security headers, and no traceback.
    current_app.logger.exception("the inspector failed to answer %s", request.path, exc_info=error)
    return _error_response(500, "Internal Server Error", "The inspector failed to answer this request.")


def _arg(name: str) -> str | None:
    value = request.args.get(name)
    return value if value else None


def _int_arg(name: str, default: int, low: int, high: int) -> int:
    text = _arg(name)
    if text is None:
        return default
    if not re.fullmatch(r"-?[0-9]{1,19}", text):
        raise InvalidArgument(f"query parameter {name}={text[:40]!r} is not an integer")
    value = int(text)
    if not low <= value <= high:
        raise InvalidArgument(f"query parameter {name}={value} is outside {low}..{high}")
    return value


def _key_arg(name: str) -> object:
    """A seq cursor parameter (see :func:`q.decode_key`); ``before=end`` means the log's end."""
    text = _arg(name)
    if text is None:
        return None
    if name == "before" and text == "end":
        return q.LATEST
    return q.decode_key(text, f"query parameter {name}=")


def _token(value: object) -> str:
    """The URL form of a seq cursor."""
    return "end" if value is q.LATEST else q.encode_key(value)


def _token_json(value: object) -> object:
    return "end" if value is q.LATEST else q.key_json(value)


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
    now = _now_ms()

    def render(conn: Any) -> str:
        page = query.fetch(conn)
        awaiting = q.list_awaiting(conn, [r.id for r in page.runs if r.status in ("running", "waiting")])
        budgets = q.budgets_of(conn, [r.id for r in page.runs], now)
        body = _runs_body(query, page, awaiting, budgets, q.display_target(app.database_path), now)
        return _page("Runs", body)

    return _html(await _read(app, render))


async def _run_route(app: InspectorApp, run_id: str) -> Response:
    run_id = q.parse_run_id(run_id)
    query = _EventsQuery.from_request(q.DEFAULT_PAGE, PAYLOAD_PREVIEW_CHARS)
    now = _now_ms()

    def render(conn: Any) -> str:
        view = _RunView.fetch(run_id, query, conn)
        refresh = view.run.status in _LIVE and query.refresh != "off"
        body = _run_body(view, query, now, refresh)
        return _page(f"Run {run_id}", body, refresh=REFRESH_SECONDS if refresh else None)

    return _html(await _read(app, render))


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


def _checkpoint_url(run_id: str, checkpoint: q.CheckpointRow) -> str:
    return _path("api", "runs", run_id, "checkpoints", q.encode_key(checkpoint.round))


def _step_url(run_id: str, step: q.StepRow) -> str:
    return _path("api", "runs", run_id, "steps", step.name)


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
        "truncated": {
            "checkpoints": len(checkpoint_items) < len(checkpoints),
            "steps": len(step_items) < len(steps),
            "timers": len(timers) > LIST_LIMIT,
        },
    }


async def _api_run(app: InspectorApp, run_id: str) -> Response:
    run_id = q.parse_run_id(run_id)
    children_after = _cursor_arg("children_after")
    return _json(await _read(app, functools.partial(_run_json, run_id, children_after)))


def _events_json(run_id: str, query: _EventsQuery, conn: Any) -> dict[str, Any]:
    q.get_run(conn, run_id, children_limit=0)
    page = query.fetch(run_id, conn, max_chars_total=API_BUDGET_CHARS)
    return {
        "events": [q.event_to_json(run_id, e) for e in page.events],
        "has_before": page.has_before,
        "has_after": page.has_after,
        "next_after": _token_json(page.next_after) if page.has_after else None,
        "prev_before": _token_json(page.prev_before) if page.has_before else None,
        "scan_edge": _token_json(page.scan_edge) if page.scan_edge is not None else None,
    }


async def _api_events(app: InspectorApp, run_id: str) -> Response:
    run_id = q.parse_run_id(run_id)
    query = _EventsQuery.from_request(q.DEFAULT_PAGE, None)
    return _json(await _read(app, functools.partial(_events_json, run_id, query)))


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
    return _json(await _read(app, read))


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
    """The event and family parameters of a run page (or of the events API)."""

    def __init__(
        self,
        after: object,
        before: object,
        limit: int,
        type: str | None,
        payload_chars: int | None,
        refresh: str | None = None,
        children_after: q.RunCursor | None = None,
    ) -> None:
        self.after, self.before, self.limit, self.type = after, before, limit, type
        self.payload_chars, self.refresh, self.children_after = payload_chars, refresh, children_after

    @classmethod
    def from_request(cls, default_limit: int, payload_chars: int | None) -> _EventsQuery:
        after, before = _key_arg("after"), _key_arg("before")
        if after is not None and before is not None:
            raise InvalidArgument("give at most one of after= and before=")
        limit = _int_arg("limit", default_limit, 1, q.MAX_PAGE)
        return cls(
            after, before, limit, _arg("type"), payload_chars, _arg("refresh"), _cursor_arg("children_after")
        )

    def fetch(self, run_id: str, conn: Any, *, max_chars_total: int | None = None) -> q.EventPage:
        return q.list_events(
            conn,
            run_id,
            after=self.after,
            before=self.before,
            limit=self.limit,
            type=self.type,
            max_payload_chars=self.payload_chars,
            max_chars_total=max_chars_total,
        )

    def url(self, run_id: str, **changes: Any) -> str:
        params: dict[str, Any] = {"type": self.type, "after": self.after, "before": self.before}
        params["limit"] = None if self.limit == q.DEFAULT_PAGE else self.limit
        params["refresh"] = self.refresh
        params.update(changes)
        for name in ("after", "before"):
            if params[name] is not None:
                params[name] = _token(params[name])
        return _url(_path("runs", run_id), params)


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
        family: tuple[tuple[q.RunSummary, ...], q.FamilyNode],
        budget: q.Usage | None,
        intents: tuple[q.IntentRow, ...],
    ) -> None:
        self.run, self.checkpoints, self.events, self.types = run, checkpoints, events, types
        self.steps, self.timers, self.awaiting = steps, timers, awaiting
        self.ancestors, self.descendants = family
        self.budget, self.intents = budget, intents

    @classmethod
    def fetch(cls, run_id: str, query: _EventsQuery, conn: Any) -> _RunView:
        return cls(
            q.get_run(
                conn,
                run_id,
                children_limit=CHILDREN_PAGE,
                children_after=query.children_after,
                max_config_chars=BLOCK_CHARS,
            ),
            q.list_checkpoints(conn, run_id, limit=LIST_LIMIT + 1, max_chars=ITEM_PREVIEW_CHARS),
            query.fetch(run_id, conn),
            q.event_types(conn, run_id),
            q.list_steps(conn, run_id, limit=LIST_LIMIT + 1, max_chars=ITEM_PREVIEW_CHARS),
            q.list_timers(conn, run_id, limit=LIST_LIMIT + 1),
            q.list_awaiting(conn, [run_id]).get(run_id, ()),
            q.family_tree(conn, run_id, depth=TREE_DEPTH, per_node=TREE_WIDTH),
            q.budgets_of(conn, [run_id], _now_ms()).get(run_id),
            q.list_intents(conn, run_id, limit=LIST_LIMIT + 1),
        )


def _path(*segments: object) -> str:
    """An absolute URL path; each segment is percent-encoded (``/`` included)."""
    return "/" + "/".join(urllib.parse.quote(str(s), safe="") for s in segments)


def _url(path: str, params: Mapping[str, Any]) -> str:
    kept = {k: str(v) for k, v in params.items() if v is not None}
    return f"{path}?{urllib.parse.urlencode(kept, quote_via=urllib.parse.quote)}" if kept else path


def _fragment(url: str, anchor: str) -> str:
    return f"{url}#{urllib.parse.quote(anchor, safe='')}"


# --------------------------------------------------------------------------- formatting


def _e(value: object) -> Html:
    """Escape any value for HTML text or a quoted attribute. Every interpolation goes here."""
    return Html(html.escape(str(value), quote=True))


def _join(parts: Iterable[Html]) -> Html:
    return Html("".join(parts))


_DASH = Html('<span class="muted">—</span>')


def _num(value: object) -> Html:
    """A stored integer with thousands separators (a malformed value shows as its placeholder)."""
    return _e(f"{value:,}") if type(value) is int else _malformed(value)


def _malformed(value: object) -> Html:
    return Html(f'<code class="malformed">{_e(value)}</code>')


def _time(ms: object) -> Html:
    if ms is None:
        return _DASH
    if type(ms) is not int:
        return _malformed(ms)
    try:
        moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return Html(f"<code>{_e(ms)}</code>")
    stamp = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    shown = moment.strftime("%Y-%m-%d %H:%M:%S")
    return Html(f'<time datetime="{_e(stamp)}" title="{_e(stamp)}">{_e(shown)}</time>')


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


def _relative(ms: object, now: int) -> Html:
    if type(ms) is not int:
        return Html("")
    return Html(f' <span class="muted">({_e(human_delta(ms - now))})</span>')


_STATUS_CLASSES = frozenset(
    {"pending", "running", "waiting", "completed", "failed", "cancelled", "candidate", "accepted", "rejected"}
)
_LIVE = ("pending", "running", "waiting")


def _pill(status: str) -> Html:
    kind = status if status in _STATUS_CLASSES else "other"
    return Html(f'<span class="pill s-{_e(kind)}">{_e(status)}</span>')


def _run_link(run_id: str) -> Html:
    try:
        run_id = q.parse_run_id(run_id)
    except InvalidArgument:
        return Html(f"<code>{_e(run_id)}</code>")
    return Html(f'<a href="{_e(_path("runs", run_id))}"><code>{_e(run_id)}</code></a>')


def _pretty(text: str) -> Html:
    """Pretty-print stored JSON text (or show it as it is if it cannot be decoded), escaped."""
    ok, value = q.parse_json(text)
    shown = text
    if ok:
        with contextlib.suppress(RecursionError, ValueError):
            shown = json.dumps(value, indent=2, ensure_ascii=False)
    return Html(f"<pre>{_e(shown)}</pre>")


def _stored_value(text: str, truncated: bool, size: int, url: str | None) -> Html:
    """A stored JSON value: pretty-printed whole, or its cut beginning and where the rest is."""
    if not truncated:
        return _pretty(text)
    where_html = Html("")
    if url is not None:
        where_html = Html(f' The whole value is at <a href="{_e(url)}">{_e(url)}</a>.')
    return Html(
        f'<pre>{_e(text)}</pre><p class="muted">Showing the first {_num(len(text))} of {_num(size)}'
        f" characters.{where_html}</p>"
    )


def _preview(text: str, limit: int = 140) -> str:
    flat = " ".join(text[: limit * 2].split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _table(headers: Iterable[Html], rows: Iterable[Html], *, cls: str = "") -> Html:
    klass_html = Html(f' class="{_e(cls)}"') if cls else Html("")
    return Html(
        f"<table{klass_html}><thead><tr>{_join(headers)}</tr></thead><tbody>{_join(rows)}</tbody></table>"
    )


def _th(*names: str) -> list[Html]:
    return [
        Html(f'<th class="num">{_e(n[1:])}</th>') if n.startswith("#") else Html(f"<th>{_e(n)}</th>")
        for n in names
    ]


def _section(title_html: Html, body_html: Html, *, anchor: str) -> Html:
    return Html(f'<section id="{_e(anchor)}"><h2>{title_html}</h2>{body_html}</section>')


def _empty(text: str) -> Html:
    return Html(f'<p class="empty">{_e(text)}</p>')


def _muted(text: str) -> Html:
    return Html(f'<span class="muted">{_e(text)}</span>')


def _link(url: str, label: str) -> Html:
    return Html(f'<a href="{_e(url)}">{_e(label)}</a>')


# --------------------------------------------------------------------------- pages


def _page(title: str, body_html: Html, *, refresh: int | None = None) -> Html:
    refresh_html = Html(f'<meta http-equiv="refresh" content="{_e(refresh)}">') if refresh else Html("")
    return Html(
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{refresh_html}<title>{_e(title)} · zincir inspector</title>"
        f'<link rel="stylesheet" href="{_e(_url("/static/inspector.css", {"v": __version__}))}">'
        '</head><body><header><a class="brand" href="/">zincir</a>'
        '<span class="label">Inspector</span><span class="readonly">read-only</span></header>'
        f"<main>{body_html}</main></body></html>"
    )


def _error_body(status: int, name: str, message: str) -> Html:
    return Html(
        f'<div class="error"><h1>{_e(status)} {_e(name)}</h1><p>{_e(message)}</p>'
        '<p><a href="/">← All runs</a></p></div>'
    )


def _runs_body(
    query: _RunsQuery,
    page: q.RunPage,
    awaiting: Mapping[str, tuple[q.Awaiting, ...]],
    budgets: Mapping[str, q.Usage],
    database: str,
    now: int,
) -> Html:
    parts = [
        Html(f'<div class="title"><h1>Runs</h1>{_muted(database)}</div>'),
        _status_tabs(query, page),
        _runs_filter(query),
    ]
    if page.runs:
        parts.append(_runs_table(page.runs, awaiting, budgets, now))
    elif page.total == 0 and query.role is None:
        parts.append(_empty("No durable runs yet."))
    else:
        parts.append(_empty("No runs match these filters."))
    parts.append(_runs_nav(query, page))
    return _join(parts)


def _status_tabs(query: _RunsQuery, page: q.RunPage) -> Html:
    tabs = [(None, "all", page.total)] + [(s, s, page.counts[s]) for s in q.RUN_STATUSES]
    links = []
    for status, label, count in tabs:
        current_html = Html(' aria-current="page"') if status == query.status else Html("")
        href = query.url(status=status)
        links.append(
            Html(
                f'<a class="tab s-{_e(label)}" href="{_e(href)}"{current_html}>{_e(label)} '
                f'<span class="count">{_num(count)}</span></a>'
            )
        )
    return Html(f'<nav class="tabs">{_join(links)}</nav>')


def _runs_filter(query: _RunsQuery) -> Html:
    options = [Html('<option value="">any status</option>')] + [
        Html(f'<option value="{_e(s)}"{_selected(s == query.status)}>{_e(s)}</option>')
        for s in q.RUN_STATUSES
    ]
    return Html(
        '<form class="filters" method="get" action="/">'
        f'<label>Status <select name="status">{_join(options)}</select></label>'
        f'<label>Role <input name="role" value="{_e(query.role or "")}" '
        'placeholder="any role"></label><button type="submit">Filter</button>'
        '<a href="/">Reset</a></form>'
    )


def _selected(selected: bool) -> Html:
    return Html(" selected") if selected else Html("")


def _clipped(text: str, limit: int) -> Html:
    """Escaped ``text`` cut to ``limit`` characters; the (bounded) whole in a tooltip."""
    if len(text) <= limit:
        return _e(text)
    return Html(f'<span title="{_e(text[:1000])}">{_e(text[: limit - 1])}…</span>')


def _lease_cell(run: q.RunSummary, now: int) -> Html:
    if run.lease_owner is None or run.lease_expires_at is None:
        return _DASH
    owner_html = Html(f"<code>{_clipped(run.lease_owner, 16)}</code>")
    expires = run.lease_expires_at
    if type(expires) is not int:
        return Html(f"{owner_html}<br>{_malformed(expires)}")
    left = expires - now
    state = f"expires {human_delta(left)}" if left > 0 else f"expired {human_delta(left)}"
    kind = "active" if left > 0 else "expired"
    return Html(f'{owner_html}<br><span class="lease-{_e(kind)}">{_e(state)}</span>')


def _ago(ms: object, now: int) -> Html:
    return _muted(human_delta(ms - now)) if type(ms) is int else Html("")


def _awaits_cell(items: tuple[q.Awaiting, ...], now: int) -> Html:
    if not items:
        return _DASH
    first = items[0]
    until_html = Html("until " + _until(first, now)) if first.until is not None else _until(first, now)
    more_html = _muted(f" +{len(items) - 1}") if len(items) > 1 else Html("")
    return Html(f"{_clipped(first.describe(), 60)}<br>{until_html}{more_html}")


def _spend_cell(usage: q.Usage | None) -> Html:
    return _DASH if usage is None else _clipped(q.spend_text(usage), 60)


def _until(item: q.Awaiting, now: int) -> Html:
    if item.until is None:
        return _muted("for ever")
    return Html(_time(item.until) + _relative(item.until, now))


def _runs_table(
    runs: Iterable[q.RunSummary],
    awaiting: Mapping[str, tuple[q.Awaiting, ...]],
    budgets: Mapping[str, q.Usage],
    now: int,
) -> Html:
    rows = [
        Html(
            f"<tr><td>{_run_link(run.id)}</td><td>{_pill(run.status)}</td>"
            f'<td class="text">{_clipped(run.role, 48)}</td>'
            f'<td class="text">{_clipped(run.provider, 32)}</td>'
            f'<td class="num">{_num(run.event_count)}</td><td class="num">{_num(run.attempts)}</td>'
            f"<td>{_lease_cell(run, now)}</td>"
            f"<td>{_spend_cell(budgets.get(run.id))}</td>"
            f"<td>{_awaits_cell(awaiting.get(run.id, ()), now)}</td>"
            f"<td>{_time(run.updated_at)}<br>{_ago(run.updated_at, now)}</td></tr>"
        )
        for run in runs
    ]
    headers = _th(
        "Run",
        "Status",
        "Role",
        "Provider",
        "#Events",
        "#Attempts",
        "Lease",
        "Budget",
        "Awaits",
        "Last activity",
    )
    return _table(headers, rows, cls="runs")


def _runs_nav(query: _RunsQuery, page: q.RunPage) -> Html:
    links = []
    if page.has_newer:
        links.append(_link(query.url(), "⇤ Newest"))
        links.append(_link(query.url(after=page.runs[0].cursor.encode()), "← Newer"))
    if page.has_older:
        links.append(_link(query.url(before=page.runs[-1].cursor.encode()), "Older →"))
    return Html(f'<nav class="pager">{_join(links)}</nav>') if links else Html("")


def _run_body(view: _RunView, query: _EventsQuery, now: int, refresh: bool) -> Html:
    run = view.run
    events_title = Html(f'Events <span class="muted">({_num(run.event_count)})</span>')
    config = _stored_value(run.config, run.config_truncated, run.config_size, _path("api", "runs", run.id))
    return _join(
        [
            Html('<p><a href="/">← All runs</a></p>'),
            Html(
                f'<div class="title"><h1>Run <code>{_e(run.id)}</code></h1>{_pill(run.status)}'
                f"{_refresh_note(view, query, refresh)}</div>"
            ),
            Html('<div class="grid">'),
            _section(_e("Overview"), _overview(run, now), anchor="overview"),
            _section(_e("Lease and attempts"), _lease(run, now), anchor="lease"),
            Html("</div>"),
            _section(_e("Awaiting"), _awaiting(run, view.awaiting, now), anchor="awaiting"),
            _section(_e("Budget"), _budget(view.budget), anchor="budget"),
            _section(_e("Tool calls"), _intents(view.intents), anchor="tool-calls"),
            _section(_e("Family"), _family(view, query), anchor="family"),
            _section(_e("Configuration"), config, anchor="config"),
            _section(_e("Checkpoints"), _checkpoints(run.id, view.checkpoints), anchor="checkpoints"),
            _section(events_title, _events(run.id, view, query), anchor="events"),
            _section(_e("Steps"), _steps(run.id, view.steps), anchor="steps"),
            _section(_e("Timers"), _timers(view.timers, now), anchor="timers"),
        ]
    )


def _refresh_note(view: _RunView, query: _EventsQuery, refresh: bool) -> Html:
    if refresh:
        off = query.url(view.run.id, refresh="off")
        return Html(
            f'<span class="muted">refreshes every {_e(REFRESH_SECONDS)} s · {_link(off, "pause")}</span>'
        )
    if view.run.status in _LIVE:
        on = query.url(view.run.id, refresh=None)
        return Html(f'<span class="muted">auto-refresh paused · {_link(on, "resume")}</span>')
    return Html("")


def _dl(items: Iterable[tuple[str, Html]]) -> Html:
    return Html(f"<dl>{_join(Html(f'<dt>{_e(k)}</dt><dd>{v_html}</dd>') for k, v_html in items)}</dl>")


def _overview(run: q.RunDetail, now: int) -> Html:
    return _dl(
        [
            ("Status", _pill(run.status)),
            ("Role", _e(run.role)),
            ("Provider", _e(run.provider) or _DASH),
            ("Created", Html(_time(run.created_at) + _relative(run.created_at, now))),
            ("Last activity", Html(_time(run.updated_at) + _relative(run.updated_at, now))),
            ("Events", _num(run.event_count)),
        ]
    )


def _lease(run: q.RunDetail, now: int) -> Html:
    if run.lease_owner is None:
        owner = _muted("none (free)")
        expires = _DASH
    else:
        owner = Html(f"<code>{_e(run.lease_owner)}</code>")
        expires = _time(run.lease_expires_at)
        if type(run.lease_expires_at) is int:
            left = run.lease_expires_at - now
            state = "active" if left > 0 else "expired"
            note = f"({state}, {human_delta(left)})"
            expires = Html(f'{_time(run.lease_expires_at)} <span class="lease-{_e(state)}">{_e(note)}</span>')
    if run.next_attempt_at is None:
        next_attempt = _muted("when what it awaits arrives")
    elif type(run.next_attempt_at) is int and run.next_attempt_at <= 0:
        next_attempt = _muted("any time")
    else:
        next_attempt = Html(_time(run.next_attempt_at) + _relative(run.next_attempt_at, now))
    return _dl(
        [
            ("Owner", owner),
            ("Epoch", _num(run.lease_epoch)),
            ("Expires", expires),
            ("Attempts", _num(run.attempts)),
            ("Next attempt", next_attempt),
        ]
    )


def _family(view: _RunView, query: _EventsQuery) -> Html:
    run = view.run
    parent_html = _run_link(run.parent_run_id) if run.parent_run_id else _muted("none")
    if len(view.ancestors) > 1:
        chain_html = _join(Html(f"{_run_link(a.id)} {_pill(a.status)} &rarr; ") for a in view.ancestors)
        parent_html = Html(f'<span class="ancestors">{chain_html}</span>')
    total_html = Html(_num(run.children_total) + ("+" if run.children_capped else ""))
    below = {node.run.id: node for node in view.descendants.children}
    if run.children:
        items = [
            Html(f"<li>{_run_link(c.id)} {_pill(c.status)} {_muted(c.role)}{_subtree(below.get(c.id))}</li>")
            for c in run.children
        ]
        links = []
        if query.children_after is not None:
            links.append(_link(_fragment(query.url(run.id), "family"), "⇤ First children"))
        if run.children_next is not None:
            more = query.url(run.id, children_after=run.children_next.encode())
            links.append(_link(_fragment(more, "family"), "More children →"))
        nav_html = Html(f'<nav class="pager">{_join(links)}</nav>') if links else Html("")
        children_html = Html(f'<ul class="children">{_join(items)}</ul>{nav_html}')
    elif query.children_after is not None:
        children_html = Html(
            f"{_muted('no more children')} {_link(_fragment(query.url(run.id), 'family'), '⇤ First')}"
        )
    else:
        children_html = _muted("none")
    return Html(
        f"<dl><dt>Parent</dt><dd>{parent_html}</dd>"
        f"<dt>Children ({total_html})</dt><dd>{children_html}</dd></dl>"
    )


def _subtree(node: q.FamilyNode | None) -> Html:
    """A child's own descendants, nested (as deep and wide as the page reads them)."""
    if node is None or (not node.children and not node.more):
        return Html("")
    items = [
        Html(f"<li>{_run_link(c.run.id)} {_pill(c.run.status)} {_muted(c.run.role)}{_subtree(c)}</li>")
        for c in node.children
    ]
    if node.more:
        items.append(Html(f"<li>{_muted(f'… {node.more} more')} {_run_link(node.run.id)}</li>"))
    return Html(f'<ul class="children">{_join(items)}</ul>')


def _anchor(seq: object) -> str:
    return "e" + q.encode_key(seq)


def _seq_link(run_id: str, seq: object) -> Html:
    if seq is None:
        return _DASH
    if type(seq) is not int:
        return _malformed(seq)
    href = _url(_path("runs", run_id), {"after": seq - 1 if seq > 0 else None})
    return _link(_fragment(href, _anchor(seq)), f"#{seq}")


def _lineage(checkpoints: Iterable[q.CheckpointRow]) -> dict[object, str]:
    """For each round, which accepted round it builds on (the baseline before it)."""
    builds_on: dict[object, str] = {}
    baseline = "original goal"
    for checkpoint in checkpoints:
        builds_on[checkpoint.round] = baseline
        if checkpoint.status == "accepted":
            baseline = f"round {checkpoint.round}"
    return builds_on


def _checkpoints(run_id: str, checkpoints: tuple[q.CheckpointRow, ...]) -> Html:
    if not checkpoints:
        return _empty("No checkpoints.")
    lineage = _lineage(checkpoints)
    rows = []
    for c in checkpoints[:LIST_LIMIT]:
        url = _checkpoint_url(run_id, c)
        verification_html = _details(
            "verification", c.verification, c.verification_truncated, c.verification_size, url
        )
        state_html = _details("state", c.state, c.state_truncated, c.state_size, url)
        rows.append(
            Html(
                f'<tr><td class="num">{_num(c.round)}</td><td>{_pill(c.status)}</td>'
                f"<td>{_e(lineage[c.round])}</td><td><code>{_e(c.tool_call_id)}</code></td>"
                f'<td class="num">{_seq_link(run_id, c.based_on_event_seq)}</td>'
                f'<td class="num">{_seq_link(run_id, c.decision_event_seq)}</td>'
                f"<td>{_time(c.created_at)}</td><td>{_time(c.decided_at)}</td>"
                f"<td>{verification_html}{state_html}</td></tr>"
            )
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
    return Html(_table(headers, rows) + _cut_note(len(checkpoints), "checkpoints"))


def _details(label: str, text: str | None, truncated: bool, size: int, url: str) -> Html:
    if text is None:
        return _muted(f"no {label}")
    return Html(
        f"<details><summary>{_e(label)}</summary>{_stored_value(text, truncated, size, url)}</details>"
    )


def _cut_note(count: int, what: str) -> Html:
    if count <= LIST_LIMIT:
        return Html("")
    return Html(
        f'<p class="muted">Showing the first {_e(LIST_LIMIT)} {_e(what)}; <code>zincir show --json</code> '
        "or <code>zincir export</code> prints all of them.</p>"
    )


def _events(run_id: str, view: _RunView, query: _EventsQuery) -> Html:
    page = view.events
    parts = [_events_filter(run_id, view.types, query), _events_nav(run_id, view, query)]
    if page.scan_edge is not None:
        parts.append(
            Html(
                f'<p class="muted">There is no index on the event type: a filtered page looks at '
                f"{_num(q.SCAN_WINDOW)} events at most, and this one stopped at "
                f"#{_e(q.encode_key(page.scan_edge))}.</p>"
            )
        )
    if not page.events:
        if query.type is None:
            parts.append(_empty("No events."))
        elif page.scan_edge is not None:
            parts.append(_empty("No events of this type among the events looked at; continue scanning."))
        else:
            parts.append(_empty("No events of this type."))
    for event in page.events:
        parts.append(_event(run_id, event))
    parts.append(_events_nav(run_id, view, query))
    return _join(parts)


def _events_filter(run_id: str, types: Iterable[str], query: _EventsQuery) -> Html:
    options = [Html('<option value="">all types</option>')] + [
        Html(f'<option value="{_e(t)}"{_selected(t == query.type)}>{_e(t)}</option>') for t in types
    ]
    hidden_html = (
        Html('<input type="hidden" name="refresh" value="off">') if query.refresh == "off" else Html("")
    )
    return Html(
        f'<form class="filters" method="get" action="{_e(_fragment(_path("runs", run_id), "events"))}">'
        f'<label>Type <select name="type">{_join(options)}</select></label>{hidden_html}'
        '<button type="submit">Filter</button></form>'
    )


def _events_nav(run_id: str, view: _RunView, query: _EventsQuery) -> Html:
    page = view.events
    scanning = page.scan_edge is not None

    def link(label: str, **changes: Any) -> Html:
        return _link(_fragment(query.url(run_id, **changes), "events"), label)

    links = []
    if page.has_before:
        links.append(link("⇤ First", after=None, before=None))
        if page.prev_before is not None:
            back = scanning and page.prev_before == page.scan_edge
            links.append(
                link("← Continue scanning" if back else "← Previous", after=None, before=page.prev_before)
            )
    if page.has_after:
        if page.next_after is not None:
            onward = scanning and page.next_after == page.scan_edge
            links.append(
                link("Continue scanning →" if onward else "Next →", after=page.next_after, before=None)
            )
        links.append(link("Latest ⇥", after=None, before=q.LATEST))
    return Html(f'<nav class="pager">{_join(links)}</nav>') if links else Html("")


def _event(run_id: str, event: q.EventRow) -> Html:
    api = _path("api", "runs", run_id, "events", q.encode_key(event.seq)) if event.truncated else None
    body_html = _stored_value(event.payload, event.truncated, event.payload_size, api)
    key_html = Html("")
    if event.idempotency_key is not None:
        key_html = Html(f'<p class="muted">idempotency key <code>{_e(event.idempotency_key)}</code></p>')
    return Html(
        f'<details class="event" id="{_e(_anchor(event.seq))}"><summary>'
        f'<span class="seq">#{_e(event.seq)}</span> <strong>{_e(event.type)}</strong> '
        f'{_time(event.created_at)} <span class="preview">{_e(_preview(event.payload))}</span>'
        f"</summary>{key_html}{body_html}</details>"
    )


def _steps(run_id: str, steps: tuple[q.StepRow, ...]) -> Html:
    if not steps:
        return _empty("No named steps.")
    rows = [
        Html(
            f"<tr><td><code>{_e(s.name)}</code></td><td>{_pill(s.status)}</td>"
            f'<td class="num">{_num(s.epoch)}</td><td>{_time(s.started_at)}</td>'
            f"<td>{_time(s.completed_at)}</td>"
            f"<td>{_details('result', s.result, s.truncated, s.result_size, _step_url(run_id, s))}</td></tr>"
        )
        for s in steps[:LIST_LIMIT]
    ]
    headers = _th("Name", "Status", "#Epoch", "Started", "Completed", "Result")
    return Html(_table(headers, rows) + _cut_note(len(steps), "steps"))


def _awaiting(run: q.RunDetail, awaiting: tuple[q.Awaiting, ...], now: int) -> Html:
    if not awaiting:
        return _empty("Nothing: no open wait, approval request or sleep.")
    rows = [
        Html(
            f"<tr><td>{_pill(a.kind)}</td><td><code>{_e(a.name)}</code></td>"
            f"<td>{_e(a.target or '—')}</td><td>{_time(a.since)}</td><td>{_until(a, now)}</td></tr>"
        )
        for a in awaiting[:LIST_LIMIT]
    ]
    note_html = Html("")
    if run.status == "waiting":
        note_html = Html(
            '<p class="muted">Suspended: no process holds this run. What it awaits arriving'
            " (or its deadline) makes it claimable, and a worker resumes it from the top.</p>"
        )
    headers = _th("Kind", "Name", "For", "Since", "Until")
    return Html(note_html + _table(headers, rows) + _cut_note(len(awaiting), "waits"))


def _budget(usage: q.Usage | None) -> Html:
    if usage is None:
        return _empty("No budget: spend is not tracked.")
    spent, limits, left = usage.spent, usage.limits, usage.remaining
    pairs = [
        ("tokens", spent.tokens), ("input_tokens", spent.input_tokens),
        ("output_tokens", spent.output_tokens), ("cost", spent.cost), ("model_calls", spent.model_calls),
        ("tool_calls", spent.tool_calls),
        ("wall_time", round(spent.wall_time, 1)), ("max_identical_tool_calls", spent.identical_tool_calls),
        ("max_responses_without_progress", spent.responses_without_progress),
    ]  # fmt: skip
    rows = [
        Html(
            f'<tr><td><code>{_e(name)}</code></td><td class="num">{_e(value)}</td>'
            f'<td class="num">{_e("—" if getattr(limits, name) is None else getattr(limits, name))}</td>'
            f'<td class="num">{_e("—" if getattr(left, name) is None else getattr(left, name))}</td></tr>'
        )
        for name, value in pairs
    ]
    return Html(f"<p>{_e(q.spend_text(usage))}</p>" + _table(_th("Limit", "Spent", "Limit", "Left"), rows))


def _state_class(state: str) -> str:
    return state.split(",")[0].replace(" ", "-")  # "started, outcome unknown" -> "started"


def _intents(intents: tuple[q.IntentRow, ...]) -> Html:
    if not intents:
        return _empty("No tool calls.")
    rows = [
        Html(
            f"<tr><td><code>{_e(i.call_id)}</code></td><td>{_e(i.name)}</td>"
            f'<td><span class="intent-{_e(_state_class(i.state))}">{_e(i.state)}</span></td>'
            f'<td class="num">{_e("—" if i.started is None else i.started)}</td>'
            f"<td>{_time(i.last_started_at)}</td></tr>"
        )
        for i in intents[:LIST_LIMIT]
    ]
    headers = _th("Call", "Tool", "State", "Starts", "Last start")
    return Html(_table(headers, rows) + _cut_note(len(intents), "tool calls"))


def _timers(timers: tuple[q.TimerRow, ...], now: int) -> Html:
    if not timers:
        return _empty("No durable timers.")
    rows = [
        Html(
            f"<tr><td><code>{_e(t.name)}</code></td>"
            f"<td>{_time(t.wake_at)}{_relative(t.wake_at, now) if t.completed_at is None else Html('')}</td>"
            f"<td>{_time(t.created_at)}</td><td>{_time(t.completed_at)}</td></tr>"
        )
        for t in timers[:LIST_LIMIT]
    ]
    headers = _th("Name", "Wakes at", "Created", "Completed")
    return Html(_table(headers, rows) + _cut_note(len(timers), "timers"))


STYLESHEET = """\
:root {
  color-scheme: dark;
  --bg: #0e1116; --panel: #161b22; --panel2: #1c222c; --border: #2b3340;
  --text: #d8dee9; --muted: #8b95a7; --link: #7fb4ff;
  --pending: #e3b341; --running: #58a6ff; --waiting: #d2a8ff; --completed: #56d364; --failed: #f47067;
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
.s-waiting { color: var(--waiting); }
.s-completed, .s-accepted { color: var(--completed); }
.s-failed, .s-rejected { color: var(--failed); }
.s-cancelled { color: var(--muted); }
.intent-started { color: var(--failed); font-weight: 600; }
.intent-never-started { color: var(--pending); }
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
.malformed { color: var(--failed); overflow-wrap: anywhere; }
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
