"""Schema migrations as files: ``migrations/<backend>/NNNN_name.sql``, numbered 1..n."""

from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path

import attrs

from ._errors import SchemaError

__all__ = ["Migration", "load"]


@attrs.frozen
class Migration:
    version: int
    name: str
    sql: str


def _files(backend: str) -> list[tuple[str, str]]:
    """(file name, SQL) of a backend's migrations (``migrations/<backend>/NNNN_name.sql``).

    In a wheel the SQL files ship inside the package; in a source checkout (editable install)
    they are read from the repository's top-level migrations/ folder.
    """
    packaged = importlib.resources.files("zincir") / "migrations" / backend
    if packaged.is_dir():
        return [(f.name, f.read_text("utf-8")) for f in packaged.iterdir() if f.name.endswith(".sql")]
    source = Path(__file__).resolve().parents[1] / "migrations" / backend
    return [(f.name, f.read_text("utf-8")) for f in source.glob("*.sql")]


def _numbered(files: list[tuple[str, str]]) -> tuple[Migration, ...]:
    """Migrations in order; they must be numbered 1..n."""
    migrations = []
    for filename, sql in files:
        number, _, _ = filename.partition("_")
        migrations.append(Migration(int(number), filename.removesuffix(".sql"), sql))
    migrations.sort(key=lambda m: m.version)
    ordered = tuple(migrations)
    if not migrations or [m.version for m in migrations] != list(range(1, len(migrations) + 1)):
        raise SchemaError(f"zincir's migrations are not numbered 1..n: {migrations!r}")
    return ordered


@functools.cache
def load(backend: str) -> tuple[Migration, ...]:
    """A backend's migrations, in order."""
    return _numbered(_files(backend))
