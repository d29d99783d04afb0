"""Options shared by the ``zincir`` commands."""

from __future__ import annotations

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
