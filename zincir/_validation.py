"""Checks shared by the public entry points; each raises InvalidArgument naming the value."""

from __future__ import annotations

import math
import uuid
from typing import Final

from ._errors import InvalidArgument

MIN_LEASE_TTL: Final = 0.030
"""The shortest lease, in seconds; production leases should leave room for contention."""
MAX_SECONDS: Final = 10 * 365 * 24 * 3600.0
"""The longest duration zincir accepts (ten years): anything longer is a mistake."""


def check_seconds(value: object, what: str, *, minimum: float = 0.0, exclusive: bool = False) -> float:
    """A finite number of seconds, at least (or, ``exclusive``, above) ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgument(f"{what} must be a finite number of seconds, not {value!r}")
    if value < minimum or (exclusive and value == minimum):
        bound = f"greater than {minimum}" if exclusive else f"at least {minimum}"
        raise InvalidArgument(f"{what} must be {bound} s, not {value!r}")
    if value > MAX_SECONDS:
        raise InvalidArgument(f"{what} must be at most {MAX_SECONDS:.0f} s (ten years), not {value!r}")
    return float(value)


def lease_ttl_ms(lease_ttl: object) -> int:
    """Validate a TTL in seconds and round it up to whole milliseconds."""
    return math.ceil(check_seconds(lease_ttl, "lease_ttl", minimum=MIN_LEASE_TTL) * 1000)


def canonical_run_id(value: object, what: str = "run_id") -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a UUID string, not {value!r}")
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidArgument(f"{what} {value!r} is not a UUID") from None


def check_name(value: object, what: str) -> str:
    """Names (roles, tools, steps, sleeps) are 1 to 255 characters, as the schema checks."""
    if not isinstance(value, str) or not 1 <= len(value) <= 255 or "\x00" in value:
        raise InvalidArgument(f"{what} must be a string of 1 to 255 characters without NUL, not {value!r}")
    return value
