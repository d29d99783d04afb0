"""Two runs' trajectories compared: their common prefix, where they part, and what each did after.

Made for a run and its fork (docs/forks.md), and for any two runs. A fork's lineage says how
much of its log is its source's copy, so that part is not read again: the comparison starts
where the copy ends and walks both logs page by page until they differ. After that, each side's
responses, tool results and other events are listed, with what its responses spent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Final

import attrs

from .._budget import SpendSum, debit_of
from .._errors import ZincirError
from .._types import EventType
from ._connect import Reader
from ._events import EventRow, iter_events
from ._keys import parse_run_id
from ._runs import RunDetail, get_run
from ._values import Int, OptInt, plain

__all__ = ["DEFAULT_ITEMS", "DiffItem", "DiffSide", "RunDiff", "SpendSum", "diff_runs", "side_by_side"]

#: How many events a side lists after the divergence, by default.
DEFAULT_ITEMS: Final = 50


@attrs.frozen
class DiffItem:
    """One event of a side after the divergence, as the diff shows it: a model response (its
    text and tool calls; its ``tool_call`` events are folded into it), a tool result, or any
    other event by its type."""

    seq: Int
    kind: str
    """``response``, ``result``, or the event's type."""
    text: str
    """One line that says what it is."""
    payload: Any
    """The decoded payload (None if it is not JSON)."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "payload": self.payload, "seq": plain(self.seq), "text": self.text}


@attrs.frozen
class DiffSide:
    """One run of a diff, after the common prefix."""

    run: RunDetail
    items: tuple[DiffItem, ...]
    """The first events after the divergence (responses, results, others)."""
    more: bool
    """Whether it has more events than ``items`` shows."""
    events_after: int
    """Its events after the common prefix (those read: see ``cut``)."""
    spend: SpendSum
    """What its responses after the common prefix spent."""
    cut: bool = False
    """Whether the read stopped at ``max_events`` (``events_after`` and ``spend`` are then
    lower bounds)."""


@attrs.frozen
class RunDiff:
    """Two runs compared (:func:`diff_runs`)."""

    a: DiffSide
    b: DiffSide
    common: int
    """How many events both logs begin with alike (type and payload): seqs ``0..common - 1``."""
    first_a: EventRow | None
    """A's event at seq ``common`` (None: A ends there)."""
    first_b: EventRow | None
    compared_all: bool = True
    """False when the comparison stopped at ``max_compare`` events alike (then the sides are
    listed from there, and ``common`` is a lower bound)."""

    @property
    def identical(self) -> bool:
        return self.compared_all and self.first_a is None and self.first_b is None

    def to_json(self) -> dict[str, Any]:
        return {
            "a": _side_json(self.a, self.first_a),
            "b": _side_json(self.b, self.first_b),
            "common_prefix": self.common,
            "compared_all": self.compared_all,
            "first_divergence": None if self.identical or not self.compared_all else self.common,
        }


def _side_json(side: DiffSide, first: EventRow | None) -> dict[str, Any]:
    run = side.run
    at = (
        None
        if first is None
        else {"payload": _decoded(first.payload), "seq": plain(first.seq), "type": first.type}
    )
    return {
        "config": _decoded(run.config),
        "cut": side.cut,
        "events_after": side.events_after,
        "first": at,
        "fork_seq": plain(run.fork_seq),
        "forked_from": run.forked_from,
        "items": [item.to_json() for item in side.items],
        "more": side.more,
        "run_id": run.id,
        "spend": side.spend.to_json(),
        "status": run.status,
    }


def diff_runs(
    conn: Reader,
    a_id: str,
    b_id: str,
    *,
    limit: int = DEFAULT_ITEMS,
    max_events: int | None = None,
    max_compare: int | None = None,
) -> RunDiff:
    """Compare runs ``a_id`` and ``b_id`` (read in the caller's snapshot). ``limit`` items per
    side are listed; ``max_events`` bounds the events read per side after the common prefix,
    ``max_compare`` the events compared beyond what the lineage says is shared (None: no bound,
    for the command line; the inspector bounds both). RunNotFound."""
    a = get_run(conn, parse_run_id(a_id), children_limit=0, forks_limit=0)
    b = get_run(conn, parse_run_id(b_id), children_limit=0, forks_limit=0)
    lineage = {run.id: run for run in (a, b)}
    for run in (a, b):
        _load_chain(conn, run, lineage)
    start = _shared_by_lineage(a, b, lineage)
    common, first_a, first_b, rest_a, rest_b, all_ = _part(conn, a.id, b.id, start, max_compare)
    return RunDiff(
        _side(a, first_a, rest_a, limit, max_events),
        _side(b, first_b, rest_b, limit, max_events),
        common,
        first_a,
        first_b,
        all_,
    )


_MAX_CHAIN: Final = 200


def _load_chain(conn: Reader, run: RunDetail, lineage: dict[str, RunDetail]) -> None:
    """Add the runs ``run`` was forked from, source after source, to ``lineage``."""
    while run.forked_from is not None and run.forked_from not in lineage and len(lineage) < _MAX_CHAIN:
        try:
            run = get_run(conn, run.forked_from, children_limit=0, forks_limit=0)
        except ZincirError:  # the source is not there (deleted since): the chain ends here
            return
        lineage[run.id] = run


def _shared_by_lineage(a: RunDetail, b: RunDetail, lineage: dict[str, RunDetail]) -> int:
    """How many first events ``a`` and ``b`` are known to share by their fork lineage (a
    fork's ``0..fork_seq`` is its source's, copied): 0 when they have no common ancestor."""
    reach_a, reach_b = _reach(a, lineage), _reach(b, lineage)
    return max((min(reach_a[r], reach_b[r]) for r in reach_a.keys() & reach_b.keys()), default=0)


def _reach(run: RunDetail, lineage: dict[str, RunDetail]) -> dict[str, int]:
    """Each run of ``run``'s chain (itself, its source, ...), with how many of its first
    events ``run`` has alike."""
    known = _count(run.event_count)
    reach = {run.id: known}
    while run.forked_from is not None and run.forked_from in lineage:
        known = min(known, _count(run.fork_seq, 1))
        run = lineage[run.forked_from]
        if run.id in reach:
            break
        reach[run.id] = known
    return reach


def _count(value: OptInt, plus: int = 0) -> int:
    """An event count (or a seq, ``plus`` one) as stored; a value that is not one counts 0."""
    return value + plus if type(value) is int else 0


def _part(
    conn: Reader, a_id: str, b_id: str, start: int, max_compare: int | None
) -> tuple[int, EventRow | None, EventRow | None, Iterator[EventRow], Iterator[EventRow], bool]:
    """Walk both logs from seq ``start`` until they differ (or for ``max_compare`` events): the
    common length, each side's first event after it, the rest of each side, and whether the
    walk found where they differ (or an end)."""
    events_a = iter_events(conn, a_id, after=start - 1)
    events_b = iter_events(conn, b_id, after=start - 1)
    common = start
    while True:
        first_a, first_b = next(events_a, None), next(events_b, None)
        if first_a is None or first_b is None or _event(first_a) != _event(first_b):
            return common, first_a, first_b, events_a, events_b, True
        common += 1
        if max_compare is not None and common - start >= max_compare:
            return common, next(events_a, None), next(events_b, None), events_a, events_b, False


def _event(row: EventRow) -> tuple[str, str]:
    """What two logs must have alike at a seq: the type and the payload."""
    return row.type, row.payload


def _plus(spend: SpendSum, response: Any) -> SpendSum:
    """``spend`` with one more response (an ``llm_call`` payload); usage zincir cannot read counts 0."""
    data = response if isinstance(response, dict) else {}
    calls = data.get("tool_calls")
    calls = calls if isinstance(calls, list) else []
    try:
        debit = debit_of(data.get("usage"), (), "a recorded response")
    except (ZincirError, AttributeError, TypeError):
        debit = debit_of(None, (), "")
    return spend.plus(debit, len(calls))


def _side(
    run: RunDetail, first: EventRow | None, rest: Iterator[EventRow], limit: int, max_events: int | None
) -> DiffSide:
    items: list[DiffItem] = []
    spend = SpendSum()
    count, more, cut = 0, False, False
    if first is not None:
        for event in _chain(first, rest):
            if max_events is not None and count >= max_events:
                cut = True
                break
            count += 1
            payload = _decoded(event.payload)
            if event.type == EventType.LLM_CALL.value:
                spend = _plus(spend, payload)
            if event.type == EventType.TOOL_CALL.value:
                continue  # shown with its response
            if len(items) < limit:
                items.append(_item(event, payload))
            else:
                more = True
    return DiffSide(run, tuple(items), more, count, spend, cut)


def _chain(first: EventRow, rest: Iterator[EventRow]) -> Iterator[EventRow]:
    yield first
    yield from rest


def _item(event: EventRow, payload: Any) -> DiffItem:
    data = payload if isinstance(payload, dict) else {}
    if event.type == EventType.LLM_CALL.value:
        calls = data.get("tool_calls")
        calls = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
        names = ", ".join(f"{c.get('name')}({_short(c.get('args'), 30)})" for c in calls)
        return DiffItem(
            event.seq, "response", _short(data.get("content")) + (f" -> {names}" if names else ""), payload
        )
    if event.type == EventType.TOOL_RESULT.value:
        inherited = " (inherited)" if "inherited" in data else ""
        text = f"{data.get('call_id')}{inherited}: {_short(data.get('content'))}"
        return DiffItem(event.seq, "result", text, payload)
    if event.type == EventType.FORKED.value:
        text = f"forked from {data.get('forked_from')} at seq {data.get('fork_seq')}"
        return DiffItem(event.seq, event.type, text, payload)
    if event.type == EventType.STATE_TRANSITION.value:
        return DiffItem(event.seq, event.type, f"{data.get('from')} -> {data.get('to')}", payload)
    return DiffItem(event.seq, event.type, _short(payload), payload)


def _short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 1] + "…"


def _decoded(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def side_by_side(diff: RunDiff, width: int = 48) -> list[tuple[str, str]]:
    """The two sides' items paired in order, each as one line of at most ``width`` characters."""
    a, b = diff.a.items, diff.b.items
    return [
        (_cell(a[i] if i < len(a) else None, width), _cell(b[i] if i < len(b) else None, width))
        for i in range(max(len(a), len(b)))
    ]


def _cell(item: DiffItem | None, width: int) -> str:
    if item is None:
        return ""
    text = f"{plain(item.seq)} {item.kind}: {item.text}"
    return text if len(text) <= width else text[: width - 1] + "…"
