"""A page of a run's log read as a conversation: plain data for ``conversation.html``.

Each model response carries its text and its tool calls, each call paired with its result
(looked up by call id, so a result on a later page still shows) unless a restart (a failed
or lost attempt, a takeover) came between them: then the result is shown where the log has
it, after the restart, and the call points to it. Calls with no result say whether they
never started, started with an outcome unknown, or (a ``submit_checkpoint`` call) wait for
their candidate's verification, under way or interrupted. A result a reconcile probe found
says so. Signals, approvals, checkpoints (as cards with state, verdict, evidence and
lineage), children, limits and restarts come inline in seq order. What is still open is
marked: unanswered approvals, undecided candidates, pending calls, and (on the page that
reaches the log's end) the open waits.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .. import _queries as q
from . import _views as v
from ._reads import RESTART_TYPES, CallOutcome, Restarts
from ._render import pretty_value

#: Characters of a tool's arguments or result shown inline (the raw event has the rest).
INLINE_CHARS = 4000


@attrs.frozen
class CallView:
    call_id: str
    name: str
    args: str
    args_cut: bool  # ``args`` is the beginning only: the raw event has them all
    state: str
    # done / never-started / outcome-unknown / pending / verifying / verification-interrupted
    mark: str
    started: int | None
    result: str | None
    result_cut: bool
    result_url: str | None
    approval: str | None  # approved / denied / unanswered / timed out
    reconciled: bool = False  # the result was found by a reconcile probe
    result_later: v.SeqRef | None = None  # the result, not folded in: shown where it is
    later_after_restart: bool = False  # ... because a restart came between (else: too far)
    checkpoint_round: object = None  # the candidate's round, for a verifying / interrupted call


@attrs.frozen
class Entry:
    kind: str
    seq: object
    at: object
    anchor: str
    title: str
    event_url: str
    text: str | None = None
    body: str | None = None
    marks: tuple[str, ...] = ()
    calls: tuple[CallView, ...] = ()
    checkpoint: v.CheckpointView | None = None
    links: tuple[v.Link, ...] = ()
    usage: str | None = None
    body_cut: bool = False  # ``body`` is the beginning only: the raw event has it all


@functools.lru_cache(maxsize=256)
def _decode(payload: str, truncated: bool) -> Any:
    """A payload decoded (None if cut or not JSON). Each page decodes an event three times
    (call ids, calls shown, the entry): the cache makes that once. The values are not
    mutated."""
    if truncated:
        return None
    ok, value = q.parse_json(payload)
    return value if ok else None


def _clip(text: str, limit: int = INLINE_CHARS) -> tuple[str, bool]:
    return (text, False) if len(text) <= limit else (text[: limit - 1] + "…", True)


def _body(text: str) -> dict[str, Any]:
    """An entry's ``body`` and ``body_cut``: ``text`` up to INLINE_CHARS."""
    body, cut = _clip(text)
    return {"body": body, "body_cut": cut}


def _text_of(value: Any) -> str:
    return pretty_value(value) if value is not None else ""


def _field(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, dict) else None


def _str(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else pretty_value(value)


def call_ids_of(events: Sequence[q.EventRow]) -> list[str]:
    """The call ids the page's events name (responses, calls, results, approvals)."""
    ids: list[str] = []
    for event in events:
        value = _decode(event.payload, event.truncated)
        if event.type == "llm_call":
            for call in _field(value, "tool_calls") or []:
                if isinstance(_field(call, "id"), str):
                    ids.append(call["id"])
        elif isinstance(_field(value, "call_id"), str):
            ids.append(value["call_id"])
    return ids[:2000]


@attrs.frozen
class Candidate:
    """The run's undecided checkpoint candidate, and whether its verification was interrupted."""

    call_id: str
    round: object
    interrupted: bool


@attrs.frozen
class Context:
    run_id: str
    outcomes: Mapping[str, CallOutcome]
    checkpoints: Mapping[Any, v.CheckpointView]
    open_approvals: frozenset[str]
    decided: Mapping[str, str]  # call id -> approved / denied, from this page
    children: Mapping[str, str]  # child id -> status
    restarts: Restarts = attrs.field(factory=lambda: Restarts((), -1))  # from the page's first event on
    reconciled: frozenset[object] = frozenset()  # seqs of results a reconcile probe found
    candidate: Candidate | None = None
    open_model_call: object = None  # the seq of the run's open model-call mark (a call in flight)

    def folds(self, call_seq: object, result_seq: object) -> bool:
        """Whether a call's result is shown with its call: no restart came between them."""
        return self.restarts.between(call_seq, result_seq) is False


def _call_view(ctx: Context, call_id: str, name: str, args: Any, call_seq: object) -> CallView:
    outcome = ctx.outcomes.get(call_id)
    state = outcome.state if outcome is not None else "unknown"
    mark = {
        "done": "done",
        "never started": "never-started",
        "started, outcome unknown": "outcome-unknown",
    }.get(state, "pending")
    checkpoint_round = None
    candidate = ctx.candidate
    if candidate is not None and candidate.call_id == call_id and state != "done":
        # A submit_checkpoint call is never "started": its candidate is being verified, or was.
        mark = "verification-interrupted" if candidate.interrupted else "verifying"
        checkpoint_round = candidate.round
    result = result_url = later = None
    cut = reconciled = after_restart = False
    if outcome is not None and outcome.result is not None:
        event = outcome.result
        reconciled = event.seq in ctx.reconciled
        if ctx.folds(call_seq, event.seq):
            value = _decode(event.payload, event.truncated)
            content = _field(value, "content") if value is not None else None
            shown = _text_of(content) if value is not None else event.payload
            result, cut = _clip(shown)
            cut = cut or event.truncated
            result_url = v.path("api", "runs", ctx.run_id, "events", q.encode_key(event.seq))
        else:
            later = v.seq_ref(ctx.run_id, event.seq)
            after_restart = ctx.restarts.between(call_seq, event.seq) is True
    approval = None
    if call_id in ctx.open_approvals:
        approval = "unanswered"
    elif call_id in ctx.decided:
        approval = ctx.decided[call_id]
    # The arguments of a call that needs (or had) an approval are shown whole: a decision
    # covers all of them. Others are cut, and say so.
    shown_args, args_cut = (_text_of(args), False) if approval is not None else _clip(_text_of(args))
    return CallView(
        call_id,
        name,
        shown_args,
        args_cut,
        state,
        mark,
        outcome.started if outcome is not None else None,
        result,
        cut,
        result_url,
        approval,
        reconciled,
        later,
        after_restart,
        checkpoint_round,
    )


def entries(ctx: Context, events: Sequence[q.EventRow]) -> list[Entry]:
    """The conversation entries of one page of events, in seq order."""
    shown_calls: dict[str, object] = {}  # call id -> the seq of the response that asked for it
    for event in events:
        if event.type == "llm_call":
            value = _decode(event.payload, event.truncated)
            for call in _field(value, "tool_calls") or []:
                if isinstance(_field(call, "id"), str):
                    shown_calls[call["id"]] = event.seq
    found: list[Entry] = []
    for event in events:
        entry = _entry(ctx, event, shown_calls)
        if entry is not None:
            found.append(entry)
    return found


def _base(ctx: Context, event: q.EventRow, kind: str, title: str, **fields: Any) -> Entry:
    page = v.url(v.path("runs", ctx.run_id), {"after": _before(event.seq), "view": "events"})
    return Entry(
        kind, event.seq, event.created_at, "c" + q.encode_key(event.seq), title,
        v.fragment(page, v.anchor(event.seq)), **fields,
    )  # fmt: skip


def _before(seq: object) -> object:
    return seq - 1 if type(seq) is int and seq > 0 else None


def _entry(ctx: Context, event: q.EventRow, shown_calls: Mapping[str, object]) -> Entry | None:
    value = _decode(event.payload, event.truncated)
    kind = event.type
    if value is None and kind not in ("state_transition",):
        return _base(ctx, event, "other", kind, **_body(event.payload))
    if kind == "llm_call":
        calls = []
        for call in _field(value, "tool_calls") or []:
            call_id = _field(call, "id")
            if isinstance(call_id, str):
                calls.append(
                    _call_view(ctx, call_id, _str(_field(call, "name")), _field(call, "args"), event.seq)
                )
        content = _field(value, "content")
        text, _ = _clip(_str(content), 20_000)
        usage = _field(value, "usage")
        marks = tuple(sorted({c.mark for c in calls if c.mark != "done"} | _approval_marks(calls)))
        return _base(
            ctx,
            event,
            "response",
            "Model response",
            text=text or None,
            calls=tuple(calls),
            marks=marks,
            usage=_usage_text(_str(_field(value, "stop_reason")), usage),
        )
    if kind == "tool_call":
        call_id = _field(value, "call_id")
        if not isinstance(call_id, str) or call_id in shown_calls:
            return None
        call = _call_view(ctx, call_id, _str(_field(value, "name")), _field(value, "args"), event.seq)
        marks = (call.mark,) if call.mark != "done" else ()
        return _base(ctx, event, "call", f"Tool call {call_id}", calls=(call,), marks=marks)
    if kind == "tool_result":
        call_id = _field(value, "call_id")
        if isinstance(call_id, str) and call_id in shown_calls and ctx.folds(shown_calls[call_id], event.seq):
            return None  # shown with its call
        found = event.seq in ctx.reconciled or _field(value, "reconciled") is True
        title = f"Result of tool call {_str(call_id)}" + (", found by a probe" if found else "")
        marks = ("reconciled",) if found else ()
        return _base(ctx, event, "result", title, **_body(_text_of(_field(value, "content"))), marks=marks)
    if kind == "tool_started":
        return None  # folded into its call's state; the raw list has it
    if kind == "model_call_started":
        if event.seq != ctx.open_model_call:
            return None  # answered by the response after it (or lost: its model_call_lost says so)
        title = f"Model call in flight{_call_size(value)}"
        return _base(ctx, event, "model-call", title, marks=("in-flight",))
    if kind == "model_call_lost":
        finder = "the owner's next call" if _field(value, "found_by") == "next_call" else "the next owner"
        title = f"Model call lost in flight{_call_size(value)}"
        text = f"Its reply was never recorded; found by {finder}, and charged to the budget by its request."
        return _base(ctx, event, "model-call", title, text=text, marks=("lost",))
    if kind == "signal_received":
        title = f"Signal {_str(_field(value, 'signal'))} received (wait {_str(_field(value, 'name'))})"
        return _base(ctx, event, "signal", title, **_body(_text_of(_field(value, "payload"))))
    if kind == "approval_requested":
        call_id = _str(_field(value, "call_id"))
        title = f"Approval requested for tool call {call_id} ({_str(_field(value, 'name'))})"
        marks = ("unanswered",) if call_id in ctx.open_approvals else ()
        # Whole, like the approve form: the decision covers every argument.
        return _base(ctx, event, "approval", title, body=_text_of(_field(value, "args")), marks=marks)
    if kind == "approval_decided":
        verdict = "approved" if _field(value, "approved") is True else "denied"
        title = f"Tool call {_str(_field(value, 'call_id'))} {verdict} by {_str(_field(value, 'by'))}"
        return _base(
            ctx, event, "decision", title, text=_str(_field(value, "reason")) or None, marks=(verdict,)
        )
    if kind == "checkpoint_proposed":
        round = _field(value, "round")
        card = ctx.checkpoints.get(round)
        marks = ("undecided",) if card is not None and card.row.status == "candidate" else ()
        title = (
            f"Checkpoint round {_str(round)} proposed (checkpoint id {_str(_field(value, 'checkpoint_id'))})"
        )
        body = {} if card is not None else _body(_text_of(_field(value, "state")))
        return _base(ctx, event, "checkpoint", title, checkpoint=card, marks=marks, **body)
    if kind in ("checkpoint_accepted", "checkpoint_rejected"):
        verdict = kind.removeprefix("checkpoint_")
        verification = _field(value, "verification")
        evidence = _field(verification, "evidence")
        lines = (
            "\n".join(e if isinstance(e, str) else pretty_value(e) for e in evidence or [])
            if isinstance(evidence, list)
            else _str(evidence)
        )
        title = f"Checkpoint id {_str(_field(value, 'checkpoint_id'))} {verdict}"
        return _base(ctx, event, "verdict", title, text=lines or None, marks=(verdict,))
    if kind in ("child_spawned", "child_joined"):
        child = _str(_field(value, "child_id") or _field(value, "id") or _field(value, "run_id"))
        ref = v.run_ref(child)
        links = (v.Link(child, ref.url),) if ref.url else ()
        status = ctx.children.get(child) or _str(_field(value, "status")) or None
        verb = "spawned" if kind == "child_spawned" else "joined"
        title = f"Child run {_str(_field(value, 'name')) or child} {verb}"
        return _base(
            ctx,
            event,
            "child",
            title,
            links=links,
            **_body(_text_of(value)),
            marks=(status,) if status else (),
        )
    if kind in ("budget_exceeded", "loop_detected", "no_progress"):
        return _base(
            ctx,
            event,
            "limit",
            kind.replace("_", " ").capitalize(),
            **_body(_text_of(value)),
            marks=("limit",),
        )
    if kind in RESTART_TYPES:
        title = {"attempt_failed": "Attempt failed", "attempt_lost": "Attempt lost"}.get(
            kind, "Lease taken over"
        )
        return _base(ctx, event, "restart", title, **_body(_text_of(value)))
    if kind == "version_changed":  # an outsider moved the run (zincir.set_version)
        moved = [_str(_field(value, end)) or "(none)" for end in ("from", "to")]
        by = _str(_field(value, "by"))
        title = f"Moved from version {moved[0]} to {moved[1]}{f' by {by}' if by else ''}"
        return _base(ctx, event, "transition", title)
    if kind == "wait_timed_out":
        return _base(ctx, event, "timeout", "Wait timed out", **_body(_text_of(value)), marks=("timed-out",))
    if kind == "state_transition":
        title = f"{_str(_field(value, 'from'))} → {_str(_field(value, 'to'))}" if value is not None else kind
        return _base(ctx, event, "transition", title)
    return _base(ctx, event, "other", kind, **_body(_text_of(value)))


def _call_size(mark: Any) -> str:
    """`` (claude-x, ~1,200 tokens, cost 0.004)``: what a model-call mark says of its request."""
    parts = [_str(_field(mark, "model"))] if isinstance(_field(mark, "model"), str) else []
    tokens = _field(mark, "request_tokens")
    if type(tokens) is int:
        parts.append(f"~{tokens:,} tokens")
    if _field(mark, "cost") is not None:
        parts.append(f"cost {pretty_value(_field(mark, 'cost'))}")
    return f" ({', '.join(parts)})" if parts else ""


def _approval_marks(calls: Sequence[CallView]) -> set[str]:
    return {"unanswered"} if any(c.approval == "unanswered" for c in calls) else set()


def _usage_text(stop_reason: str, usage: Any) -> str | None:
    """``stop tool_use · input_tokens 120 · output_tokens 30``."""
    parts = [f"stop {stop_reason}"] if stop_reason else []
    if isinstance(usage, dict):
        parts += [f"{k} {pretty_value(val)}" for k, val in list(usage.items())[:8]]
    return " · ".join(parts) or None


def decided_on_page(events: Sequence[q.EventRow]) -> dict[str, str]:
    found = {}
    for event in events:
        if event.type == "approval_decided":
            value = _decode(event.payload, event.truncated)
            call_id = _field(value, "call_id")
            if isinstance(call_id, str):
                found[call_id] = "approved" if _field(value, "approved") is True else "denied"
    return found
