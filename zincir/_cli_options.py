"""Options shared by the ``zincir`` commands."""

from __future__ import annotations

import getpass
import os

import click

DATABASE_ENV = "ZINCIR_DATABASE_PATH"
DEFAULT_DATABASE = "zincir.db"

database_option = click.option(
    "--db",
    "database_path",
    envvar=DATABASE_ENV,
    default=DEFAULT_DATABASE,
    show_default=True,
    type=click.Path(dir_okay=False),
    metavar="PATH|URL",
    help=f"SQLite database file (or sqlite:///PATH), or a postgresql:// URL (env {DATABASE_ENV}).",
)


def os_user() -> str:
    """Who a command acts as unless told: the OS user name (``getpass``), or ``uid <n>``."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (a container's bare uid)
        return f"uid {os.getuid()}"
