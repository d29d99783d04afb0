"""The audit trail: every write an outsider made to a run (schema version 7 and later).

Signals, approval decisions, cancellations, retries and raised budgets, each with who made it
as the caller named them.
"""

from __future__ import annotations

import attrs

from ._connect import Reader
from ._keys import check_limit
from ._values import Int, as_int, as_opt_text, as_size, as_text, json_columns, name_column, was_cut

__all__ = ["OutsiderAction", "list_outsider_actions"]


@attrs.frozen
class OutsiderAction:
    """One row of a run's audit trail: an outsider's write (schema version 7 and later).

    ``action`` is what was done (signal, approve, deny, cancel, retry_now, raise_budget),
    ``by`` who did it as the caller named them (``None``: nobody was named), ``detail`` the
    stored JSON text of what the write said (cut to a prefix, see ``detail_truncated``).
    """

    id: Int
    action: str
    by: str | None
    detail: str
    detail_truncated: bool
    created_at: Int


def list_outsider_actions(
    conn: Reader, run_id: str, *, limit: int | None = None, max_chars: int | None = 500
) -> tuple[OutsiderAction, ...]:
    """The run's latest outsiders' writes, newest first (one indexed read): the first
    ``limit`` (all by default), each ``detail`` cut to ``max_chars``. A database from before
    the audit trail (schema version 6 or older) has none."""
    if limit is not None:
        check_limit(limit)
    if not conn.has_table("outsider_actions"):
        return ()
    d = conn.dialect
    rows = conn.execute(
        f"SELECT {d.int_column('id')}, {name_column('action')}, {name_column('done_by')},"
        f" {json_columns('detail', max_chars)}, {d.int_column('created_at')}"
        " FROM outsider_actions WHERE run_id = ? ORDER BY id DESC LIMIT ?",
        (run_id, d.limit(limit)),
    )
    return tuple(
        OutsiderAction(
            as_int(r[0]),
            as_text(r[1]),
            as_opt_text(r[2]),
            as_text(r[3]),
            was_cut(max_chars, as_size(r[4])),
            as_int(r[5]),
        )
        for r in rows
    )
