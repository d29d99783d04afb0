"""The inspector's app class, and what guards every answer it gives.

:class:`InspectorApp` is a Quart-Trio app that, before any route runs, answers 421 to a
request whose ``Host`` is not the exact loopback address it serves (a DNS-rebinding page
cannot read it), 403 to one a browser marks as made by another site, and refuses WebSocket
connections. Every answer carries :data:`SECURITY_HEADERS`: added by the app to its own, or,
when served (:class:`SecuredConfig`), by Hypercorn to every response it writes, including
those it writes on its own (a malformed request's 400, a 431, a refused WebSocket's 403).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import hypercorn.config
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, ASGISendEvent, Scope
from quart_trio import QuartTrio

from ._pool import ReadPool
from ._render import error_page

__all__ = ["CONTENT_SECURITY_POLICY", "SECURITY_HEADERS", "InspectorApp", "SecuredConfig"]


CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)


_SECURITY_NAMES = frozenset(name for name, _ in SECURITY_HEADERS)


class InspectorApp(QuartTrio):
    """The inspector's Quart-Trio app: checks ``Host`` and adds security headers.

    Only ``http`` and ``lifespan`` scopes reach Quart. A WebSocket handshake is refused (the
    server answers 403) before any route, Host check or header logic could be skipped.
    """

    database_path: str
    served_host: str
    #: Where page reads get their connection: kept between requests while :func:`serve` runs.
    read_pool: ReadPool
    #: The label shown in every page's header.
    mode: str
    #: Callables run in a page request's context; each returns names for the templates.
    page_context: list[Callable[[], Mapping[str, Any]]]
    #: The headers every answer carries; an ``extend`` hook may adjust them (the actions send
    #: ``Referrer-Policy: same-origin``, or a browser's form POST says ``Origin: null``).
    security_headers: tuple[tuple[bytes, bytes], ...]
    #: Whether the server adds :attr:`security_headers` to every response it writes (served by
    #: :func:`serve`); otherwise (a test client) the app adds them to its own.
    server_adds_headers: bool = False

    async def asgi_app(self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] == "lifespan":
            await super().asgi_app(scope, receive, send)
            return
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008, "reason": "not served here"})
            return
        headers = scope["headers"]
        send = _secured(send, self.security_headers, add=not self.server_adds_headers)
        if _host_of(headers) not in _accepted_hosts(self.served_host):
            await _send_refusal(
                send,
                421,
                "Misdirected Request",
                "This inspector only answers requests addressed to the loopback address it serves.",
            )
            return
        if _from_another_site(headers):
            await _send_refusal(
                send,
                403,
                "Forbidden",
                "This inspector does not answer requests made by other sites. "
                "Open it by typing its address or following a link from the inspector itself.",
            )
            return
        await super().asgi_app(scope, receive, send)


def _accepted_hosts(served_host: str) -> tuple[str, ...]:
    # Browsers leave out the default port: http://127.0.0.1:80/ is sent as "Host: 127.0.0.1".
    served = served_host.lower()
    return (served, served.removesuffix(":80")) if served.endswith(":80") else (served,)


def _from_another_site(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a browser marked the request ``Sec-Fetch-Site: cross-site``, or the header is
    there more than once or holds a list: a browser sends it once, with one value, so anything
    else was made to slip past this check."""
    values = [value for key, value in headers if key.lower() == b"sec-fetch-site"]
    if not values:
        return False  # not a browser's request (curl, scripts): the Host check still holds
    if len(values) > 1:
        return True
    value = values[0].decode("latin-1").strip().lower()
    return value == "cross-site" or "," in value


def _host_of(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    hosts = [value for name, value in headers if name.lower() == b"host"]
    if len(hosts) != 1:
        return None
    return hosts[0].decode("latin-1").lower()


def _secured(
    send: ASGISendCallable, security_headers: tuple[tuple[bytes, bytes], ...], *, add: bool
) -> ASGISendCallable:
    """``send``, with the app's own values of the security headers removed from every response,
    and ``security_headers`` added (``add``) unless the server adds them itself."""
    added = security_headers if add else ()

    async def send_secured(message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start":
            kept = [(n, v) for n, v in message["headers"] if n.lower() not in _SECURITY_NAMES]
            message = {**message, "headers": [*kept, *added]}
        await send(message)

    return send_secured


class SecuredConfig(hypercorn.config.Config):
    """Hypercorn's configuration, adding the app's security headers to every response Hypercorn
    writes: the app's answers, and those it writes on its own (a malformed request's 400, 431
    for headers too large, 403 for a refused WebSocket, a 500, 100 Continue, an h2c 101)."""

    def __init__(self, app: InspectorApp) -> None:
        self._app = app

    def response_headers(self, protocol: str) -> list[tuple[bytes, bytes]]:
        return [*super().response_headers(protocol), *self._app.security_headers]


async def _send_refusal(send: ASGISendCallable, status: int, name: str, message: str) -> None:
    """A styled error page sent straight through ASGI, before Quart sees the request (``send``
    adds the security headers)."""
    body = error_page(status, name, message).encode("utf-8", "backslashreplace")
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers, "trailers": False})
    await send({"type": "http.response.body", "body": body, "more_body": False})
