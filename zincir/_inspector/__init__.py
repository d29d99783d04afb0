"""``zincir ui``: the read-only web inspector, as a package.

The app is made by :mod:`._app`, guarded by :mod:`._security` and served by :mod:`._serve`;
this module gives the rest of zincir (the CLI) and the tests their names. The web stack
(Quart, Hypercorn, Jinja2) is imported on first use of a name that needs it, so that
``zincir worker``, ``zincir show`` and the other commands, which import the names of
:mod:`._plain` only, start without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._plain import DEFAULT_ADDRESS, format_host, human_delta, parse_address

if TYPE_CHECKING:
    from ._app import create_app
    from ._security import CONTENT_SECURITY_POLICY
    from ._serve import serve

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "DEFAULT_ADDRESS",
    "create_app",
    "format_host",
    "human_delta",
    "parse_address",
    "serve",
]


def __getattr__(name: str) -> Any:
    # These names need the web stack: imported on first use.
    if name == "CONTENT_SECURITY_POLICY":
        from ._security import CONTENT_SECURITY_POLICY

        return CONTENT_SECURITY_POLICY
    if name == "create_app":
        from ._app import create_app

        return create_app
    if name == "serve":
        from ._serve import serve

        return serve
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
