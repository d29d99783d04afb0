"""The inspector's Jinja2 environment: templates from ``templates/``, autoescape always on.

Every filter and global registered here returns plain data (``str``, numbers, lists), never
:class:`markupsafe.Markup`, so whatever a template prints from the database is escaped by
Jinja2. Markup comes only from the template files themselves, and a test scans those for
``|safe``, ``Markup`` and ``autoescape false``.

Escaping HTML is not enough to show a value as it is: a browser obeys the bidi controls and
other invisible format characters in a text (U+202E draws what follows right to left), so
``acct \u202e7777-4321\u202c`` would be drawn as ``acct 1234-7777``. Every printed string
therefore goes through :func:`visible` first (the environment's ``finalize``), which writes
each character that is not drawn as itself as an escape such as ``\u202e``, as the CLI does.
Pretty-printed JSON gets JSON's own escapes (:func:`visible_json`), so it stays valid JSON.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import re
import unicodedata
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

from .. import _queries as q
from .._version import __version__
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


# Characters that may need escaping: everything but printable ASCII, newline and tab. A run of
# them is kept when Python calls it printable (letters, marks, symbols of any script).
_MAYBE_HIDDEN = re.compile(r"[^\x20-\x7e\n\t]+")


def _drawn_as_itself(char: str) -> bool:
    # Printable, or a space of another width (U+00A0, U+3000...): drawn as a space, no reordering.
    return char.isprintable() or unicodedata.category(char) == "Zs"


def _python_escape(char: str) -> str:
    return char if _drawn_as_itself(char) else char.encode("unicode_escape").decode("ascii")


def _json_escape(char: str) -> str:
    if _drawn_as_itself(char):
        return char
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as JSON writes a character past U+FFFF
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def _escape_runs(text: str, escape: Any) -> str:
    # Nearly every text hides nothing: str methods (C speed) say so, even for megabytes.
    if text.replace("\n", "").replace("\t", "").isprintable():
        return text

    def replace(match: re.Match[str]) -> str:
        run = match.group(0)
        return run if run.isprintable() else "".join([escape(char) for char in run])

    lines = text.split("\n")  # then only the lines that do hide something are gone through
    for i, line in enumerate(lines):
        if not line.replace("\t", "").isprintable():
            lines[i] = (
                "".join([c if c.isprintable() or c == "\t" else escape(c) for c in line])
                if len(line) < 256  # a short line: one pass; a long one: by runs of non-ASCII
                else _MAYBE_HIDDEN.sub(replace, line)
            )
    return "\n".join(lines)


def visible(text: str) -> str:
    """``text`` with every character a browser would not draw as itself (bidi controls and
    other format characters, control characters, line and paragraph separators, surrogates,
    private-use and unassigned code points) written as its Python escape (``\\u202e``,
    ``\\x1b``, ``\\U000e0001``). Newlines, tabs and spaces stay as they are."""
    return _escape_runs(text, _python_escape)


def visible_json(text: str) -> str:
    """JSON text (from :func:`json.dumps` with ``ensure_ascii=False``) with the characters
    :func:`visible` escapes written as JSON escapes (``\\u202e``), so it is still the same JSON.
    Outside strings JSON has only printable ASCII and whitespace, so only strings change."""
    return _escape_runs(text, _json_escape)


def pretty(text: str) -> str:
    """Stored JSON text pretty-printed (or as it is when it cannot be decoded)."""
    ok, value = q.parse_json(text)
    if ok:
        with contextlib.suppress(RecursionError, ValueError):
            return visible_json(json.dumps(value, indent=2, ensure_ascii=False))
    return text


def pretty_value(value: Any) -> str:
    """A decoded JSON value, pretty-printed (strings as they are)."""
    if isinstance(value, str):
        return value
    try:
        return visible_json(json.dumps(value, indent=2, ensure_ascii=False))
    except (RecursionError, ValueError, TypeError):
        return str(value)


class FormValue(str):
    """A value a form sends back unseen (a call id in a hidden field, a choice's value):
    HTML-escaped like any value, but not made :func:`visible`, so that what the form submits is
    the value itself. Only hidden inputs and ``<option value=...>`` print it (a test checks);
    the page shows the value visibly beside them."""

    __slots__ = ()


def form_value(value: object) -> FormValue:
    return FormValue(str(value))


def editable(value: object) -> str:
    """The initial text of a field a person edits: the value when it is drawn as itself, else
    empty (its escaped picture would be sent back as a different value)."""
    text = str(value)
    return text if visible(text) == text else ""


def _finalize(value: object) -> object:
    # Exactly str: the markup of a macro call (a str subclass) was made visible inside it, and a
    # FormValue must stay as it is.
    return visible(value) if type(value) is str else value


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
        finalize=_finalize,
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
        form_value=form_value,
        editable=editable,
        key=encode_key,
        status_class=status_class,
        human_delta=human_delta,
    )
    env.tests["stored_int"] = is_int
    return env


def render(name: str, context: Mapping[str, Any]) -> str:
    """Render template ``name`` with ``context`` (everything in it is escaped on output)."""
    return environment().get_template(name).render(context)


#: The stylesheet's URL names zincir's version, so that a browser never keeps an older one.
STYLESHEET_URL = "/static/inspector.css?" + urllib.parse.urlencode(
    {"v": __version__}, quote_via=urllib.parse.quote
)


def page_context(title: str, mode: str, refresh: int | None) -> dict[str, Any]:
    """What ``base.html`` needs beside a page's own names: its title, the mode label (read-only,
    or the actions allowed), and whether it refreshes itself."""
    return {"title": title, "mode": mode, "refresh": refresh, "stylesheet": STYLESHEET_URL}


def error_page(status: int, name: str, message: str, mode: str = "read-only") -> str:
    """The styled page of an error answer."""
    context = {**page_context(f"{status} {name}", mode, None), "status": status}
    return render("error.html", {**context, "name": name, "message": message})
