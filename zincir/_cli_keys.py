"""``zincir erase`` and ``zincir rotate-keys``: erasure and key rotation on an encrypted database.

The master keys come from the environment (``ZINCIR_ENCRYPTION_KEY`` or
``ZINCIR_ENCRYPTION_KEY_FILE``), as for every command (docs/cli.md#encryption).
"""

from __future__ import annotations

import click
import trio

from . import _queries as q
from ._cli_inspect import clean_errors, keys_if_encrypted, readonly_database, require_file
from ._cli_options import database_option, os_user
from ._crypto import KEY_ENV, KEY_FILE_ENV, KeyRing, keys_from_env
from ._database import open_database
from ._erasure import erase_run, rotate_keys
from ._errors import ZincirError

__all__ = ["erase_command", "rotate_keys_command"]

_NO_KEY = f"give the database's master key in {KEY_ENV} (or a file of it in {KEY_FILE_ENV})"


@click.command("erase")
@click.argument("run_id")
@click.option(
    "--by", default=None, help="Who acts, recorded in the audit trail (default: your OS user name)."
)
@database_option
def erase_command(run_id: str, by: str | None, database_path: str) -> None:
    """Erase ended run RUN_ID: delete its key, so that its payloads can never be read again.

    Its shape stays (ids, types, seqs, times, statuses): `zincir show` and the inspector mark it
    erased. The database must be encrypted; the key comes from the environment.
    """
    require_file(database_path, "zincir erase never creates a database")
    with clean_errors(), readonly_database(database_path) as conn, q.read_snapshot(conn):
        run_id = q.resolve_run_id(conn, run_id)
    keys = _encrypted_database_keys(database_path)

    async def erase() -> int:
        async with open_database(database_path, keys=keys) as db:
            return await erase_run(db, run_id, by=by or os_user())

    try:
        trio.run(erase)
    except ZincirError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    click.echo(f"erased {run_id}")


@click.command("rotate-keys")
@database_option
def rotate_keys_command(database_path: str) -> None:
    """Re-wrap every run's key with the current master key (the first key given).

    Give the new key first and the old ones after it (comma-separated in ZINCIR_ENCRYPTION_KEY,
    or one a line in the key file); once this has run, the old keys may be dropped.
    """
    require_file(database_path, "zincir rotate-keys never creates a database")
    keys = _encrypted_database_keys(database_path)

    async def rotate() -> int:
        async with open_database(database_path, keys=keys) as db:
            return await rotate_keys(db)

    try:
        count = trio.run(rotate)
    except ZincirError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    click.echo(f"re-wrapped {count} run keys with master key {keys.current_key_id}")


def _encrypted_database_keys(database_path: str) -> KeyRing:
    """The environment's keys for an encrypted database; a clear error, with nothing changed,
    when there are none or the database is not encrypted (the CLI never turns encryption on)."""
    with clean_errors():
        given = keys_from_env()
    if given is None:
        raise click.ClickException(_NO_KEY)
    keys = keys_if_encrypted(database_path)
    if keys is None:
        raise click.ClickException(
            f"database {database_path!r} is not encrypted: it has no run keys to erase or rotate"
            " (an application turns encryption on with open_database(encryption_key=...))"
        )
    return keys
