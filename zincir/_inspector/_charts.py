"""Geometry for the inspector's server-rendered SVG pictures (plain numbers and labels).

The templates draw these as inline SVG (no script, nothing remote); every label is text that
Jinja2 escapes. Three pictures: a run's timeline, its spend against its budget, and the runs
page's runs by status over time.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .. import _queries as q
from ._reads import Activity, Intent, Mark, WaitSpan
from ._render import duration, iso_time

LABEL_WIDTH = 96
PLOT_WIDTH = 880
LANE_HEIGHT = 22
#: Marks drawn per lane at most (the latest ones); the picture says when it drew fewer.
LANE_CAP = 250


@attrs.frozen
class Bar:
    lane: int
    x: float
    width: float
    cls: str
    label: str


@attrs.frozen
class Point:
    lane: int
    x: float
    cls: str
    label: str


@attrs.frozen
class Rule:
    x: float
    cls: str
    label: str


@attrs.frozen
class Tick:
    x: float
    label: str


@attrs.frozen
class Timeline:
    width: int
    height: int
    plot_left: int
    lanes: tuple[tuple[str, float], ...]  # name, y of the lane's middle
    bars: tuple[Bar, ...]
    points: tuple[Point, ...]
    rules: tuple[Rule, ...]
    ticks: tuple[Tick, ...]
    note: str
    lane_height: int = LANE_HEIGHT


LANES = ("model", "tools", "steps", "sleeps", "waits", "checkpoints", "restarts")


def _ints(*values: object) -> bool:
    return all(type(v) is int for v in values)


class _Scale:
    def __init__(self, start: int, end: int) -> None:
        self.start, self.span = start, max(end - start, 1)

    def x(self, ms: object) -> float:
        if type(ms) is not int:
            return float(LABEL_WIDTH)
        fraction = min(max((ms - self.start) / self.span, 0.0), 1.0)
        return round(LABEL_WIDTH + fraction * PLOT_WIDTH, 1)

    def bar(self, lane: int, start: object, end: object, cls: str, label: str) -> Bar:
        left, right = self.x(start), self.x(end)
        return Bar(lane, left, round(max(right - left, 2.0), 1), cls, label)


def timeline(
    *,
    run: q.RunDetail,
    now: int,
    marks: Sequence[Mark],
    earlier: bool,
    intents: Sequence[Intent],
    steps: Sequence[q.StepRow],
    timers: Sequence[q.TimerRow],
    waits: Sequence[WaitSpan],
    checkpoints: Sequence[q.CheckpointRow],
    live: bool,
) -> Timeline | None:
    times = [m.at for m in marks if type(m.at) is int]
    start = times[0] if earlier and times else run.created_at
    if type(start) is not int:
        return None
    end_candidates = [*times, run.updated_at] if not live else [now]
    end = max([t for t in end_candidates if type(t) is int] or [start + 1])
    scale = _Scale(start, end)
    at = {m.seq: m.at for m in marks}
    bars: list[Bar] = []
    points: list[Point] = []
    rules: list[Rule] = []
    cut: set[str] = set()

    previous: object = None
    model = []
    for m in marks:
        if m.type == "llm_call" and _ints(previous, m.at):
            took = m.at - previous  # type: ignore[operator]
            model.append(
                scale.bar(
                    0,
                    previous,
                    m.at,
                    "model",
                    f"model response #{m.seq}: {duration(took)} since the event before",
                )
            )
        previous = m.at
    bars += _capped(_merged(model, "model responses"), "model", cut)

    tools = []
    for i in intents:
        began = i.last_started_at if type(i.last_started_at) is int else at.get(i.intent_seq)
        if type(began) is not int:
            continue
        ended = at.get(i.result_seq) if i.result_seq is not None else None
        if i.result_seq is None:
            tools.append(
                scale.bar(
                    1, began, now if live else end, "tool open", f"{i.name} ({i.call_id}): no result yet"
                )
            )
        elif type(ended) is int:
            tools.append(
                scale.bar(1, began, ended, "tool", f"{i.name} ({i.call_id}): {duration(ended - began)}")
            )
    bars += _capped(tools, "tools", cut)

    step_bars = []
    for s in steps:
        if type(s.started_at) is not int or s.started_at < start:
            continue
        done = type(s.completed_at) is int
        finish = s.completed_at if done else (now if live else end)
        took = f"{duration(finish - s.started_at)}" if type(finish) is int else ""
        step_bars.append(
            scale.bar(2, s.started_at, finish, f"step s-{s.status}", f"step {s.name}: {s.status}, {took}")
        )
    bars += _capped(step_bars, "steps", cut)

    sleeps = []
    for t in timers:
        if not _ints(t.created_at, t.wake_at) or t.wake_at < start:  # type: ignore[operator]
            continue
        cls = "sleep" if t.completed_at is not None else "sleep open"
        sleeps.append(
            scale.bar(3, t.created_at, t.wake_at, cls, f"sleep {t.name} until {iso_time(t.wake_at)}")
        )
    bars += _capped(sleeps, "sleeps", cut)

    spans = []
    for w in waits:
        if type(w.since) is not int:
            continue
        is_open = w.ended is None
        finish = w.ended if not is_open else (now if live else end)
        if type(finish) is int and finish < start:
            continue
        what = {
            "signal": f"signal {w.target} (wait {w.name})",
            "approval": f"approval of call {w.name} ({w.target})",
        }.get(w.kind, f"child run {w.name}")
        state = "open" if is_open else "timed out" if w.timed_out else "answered"
        until = f", until {iso_time(w.until)}" if type(w.until) is int else ""
        spans.append(
            scale.bar(
                4, w.since, finish, f"wait w-{w.kind}{' open' if is_open else ''}", f"{what}: {state}{until}"
            )
        )
        if is_open and type(w.until) is int:
            points.append(Point(4, scale.x(w.until), "deadline", f"deadline of {what}: {iso_time(w.until)}"))
    bars += _capped(spans, "waits", cut)

    for c in checkpoints:
        moment = c.decided_at if c.decided_at is not None else c.created_at
        if type(moment) is not int or moment < start:
            continue
        points.append(
            Point(
                5,
                scale.x(moment),
                f"verdict s-{c.status}",
                f"checkpoint round {c.round} (id {c.id}): {c.status}",
            )
        )

    for m in marks:
        if m.type in ("attempt_failed", "lease_taken_over") and type(m.at) is int:
            ok, value = q.parse_json(m.payload or "")
            detail = ""
            if ok and isinstance(value, dict):
                if "from_epoch" in value:
                    detail = f": epoch {value['from_epoch']} fenced"
                elif "error" in value:
                    detail = f": {str(value['error'])[:120]}"
            what = "attempt failed" if m.type == "attempt_failed" else "lease taken over"
            rules.append(Rule(scale.x(m.at), "restart", f"#{m.seq} {what}{detail}"))
            points.append(Point(6, scale.x(m.at), "restart", f"#{m.seq} {what}{detail}"))
        elif m.type in ("budget_exceeded", "loop_detected", "no_progress") and type(m.at) is int:
            points.append(Point(6, scale.x(m.at), "limit", f"#{m.seq} {m.type.replace('_', ' ')}"))

    ticks = tuple(Tick(scale.x(t), _tick_label(t, end - start)) for t in _tick_times(start, end))
    lanes = tuple((name, 14 + LANE_HEIGHT * (i + 0.5)) for i, name in enumerate(LANES))
    window = f"the latest {len(marks):,} events" if earlier else "the whole run"
    note = f"{window}, {iso_time(start)} to {iso_time(end)}; epoch {run.lease_epoch} now"
    if cut:
        note += f"; only the latest {LANE_CAP} marks drawn in {', '.join(sorted(cut))}"
    return Timeline(
        LABEL_WIDTH + PLOT_WIDTH + 10,
        int(14 + LANE_HEIGHT * len(LANES) + 18),
        LABEL_WIDTH,
        lanes,
        tuple(bars),
        tuple(points),
        tuple(rules),
        ticks,
        note,
    )


def _merged(items: list[Bar], what: str, gap: float = 1.5) -> list[Bar]:
    """Bars (in x order) closer than ``gap`` pixels drawn as one, labelled with their count:
    a long run's responses are denser than the picture's pixels."""
    merged: list[Bar] = []
    group: list[Bar] = []

    def flush() -> None:
        if len(group) == 1:
            merged.append(group[0])
        elif group:
            first, last = group[0], group[-1]
            right = max(b.x + b.width for b in group)
            label = f"{len(group)} {what}: {first.label.split(':')[0]} to {last.label.split(':')[0]}"
            merged.append(Bar(first.lane, first.x, round(right - first.x, 1), first.cls, label))
        group.clear()

    for bar in items:
        if group and bar.x > max(b.x + b.width for b in group[-1:]) + gap:
            flush()
        group.append(bar)
    flush()
    return merged


def _capped(items: list[Bar], lane: str, cut: set[str]) -> list[Bar]:
    if len(items) > LANE_CAP:
        cut.add(lane)
        return items[-LANE_CAP:]
    return items


def _tick_times(start: int, end: int, count: int = 6) -> list[int]:
    step = max((end - start) // (count - 1), 1)
    return [start + i * step for i in range(count)]


def _tick_label(ms: int, span: int) -> str:
    stamp = iso_time(ms) or ""
    if span < 86_400_000:
        return stamp[11:19]
    return stamp[5:16].replace("T", " ")


# --------------------------------------------------------------------------- budget


@attrs.frozen
class BudgetBar:
    name: str
    spent: str
    limit: str
    fraction: float  # 0..1, drawn
    over: bool
    y: int
    fill_width: float


BAR_WIDTH = 420


def budget_bars(usage: q.Usage) -> list[BudgetBar]:
    spent, limits = usage.spent, usage.limits
    rows = [
        ("tokens", spent.tokens, limits.tokens),
        ("input tokens", spent.input_tokens, limits.input_tokens),
        ("output tokens", spent.output_tokens, limits.output_tokens),
        ("cost", spent.cost, limits.cost),
        ("model calls", spent.model_calls, limits.model_calls),
        ("tool calls", spent.tool_calls, limits.tool_calls),
        ("wall time (s)", round(spent.wall_time, 1), limits.wall_time),
        ("identical tool calls", spent.identical_tool_calls, limits.max_identical_tool_calls),
        (
            "responses without progress",
            spent.responses_without_progress,
            limits.max_responses_without_progress,
        ),
    ]
    bars = []
    for name, used, limit in rows:
        if limit is None:
            continue
        fraction = used / limit if limit else 1.0
        shown = min(max(fraction, 0.0), 1.0)
        bars.append(
            BudgetBar(
                name,
                _number(used),
                _number(limit),
                round(fraction, 4),
                used >= limit,
                0,
                round(shown * BAR_WIDTH, 1),
            )
        )
    return [attrs.evolve(b, y=i * 24) for i, b in enumerate(bars)]


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.4g}"


# --------------------------------------------------------------------------- runs by status


@attrs.frozen
class Column:
    x: float
    label: str
    segments: tuple[tuple[str, float, float, int], ...]  # status, y, height, count


@attrs.frozen
class StatusChart:
    width: int
    height: int
    columns: tuple[Column, ...]
    column_width: float
    note: str
    legend: tuple[tuple[str, int], ...]


CHART_BUCKETS = 24
CHART_HEIGHT = 80


def status_chart(found: Activity | None, statuses: Sequence[str], total: int) -> StatusChart | None:
    """Stacked columns of runs by status, oldest bucket of last activity on the left."""
    if found is None or not found.counts:
        return None
    counts: list[dict[str, int]] = [{} for _ in range(found.buckets)]
    for status, bucket, n in found.counts:
        counts[bucket][status] = counts[bucket].get(status, 0) + n
    peak = max(sum(c.values()) for c in counts) or 1
    column_width = 700 / found.buckets
    width = (found.newest - found.oldest + 1) / found.buckets
    columns = []
    for i, bucket_counts in enumerate(counts):
        y = float(CHART_HEIGHT)
        segments = []
        for status in [*statuses, *sorted(set(bucket_counts) - set(statuses))]:
            n = bucket_counts.get(status, 0)
            if not n:
                continue
            height = round(n / peak * (CHART_HEIGHT - 4), 1)
            y -= height
            segments.append((status, round(y, 1), height, n))
        start = found.oldest + int(i * width)
        columns.append(Column(round(i * column_width, 1), f"{iso_time(start)}", tuple(segments)))
    legend = tuple(
        (s, sum(c.get(s, 0) for c in counts)) for s in statuses if any(c.get(s, 0) for c in counts)
    )
    shown = sum(n for _, _, n in found.counts)
    note = (
        f"the {shown:,} most recently active runs" if shown < total else f"all {shown:,} runs"
    ) + f", by status, per {duration(int(width))} of last activity, since {iso_time(found.oldest)}"
    return StatusChart(700, CHART_HEIGHT + 16, tuple(columns), round(column_width - 2, 1), note, legend)
