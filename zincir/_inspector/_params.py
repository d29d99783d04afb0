"""What a page or an API request asks for, read from its query string, and the URLs that ask
for it again with a change.

Every parameter is checked before any read: a malformed one is :class:`InvalidArgument` (a
400 that names it), never a page built on a guess.
"""

from __future__ import annotations

import re
from typing import Any

from quart import request

from .. import _queries as q
from .._errors import InvalidArgument
from . import _views as v

__all__ = [
    "RUNS_PAGE",
    "EventsQuery",
    "RunsQuery",
    "arg",
    "cursor_arg",
    "int_arg",
    "key_arg",
    "status_arg",
    "token",
    "token_json",
]


#: Runs listed per page when the request does not say.
RUNS_PAGE = 50


def arg(name: str) -> str | None:
    """A query parameter's value; None when it is absent or empty."""
    value = request.args.get(name)
    return value if value else None


def int_arg(name: str, default: int, low: int, high: int) -> int:
    """An integer parameter within ``low..high``, or ``default`` when absent."""
    text = arg(name)
    if text is None:
        return default
    if not re.fullmatch(r"-?[0-9]{1,19}", text):
        raise InvalidArgument(f"query parameter {name}={text[:40]!r} is not an integer")
    value = int(text)
    if not low <= value <= high:
        raise InvalidArgument(f"query parameter {name}={value} is outside {low}..{high}")
    return value


def key_arg(name: str) -> object:
    """A seq cursor parameter (see :func:`q.decode_key`); ``before=end`` means the log's end."""
    text = arg(name)
    if text is None:
        return None
    if name == "before" and text == "end":
        return q.LATEST
    return q.decode_key(text, f"query parameter {name}=")


def token(value: object) -> str:
    """The URL form of a seq cursor."""
    return "end" if value is q.LATEST else q.encode_key(value)


def token_json(value: object) -> object:
    """A seq cursor in a JSON answer: an integer as is, another key as its token."""
    return "end" if value is q.LATEST else q.key_json(value)


def status_arg() -> str | None:
    """The ``status`` filter: one of the statuses zincir writes, or None."""
    status = arg("status")
    if status is not None and status not in q.RUN_STATUSES:
        raise InvalidArgument(f"unknown status {status[:40]!r}: expected one of {q.RUN_STATUSES}")
    return status


def cursor_arg(name: str) -> q.RunCursor | None:
    """A runs cursor parameter (see :meth:`zincir._queries.RunCursor.encode`), or None."""
    text = arg(name)
    return None if text is None else q.parse_cursor(text)


class RunsQuery:
    def __init__(
        self,
        status: str | None,
        role: str | None,
        limit: int,
        before: q.RunCursor | None,
        after: q.RunCursor | None,
        version: str | None = None,
    ) -> None:
        self.status, self.role, self.limit = status, role, limit
        self.before, self.after = before, after
        #: Only runs of this version; :data:`q.NO_VERSION` for those without one (the URL says
        #: ``unversioned=1``: an empty parameter is an absent one).
        self.version = version

    @classmethod
    def from_request(cls) -> RunsQuery:
        limit = int_arg("limit", RUNS_PAGE, 1, q.MAX_PAGE)
        before, after = cursor_arg("before"), cursor_arg("after")
        if before is not None and after is not None:
            raise InvalidArgument("give at most one of before= and after=")
        version = arg("version")
        if arg("unversioned") is not None:
            if version is not None:
                raise InvalidArgument("give at most one of version= and unversioned=")
            version = q.NO_VERSION
        return cls(status_arg(), arg("role"), limit, before, after, version)

    def fetch(self, conn: Any) -> q.RunPage:
        return q.list_runs(
            conn,
            status=self.status,
            role=self.role,
            limit=self.limit,
            before=self.before,
            after=self.after,
            version=self.version,
        )

    def url(self, **changes: Any) -> str:
        params = {"status": self.status, "role": self.role, "limit": self.limit, **self._version_params()}
        if params["limit"] == RUNS_PAGE:
            params["limit"] = None
        if "version" in changes:  # a change of version: one of the two parameters, or neither
            params.update(self._version_params(changes.pop("version")))
        params.update(changes)
        return v.url("/", params)

    def _version_params(self, version: object = ...) -> dict[str, Any]:
        version = self.version if version is ... else version
        if version == q.NO_VERSION:
            return {"version": None, "unversioned": 1}
        return {"version": version, "unversioned": None}


class EventsQuery:
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
        view: str | None = None,
    ) -> None:
        self.after, self.before, self.limit, self.type = after, before, limit, type
        self.payload_chars, self.refresh, self.children_after = payload_chars, refresh, children_after
        #: "events" shows the raw event list; anything else (the default) the conversation.
        #: A type filter applies to the raw list only, so it implies "events".
        self.view = "events" if view == "events" or type is not None else None

    @classmethod
    def from_request(cls, default_limit: int, payload_chars: int | None) -> EventsQuery:
        after, before = key_arg("after"), key_arg("before")
        if after is not None and before is not None:
            raise InvalidArgument("give at most one of after= and before=")
        limit = int_arg("limit", default_limit, 1, q.MAX_PAGE)
        view = arg("view")
        if view not in (None, "events", "conversation"):
            raise InvalidArgument(f"unknown view {view[:40]!r}: expected events or conversation")
        return cls(
            after,
            before,
            limit,
            arg("type"),
            payload_chars,
            arg("refresh"),
            cursor_arg("children_after"),
            view,
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
        params["view"] = self.view if self.type is None else None
        params.update(changes)
        if params.get("type") is not None:
            params["view"] = None  # implied
        for name in ("after", "before"):
            if params[name] is not None:
                params[name] = token(params[name])
        return v.url(v.path("runs", run_id), params)
