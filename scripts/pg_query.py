"""The crash script's window onto a PostgreSQL database, in the shape of ``sqlite3 -batch``.

    pg_query.py create ADMIN_URL [N]  create N (default 1) fresh databases, print their URLs
    pg_query.py drop ADMIN_URL URL... drop them again
    pg_query.py URL < SQL             run the statements, print each row as a|b|c

(One process creates or drops them all: each of these processes spends half a second
importing psycopg.)

The database gets a ``json_extract(text, path)`` function that reads SQLite's JSON paths
(``$.a[0].b``, which jsonpath reads the same way), so one query text serves both backends.
"""

from __future__ import annotations

import sys
import uuid
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

JSON_EXTRACT = """
CREATE FUNCTION json_extract(document TEXT, path TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_path_query_first(document::jsonb, path::jsonpath) #>> '{}'
$$
"""


def _cell(value: object) -> str:
    return "" if value is None else str(value)


def create(admin_url: str, count: int) -> None:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        for _ in range(count):
            name = f"zincir_crash_{uuid.uuid4().hex[:12]}"
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            url = urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))
            print(url, flush=True)  # as soon as it exists: the caller drops what it was told of
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(JSON_EXTRACT)


def drop(admin_url: str, urls: list[str]) -> None:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        for url in urls:
            name = urlsplit(url).path.lstrip("/")
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def query(url: str, statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
        cursor.execute(statements.encode())  # several statements: the simple query protocol
        while True:
            if cursor.description is not None:
                for row in cursor.fetchall():
                    print("|".join(_cell(v) for v in row))
            if not cursor.nextset():
                break


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["create"] and len(argv) in (2, 3) and (len(argv) == 2 or argv[2].isdigit()):
            create(argv[1], int(argv[2]) if len(argv) == 3 else 1)
        elif argv[:1] == ["drop"] and len(argv) >= 3:
            drop(argv[1], argv[2:])
        elif len(argv) == 1:
            query(argv[0], sys.stdin.read())
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except psycopg.Error as exc:
        print(f"pg_query: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
