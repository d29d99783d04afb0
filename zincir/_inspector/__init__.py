"""``zincir ui``: the read-only web inspector, as a package.

The application lives in :mod:`._app`; this module gives the rest of zincir (the CLI) and
the tests its names. The web stack (Quart, Hypercorn, Jinja2) is imported on first use of a
name that needs it, so that ``zincir worker``, ``zincir show`` and the other commands, which
import the names of :mod:`._plain` only, start without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._plain import DEFAULT_ADDRESS, format_host, human_delta, parse_address

if TYPE_CHECKING:
    from ._app import CONTENT_SECURITY_POLICY, create_app, serve

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "DEFAULT_ADDRESS",
    "create_app",
    "format_host",
    "human_delta",
    "parse_address",
    "serve",
]

_FROM_APP = frozenset({"CONTENT_SECURITY_POLICY", "create_app", "serve"})


def __getattr__(name: str) -> Any:
    if name in _FROM_APP:
        from . import _app

        return getattr(_app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
