"""``zincir ui``: a read-only web inspector (Quart-Trio on Hypercorn's Trio worker).

:func:`create_app` makes the app: the pages (:mod:`._pages`), the JSON API (:mod:`._api`)
and the error handlers (:mod:`._http`) on an :class:`~._security.InspectorApp`;
:func:`~._serve.serve` serves it. Safety properties, each pinned by tests:

- it binds loopback only (127.0.0.0/8 or ::1, given as a literal IP and port: :mod:`._plain`);
- it answers 421 to any request whose ``Host`` is not the exact ``ip:port`` it serves, so a
  DNS-rebinding page cannot read it, and 403 to requests a browser marks
  ``Sec-Fetch-Site: cross-site`` (or that carry that header more than once, or a list in it:
  no browser does); WebSocket connections are refused before the app sees them
  (:mod:`._security`);
- every response carries a restrictive Content-Security-Policy (no script at all, styles
  only from the inspector itself, no framing), ``nosniff`` and ``no-referrer``: when served,
  Hypercorn itself adds them (:class:`~._security.SecuredConfig`), so that the answers it
  writes on its own (a malformed request's 400, a 431, a refused WebSocket's 403, a 101)
  carry them too;
- it opens the database read-only (SQLite's ``mode=ro``; on PostgreSQL a read-only session and
  ``REPEATABLE READ READ ONLY`` transactions) and never writes, creates or migrates;
- pages are Jinja2 templates (``templates/``) rendered with autoescape always on, from view
  models (:mod:`._views`, :mod:`._runpage`) of plain data: every value printed is
  HTML-escaped, whatever its type (the queries normalise stored values, but an INTEGER column
  can hold text, so the pages trust no type). No filter returns markup and no template marks
  data ``|safe``; a test scans the templates to keep it so (:mod:`._render`).

Each request reads through its own read-only connection in a worker thread, inside one read
transaction, and renders there too, so the Trio loop never blocks on the database.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from quart import Response
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from .._errors import ZincirError
from ._api import api_checkpoint, api_event, api_events, api_run, api_runs, api_step
from ._http import http_error, unexpected_error, zincir_error
from ._pages import checkpoint_page, run_page, runs_page, stylesheet
from ._pool import ReadPool
from ._security import SECURITY_HEADERS, InspectorApp

__all__ = ["create_app"]


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
    exists (``ignore missing``), with the whole run-page context (``view``: the run and each
    section of its page, a :class:`~._runpage.RunPageView`; ``now``) plus those extra names.
    Everything stays autoescaped. Without ``extend`` the app opens no write connection.
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
        ("/", "runs", functools.partial(runs_page, app)),
        ("/runs/<run_id>", "run", functools.partial(run_page, app)),
        ("/runs/<run_id>/checkpoints/<round>", "checkpoint", functools.partial(checkpoint_page, app)),
        ("/static/inspector.css", "css", stylesheet),
        ("/api/runs", "api_runs", functools.partial(api_runs, app)),
        ("/api/runs/<run_id>", "api_run", functools.partial(api_run, app)),
        ("/api/runs/<run_id>/events", "api_events", functools.partial(api_events, app)),
        ("/api/runs/<run_id>/events/<seq>", "api_event", functools.partial(api_event, app)),
        ("/api/runs/<run_id>/steps/<path:name>", "api_step", functools.partial(api_step, app)),
        ("/api/runs/<run_id>/checkpoints/<round>", "api_checkpoint", functools.partial(api_checkpoint, app)),
    ]
    for rule, endpoint, view in routes:
        app.add_url_rule(rule, endpoint, view, methods=["GET"])
    app.register_error_handler(HTTPException, http_error)
    app.register_error_handler(ZincirError, zincir_error)
    app.register_error_handler(Exception, unexpected_error)
