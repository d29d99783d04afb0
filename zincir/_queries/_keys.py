"""Run ids, keyset cursors, and the checks of what a caller asks the read queries for.

Every list is paged by keyset: a cursor is the stored sort key of the last row shown, so a
page costs one index range read, however long the list. A stored key may be of any type on
SQLite (see :mod:`._values`), so :func:`encode_key` writes any of them as a URL-safe token and
:func:`decode_key` reads it back exactly.
"""

from __future__ import annotations

import re
import struct
from typing import Final

import attrs

from .._errors import InvalidArgument, RunNotFound
from .._sql import KEY_CHARS, Dialect
from ._connect import Reader
from ._values import MAX_INT, MIN_INT, Malformed, as_text

__all__ = [
    "DEFAULT_PAGE",
    "LATEST",
    "MAX_PAGE",
    "MIN_PREFIX",
    "RUN_STATUSES",
    "RunCursor",
    "check_cursor",
    "check_key",
    "check_limit",
    "check_status",
    "comparable",
    "decode_key",
    "encode_key",
    "key_json",
    "parse_cursor",
    "parse_run_id",
    "resolve_run_id",
]


RUN_STATUSES = ("pending", "running", "waiting", "completed", "failed", "cancelled")
#: A page's length when none is asked for, and the longest one a caller may ask for.
DEFAULT_PAGE = 100
MAX_PAGE = 1000

_RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_INT_KEY = re.compile(r"-?[0-9]{1,19}")
_TAGGED_KEY = re.compile(r"n|r[0-9a-f]{16}|[tb](?:[0-9a-f]{2}){0,4096}")


def encode_key(value: object) -> str:
    """A URL-safe token for a stored sort-key value (``seq``, ``updated_at``, a run id).

    Integers are written in decimal and canonical run ids as themselves, so ordinary cursors
    read naturally; other stored values get a tag and hex (``t`` TEXT, ``b`` BLOB, ``r`` REAL,
    ``n`` NULL) so that paging past a malformed row keeps SQLite's ordering exactly.
    """
    if isinstance(value, Malformed):
        value = value.raw
    if type(value) is int:
        return str(value)
    if isinstance(value, float):
        return "r" + struct.pack(">d", value).hex()
    if isinstance(value, str):
        if _RUN_ID.fullmatch(value):
            return value
        return "t" + value[:KEY_CHARS].encode("utf-8", "surrogatepass").hex()
    if isinstance(value, bytes):
        return "b" + value[:KEY_CHARS].hex()
    return "n"


def decode_key(text: str, what: str) -> object:
    """The value of a token made by :func:`encode_key`; :class:`InvalidArgument` if malformed."""
    if _INT_KEY.fullmatch(text):
        number = int(text)
        if not MIN_INT <= number <= MAX_INT:
            raise InvalidArgument(f"{what} {text!r} is outside the 64-bit integer range SQLite stores")
        return number
    if _RUN_ID.fullmatch(text):
        return text
    if not _TAGGED_KEY.fullmatch(text):
        raise InvalidArgument(f"malformed {what} {_shown(text)}: expected an integer")
    tag, data = text[0], text[1:]
    if tag == "n":
        return None
    raw = bytes.fromhex(data)
    if tag == "r":
        return float(struct.unpack(">d", raw)[0])
    if tag == "b":
        return raw
    return raw.decode("utf-8", "replace")


def key_json(value: object) -> object:
    """A sort key for a JSON response: an int as is, any other value as its token."""
    if type(value) is int or value is None:
        return value
    return encode_key(value)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "…")


class _Latest:
    def __repr__(self) -> str:
        return "LATEST"


#: ``before=LATEST`` asks :func:`list_events` for the end of the log (the last page).
LATEST: Final = _Latest()


def parse_run_id(text: str) -> str:
    """Return the canonical (lowercase) form of a run id, or raise :class:`InvalidArgument`."""
    lowered = text.lower()
    if not _RUN_ID.fullmatch(lowered):
        shown = text if len(text) <= 80 else text[:80] + "…"
        raise InvalidArgument(f"malformed run id {shown!r}: expected a UUID like {_EXAMPLE_ID}")
    return lowered


_EXAMPLE_ID = "0b7c6a1e-5a43-4f4e-9d7e-2f0c7a1d9b11"


_RUN_ID_PREFIX = re.compile(r"[0-9a-f-]{1,35}")


#: The fewest leading characters of a run id that the CLI accepts in its place.
MIN_PREFIX = 4


def resolve_run_id(conn: Reader, text: str) -> str:
    """A whole run id (canonical form), or the one run id that starts with ``text``.

    A prefix needs :data:`MIN_PREFIX` characters at least. No run with it is
    :class:`RunNotFound`; several are :class:`InvalidArgument` naming the first few. One
    indexed range read (ids are compared bytewise on both backends).
    """
    lowered = text.lower()
    if _RUN_ID.fullmatch(lowered):
        return lowered
    if len(lowered) < MIN_PREFIX or not _RUN_ID_PREFIX.fullmatch(lowered):
        shown = text if len(text) <= 80 else text[:80] + "…"
        raise InvalidArgument(
            f"malformed run id {shown!r}: expected a UUID like {_EXAMPLE_ID}, "
            f"or its first {MIN_PREFIX} characters or more"
        )
    # Every id character is 0-9, a-f or '-', all below 'g': [prefix, prefix + 'g') holds them.
    rows = conn.execute(
        "SELECT id FROM agent_runs WHERE id >= ? AND id < ? ORDER BY id LIMIT 3", (lowered, lowered + "g")
    )
    found = [as_text(row[0]) for row in rows]
    if not found:
        raise RunNotFound(f"no run id starts with {lowered!r}")
    if len(found) > 1:
        more = ", …" if len(found) > 2 else ""
        raise InvalidArgument(
            f"run id prefix {lowered!r} is ambiguous: {found[0]}, {found[1]}{more} start with it;"
            " give more characters"
        )
    return found[0]


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidArgument(f"page limit must be between 1 and {MAX_PAGE}, got {limit}")
    return limit


def comparable(d: Dialect, value: object, kind: type) -> bool:
    """Whether a stored-value key can be compared with a column of ``kind`` (int or str).

    Always on SQLite (any column may hold any value, and SQLite orders across types); on
    PostgreSQL a column holds only its type, so a key of another type names no row.
    """
    if d.loose_types or value is None:
        return True
    if kind is int:
        return type(value) is int or isinstance(value, float)
    return isinstance(value, str)


def check_key(conn: Reader, value: object, kind: type, what: str) -> None:
    if not comparable(conn.dialect, value, kind):
        raise InvalidArgument(
            f"{what} {encode_key(value)!r} cannot name a row of this database"
            f" ({conn.dialect.name} stores {'integers' if kind is int else 'text'} there)"
        )


def check_cursor(conn: Reader, cursor: RunCursor | None) -> None:
    if cursor is not None:
        check_key(conn, cursor.key, int, "cursor key")
        check_key(conn, cursor.id, str, "cursor id")


def check_status(status: str | None) -> None:
    if status is not None and status not in RUN_STATUSES:
        raise InvalidArgument(f"unknown run status {status!r}: expected one of {RUN_STATUSES}")


@attrs.frozen
class RunCursor:
    """A position in a keyset-paged list of runs: the row's sort key and its id, as stored.

    The runs list sorts by ``updated_at``, a run's children by ``created_at``.
    """

    key: object
    id: object

    def encode(self) -> str:
        return f"{encode_key(self.key)}_{encode_key(self.id)}"


def parse_cursor(text: str) -> RunCursor:
    """Parse a cursor made by :meth:`RunCursor.encode` (``<key>_<id>``)."""
    key, sep, run_id = text.partition("_")
    if not sep:
        raise InvalidArgument(f"malformed runs cursor {_shown(text)}: expected <updated_at>_<id>")
    try:
        return RunCursor(decode_key(key, "cursor key"), decode_key(run_id, "cursor id"))
    except InvalidArgument as exc:
        raise InvalidArgument(f"malformed runs cursor {_shown(text)}: {exc}") from None
