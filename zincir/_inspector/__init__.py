"""``zincir ui``: the read-only web inspector, as a package.

The application lives in :mod:`._app`; this module re-exports what the rest of zincir (the
CLI) and the tests import from it.
"""

from ._app import (
    CONTENT_SECURITY_POLICY,
    DEFAULT_ADDRESS,
    create_app,
    format_host,
    parse_address,
    serve,
)
from ._render import human_delta

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "DEFAULT_ADDRESS",
    "create_app",
    "format_host",
    "human_delta",
    "parse_address",
    "serve",
]
