"""Model calls in flight: the mark an owner places before a model call, and what becomes of a
mark no reply closed.

A run has at most one open mark, ``agent_runs.model_call_seq`` (the seq of its
``model_call_started`` event). The reply recorded after it (``record_response``) closes it in
the response's own transaction. A mark left open is a call whose reply was never recorded: it
is closed by a ``model_call_lost`` event and charged to the budget by its request size, once,
in the transaction that finds it: the owner's next mark (the call ended without a reply while
its process lived), or the next owner's taking of the run (the attempt ended with the call in
flight: its process died, its lease was lost, or its block was left). docs/adapters.md
describes it for users.
"""

from __future__ import annotations

from typing import Literal

from .._budget import Exceeded, judge
from .._json import decode
from .._json import dump_trusted as _dump
from .._payloads import texts
from .._types import EventType
from ._budgets import budget_usage, charge_unanswered
from ._tx import Tx
from ._types import Lease

FoundBy = Literal["next_call", "next_owner"]
"""Who closed a mark no reply closed: the same owner's next mark, or the next owner."""


def start_model_call(tx: Tx, lease: Lease, mark_json: str) -> tuple[int | None, Exceeded | None]:
    """Place the run's model-call mark (``model_call_started`` with ``mark_json``), after
    closing and charging a mark of the owner's that no reply closed (``model_call_lost``).
    Refused while a limit of the run's budget is reached (by that charge or before): then no
    mark is placed, and the limit is returned. (The mark's seq, the limit reached.) Fenced."""
    tx.fence(lease)
    open_seq, budgeted = tx.one(
        "SELECT r.model_call_seq, b.run_id FROM agent_runs AS r LEFT JOIN budgets AS b ON b.run_id = r.id"
        " WHERE r.id = ?",
        (lease.run_id,),
    )
    reached = None
    if open_seq is not None:
        reached = close_unanswered(tx, lease.run_id, int(open_seq), "next_call")
    if reached is None and budgeted is not None:
        usage = budget_usage(tx, lease.run_id)
        reached = None if usage is None else judge(usage)
    if reached is not None:
        return None, reached
    reply = tx.log(
        lease.run_id, EventType.MODEL_CALL_STARTED, mark_json, run_set=", model_call_seq = last_seq + 1"
    )
    return int(reply.one()[0]), None


def close_unanswered(tx: Tx, run_id: str, mark_seq: int, found_by: FoundBy) -> Exceeded | None:
    """Close the open mark at ``mark_seq``, whose reply was never recorded: log
    ``model_call_lost`` and charge the run's budget by the request's tokens and estimated cost
    (and one model call). The limit the charge reached, if any."""
    row = tx.one("SELECT payload FROM events WHERE run_id = ? AND seq = ?", (run_id, mark_seq))
    mark = decode(texts(tx, row)[0]) if row is not None else {}
    tokens, cost = mark.get("request_tokens"), mark.get("cost")
    lost = {
        "cost": cost,
        "epoch": mark.get("epoch"),
        "found_by": found_by,
        "mark_seq": mark_seq,
        "model": mark.get("model"),
        "request_tokens": tokens,
    }
    tx.log(run_id, EventType.MODEL_CALL_LOST, _dump(lost), run_set=", model_call_seq = NULL")
    return charge_unanswered(tx, run_id, tokens or 0, float(cost or 0))
