"""Versions of an agent: how many runs each has, per status (what is still draining)."""

from __future__ import annotations

from typing import Final

import attrs

from ._connect import Reader
from ._keys import RUN_STATUSES
from ._runs import NAMED_STATUS, has_versions
from ._values import as_opt_text, as_size, name_column

__all__ = [
    "LIVE_COUNT_CAP",
    "LIVE_STATUSES",
    "MAX_VERSIONS",
    "PANEL_VERSIONS",
    "Draining",
    "VersionCounts",
    "count_versions",
    "draining_versions",
]

#: The statuses of a run that has not ended: a version with runs in them is still draining.
LIVE_STATUSES: Final = ("pending", "running", "waiting")
#: Versions listed at most (by name; the runs without a version first).
MAX_VERSIONS: Final = 1000


@attrs.frozen
class VersionCounts:
    """The runs of one version (None: the runs without one), per status: every status zincir
    writes, zero included, and ``other`` when some row holds a status it does not write."""

    version: str | None
    counts: dict[str, int]

    @property
    def live(self) -> int:
        """Its runs that have not ended: while there are any, the version is still draining."""
        return sum(self.counts[status] for status in LIVE_STATUSES)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def count_versions(conn: Reader) -> tuple[list[VersionCounts], bool]:
    """Every version's runs per status, the runs without a version first, then by name (at
    most :data:`MAX_VERSIONS`; the flag says whether there were more). One scan of the runs
    table: ended runs are in no index by version."""
    if not has_versions(conn):  # before versions were stored: every run had none
        sql = f"SELECT NULL, {NAMED_STATUS}, count(*) FROM agent_runs GROUP BY named"
    else:
        sql = (
            f"SELECT {name_column('version')} AS shown, {NAMED_STATUS}, count(*)"
            f" FROM {conn.dialect.unindexed('agent_runs')} GROUP BY shown, named"
        )
    found: dict[str | None, dict[str, int]] = {}
    for version, status, count in conn.execute(sql, ()):
        counts = found.setdefault(as_opt_text(version), dict.fromkeys(RUN_STATUSES, 0))
        name = "other" if status is None else str(status)
        counts[name] = counts.get(name, 0) + as_size(count)
    ordered = sorted(found, key=lambda version: (version is not None, version or ""))
    listed = [VersionCounts(version, found[version]) for version in ordered[:MAX_VERSIONS]]
    return listed, len(ordered) > MAX_VERSIONS


#: Live runs counted per version up to this many, as the runs page counts them per status.
LIVE_COUNT_CAP: Final = 10_000
#: Versions the runs page shows at most (by name).
PANEL_VERSIONS: Final = 50


@attrs.frozen
class Draining:
    """A version with runs that have not ended (None: the runs without a version); ``capped``:
    there are more than ``live``."""

    version: str | None
    live: int
    capped: bool = False


def draining_versions(conn: Reader) -> list[Draining]:
    """The versions that have runs not ended, the runs without a version first, then by name
    (at most :data:`PANEL_VERSIONS`), each with its live runs counted up to
    :data:`LIVE_COUNT_CAP`. Bounded whatever the table holds: the versions are found one index
    probe each (``idx_agent_runs_version_claimable`` holds the live runs by version) and each
    count walks its version's range of that index."""
    if not has_versions(conn):
        return []
    # As idx_agent_runs_version_claimable's predicate says it (see its migration): its index.
    live = "status NOT IN ('completed', 'failed', 'cancelled')"
    found = list(
        conn.execute(
            "WITH RECURSIVE versions (version) AS ("
            f" SELECT min(version) FROM agent_runs WHERE {live} AND version IS NOT NULL"
            " UNION ALL SELECT (SELECT min(r.version) FROM agent_runs AS r"
            f" WHERE r.{live} AND r.version > versions.version)"
            " FROM versions WHERE versions.version IS NOT NULL)"
            " SELECT version FROM versions WHERE version IS NOT NULL LIMIT ?",
            (PANEL_VERSIONS,),
        )
    )
    drained: list[Draining] = []
    for version in [None, *(row[0] for row in found)]:
        where = "version IS NULL" if version is None else "version = ?"
        (count,) = conn.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM agent_runs WHERE {where} AND {live} LIMIT ?) AS found",
            (*(() if version is None else (version,)), LIVE_COUNT_CAP + 1),
        ).fetchone()
        count = as_size(count)
        if count:
            drained.append(Draining(as_opt_text(version), min(count, LIVE_COUNT_CAP), count > LIVE_COUNT_CAP))
    return drained
