"""Model calls in flight and lost: the run's open model-call mark, and the calls whose reply
was never recorded (``model_call_lost``), charged by their request size (docs/adapters.md)."""

from __future__ import annotations

from typing import Any

import attrs

from .._payloads import cut_texts
from ._connect import Reader
from ._keys import check_limit
from ._values import Int, OptInt, as_int, as_opt_int, as_opt_text, as_text, json_columns, parse_json

__all__ = ["ModelCall", "ModelCalls", "model_call_to_json", "model_calls"]

#: Characters of a mark's payload read (it holds a model name and three numbers).
_MARK_CHARS = 1000


@attrs.frozen
class ModelCall:
    """A model call whose reply is not recorded: still open (``lost_seq`` None), or closed by a
    ``model_call_lost`` event at ``lost_seq`` and charged. ``found_by``: ``next_call`` (the
    owner's next call found it) or ``next_owner`` (the next owner of the run did)."""

    mark_seq: Int
    model: str | None
    request_tokens: Any
    cost: Any
    epoch: Any
    at: OptInt
    """When the mark was placed (open), or when the loss was found (lost)."""
    lost_seq: OptInt = None
    found_by: str | None = None


@attrs.frozen
class ModelCalls:
    """The open mark of a run (None: no call in flight), and its latest lost calls, newest first."""

    open: ModelCall | None
    lost: tuple[ModelCall, ...]


def _payload(text: object) -> dict[str, Any]:
    ok, value = parse_json(as_text(text))
    return value if ok and isinstance(value, dict) else {}


def _model(value: object) -> str | None:
    return value if isinstance(value, str) else None


def model_calls(conn: Reader, run_id: str, *, limit: int = 20) -> ModelCalls:
    """The run's open mark, if any, and its latest ``limit`` lost calls (none on a database
    from before model-call marks)."""
    if not conn.has_column("agent_runs", "model_call_seq"):
        return ModelCalls(None, ())
    d = conn.dialect
    found = None
    row = conn.execute(
        f"SELECT {d.int_column('e.seq')}, {json_columns('e.payload', _MARK_CHARS)},"
        f" {d.int_column('e.created_at')}"
        " FROM agent_runs AS r JOIN events AS e ON e.run_id = r.id AND e.seq = r.model_call_seq"
        " WHERE r.id = ?",
        (run_id,),
    ).fetchone()
    if row is not None:
        row = cut_texts(conn, [row], (1,), _MARK_CHARS)[0]
        mark = _payload(row[1])
        found = ModelCall(
            as_int(row[0]), _model(mark.get("model")), mark.get("request_tokens"), mark.get("cost"),
            mark.get("epoch"), as_opt_int(row[3]),
        )  # fmt: skip
    # The run's events by primary key, newest first; only the lost calls' payloads are read.
    rows = conn.execute(
        f"SELECT {d.int_column('seq')}, {json_columns('payload', _MARK_CHARS)}, {d.int_column('created_at')}"
        " FROM events WHERE run_id = ? AND type = 'model_call_lost' ORDER BY seq DESC LIMIT ?",
        (run_id, check_limit(limit)),
    )
    lost = []
    for seq, payload, _, at in cut_texts(conn, list(rows), (1,), _MARK_CHARS):
        value = _payload(payload)
        model, tokens, cost, epoch = (value.get(k) for k in ("model", "request_tokens", "cost", "epoch"))
        found_by = as_opt_text(value.get("found_by"))
        lost.append(
            ModelCall(
                as_int(value.get("mark_seq")),
                _model(model),
                tokens,
                cost,
                epoch,
                as_opt_int(at),
                as_int(seq),
                found_by,
            )
        )
    return ModelCalls(found, tuple(lost))


def model_call_to_json(call: ModelCall) -> dict[str, Any]:
    data: dict[str, Any] = {
        "mark_seq": call.mark_seq,
        "model": call.model,
        "request_tokens": call.request_tokens,
        "cost": call.cost,
        "epoch": call.epoch,
    }
    if call.lost_seq is None:
        data["started_at"] = call.at
    else:
        data.update(lost_seq=call.lost_seq, found_at=call.at, found_by=call.found_by)
    return data
