"""The one chart every report draws: panels of horizontal bars side by side, as a standalone SVG.

Drawn by hand (plain SVG text, no plotting library), so that the benchmarks need nothing beyond
their peers. A chart is data: a report says what to show (:class:`Chart`), :func:`write_chart`
how. A bar may carry a whisker (min to max) and a pale bar behind it (a p99 behind its p50);
a dashed mark shows a target, across a panel or one group of its bars.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path

CHAR_W = 6.6  # the width of a character at 12 px, sans-serif, near enough to lay out labels
ROW, BAR, GROUP_TITLE, GAP = 24, 14, 22, 28  # heights and the space between panels, in px
BLUE = "#4a7ab5"


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    color: str = BLUE
    low: float | None = None  # a whisker from low to high: the spread of the repetitions
    high: float | None = None
    behind: float | None = None  # a pale bar of the same color behind this one
    text: str = ""  # printed past the bar's end


@dataclass(frozen=True)
class Mark:
    value: float  # a dashed line at this value, e.g. a target
    text: str
    color: str = "#c33"


@dataclass(frozen=True)
class Group:
    bars: Sequence[Bar]
    title: str = ""  # a heading above the bars (none when empty)
    marks: Sequence[Mark] = ()  # lines across this group's bars only


@dataclass(frozen=True)
class Panel:
    groups: Sequence[Group]
    title: str = ""
    note: str = ""  # a grey line under the title: the unit, which way is better
    marks: Sequence[Mark] = ()  # lines across the whole panel
    log: bool = False  # a logarithmic axis (values > 0)
    top: float | None = None  # the axis's end (default: a round number past every value)
    labels: bool = True  # False: the bars' labels are those of the panel to the left
    width: float = 300  # of the plot, labels and texts aside


@dataclass(frozen=True)
class Chart:
    title: str
    panels: Sequence[Panel]
    note: str = ""


def write_chart(path: Path, chart: Chart) -> None:
    path.write_text(svg(chart), encoding="utf-8")


def svg(chart: Chart) -> str:
    top = 46 if chart.note else 32
    body = [f'<text x="10" y="20" font-weight="bold">{escape(chart.title)}</text>']
    if chart.note:
        body.append(f'<text x="10" y="36" fill="#555">{escape(chart.note)}</text>')
    x, height = 10.0, float(top)
    for panel in chart.panels:
        label_w = (
            _text_width(bar.label for group in panel.groups for bar in group.bars) + 8 if panel.labels else 0
        )
        drawn, right, bottom = _panel(panel, x, top, label_w)
        body += drawn
        x, height = right + GAP, max(height, bottom)
    width, height = x - GAP + 10, height + 10
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}"'
        f' viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="12">\n'
        f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n"
    )


def _text_width(texts: Iterable[str]) -> float:
    return max((len(text) * CHAR_W for text in texts), default=0.0)


def _panel(panel: Panel, left: float, top: float, label_w: float) -> tuple[list[str], float, float]:
    """The panel's SVG elements, its right edge and its bottom."""
    out: list[str] = []
    y = top
    if panel.title:
        y += 14
        out.append(f'<text x="{left}" y="{y}" font-weight="bold">{escape(panel.title)}</text>')
    if panel.note:
        y += 16
        out.append(f'<text x="{left}" y="{y}" fill="#555">{escape(panel.note)}</text>')
    if panel.title or panel.note or panel.marks:
        y += 18  # room for the marks' texts
    x0 = left + label_w
    scale = _Scale(panel)
    rows_top = y
    rows_bottom = y + sum(GROUP_TITLE * bool(g.title) + ROW * len(g.bars) for g in panel.groups)
    out += _axis(scale, x0, rows_top - 6, rows_bottom)  # first: the bars go over its grid
    spans: list[tuple[Mark, float, float]] = [(m, rows_top, rows_bottom) for m in panel.marks]
    for group in panel.groups:
        if group.title:
            out.append(f'<text x="{left}" y="{y + 16}" font-weight="bold">{escape(group.title)}</text>')
            y += GROUP_TITLE
        group_top = y
        for bar in group.bars:
            out += _bar(bar, x0, y, scale, label_w > 0)
            y += ROW
        spans += [(m, group_top, y) for m in group.marks]
    for mark, start, end in spans:
        at = scale.x(mark.value, x0)
        out.append(
            f'<line x1="{at:.1f}" y1="{start - 6}" x2="{at:.1f}" y2="{end}" stroke="{mark.color}"'
            ' stroke-dasharray="5,3"/>'
        )
        out.append(
            f'<text x="{at + 3:.1f}" y="{start - 8}" font-size="11" fill="{mark.color}">'
            f"{escape(mark.text)}</text>"
        )
    texts = _text_width(bar.text for group in panel.groups for bar in group.bars)
    right = max(x0 + panel.width + texts + 8, left + _text_width([panel.title, panel.note]))
    return out, right, rows_bottom + 20


def _bar(bar: Bar, x0: float, y: float, scale: _Scale, label: bool) -> list[str]:
    out = []
    if label:
        out.append(f'<text x="{x0 - 8:.1f}" y="{y + 16}" text-anchor="end">{escape(bar.label)}</text>')
    top, mid = y + 5, y + 5 + BAR / 2
    if bar.behind is not None:
        out.append(_rect(x0, top, scale.x(bar.behind, x0) - x0, bar.color, ' opacity="0.3"'))
    out.append(_rect(x0, top, scale.x(bar.value, x0) - x0, bar.color, ""))
    end = scale.x(max(v for v in (bar.value, bar.high, bar.behind) if v is not None), x0)
    if bar.low is not None and bar.high is not None and bar.high > bar.low:
        low, high = scale.x(bar.low, x0), scale.x(bar.high, x0)
        out.append(f'<line x1="{low:.1f}" y1="{mid}" x2="{high:.1f}" y2="{mid}" stroke="#222"/>')
        for at in (low, high):
            out.append(f'<line x1="{at:.1f}" y1="{mid - 4}" x2="{at:.1f}" y2="{mid + 4}" stroke="#222"/>')
    if bar.text:
        out.append(
            f'<text x="{end + 6:.1f}" y="{y + 16}" stroke="white" stroke-width="3"'
            f' paint-order="stroke">{escape(bar.text)}</text>'
        )
    return out


def _rect(x: float, y: float, width: float, color: str, extra: str) -> str:
    return f'<rect x="{x:.1f}" y="{y}" width="{max(0.5, width):.1f}" height="{BAR}" fill="{color}"{extra}/>'


def _axis(scale: _Scale, x0: float, top: float, bottom: float) -> list[str]:
    out = [f'<line x1="{x0}" y1="{top}" x2="{x0}" y2="{bottom}" stroke="#888"/>']
    for tick in scale.ticks():
        at = scale.x(tick, x0)
        out.append(f'<line x1="{at:.1f}" y1="{top}" x2="{at:.1f}" y2="{bottom}" stroke="#e4e4e4"/>')
        out.append(
            f'<text x="{at:.1f}" y="{bottom + 14}" text-anchor="middle" fill="#555">{_number(tick)}</text>'
        )
    return out


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 or value == int(value) else f"{value:g}"


class _Scale:
    """Values to x positions across a panel's plot: linear from 0, or logarithmic."""

    def __init__(self, panel: Panel) -> None:
        self.width, self.log = panel.width, panel.log
        values = [
            v
            for group in panel.groups
            for bar in group.bars
            for v in (bar.value, bar.high, bar.behind)
            if v is not None and math.isfinite(v)
        ] + [m.value for m in (*panel.marks, *(m for g in panel.groups for m in g.marks))]
        if self.log:
            positive = [v for v in values if v > 0] or [1.0]
            self.low = 10 ** math.floor(math.log10(min(positive)))
            self.high = panel.top or _nice(max(positive) * 1.05, (1, 2, 5, 10))
        else:
            self.low = 0.0
            self.high = panel.top or _nice(max([*values, 0.0]) * 1.05)

    def x(self, value: float, x0: float) -> float:
        if not math.isfinite(value):
            return x0
        if self.log:
            value = min(max(value, self.low), self.high)
            share = math.log10(value / self.low) / math.log10(self.high / self.low)
        else:
            share = max(0.0, value) / self.high
        return x0 + self.width * share

    def ticks(self) -> list[float]:
        if self.log:
            decades = [self.low * 10**k for k in range(round(math.log10(self.high / self.low)) + 1)]
            return [d for d in decades if d <= self.high * 1.001]
        labels = max(2, int(self.width // 60))  # room for a tick's number every 60 px
        step = _nice(self.high / labels, (1, 2, 2.5, 5, 10))
        return [step * k for k in range(int(self.high / step + 1e-9) + 1)]


def _nice(value: float, steps: Sequence[float] = (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10)) -> float:
    """The smallest of ``steps`` x 10^k at or above ``value``: an axis's round end."""
    if value <= 0:
        return 1.0
    exponent = math.floor(math.log10(value))
    for m in steps:
        if m * 10**exponent >= value * (1 - 1e-9):
            return float(m * 10**exponent)
    return float(10 ** (exponent + 1))
