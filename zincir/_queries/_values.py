"""Stored values as the read queries hand them on: normalised, bounded, never failing.

SQLite's tables are not ``STRICT``, so anyone with write access to the file can store any
type in any column (PostgreSQL's columns are typed: there these cases never arise). Every
row is normalised here before it leaves the read queries:

- an INTEGER column gives an :class:`int`, or a :class:`Malformed` placeholder when the stored
  value is TEXT, BLOB, REAL or NULL (the placeholder keeps the value for keyset cursors);
- a TEXT column gives a :class:`str` (a BLOB is decoded as UTF-8 with replacement), cut to
  :data:`NAME_CHARS` characters;
- a JSON column is decoded by :func:`json_value`, which never fails: text that is not JSON,
  too deep, or holds ``NaN``/``Infinity`` stays usable (see :func:`parse_json`).

The SQL fragments that read such columns bounded (:func:`name_column`, :func:`json_columns`)
live here too, beside the functions that normalise what they return.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, Final

import attrs

from .._payloads import shown_columns

__all__ = [
    "MAX_INT",
    "MAX_JSON_DEPTH",
    "MIN_INT",
    "NAME_CHARS",
    "Int",
    "Malformed",
    "OptInt",
    "as_int",
    "as_opt_int",
    "as_opt_text",
    "as_size",
    "as_text",
    "json_columns",
    "json_field",
    "json_value",
    "name_column",
    "parse_json",
    "plain",
    "raw_value",
    "was_cut",
    "where_sql",
]

#: The range of the integers both backends store (SQLite's INTEGER, PostgreSQL's BIGINT).
MAX_INT: Final = 2**63 - 1
MIN_INT: Final = -(2**63)
#: Characters read of a TEXT column that holds a name, id, status or key (zincir writes <= 255).
NAME_CHARS: Final = 1024
#: Stored JSON nested deeper than this is treated as text (so that re-encoding it never recurses
#: past Python's limit).
MAX_JSON_DEPTH: Final = 200


@attrs.frozen
class Malformed:
    """A value of the wrong type found in an INTEGER column (TEXT, BLOB, REAL or NULL).

    zincir never writes one; someone with write access to the file can. ``raw`` is the stored
    value (TEXT and BLOB cut to :data:`KEY_CHARS`), kept so that keyset cursors still work;
    ``str()`` gives a bounded, printable description for display.
    """

    raw: object

    @property
    def storage(self) -> str:
        """The SQLite storage class of the value: ``real``, ``text``, ``blob`` or ``null``."""
        if self.raw is None:
            return "null"
        if isinstance(self.raw, float):
            return "real"
        if isinstance(self.raw, bytes):
            return "blob"
        return "text"

    @property
    def preview(self) -> str:
        raw = self.raw
        if isinstance(raw, bytes):
            shown = raw[:32].hex()
            return f"x'{shown}{'…' if len(raw) > 32 else ''}'"
        if isinstance(raw, str):
            return repr(raw if len(raw) <= 60 else raw[:60] + "…")
        return repr(raw)

    def __str__(self) -> str:
        return f"(malformed {self.storage}: {self.preview})"

    def __format__(self, spec: str) -> str:
        # Whatever the format (``{n:,}``, ``{n:>6}``), show the placeholder rather than fail.
        return str(self)

    def to_json(self) -> dict[str, str]:
        return {"malformed": self.storage, "value": self.preview}


#: What an INTEGER column gives, and a nullable one.
Int = int | Malformed
OptInt = int | Malformed | None


def as_int(value: object) -> Int:
    return value if type(value) is int else Malformed(value)


def as_opt_int(value: object) -> OptInt:
    return None if value is None else as_int(value)


def as_text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def as_opt_text(value: object) -> str | None:
    return None if value is None else as_text(value)


def as_size(value: object) -> int:
    """A stored length as computed by SQL (``length()``): 0 when it is not an integer."""
    return value if type(value) is int else 0


def was_cut(max_chars: int | None, size: int) -> bool:
    """Whether a value of ``size`` characters was read cut to ``max_chars``."""
    return max_chars is not None and size > max_chars


def name_column(column: str) -> str:
    """SQL for a TEXT column read at most :data:`NAME_CHARS` characters."""
    return f"substr({column}, 1, {NAME_CHARS})"


def json_columns(column: str, max_chars: int | None) -> str:
    """SQL for a JSON TEXT column (cut to ``max_chars`` characters) followed by its length. A
    value stored in parts is read whole: the query hands its rows to
    :func:`zincir._payloads.cut_texts`, which reads the parts it needs (docs/payloads.md)."""
    return shown_columns(column, max_chars)


def plain(value: object) -> object:
    """A value for JSON: a :class:`Malformed` placeholder becomes its description."""
    return value.to_json() if isinstance(value, Malformed) else value


def raw_value(value: object) -> object:
    """The stored value behind a normalised one (a :class:`Malformed` gives its ``raw``)."""
    return value.raw if isinstance(value, Malformed) else value


def where_sql(clauses: Sequence[str]) -> str:
    """A ``WHERE`` clause joining ``clauses`` with ``AND`` (nothing for none)."""
    return f"WHERE {' AND '.join(clauses)}" if clauses else ""


def _parse_float(text: str) -> float | str:
    value = float(text)
    return value if math.isfinite(value) else text  # 1e999 overflows to inf: keep the text


def _parse_constant(name: str) -> str:
    return name  # NaN, Infinity, -Infinity: JSON has no such numbers; keep them as strings


def _too_deep(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def parse_json(text: str) -> tuple[bool, Any]:
    """Decode stored JSON text: ``(True, value)``, or ``(False, text)`` when it cannot be.

    Never raises. Text that is not JSON, or nests deeper than :data:`MAX_JSON_DEPTH`, is not
    decoded. ``NaN``, ``Infinity``, ``-Infinity`` and numbers too large for a float decode
    to their text (a string), so the value always re-encodes as strict JSON.
    """
    try:
        value = json.loads(text, parse_float=_parse_float, parse_constant=_parse_constant)
    except (ValueError, RecursionError):
        return False, text
    # Nesting needs one bracket per level: a text with few brackets is never too deep.
    shallow = text.count("[") + text.count("{") <= MAX_JSON_DEPTH
    if not shallow and isinstance(value, dict | list) and _too_deep(value, MAX_JSON_DEPTH):
        return False, text
    return True, value


def json_value(text: str | None) -> Any:
    """Decode a stored JSON column; text that cannot be decoded is returned as the string itself."""
    if text is None:
        return None
    return parse_json(text)[1]


def json_field(text: str | None, truncated: bool) -> Any:
    # A cut value is a prefix: usually not JSON, and never the value; give the text itself.
    return text if truncated else json_value(text)
