"""Checks shared by the public entry points; each raises InvalidArgument naming the value."""

from __future__ import annotations

import inspect
import math
import uuid
from collections.abc import Mapping
from types import FunctionType
from typing import Any, Final

from ._errors import InvalidArgument

MIN_LEASE_TTL: Final = 0.030
"""The shortest lease, in seconds. Leases shorter than about 1 s are for tests only (with a
clock the test moves): an owner stops with a fifth of its TTL left, and a loaded machine cannot
promise to renew within a few ms (docs/leases.md)."""
MAX_SECONDS: Final = 10 * 365 * 24 * 3600.0
"""The longest duration zincir accepts (ten years): anything longer is a mistake."""


MAX_INT: Final = 2**63 - 1
"""Counts, seqs and limits are stored as signed 64-bit integers."""


def check_seconds(value: object, what: str, *, minimum: float = 0.0, exclusive: bool = False) -> float:
    """A finite number of seconds, at least (or, ``exclusive``, above) ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{what} must be a finite number of seconds, not {value!r}")
    if isinstance(value, int) and abs(value) > MAX_SECONDS:  # too big for a float, or a mistake
        raise InvalidArgument(f"{what} must be at most {MAX_SECONDS:.0f} s (ten years), not {value!r}")
    if not math.isfinite(value):
        raise InvalidArgument(f"{what} must be a finite number of seconds, not {value!r}")
    if value < minimum or (exclusive and value == minimum):
        bound = f"greater than {minimum}" if exclusive else f"at least {minimum}"
        raise InvalidArgument(f"{what} must be {bound} s, not {value!r}")
    if value > MAX_SECONDS:
        raise InvalidArgument(f"{what} must be at most {MAX_SECONDS:.0f} s (ten years), not {value!r}")
    return float(value)


def lease_ttl_ms(lease_ttl: object) -> int:
    """Validate a TTL in seconds and round it up to whole milliseconds."""
    seconds = check_seconds(lease_ttl, "lease_ttl", minimum=-math.inf)
    if seconds < MIN_LEASE_TTL:
        raise InvalidArgument(
            f"lease_ttl must be at least {MIN_LEASE_TTL} s, not {lease_ttl!r}; leases shorter than"
            " about 1 s are for tests only: an owner stops with a fifth of its TTL left, which a"
            " loaded machine cannot keep to (docs/leases.md, 'Choosing lease_ttl')"
        )
    return math.ceil(seconds * 1000)


def canonical_run_id(value: object, what: str = "run_id") -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a UUID string, not {value!r}")
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidArgument(f"{what} {value!r} is not a UUID") from None


def check_int(value: object, what: str, *, minimum: int, maximum: int = MAX_INT) -> int:
    """An int (not a bool) in [minimum, maximum]; the default maximum fits 64 bits."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidArgument(f"{what} must be an int from {minimum} to {maximum}, not {value!r}")
    return value


def check_text(value: object, what: str, *, max_chars: int = 255, allow_empty: bool = False) -> str:
    """A string the database can store as UTF-8: no lone surrogates, no NUL, bounded."""
    low = 0 if allow_empty else 1
    if not isinstance(value, str) or not low <= len(value) <= max_chars or "\x00" in value:
        raise InvalidArgument(
            f"{what} must be a string of {low} to {max_chars} characters without NUL, not {value!r}"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} {value!r} is not valid Unicode (it holds a lone surrogate)") from None
    return value


def check_name(value: object, what: str) -> str:
    """Names (roles, tools, steps, sleeps, call ids) are 1 to 255 characters of valid Unicode."""
    return check_text(value, what)


def is_name(value: object) -> bool:
    """Whether :func:`check_name` accepts ``value``: for a hot path whose error text costs more
    than the check (it calls :func:`check_name` with that text only when this is False)."""
    try:
        check_text(value, "")
    except InvalidArgument:
        return False
    return True


MAX_CALL_ID_CHARS: Final = 1024
"""Tool call ids come from model providers; they are short in practice, bounded here."""


def check_call_id(value: object, what: str) -> str:
    return check_text(value, what, max_chars=MAX_CALL_ID_CHARS)


def is_async_function(value: object) -> bool:
    """Whether ``value`` is an ``async def`` function: the common case of
    :func:`check_async_callable`, which a hot path calls only when this is False."""
    return type(value) is FunctionType and bool(value.__code__.co_flags & inspect.CO_COROUTINE)


def check_async_callable(value: object, what: str) -> Any:
    """An ``async def`` function (or a partial of one, or an object with an async
    ``__call__``): checked before anything is written or run, since calling a plain function
    to find out would already run it."""
    if type(value) is FunctionType and value.__code__.co_flags & inspect.CO_COROUTINE:
        return value  # an async def function: the common case, without inspect's unwrapping
    if not callable(value):
        raise InvalidArgument(f"{what} must be an async function, not {value!r}")
    if inspect.iscoroutinefunction(value) or inspect.iscoroutinefunction(type(value).__call__):
        return value
    raise InvalidArgument(f"{what} must be an async function (async def), not the plain callable {value!r}")


MAX_VERSION_CHARS: Final = 255
"""A version names a deploy of an agent ("2026-12-03.1", a git sha): short."""
MAX_FINGERPRINTS: Final = 64
"""Fingerprints name what shaped a run (a prompt, tool schemas, a model): a few, each a hash."""


def check_version(value: object, what: str) -> str | None:
    """A version of an agent: None, or 1 to 255 characters of valid Unicode."""
    return None if value is None else check_text(value, what, max_chars=MAX_VERSION_CHARS)


def check_fingerprints(value: object, what: str) -> dict[str, str] | None:
    """None, or a mapping of up to 64 names (as :func:`check_name`) to fingerprints (1 to 1024
    characters, a hash say), as a plain dict in name order."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{what} must be a mapping of names to strings, not {value!r}")
    if len(value) > MAX_FINGERPRINTS:
        raise InvalidArgument(f"{what} hold {len(value)} entries; at most {MAX_FINGERPRINTS} are allowed")
    return {
        check_name(name, f"{what}: a name"): check_text(value[name], f"{what}[{name!r}]", max_chars=1024)
        for name in sorted(value, key=lambda name: str(name))
    }
