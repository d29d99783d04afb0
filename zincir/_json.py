"""JSON as zincir stores it: compact, sorted keys, no NaN or Infinity, bounded in size and depth."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

from ._errors import InvalidArgument

JSONValue = Any
"""What ``json.dumps(value, allow_nan=False)`` accepts."""

MAX_DEPTH: Final = 100
"""The deepest nesting of lists and objects in any JSON value zincir stores.

Checked explicitly, so whether a value is accepted never depends on how deep the caller's stack
happens to be, and everything stored (wrapped in a few levels of its event) decodes anywhere.
"""


# json.dumps with options builds a JSONEncoder at every call; these are built once (an
# encoder keeps no state between calls, so threads may share it).
_ENCODER: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)
_TRUSTED_ENCODER: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def encode(value: JSONValue, *, what: str | Callable[[], str], limit: int, nested_in: int = 0) -> str:
    """Serialize ``value`` or raise :class:`InvalidArgument` naming ``what`` it was (a
    function giving it, on a hot path: only an error needs the text). ``nested_in``: how many
    levels deep the record that will store it puts it."""
    try:
        if type(value) is int:
            text = int.__repr__(value)  # what the encoder writes for an int, without its calls
        else:
            if isinstance(value, dict | list | tuple):
                _check_depth(value, what, nested_in)
            text = _ENCODER.encode(value)
    except InvalidArgument:  # the depth check's own error (a ValueError too): as it is
        raise
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgument(f"{_named(what)} is not a JSON value: {exc}") from None
    # ensure_ascii (the default) makes the text pure ASCII: its length is its size in bytes.
    if len(text) > limit:
        raise InvalidArgument(f"{_named(what)} is {len(text)} bytes of JSON, over the limit of {limit} bytes")
    return text


def _named(what: str | Callable[[], str]) -> str:
    return what if isinstance(what, str) else what()


def _check_depth(value: JSONValue, what: str | Callable[[], str], nested_in: int) -> None:
    # Iterative, so that the check itself cannot hit the recursion limit; a cycle is caught
    # as nesting past the limit.
    stack: list[tuple[Any, int]] = [(value, 1 + nested_in)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > MAX_DEPTH:
            raise InvalidArgument(
                f"{_named(what)} nests lists and objects deeper than {MAX_DEPTH - nested_in} levels"
                + (f" (the record that keeps it adds {nested_in})" if nested_in else "")
            )
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list | tuple))


def decode(text: str) -> JSONValue:
    return json.loads(text)


def dump_trusted(value: JSONValue) -> str:
    """Serialize a value zincir built itself from already-validated parts."""
    return _TRUSTED_ENCODER.encode(value)
