"""``zincir prune``: delete ended runs older than a duration (docs/retention.md)."""

from __future__ import annotations

import datetime
import os
import re
import sqlite3
import time
from typing import Final

import click
import trio

from ._cli_inspect import clean_errors, keys_if_encrypted, require_file
from ._cli_options import database_option
from ._database import open_database
from ._prune import PruneReport, prune
from ._sqlite._connection import BUSY_TIMEOUT_MS
from ._store._prune import ENDED
from ._target import parse_target

__all__ = ["parse_duration", "prune_command", "vacuum_command"]

_DURATION: Final = re.compile(r"(\d+)([dhms])")
_UNITS: Final = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
_PROGRESS_EVERY_S: Final = 1.0


def parse_duration(text: str) -> datetime.timedelta:
    """``30d``, ``12h``, ``90m`` or ``45s`` as a timedelta."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise click.BadParameter(f"{text!r} is not a duration such as 30d, 12h, 90m or 45s")
    try:
        age = datetime.timedelta(**{_UNITS[match[2]]: int(match[1])})
        datetime.datetime.now(datetime.UTC) - age  # a cutoff before year 1 is no date
    except OverflowError:
        raise click.BadParameter(f"{text!r} reaches back before any date there is") from None
    return age


@click.command("prune")
@click.option(
    "--older-than",
    "older_than",
    required=True,
    metavar="DURATION",
    help="Delete runs that ended longer ago than this: 30d, 12h, 90m, 45s.",
)
@click.option(
    "--keep-latest",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Keep this many of the runs that ended last, however old.",
)
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(ENDED),
    help="Only runs that ended so (repeat it for several; default: all of them).",
)
@click.option("--dry-run", is_flag=True, help="Delete nothing; say what would go.")
@click.option(
    "--batch",
    "batch_size",
    type=click.IntRange(1, 10_000),
    default=None,
    help="Runs per transaction, a family never split (default: 10 on PostgreSQL, 2 on SQLite).",
)
@database_option
def prune_command(
    older_than: str,
    keep_latest: int,
    statuses: tuple[str, ...],
    dry_run: bool,
    batch_size: int | None,
    database_path: str,
) -> None:
    """Delete ended runs older than --older-than with all their rows.

    Runs go in batches, one short transaction each, whole families at once: a run whose parent,
    child, fork or fork's source is live (or recent) stays. Progress goes to stderr, the
    summary to stdout. On SQLite the freed pages go back to the file system (for a file made
    by an older zincir, run 'zincir vacuum' once first).
    """
    age = parse_duration(older_than)
    require_file(database_path, "prune never creates a database")
    keys = keys_if_encrypted(database_path)
    cutoff = datetime.datetime.now(datetime.UTC) - age

    shown_at = -_PROGRESS_EVERY_S

    def show(report: PruneReport) -> None:
        # The first batch, then one line a second: a SQLite prune makes hundreds of batches a
        # second (the summary has the totals).
        nonlocal shown_at
        if time.monotonic() - shown_at >= _PROGRESS_EVERY_S:
            shown_at = time.monotonic()
            click.echo(f"batch {report.batches}: {report.runs} runs, {report.total_rows} rows", err=True)

    async def run() -> PruneReport:
        async with open_database(database_path, keys=keys) as db:
            return await prune(
                db,
                finished_before=cutoff,
                keep_latest=keep_latest,
                statuses=statuses or ENDED,
                dry_run=dry_run,
                batch_size=batch_size,
                progress=show,
            )

    with clean_errors():
        report = trio.run(run)
    verb = "would delete" if report.dry_run else "deleted"
    tables = ", ".join(f"{table} {count}" for table, count in sorted(report.rows.items()) if count)
    click.echo(
        f"{verb} {report.runs} runs ended before {cutoff:%Y-%m-%d %H:%M:%S} UTC, {report.total_rows} rows"
        f" in {report.batches} batches, {report.seconds:.1f} s"
    )
    if tables:
        click.echo(f"rows: {tables}")
    if report.kept_for_family:
        click.echo(f"kept {report.kept_for_family} old runs whose family is live or recent")


@click.command("vacuum")
@database_option
def vacuum_command(database_path: str) -> None:
    """Give a SQLite file's free pages back to the file system, and make later prunes do so.

    Rebuilds the file (SQLite's VACUUM) with incremental auto-vacuum, which a file zincir
    creates has from the start: needed once for a file made before, or after deleting much
    from one. It needs as much free disk again as the file, and holds the file's write lock
    while it runs (writers wait). PostgreSQL reuses the space of deleted rows by itself
    (autovacuum; docs/retention.md): nothing is done there.
    """
    require_file(database_path, "vacuum never creates a database")
    where = parse_target(database_path)
    if where.backend == "postgresql":
        click.echo(
            "PostgreSQL: autovacuum reuses the space of deleted rows; nothing to do (docs/retention.md)"
        )
        return

    keys = keys_if_encrypted(database_path)

    async def check() -> None:
        # A zincir file, migrated (anything else is refused), opened with its key if it has one.
        async with open_database(database_path, keys=keys):
            pass

    with clean_errors():
        trio.run(check)
    before = os.path.getsize(where.location)
    try:
        _vacuum(where.location)
    except sqlite3.Error as exc:
        raise click.ClickException(f"cannot vacuum {where.location!r}: {exc}") from None
    after = os.path.getsize(where.location)
    click.echo(f"{where.location}: {before:,} bytes before, {after:,} after")


def _vacuum(path: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # taken by the VACUUM that follows
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
