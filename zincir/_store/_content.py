"""The content store's sweep: parts of large values that no run refers to any more (docs/payloads.md).

Writing and reading the parts is :mod:`zincir._payloads`'s; a part is garbage once the last run
that referred to it is deleted (its ``payload_refs`` rows go with it), and only then.
"""

from __future__ import annotations

from ._tx import Tx
from ._types import SweptContent


def sweep_content(tx: Tx, limit: int = 1000) -> SweptContent:
    """Delete up to ``limit`` stored parts that no run refers to; how many, and their size in
    characters. A bounded batch, one short transaction: call again while ``parts == limit``.
    On PostgreSQL it waits for the writers storing parts right now (Dialect.sweep_guard)."""
    d = tx.dialect
    if d.sweep_guard:
        tx.execute(d.sweep_guard)
    rows = tx.all(
        "SELECT digest, size FROM payload_content AS c"
        " WHERE NOT EXISTS (SELECT 1 FROM payload_refs AS r WHERE r.digest = c.digest) LIMIT ?",
        (limit,),
    )
    for chunk in d.chunks([row[0] for row in rows]):
        where, params = d.any_of("digest", chunk)
        tx.execute(f"DELETE FROM payload_content WHERE {where}", params)
    return SweptContent(len(rows), sum(int(row[1]) for row in rows))
