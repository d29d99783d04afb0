"""The inspector's Jinja2 environment: templates from ``templates/``, autoescape always on.

Every filter and global registered here returns plain data (``str``, numbers, lists), never
:class:`markupsafe.Markup`, so whatever a template prints from the database is escaped by
Jinja2. Markup comes only from the template files themselves, and a test scans those for
``|safe``, ``Markup`` and ``autoescape false``.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

from .. import _queries as q
from ._plain import human_delta

TEMPLATES = Path(__file__).with_name("templates")
STATIC = Path(__file__).with_name("static")


def duration(ms: object) -> str:
    """A duration without direction: ``1.2 s``, ``4 min``."""
    if type(ms) is not int:
        return ""
    if ms < 1000:
        return f"{ms} ms"
    return human_delta(ms).removeprefix("in ")


def is_int(value: object) -> bool:
    """A stored integer (bool and Malformed placeholders are not)."""
    return type(value) is int


def thousands(value: object) -> str:
    return f"{value:,}" if type(value) is int else str(value)


def _moment(ms: object) -> datetime.datetime | None:
    if type(ms) is not int:
        return None
    try:
        return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return None


def iso_time(ms: object) -> str | None:
    moment = _moment(ms)
    return None if moment is None else moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def stamp(ms: object) -> tuple[str, str] | None:
    """(ISO 8601 in UTC to the millisecond, ``YYYY-MM-DD HH:MM:SS``), or None if out of range."""
    iso = iso_time(ms)
    return None if iso is None else (iso, f"{iso[:10]} {iso[11:19]}")


def clock_time(ms: object) -> str | None:
    moment = _moment(ms)
    return None if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def relative(ms: object, now: int) -> str:
    return human_delta(ms - now) if type(ms) is int else ""


def preview(text: str, limit: int = 140) -> str:
    flat = " ".join(text[: limit * 2].split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def pretty(text: str) -> str:
    """Stored JSON text pretty-printed (or as it is when it cannot be decoded)."""
    ok, value = q.parse_json(text)
    if ok:
        with contextlib.suppress(RecursionError, ValueError):
            return json.dumps(value, indent=2, ensure_ascii=False)
    return text


def pretty_value(value: Any) -> str:
    """A decoded JSON value, pretty-printed (strings as they are)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, indent=2, ensure_ascii=False)
    except (RecursionError, ValueError, TypeError):
        return str(value)


def encode_key(value: object) -> str:
    return q.encode_key(value)


_STATUS_CLASSES = frozenset(
    {"pending", "running", "waiting", "completed", "failed", "cancelled", "candidate", "accepted", "rejected"}
)


def status_class(status: str) -> str:
    return status if status in _STATUS_CLASSES else "other"


@functools.cache
def environment() -> jinja2.Environment:
    """The one environment (thread-safe for rendering; pages render in worker threads)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        auto_reload=False,
    )
    env.filters.update(
        thousands=thousands,
        iso_time=iso_time,
        clock_time=clock_time,
        stamp=stamp,
        relative=relative,
        duration=duration,
        preview=preview,
        pretty=pretty,
        pretty_value=pretty_value,
        key=encode_key,
        status_class=status_class,
        human_delta=human_delta,
    )
    env.tests["stored_int"] = is_int
    return env


def render(name: str, context: Mapping[str, Any]) -> str:
    """Render template ``name`` with ``context`` (everything in it is escaped on output)."""
    return environment().get_template(name).render(context)
