"""What the command line needs from the inspector without loading its web stack.

``zincir show``, ``zincir worker`` and every other command import this module (through
:mod:`zincir._cli_inspect`); importing Quart, Hypercorn and Jinja2 costs about half a second,
so those are imported only when ``zincir ui`` serves (see :mod:`zincir._inspector`).
"""

from __future__ import annotations

import ipaddress
import re
import secrets

from .._errors import InvalidArgument

__all__ = ["DEFAULT_ADDRESS", "format_host", "human_delta", "parse_address", "random_loopback_ip"]

DEFAULT_ADDRESS = "127.0.0.1:8787"

_ADDRESS = re.compile(r"(?:\[(?P<v6>[^\]]*)\]|(?P<v4>[^:\[\]]*)):(?P<port>[0-9]{1,5})")


def parse_address(text: str) -> tuple[str, int]:
    """Parse ``IP:PORT`` (IPv6 in brackets) and insist on a loopback address.

    Returns the canonical IP text and the port (0 asks for any free port). Raises
    :class:`InvalidArgument` for hostnames, wildcard or non-loopback addresses.
    """
    match = _ADDRESS.fullmatch(text)
    if match is None:
        raise InvalidArgument(
            f"invalid inspector address {text!r}: expected a literal loopback IP and port, "
            "such as 127.0.0.1:8787 or [::1]:8787"
        )
    literal = match.group("v6") if match.group("v6") is not None else match.group("v4")
    port = int(match.group("port"))
    if port > 65535:
        raise InvalidArgument(f"invalid inspector address {text!r}: port {port} is above 65535")
    try:
        ip = ipaddress.ip_address(literal)
    except ValueError:
        raise InvalidArgument(
            f"invalid inspector address {text!r}: {literal!r} is not a literal IP address "
            "(hostnames such as localhost are not accepted; use 127.0.0.1 or [::1])"
        ) from None
    if (match.group("v6") is None) != (ip.version == 4):
        raise InvalidArgument(
            f"invalid inspector address {text!r}: IPv6 addresses must be bracketed, IPv4 addresses must not"
        )
    if not _is_loopback(ip):
        raise InvalidArgument(
            f"refusing inspector address {text!r}: the inspector binds loopback only "
            "(127.0.0.0/8 or [::1]); it has no authentication"
        )
    return str(ip), port


def _is_loopback(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv4Address):
        return ip in ipaddress.IPv4Network("127.0.0.0/8")
    return ip.scope_id is None and ip == ipaddress.IPv6Address("::1")


def format_host(ip: str, port: int) -> str:
    """The ``Host`` header value (and URL authority) of ``ip:port``."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def random_loopback_ip() -> str:
    """A random address of 127.0.0.0/8 other than 127.0.0.1 (and the network's first and last).

    Browsers keep cookies apart by host, not by port: an inspector with actions serves on an
    address no other program uses, so that no other local server receives its session cookie.
    """
    while True:
        # The last byte in 1..254: never the network's first (127.0.0.0) or last address.
        x, y, z = secrets.randbelow(256), secrets.randbelow(256), 1 + secrets.randbelow(254)
        if (x, y, z) != (0, 0, 1):
            return f"127.{x}.{y}.{z}"


def human_delta(ms: int) -> str:
    """A short human duration: ``in 4.2 s``, ``3 min ago``."""
    seconds = abs(ms) / 1000
    if seconds < 60:
        text = f"{seconds:.1f} s"
    elif seconds < 3600:
        text = f"{seconds / 60:.0f} min"
    elif seconds < 86400:
        text = f"{seconds / 3600:.1f} h"
    elif seconds < 864000:
        text = f"{seconds / 86400:.1f} d"
    else:
        text = f"{seconds / 86400:,.0f} d"
    return f"in {text}" if ms >= 0 else f"{text} ago"
