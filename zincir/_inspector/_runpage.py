"""The run page: what it reads of one run, and the view ``run.html`` shows of it.

:class:`RunPageData` holds the bounded reads, made in one snapshot; :func:`run_context` turns
them into :class:`RunPageView`, plain data the templates print (see :mod:`._views`).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from .. import _queries as q
from . import _views as v
from ._charts import LANE_CAP, BudgetBar, Timeline, budget_bars, timeline
from ._conversation import Candidate, Context, Entry, call_ids_of, decided_on_page, entries
from ._http import now_ms
from ._params import EventsQuery
from ._plain import human_delta
from ._reads import (
    CallOutcome,
    Intent,
    Mark,
    Restarts,
    WaitSpan,
    call_outcomes,
    intents_since,
    latest_events,
    restarts_after,
    wait_spans,
)
from ._views import BLOCK_CHARS, CHILDREN_PAGE, ITEM_PREVIEW_CHARS, LIST_LIMIT

__all__ = ["PAYLOAD_PREVIEW_CHARS", "REFRESH_SECONDS", "RunPageData", "RunPageView", "run_context"]


#: Payload characters shown per event on a run page; the JSON API gives whole payloads.
PAYLOAD_PREVIEW_CHARS = 64 * 1024
# The family tree on a run page: grandchildren and below, this deep and this wide per run.
TREE_DEPTH = 4
TREE_WIDTH = 20
#: A live run's page reloads itself this often (unless paused).
REFRESH_SECONDS = 5
#: The run page's timeline covers the latest this many events (the whole run when shorter).
TIMELINE_EVENTS = 600
#: Streams a run page shows, and of each, the latest attempt's last chunks, each cut to so many
#: characters (``zincir stream`` prints them all).
STREAMS_SHOWN = 20
STREAM_TAIL = 200
STREAM_CHUNK_CHARS = 2000


class RunPageData:
    """Everything the run page reads of one run: bounded reads, in one snapshot (:meth:`fetch`)."""

    def __init__(
        self,
        run: q.RunDetail,
        checkpoints: tuple[q.CheckpointRow, ...],
        events: q.EventPage,
        types: tuple[str, ...],
        steps: tuple[q.StepRow, ...],
        timers: tuple[q.TimerRow, ...],
        awaiting: tuple[q.Awaiting, ...],
        approvals: tuple[q.ApprovalRequest, ...],
        family: tuple[tuple[q.RunSummary, ...], q.FamilyNode],
        budget: q.Usage | None,
        intents: tuple[q.IntentRow, ...],
        outcomes: Mapping[str, CallOutcome],
        marks: tuple[tuple[Mark, ...], bool],
        window_intents: tuple[Intent, ...],
        waits: tuple[WaitSpan, ...],
        outsider_actions: tuple[q.OutsiderAction, ...],
        streams: tuple[tuple[q.StreamRow, tuple[q.StreamChunkRow, ...]], ...] = (),
    ) -> None:
        self.run, self.checkpoints, self.events, self.types = run, checkpoints, events, types
        self.steps, self.timers, self.awaiting, self.approvals = steps, timers, awaiting, approvals
        self.ancestors, self.descendants = family
        self.budget, self.intents = budget, intents
        self.outcomes, (self.marks, self.earlier) = outcomes, marks
        self.window_intents, self.waits = window_intents, waits
        self.outsider_actions = outsider_actions
        self.streams = streams  # each stream with its latest attempt's last chunks
        # What the conversation needs beyond the page (set by fetch in the conversation view).
        self.restarts = Restarts((), -1)
        self.reconciled: frozenset[object] = frozenset()
        self.candidate: q.CheckpointRow | None = None
        self.model_calls = q.ModelCalls(None, ())  # set by fetch

    @classmethod
    def fetch(cls, run_id: str, query: EventsQuery, conn: Any) -> RunPageData:
        events = query.fetch(run_id, conn)
        conversation = query.view != "events"
        outcomes = (
            call_outcomes(conn, run_id, call_ids_of(events.events), max_chars=ITEM_PREVIEW_CHARS)
            if conversation
            else {}
        )
        later = query.after is not None or query.before is not None
        awaiting = q.list_awaiting(conn, [run_id]).get(run_id, ())
        approvals = (  # the calls and arguments a decision binds to
            q.list_open_approvals(conn, run_id, now_ms(), limit=LIST_LIMIT)
            if any(item.kind == "approval" for item in awaiting)
            else ()
        )
        marks: tuple[tuple[Mark, ...], bool] = ((), False)
        window: tuple[Intent, ...] = ()
        waits: tuple[WaitSpan, ...] = ()
        if not later:
            marks = latest_events(conn, run_id, TIMELINE_EVENTS)
            first_seq = marks[0][0].seq if marks[0] else 0
            window = intents_since(conn, run_id, first_seq, LANE_CAP * 2)
            waits = wait_spans(conn, run_id, LIST_LIMIT)
        view = cls(
            q.get_run(
                conn,
                run_id,
                children_limit=CHILDREN_PAGE,
                children_after=query.children_after,
                max_config_chars=BLOCK_CHARS,
                max_result_chars=BLOCK_CHARS,
            ),
            q.list_checkpoints(conn, run_id, limit=LIST_LIMIT + 1, max_chars=ITEM_PREVIEW_CHARS),
            events,
            q.event_types(conn, run_id),
            q.list_steps(conn, run_id, limit=LIST_LIMIT + 1, max_chars=ITEM_PREVIEW_CHARS),
            q.list_timers(conn, run_id, limit=LIST_LIMIT + 1),
            awaiting,
            approvals,
            q.family_tree(conn, run_id, depth=TREE_DEPTH, per_node=TREE_WIDTH),
            q.budgets_of(conn, [run_id], now_ms()).get(run_id),
            q.list_intents(conn, run_id, limit=LIST_LIMIT + 1),
            outcomes,
            marks,
            window,
            waits,
            () if later else q.list_outsider_actions(conn, run_id, limit=LIST_LIMIT + 1),
            () if later else _streams(conn, run_id),
        )
        view.model_calls = q.model_calls(conn, run_id, limit=LIST_LIMIT)
        if conversation:
            view._fetch_beyond_the_page(conn)
        return view

    def _fetch_beyond_the_page(self, conn: Any) -> None:
        """The restarts between the page's calls and their results (to keep log order), which
        results a reconcile probe found, and the undecided candidate (bounded reads)."""
        run_id = self.run.id
        seqs = [e.seq for e in self.events.events if type(e.seq) is int]
        results = [o.result.seq for o in self.outcomes.values() if o.result is not None]
        if seqs:
            upto = max([seqs[-1], *(r for r in results if type(r) is int)])
            self.restarts = restarts_after(conn, run_id, seqs[0] - 1, upto, q.SCAN_WINDOW)
        on_page = [e.seq for e in self.events.events if e.type == "tool_result"]
        self.reconciled = q.reconciled_results(conn, run_id, [*results, *on_page])
        self.candidate = q.candidate_checkpoint(conn, run_id)


@attrs.frozen
class _StepView:
    row: q.StepRow
    result: v.Stored | None


@attrs.frozen
class _EventView:
    row: q.EventRow
    anchor: str
    payload: v.Stored


@attrs.frozen
class Refresh:
    """Whether the page reloads itself, and the links that pause and resume that."""

    live: bool  # the run has not ended: its page may change
    on: bool
    seconds: int
    pause_url: str
    resume_url: str


@attrs.frozen
class LeaseLine:
    """Who may run it next, in words."""

    state: str | None  # "active" or "expired"; None when nobody holds the lease
    delta: str  # how long until (or since) the lease expires
    next_attempt: str  # "ended", "awaits", "any" or "at"


@attrs.frozen
class Tabs:
    """Which view of the log the page shows, and the links between the page's views."""

    mode: str  # "conversation" or "events"
    page_url: str  # /runs/<id>, for the section links
    later_page: bool  # paged past the first page: the overview is left out
    top_url: str
    conversation_url: str
    raw_url: str


@attrs.frozen
class WaitLine:
    """One thing the run waits for, in words: "signal 'go' (wait 'w')"."""

    item: q.Awaiting
    kind: str
    what: str
    url: str | None
    link_label: str


@attrs.frozen
class Waits:
    """What the run waits for: as read, in words, and the approval requests in full."""

    awaiting: tuple[q.Awaiting, ...]
    lines: list[WaitLine]
    approvals: list[v.ApprovalView]  # the open requests, with all their calls' arguments


@attrs.frozen
class Conversation:
    """The log as a conversation (empty when the raw events are shown)."""

    entries: list[Entry]
    open_waits_here: bool  # the page reaches the log's end: the open waits close it


@attrs.frozen
class Spend:
    """The run's budget: its limits and spend, in words, as rows and as bars."""

    usage: q.Usage | None  # None: no budget, spend is not tracked
    text: str
    rows: list[v.BudgetRow]
    bars: list[BudgetBar]
    over: bool


@attrs.frozen
class ForkLine:
    """A run a fork came from, or a fork of the run: where the fork point is, and the diff."""

    ref: v.RunRef
    at: v.SeqRef | None  # the fork point, an event of the source
    diff_url: str


@attrs.frozen
class Family:
    """The run's ancestors, its parent, and one page of its children with their subtrees; the
    run it was forked from and its own first forks (docs/forks.md)."""

    ancestors: list[v.RunRef]
    parent: v.RunRef | None
    children: list[v.TreeNode]
    nav: list[v.Link]
    first_url: str | None  # paged past the last child: the way back to the first
    source: ForkLine | None = None
    forks: list[ForkLine] = attrs.Factory(list)
    forks_more: bool = False


@attrs.frozen
class Events:
    """One page of the raw events, with the type filter and the links to other pages."""

    page: q.EventPage
    rows: list[_EventView]
    types: tuple[str, ...]
    type: str | None
    action: str  # where the filter form goes
    hidden: list[tuple[str, str]]  # the form's hidden fields
    nav: list[v.Link]


@attrs.frozen
class RunPageView:
    """Everything ``run.html`` shows of one run, a section per field (plain data; see
    :mod:`._views`)."""

    run: q.RunDetail
    refresh: Refresh
    lease: LeaseLine
    tabs: Tabs
    waits: Waits
    conversation: Conversation
    events: Events
    timeline: Timeline | None  # only on the log's first page
    spend: Spend
    family: Family
    config: v.Stored
    result: v.Stored | None  # what the run completed with (None: nothing, or not completed)
    checkpoints: list[v.CheckpointView]
    checkpoint_count: int
    steps: list[_StepView]
    step_count: int
    timers: tuple[q.TimerRow, ...]
    intents: tuple[q.IntentRow, ...]
    outsider_actions: tuple[q.OutsiderAction, ...]
    streams: list[StreamView]
    more_streams: bool
    model_calls: q.ModelCalls


@attrs.frozen
class StreamView:
    """One stream of the run: its attempts, and its latest attempt's last chunks as text
    (string chunks joined as they are, any other one as a JSON line)."""

    name: str
    chunks: int
    attempts: tuple[q.StreamAttemptRow, ...]
    text: str
    shown: int  # how many chunks ``text`` holds
    first_shown: object  # the offset of the first of them
    cut: bool  # whether a chunk was cut (to STREAM_CHUNK_CHARS)
    command: str  # the command that prints it all


def _streams(conn: Any, run_id: str) -> tuple[tuple[q.StreamRow, tuple[q.StreamChunkRow, ...]], ...]:
    """The run's first streams, each with the last chunks of its latest attempt (bounded)."""
    found: list[tuple[q.StreamRow, tuple[q.StreamChunkRow, ...]]] = []
    for stream in q.list_streams(conn, run_id, limit=STREAMS_SHOWN + 1):
        last = stream.attempts[-1]
        tail: tuple[q.StreamChunkRow, ...] = ()
        if len(found) < STREAMS_SHOWN and type(last.first_offset) is int and type(last.next_offset) is int:
            after = max(last.first_offset, last.next_offset - STREAM_TAIL) - 1
            tail = q.list_stream_chunks(
                conn, run_id, stream.name, after=after, limit=STREAM_TAIL, max_chars=STREAM_CHUNK_CHARS
            )
        found.append((stream, tail))
    return tuple(found)


def _stream_view(run_id: str, stream: q.StreamRow, tail: tuple[q.StreamChunkRow, ...]) -> StreamView:
    parts = []
    for chunk in tail:
        if chunk.truncated:
            parts.append(f"{chunk.data}… ({chunk.size:,} characters)\n")
            continue
        value = q.json_value(chunk.data)
        parts.append(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False) + "\n")
    return StreamView(
        name=stream.name,
        chunks=stream.chunks,
        attempts=stream.attempts,
        text="".join(parts),
        shown=len(tail),
        first_shown=tail[0].offset if tail else None,
        cut=any(chunk.truncated for chunk in tail),
        command=f"zincir stream {run_id} {shlex.quote(stream.name)}",
    )


def run_context(view: RunPageData, query: EventsQuery, now: int) -> dict[str, Any]:
    """The names ``run.html`` renders one run with."""
    run = view.run
    cards = [v.with_interruption(run, card, now) for card in v.checkpoint_views(run.id, view.checkpoints)]
    live = run.status in v.LIVE
    later = query.after is not None or query.before is not None
    tabs = _tabs(run.id, query, later)
    steps = [
        _StepView(
            s,
            None
            if s.result is None
            else v.Stored(s.result, s.truncated, s.result_size, v.step_api_url(run.id, s)),
        )
        for s in view.steps[:LIST_LIMIT]
    ]
    page = RunPageView(
        run=run,
        refresh=Refresh(
            live,
            live and query.refresh != "off",
            REFRESH_SECONDS,
            query.url(run.id, refresh="off"),
            query.url(run.id, refresh=None),
        ),
        lease=_lease_line(run, now),
        tabs=tabs,
        waits=Waits(view.awaiting, _wait_lines(view.awaiting[:LIST_LIMIT]), v.approval_views(view.approvals)),
        conversation=_conversation(view, tabs.mode, now, cards),
        events=_events(view, query),
        timeline=None if later else _timeline(view, now, live),
        spend=_spend(view.budget),
        family=_family(view, query),
        config=v.Stored(run.config, run.config_truncated, run.config_size, v.path("api", "runs", run.id)),
        result=None
        if run.result is None
        else v.Stored(run.result, run.result_truncated, run.result_size, v.path("api", "runs", run.id)),
        checkpoints=cards,
        checkpoint_count=len(view.checkpoints),
        steps=steps,
        step_count=len(view.steps),
        timers=view.timers,
        intents=view.intents,
        outsider_actions=view.outsider_actions,
        streams=[_stream_view(run.id, stream, tail) for stream, tail in view.streams[:STREAMS_SHOWN]],
        more_streams=len(view.streams) > STREAMS_SHOWN,
        model_calls=view.model_calls,
    )
    return {"view": page, "now": now, "limit": LIST_LIMIT, "scan_window": q.SCAN_WINDOW}


def _lease_line(run: q.RunDetail, now: int) -> LeaseLine:
    state, delta = None, ""
    if run.lease_owner is not None and type(run.lease_expires_at) is int:
        left = run.lease_expires_at - now
        state, delta = ("active" if left > 0 else "expired"), human_delta(left)
    if run.status in v.TERMINAL:
        next_attempt = "ended"
    elif run.next_attempt_at is None:
        next_attempt = "awaits"
    elif type(run.next_attempt_at) is int and run.next_attempt_at <= 0:
        next_attempt = "any"
    else:
        next_attempt = "at"
    return LeaseLine(state, delta, next_attempt)


def _tabs(run_id: str, query: EventsQuery, later: bool) -> Tabs:
    base = v.path("runs", run_id)
    return Tabs(
        mode="events" if query.view == "events" else "conversation",
        page_url=base,
        later_page=later,
        top_url=query.url(run_id, after=None, before=None),
        conversation_url=v.fragment(v.url(base, {"refresh": query.refresh}), "views"),
        raw_url=v.fragment(v.url(base, {"view": "events", "refresh": query.refresh}), "views"),
    )


def _wait_lines(awaiting: Iterable[q.Awaiting]) -> list[WaitLine]:
    lines = []
    for a in awaiting:
        if a.kind == "signal":
            lines.append(WaitLine(a, a.kind, f"signal {a.target!r} (wait {a.name!r})", None, ""))
        elif a.kind == "approval":
            lines.append(WaitLine(a, a.kind, f"approval of tool call {a.name!r} ({a.target})", None, ""))
        elif a.kind == "child":
            ref = v.run_ref(a.name)
            lines.append(WaitLine(a, a.kind, f"child run {a.name} to end", ref.url, "open it"))
        elif a.kind == "budget":
            lines.append(WaitLine(a, a.kind, f"its budget to be raised ({a.name} reached)", None, ""))
        else:
            lines.append(WaitLine(a, a.kind, f"sleep {a.name!r} to end", None, ""))
    return lines


def _conversation(view: RunPageData, mode: str, now: int, cards: list[v.CheckpointView]) -> Conversation:
    if mode != "conversation":
        return Conversation([], False)
    run = view.run
    row = view.candidate
    candidate = (
        None
        if row is None
        else Candidate(row.tool_call_id, row.round, q.verification_interrupted(run, row, now))
    )
    ctx = Context(
        run.id,
        view.outcomes,
        {c.row.round: c for c in cards},
        frozenset(a.name for a in view.awaiting if a.kind == "approval"),
        decided_on_page(view.events.events),
        {c.id: c.status for c in run.children},
        view.restarts,
        view.reconciled,
        candidate,
        None if view.model_calls.open is None else view.model_calls.open.mark_seq,
    )
    return Conversation(entries(ctx, view.events.events), not view.events.has_after)


def _timeline(view: RunPageData, now: int, live: bool) -> Timeline | None:
    return timeline(
        run=view.run,
        now=now,
        marks=view.marks,
        earlier=view.earlier,
        intents=view.window_intents,
        steps=view.steps[:LIST_LIMIT],
        timers=view.timers[:LIST_LIMIT],
        waits=view.waits,
        checkpoints=view.checkpoints[:LIST_LIMIT],
        live=live,
    )


def _spend(usage: q.Usage | None) -> Spend:
    if usage is None:
        return Spend(None, "", [], [], False)
    bars = budget_bars(usage)
    return Spend(usage, q.spend_text(usage), v.budget_rows(usage), bars, any(b.over for b in bars))


def _family(view: RunPageData, query: EventsQuery) -> Family:
    run = view.run
    below = {node.run.id: node for node in view.descendants.children}
    children = [
        v.TreeNode(v.run_ref(c.id, c.status, c.role), v.tree_nodes(below.get(c.id)), _more(below.get(c.id)))
        for c in run.children
    ]
    nav = []
    first_url = None
    if run.children:
        if query.children_after is not None:
            nav.append(v.Link("⇤ First children", v.fragment(query.url(run.id), "family")))
        if run.children_next is not None:
            more = query.url(run.id, children_after=run.children_next.encode())
            nav.append(v.Link("More children →", v.fragment(more, "family")))
    elif query.children_after is not None:
        first_url = v.fragment(query.url(run.id), "family")
    source = None
    if run.forked_from is not None:
        ref = v.run_ref(run.forked_from)
        source = ForkLine(ref, v.seq_ref(ref.id, run.fork_seq), diff_url(run.forked_from, run.id))
    forks = [
        ForkLine(
            v.run_ref(f.run.id, f.run.status, f.run.role),
            v.seq_ref(run.id, f.fork_seq),
            diff_url(run.id, f.run.id),
        )
        for f in run.forks
    ]
    return Family(
        ancestors=[v.run_ref(a.id, a.status, a.role) for a in view.ancestors],
        parent=v.run_ref(run.parent_run_id) if run.parent_run_id else None,
        children=children,
        nav=nav,
        first_url=first_url,
        source=source,
        forks=forks,
        forks_more=run.forks_more,
    )


def diff_url(a: str, b: str) -> str:
    """The diff page of two runs."""
    return v.url(v.path("diff"), {"a": a, "b": b})


def _more(node: q.FamilyNode | None) -> int:
    return 0 if node is None else node.more


def _events(view: RunPageData, query: EventsQuery) -> Events:
    run_id = view.run.id
    page = view.events
    scanning = page.scan_edge is not None

    def link(label: str, **changes: Any) -> v.Link:
        return v.Link(label, v.fragment(query.url(run_id, **changes), "events"))

    nav = []
    if page.has_before:
        nav.append(link("⇤ First", after=None, before=None))
        if page.prev_before is not None:
            back = scanning and page.prev_before == page.scan_edge
            nav.append(
                link("← Continue scanning" if back else "← Previous", after=None, before=page.prev_before)
            )
    if page.has_after:
        if page.next_after is not None:
            onward = scanning and page.next_after == page.scan_edge
            nav.append(
                link("Continue scanning →" if onward else "Next →", after=page.next_after, before=None)
            )
        nav.append(link("Latest ⇥", after=None, before=q.LATEST))
    rows = []
    for event in page.events:
        api = v.path("api", "runs", run_id, "events", q.encode_key(event.seq)) if event.truncated else None
        rows.append(
            _EventView(
                event, v.anchor(event.seq), v.Stored(event.payload, event.truncated, event.payload_size, api)
            )
        )
    return Events(
        page=page,
        rows=rows,
        types=view.types,
        type=query.type,
        action=v.fragment(v.path("runs", run_id), "events"),
        hidden=[("refresh", "off")] if query.refresh == "off" else [],
        nav=nav,
    )
