"""Which database a target names: a SQLite file or a PostgreSQL server.

A target is what :func:`~zincir.open_database`, the CLI's ``--db`` and the inspector take: a
path, ``sqlite:///path``, or a ``postgresql://`` (or ``postgres://``) URL. This module is the
one place that reads it, so every entry point accepts the same targets and refuses any other
URL scheme with the same message.
"""

from __future__ import annotations

import os
from typing import Final, Literal

import attrs

from ._errors import InvalidArgument

__all__ = ["Target", "display_target", "parse_target"]

_SERVER_SCHEMES: Final = ("postgresql", "postgres")


@attrs.frozen
class Target:
    """A parsed target: the backend, and where its database is."""

    backend: Literal["sqlite", "postgresql"]
    location: str
    """SQLite: the file's path (``sqlite:///x.db`` is ``x.db``, ``sqlite:////abs/x.db`` is
    ``/abs/x.db``). PostgreSQL: the URL as given."""


def parse_target(target: str | os.PathLike[str]) -> Target:
    """The backend and location ``target`` names; :class:`InvalidArgument` for another URL scheme."""
    text = os.fspath(target)
    scheme, sep, _ = text.partition("://")
    if not sep:
        return Target("sqlite", text)
    if scheme in _SERVER_SCHEMES:
        return Target("postgresql", text)
    if scheme == "sqlite":
        return Target("sqlite", text.removeprefix("sqlite:///"))
    raise InvalidArgument(
        f"unknown database URL scheme {scheme!r}: use a path, sqlite:///path or postgresql://"
    )


def display_target(target: str | os.PathLike[str]) -> str:
    """The database as shown to people: a path as given, a URL without its password.

    Never raises: a target with an unknown scheme is shown as it is (opening it says why not).
    """
    text = os.fspath(target)
    scheme, sep, _ = text.partition("://")
    if sep and scheme in _SERVER_SCHEMES:
        # Only a server URL needs psycopg (an optional extra) to be read.
        from ._postgres._connection import redact

        return redact(text)
    return text
