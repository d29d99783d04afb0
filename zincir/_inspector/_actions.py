"""The guarded actions of ``zincir ui --allow-actions``: outsiders' writes from the run page.

Only :func:`serve_with_actions` opens a write :class:`~zincir.Database`; plain ``zincir ui``
never imports this module's writes and keeps no write connection at all. Each action is one of
zincir's outsider writes (:mod:`zincir._inbox`), made as the ``--as`` name, so it lands in the
audit trail (``outsider_actions``) with who did it:

========  =====================================================================
approve   :func:`zincir.decide_approval` (approved) of a requested tool call
deny      :func:`zincir.decide_approval` (denied)
signal    :func:`zincir.send_signal` with a JSON payload (and an optional key)
cancel    :func:`zincir.cancel_run` with a reason
retry     :func:`zincir.retry_now` of a run backing off after a failure
budget    :func:`zincir.raise_budget` with the limits given
fork      :func:`zincir.fork_run` at an event of the log (with an optional config)
========  =====================================================================

A write is a ``POST /runs/<id>/actions/<action>`` that passes :class:`~._auth.Guard`'s checks
(Host, Origin, the session cookie) and carries the form's CSRF token; then it is made, and the
answer is a 303 back to the run page (after a fork: the new run's page), whose panel says what
was done (a fixed sentence chosen by the action's name: nothing from the request is echoed). A
refused write is a styled 403 (421 for a foreign Host) and writes nothing; a write zincir
refuses (say, the approval was decided the other way) is a 409 with zincir's message, a
malformed one (a fork point inside a model response, say) a 400.
"""

from __future__ import annotations

import errno
import functools
import json
import math
import re
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import attrs
import trio
from quart import Response, request
from werkzeug.datastructures import MultiDict
from werkzeug.exceptions import Conflict, Forbidden, MethodNotAllowed, MisdirectedRequest

from .. import _queries as q
from .._crypto import keys_from_env
from .._database import Database, open_database
from .._errors import InvalidArgument, RunNotFound, StorageError, ZincirError
from .._forks import fork_run
from .._inbox import cancel_run, decide_approval, raise_budget, retry_now, send_signal
from .._json import MAX_DEPTH
from .._validation import check_text
from ._auth import Guard, Refusal
from ._http import extra_context, html_response, render_page
from ._plain import parse_address, random_loopback_ip
from ._security import InspectorApp
from ._serve import serve

__all__ = ["ACTIONS", "BUDGET_FIELDS", "Actions", "Panel", "serve_with_actions"]

ACTIONS: Final = ("approve", "deny", "signal", "cancel", "retry", "budget", "fork")

# The confirmation the run page shows after a write, by the ``done`` parameter: fixed text only.
_DONE: Final = {
    "approve": "Approved. The run's owner enters the decision in its log when its wait sees it.",
    "deny": "Denied. The run's owner enters the decision in its log when its wait sees it.",
    "signal": "Signal sent: the run's next wait for that signal receives it.",
    "cancel": "Cancelled: a run nobody held has ended; a running one's owner was asked to stop.",
    "retry": "Retried now: the run is due, and the workers were woken to claim it.",
    "retry-due": "Nothing to cut short: the run was due already.",
    "budget": "Budget limits set. A run suspended for its budget resumes if it is within them now.",
    "fork": "Forked: this is the new run. It holds the source's events up to the fork point and is"
    " pending until a worker claims it.",
}

_BAD_CSRF: Final = (
    "This form's CSRF token is missing or wrong (a form from another session, or another server"
    " instance): reload the page and try again."
)

# (name, label, kind) of the limits the budget form offers, as zincir.Budget names them.
BUDGET_FIELDS: Final = (
    ("tokens", "tokens", int),
    ("input_tokens", "input tokens", int),
    ("output_tokens", "output tokens", int),
    ("cost", "cost", float),
    ("model_calls", "model calls", int),
    ("tool_calls", "tool calls", int),
    ("wall_time", "wall time (s)", float),
    ("max_identical_tool_calls", "identical tool calls", int),
    ("max_responses_without_progress", "responses without progress", int),
)

MAX_FORM_BYTES: Final = 2 * 1024 * 1024
"""The largest form a write accepts; a larger one is a 413 and writes nothing (a bigger signal
payload, up to the database's limit, goes through :func:`zincir.send_signal` or ``zincir signal``)."""


@attrs.frozen
class Panel:
    """What the run page's actions panel sees (plain data and strings; Jinja2 escapes them)."""

    actor: str
    logged_in: bool
    done: str | None
    run_id: str | None
    _guard: Guard
    _session: str | None

    budget_fields: tuple[tuple[str, str, str], ...] = tuple(
        (name, label, "any" if kind is float else "1") for name, label, kind in BUDGET_FIELDS
    )

    def url(self, action: str) -> str:
        return f"/runs/{self.run_id}/actions/{action}"

    @property
    def logout_token(self) -> str:
        return "" if self._session is None else self._guard.csrf_token(self._session, "logout", "")

    def token(self, action: str, target: str = "") -> str:
        """The CSRF token of one form (empty when logged out: no form is shown then)."""
        if self._session is None or self.run_id is None:
            return ""
        return self._guard.csrf_token(self._session, action, self.run_id, target)

    @staticmethod
    def signal_topics(awaiting: Any) -> list[str]:
        """The signals a run's open waits are for, to suggest in the signal form."""
        return sorted({a.target for a in awaiting if a.kind == "signal" and isinstance(a.target, str)})

    @staticmethod
    def backing_off(run: Any, now: int) -> bool:
        """A live run nobody holds, not waiting, due later than now: what retry cuts short."""
        if run.status not in ("pending", "running"):
            return False
        held = (
            run.lease_owner is not None and type(run.lease_expires_at) is int and run.lease_expires_at > now
        )
        return not held and type(run.next_attempt_at) is int and run.next_attempt_at > now


class Actions:
    """The actions of one server instance: its write database, the name it acts as, its guard."""

    def __init__(self, db: Database, actor: str, guard: Guard) -> None:
        self.db = db
        self.actor = actor
        self.guard = guard
        self._app: InspectorApp

    def install(self, app: InspectorApp) -> None:
        """The ``extend`` hook of :func:`~._app.create_app`: routes, the mode label, the panel."""
        app.mode = f"actions allowed, as {self.actor}"
        app.page_context.append(self._panel)
        app.config["MAX_CONTENT_LENGTH"] = MAX_FORM_BYTES
        # Forms need the browser to send Origin: under "no-referrer" a form's POST says
        # "Origin: null". "same-origin" still sends nothing to any other site.
        app.security_headers = tuple(
            (name, b"same-origin" if name == b"referrer-policy" else value)
            for name, value in app.security_headers
        )
        self._app = app
        # GET shows the login button and spends nothing; the POST it makes logs in.
        app.add_url_rule("/login", "login", self._login_page, methods=["GET"])
        app.add_url_rule("/login", "log_in", self._log_in, methods=["POST"])
        app.add_url_rule("/logout", "logout", self._logout, methods=["POST"])
        app.add_url_rule("/runs/<run_id>/actions/<action>", "action", self._act, methods=["POST"])

    # -- pages -----------------------------------------------------------------------------

    def _panel(self) -> Mapping[str, Any]:
        session = self.guard.session_of(request.cookies)
        run_id = (request.view_args or {}).get("run_id")
        try:
            run_id = None if run_id is None else q.parse_run_id(run_id)
        except InvalidArgument:
            run_id = None
        done = _DONE.get(request.args.get("done", ""))
        panel = Panel(self.actor, session is not None, done, run_id, self.guard, session)
        return {"actions": panel}

    async def _login_page(self) -> Response:
        if request.method != "GET":
            # Quart answers HEAD through the GET view. The page spends nothing either way, but a
            # HEAD of a login URL is no person logging in: refused.
            raise MethodNotAllowed(valid_methods=["GET", "POST"])
        if self.guard.session_of(request.cookies) is not None:
            return _see_other("/")  # this browser is logged in already
        token = request.args.get("token")
        try:
            self.guard.check_login_token(token)  # a used or foreign link says so at once
        except Refusal as refusal:
            raise Forbidden(refusal.message) from None
        app = self._app
        context = {**extra_context(app), "token": token}
        return html_response(render_page(app, "login.html", "Log in", context))

    async def _log_in(self) -> Response:
        try:
            self.guard.check_origin(_once("Host"), _once("Origin"))
        except Refusal as refusal:
            raise (MisdirectedRequest if refusal.status == 421 else Forbidden)(refusal.message) from None
        if self.guard.session_of(request.cookies) is not None:
            return _see_other("/")  # this browser is logged in already
        form = await request.form
        try:
            session = self.guard.log_in(form.get("token"))
        except Refusal as refusal:
            raise Forbidden(refusal.message) from None
        response = _see_other("/")
        response.set_cookie(self.guard.cookie_name, session, path="/", httponly=True, samesite="Strict")
        return response

    async def _logout(self) -> Response:
        session = self._checked_session()
        form = await request.form
        if not self.guard.csrf_ok(session, "logout", "", "", form.get("csrf")):
            raise Forbidden(_BAD_CSRF)
        self.guard.log_out(session)
        response = _see_other("/")
        response.delete_cookie(self.guard.cookie_name, path="/", httponly=True, samesite="Strict")
        return response

    def _checked_session(self) -> str:
        try:
            return self.guard.check_write(_once("Host"), _once("Origin"), request.cookies)
        except Refusal as refusal:
            raise (MisdirectedRequest if refusal.status == 421 else Forbidden)(refusal.message) from None

    # -- writes ----------------------------------------------------------------------------

    async def _act(self, run_id: str, action: str) -> Response:
        session = self._checked_session()
        write = _WRITES.get(action)
        if write is None:
            raise Forbidden(f"There is no action {action[:40]!r}.")
        form = await request.form
        target = form.get(_TARGETS[action], "") if action in _TARGETS else ""
        if not self.guard.csrf_ok(session, action, run_id, target, form.get("csrf")):
            raise Forbidden(_BAD_CSRF)
        run_id = q.parse_run_id(run_id)
        try:
            done = await write(self, run_id, form)
        except (InvalidArgument, RunNotFound, StorageError):
            raise  # 400, 404, 5xx pages
        except ZincirError as error:
            raise Conflict(str(error)) from None
        if isinstance(done, tuple):  # the write made another run: show it
            done, run_id = done
        return _see_other(f"/runs/{run_id}?refresh=off&done={done}#actions")

    async def _approve(self, run_id: str, form: MultiDict[str, str], approved: bool = True) -> str:
        call_id = form.get("call_id", "")
        reason = form.get("reason", "")
        args_hash = form.get("args_hash", "")
        if not args_hash:  # a decision is for the arguments the person saw, never for any
            raise InvalidArgument(f"run {run_id}: a decision needs the arguments hash of the call shown")
        await decide_approval(
            self.db, run_id, call_id, approved=approved, by=self.actor, reason=reason, args_hash=args_hash
        )
        return "approve" if approved else "deny"

    async def _deny(self, run_id: str, form: MultiDict[str, str]) -> str:
        return await self._approve(run_id, form, approved=False)

    async def _signal(self, run_id: str, form: MultiDict[str, str]) -> str:
        text = form.get("payload", "").strip() or "null"
        try:
            payload = json.loads(text)
        except ValueError as error:
            raise InvalidArgument(f"run {run_id}: the signal's payload is not JSON ({error})") from None
        except RecursionError:  # nested past the parser's stack: past zincir's depth limit too
            raise InvalidArgument(
                f"run {run_id}: the signal's payload nests lists and objects deeper than {MAX_DEPTH} levels"
            ) from None
        key = form.get("key", "").strip() or None
        await send_signal(self.db, run_id, form.get("signal", "").strip(), payload, key=key, by=self.actor)
        return "signal"

    async def _cancel(self, run_id: str, form: MultiDict[str, str]) -> str:
        reason = form.get("reason", "").strip() or "cancelled from the inspector"
        await cancel_run(self.db, run_id, reason, by=self.actor)
        return "cancel"

    async def _retry(self, run_id: str, form: MultiDict[str, str]) -> str:
        return "retry" if await retry_now(self.db, run_id, by=self.actor) else "retry-due"

    async def _budget(self, run_id: str, form: MultiDict[str, str]) -> str:
        limits: dict[str, Any] = {}
        for name, _, kind in BUDGET_FIELDS:
            text = form.get(name, "").strip()
            if text:
                limits[name] = _number(text, kind, f"run {run_id}: the {name} limit")
        if not limits:
            raise InvalidArgument(f"run {run_id}: give at least one limit to set")
        await raise_budget(self.db, run_id, by=self.actor, **limits)
        return "budget"

    async def _fork(self, run_id: str, form: MultiDict[str, str]) -> tuple[str, str]:
        at = form.get("at_seq", "")
        if not re.fullmatch(r"[0-9]{1,19}", at):
            raise InvalidArgument(f"run {run_id}: the seq to fork at must be a whole number, not {at[:40]!r}")
        text = form.get("config", "").strip()
        config = None
        if text:
            try:
                config = json.loads(text)
            except ValueError as error:
                raise InvalidArgument(f"run {run_id}: the fork's config is not JSON ({error})") from None
            except RecursionError:
                raise InvalidArgument(
                    f"run {run_id}: the fork's config nests lists and objects deeper than {MAX_DEPTH} levels"
                ) from None
        reason = form.get("reason", "").strip() or None
        fork = await fork_run(self.db, run_id, int(at), config=config, by=self.actor, reason=reason)
        return "fork", fork


# The form field a write's CSRF token is bound to besides the run: the call decided, the seq forked at.
_TARGETS: Final = {"approve": "call_id", "deny": "call_id", "fork": "at_seq"}

_WRITES: Final[dict[str, Callable[[Actions, str, MultiDict[str, str]], Awaitable[str | tuple[str, str]]]]] = {
    "approve": Actions._approve,
    "deny": Actions._deny,
    "signal": Actions._signal,
    "cancel": Actions._cancel,
    "retry": Actions._retry,
    "budget": Actions._budget,
    "fork": Actions._fork,
}


def _once(name: str) -> str | None:
    """A request header sent exactly once (a repeated one counts as missing)."""
    values = request.headers.getlist(name)
    return values[0] if len(values) == 1 else None


def _see_other(location: str) -> Response:
    """303 See Other: the browser follows with a GET, so a reload repeats no write."""
    response = Response("", status=303, headers={"Location": location})
    response.headers["Cache-Control"] = "no-store"
    return response


def _number(text: str, kind: type, what: str) -> int | float:
    if kind is int:
        if not re.fullmatch(r"[0-9]{1,19}", text):
            raise InvalidArgument(f"{what} must be a whole number, not {text[:40]!r}")
        return int(text)
    try:
        value = float(text)
    except ValueError:
        raise InvalidArgument(f"{what} must be a number, not {text[:40]!r}") from None
    if not math.isfinite(value):
        raise InvalidArgument(f"{what} must be a finite number, not {text[:40]!r}")
    return value


async def serve_with_actions(
    database_path: str,
    address: str | None = None,
    *,
    actor: str,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[tuple[str, str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the inspector with the guarded actions, acting as ``actor``, until shutdown.

    Checks the address, and the database read-only (so a missing or foreign one is refused,
    never created or migrated into a zincir database), then opens the one write
    :class:`~zincir.Database` the actions use. Reports ``(url, one-time login url)``.

    Without ``address`` it serves on a random address of 127.0.0.0/8 of its own, any free port:
    browsers keep cookies apart by host, not by port, so no other local server (on 127.0.0.1,
    say) receives the session cookie. Where only 127.0.0.1 is loopback (macOS, by default), it
    serves there, and the URL says so.
    """
    actor = check_text(actor, "the name the inspector acts as (--as)")
    if address is None:
        address = await trio.to_thread.run_sync(_address_of_its_own)
    parse_address(address)
    await trio.to_thread.run_sync(_check_readable, database_path)
    async with open_database(database_path, keys=keys_from_env()) as db:
        apps: list[InspectorApp] = []
        guard = Guard(lambda: apps[0].served_host)
        actions = Actions(db, actor, guard)

        def extend(app: InspectorApp) -> None:
            apps.append(app)
            actions.install(app)

        async with trio.open_nursery() as nursery:
            serving = functools.partial(
                serve, database_path, address, shutdown_trigger=shutdown_trigger, extend=extend
            )
            url: str = await nursery.start(serving)
            task_status.started((url, guard.login_url(url)))


def _check_readable(path: str) -> None:
    q.open_readonly(path).close()


def _address_of_its_own() -> str:
    """A random loopback address and port 0, or 127.0.0.1:0 where that cannot be bound."""
    ip = random_loopback_ip()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((ip, 0))
    except OSError as error:
        if error.errno != errno.EADDRNOTAVAIL:
            raise
        ip = "127.0.0.1"
    return f"{ip}:0"
