"""Checks shared by the public entry points; each raises InvalidArgument naming the value."""

from __future__ import annotations

import math
import uuid
from typing import Final

from ._errors import InvalidArgument

MIN_LEASE_TTL: Final = 0.030
"""The shortest lease, in seconds; production leases should leave room for contention."""


def lease_ttl_ms(lease_ttl: float) -> int:
    """Validate a TTL in seconds and round it up to whole milliseconds."""
    if isinstance(lease_ttl, bool) or not isinstance(lease_ttl, int | float) or not math.isfinite(lease_ttl):
        raise InvalidArgument(f"lease_ttl must be a finite number of seconds, not {lease_ttl!r}")
    if lease_ttl < MIN_LEASE_TTL:
        raise InvalidArgument(f"lease_ttl must be at least {MIN_LEASE_TTL} s, not {lease_ttl!r}")
    return math.ceil(lease_ttl * 1000)


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
