"""Opening a database for reading: strictly read-only, its schema checked, one snapshot a read.

Each backend brings its own connection (:mod:`zincir._sqlite._readonly`,
:mod:`zincir._postgres._readonly`); :func:`open_readonly` picks it from the target, as
:func:`~zincir.open_database` does (:mod:`zincir._target`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from .._crypto import KeyProvider, Sealer, check_readonly_keys, keys_from_env
from .._sql import ReadOnly
from .._sqlite._readonly import open_sqlite_readonly
from .._target import parse_target

__all__ = ["REQUIRED_TABLES", "Reader", "open_readonly", "read_snapshot"]


#: The tables a database must have to be read as zincir's (those of the first schema version).
REQUIRED_TABLES = frozenset(
    {
        "zincir_schema_migrations",
        "agent_runs",
        "events",
        "tool_intents",
        "checkpoints",
        "steps",
        "timers",
        "messages",
    }
)


Reader = ReadOnly
"""What every query takes: the connection :func:`open_readonly` returned."""


def open_readonly(path: str | os.PathLike[str], keys: KeyProvider | None = None) -> Reader:
    """Open an existing zincir database strictly read-only and check its schema.

    ``path`` is a SQLite file (or ``sqlite:///path``) or a ``postgresql://`` URL. A missing
    file raises :class:`StorageError` and is not created; a database that is not zincir's (or
    is newer than this code) raises :class:`~zincir.SchemaError`, and is left as it is. A
    server that cannot be reached raises :class:`~zincir.DatabaseUnavailable` (a
    :class:`StorageError`).

    ``keys`` (default: the environment's, ``ZINCIR_ENCRYPTION_KEY`` or
    ``ZINCIR_ENCRYPTION_KEY_FILE``) open encrypted payloads; keys that are not the database's
    raise :class:`~zincir.EncryptionKeyInvalid` here. Without keys an encrypted database is read
    all the same, up to its first encrypted value, which raises
    :class:`~zincir.EncryptionKeyMissing`.
    """
    where = parse_target(path)
    if keys is None:
        keys = keys_from_env()
    conn: Reader
    if where.backend == "postgresql":
        # Imported here: psycopg is an optional extra, needed only for a server.
        from .._postgres._readonly import open_postgres_readonly

        conn = open_postgres_readonly(where.location, REQUIRED_TABLES)
    else:
        conn = open_sqlite_readonly(where.location, REQUIRED_TABLES)
    if keys is not None and conn.has_table("run_keys"):
        try:
            conn.sealer = Sealer(keys)
            with conn.snapshot():
                check_readonly_keys(conn.sealer, lambda sql: list(conn.execute(sql)))
        except BaseException:
            conn.close()
            raise
    return conn


@contextlib.contextmanager
def read_snapshot(conn: Reader) -> Iterator[Reader]:
    """Run the reads inside the block in one read transaction (one consistent snapshot).

    Database errors raised inside become :class:`StorageError` (or :class:`DatabaseBusy`).
    """
    with conn.snapshot():
        yield conn
