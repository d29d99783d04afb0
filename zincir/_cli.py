"""The ``zincir`` command line."""

from __future__ import annotations

import click

from ._version import __version__

DATABASE_ENV = "ZINCIR_DATABASE_PATH"
DEFAULT_DATABASE = "zincir.db"

database_option = click.option(
    "--db",
    "database_path",
    envvar=DATABASE_ENV,
    default=DEFAULT_DATABASE,
    show_default=True,
    type=click.Path(dir_okay=False),
    help=f"SQLite database file (env {DATABASE_ENV}).",
)


@click.group()
@click.version_option(__version__, prog_name="zincir")
def main() -> None:
    """Durable, resumable execution for long-horizon AI agents."""
