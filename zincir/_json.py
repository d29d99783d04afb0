"""JSON as zincir stores it: compact, sorted keys, no NaN or Infinity, bounded in size."""

from __future__ import annotations

import json
from typing import Any

from ._errors import InvalidArgument

JSONValue = Any
"""What ``json.dumps(value, allow_nan=False)`` accepts."""


def encode(value: JSONValue, *, what: str, limit: int) -> str:
    """Serialize ``value`` or raise :class:`InvalidArgument` naming ``what`` it was."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgument(f"{what} is not a JSON value: {exc}") from None
    # ensure_ascii (the default) makes the text pure ASCII: its length is its size in bytes.
    if len(text) > limit:
        raise InvalidArgument(f"{what} is {len(text)} bytes of JSON, over the limit of {limit} bytes")
    return text


def decode(text: str) -> JSONValue:
    return json.loads(text)


def dump_trusted(value: JSONValue) -> str:
    """Serialize a value zincir built itself from already-validated parts."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
