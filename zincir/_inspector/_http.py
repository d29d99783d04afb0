"""How the inspector's routes read and answer: reads off the Trio loop, HTML and JSON
responses, and errors as styled pages (or JSON for the API).

Every answer says ``Cache-Control: no-store`` (a run's page changes as it runs) and is encoded
so that no stored text can fail it: a lone surrogate is written as the text ``\\udXXX``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import trio
from quart import Response, current_app, request
from werkzeug.exceptions import HTTPException

from .._errors import (
    DatabaseBusy,
    DatabaseUnavailable,
    InvalidArgument,
    RunNotFound,
    StorageError,
    ZincirError,
)
from ._render import error_page, page_context, render, visible_json
from ._security import InspectorApp

__all__ = [
    "extra_context",
    "html_response",
    "http_error",
    "json_response",
    "now_ms",
    "render_page",
    "run_read",
    "unexpected_error",
    "zincir_error",
]


T = TypeVar("T")


async def run_read(app: InspectorApp, read: Callable[[Any], T]) -> T:
    """Run ``read(conn)`` in a worker thread on a read-only connection, in one snapshot."""
    return await trio.to_thread.run_sync(app.read_pool.read, read)


def now_ms() -> int:
    """The wall clock in integer ms, as the database stores times."""
    return time.time_ns() // 1_000_000


def html_response(body: str, status: int = 200) -> Response:
    # A JSON string escape can decode to a lone surrogate, which UTF-8 cannot encode: show it
    # as the text \udXXX rather than fail the page.
    data = body.encode("utf-8", "backslashreplace")
    response = Response(data, status=status, content_type="text/html; charset=utf-8")
    response.headers["Cache-Control"] = "no-store"
    return response


def json_response(data: Any, status: int = 200) -> Response:
    # Bidi controls and other characters a browser would not draw as themselves are sent as
    # JSON escapes (the same JSON), so a browser showing the raw response shows them visibly.
    # That includes lone surrogates, which UTF-8 could not encode.
    text = visible_json(json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")))
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
        return json_response({"error": {"status": status, "name": name, "message": message}}, status)
    mode = getattr(current_app, "mode", "read-only")  # the app's, once a request reached it
    return html_response(error_page(status, name, message, mode), status)


_ERROR_STATUS: tuple[tuple[type[ZincirError], int, str], ...] = (
    (InvalidArgument, 400, "Bad Request"),
    (RunNotFound, 404, "Not Found"),
    (DatabaseBusy, 503, "Service Unavailable"),
    (DatabaseUnavailable, 503, "Service Unavailable"),
    (StorageError, 500, "Internal Server Error"),
)


async def zincir_error(error: ZincirError) -> Response:
    """A refusal or failure zincir names, as its HTTP status: bad input 400, an unknown run 404,
    a busy or unreachable database 503."""
    for kind, status, name in _ERROR_STATUS:
        if isinstance(error, kind):
            return _error_response(status, name, str(error))
    return _error_response(500, "Internal Server Error", str(error))


async def http_error(error: HTTPException) -> Response:
    status = error.code or 500
    response = _error_response(status, error.name, error.description or "")
    for name, value in error.get_headers():
        if name.lower() == "allow":  # a 405 says which methods the URL takes
            response.headers[name] = value
    return response


async def unexpected_error(error: Exception) -> Response:
    # A bug must still give a styled page with the security headers, and no traceback.
    current_app.logger.exception("the inspector failed to answer %s", request.path, exc_info=error)
    return _error_response(500, "Internal Server Error", "The inspector failed to answer this request.")


def extra_context(app: InspectorApp) -> dict[str, Any]:
    """What ``create_app(extend=...)`` hooks add to a page's context (run in the request)."""
    extra: dict[str, Any] = {}
    for hook in app.page_context:
        extra.update(hook())
    return extra


def render_page(
    app: InspectorApp, template: str, title: str, context: Mapping[str, Any], *, refresh: int | None = None
) -> str:
    """A whole page: ``template`` with ``context`` in the app's frame."""
    return render(template, {**page_context(title, app.mode, refresh), **context})
