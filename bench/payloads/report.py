"""The Markdown and the chart of ``python -m bench.payloads``."""

from __future__ import annotations

from typing import Any

from ..harness.charts import Bar, Chart, Group, Mark, Panel
from ..harness.reports import generated, load_line, machine_lines, middle_half, ratio

SETTINGS: dict[str, int | None] = {"off": None, "on": 4096}
"""The content store's settings compared: ``content_threshold`` of each."""

_COLORS = {"off": "#9aa5b1", "on": "#4a7ab5"}


def render(results: dict[str, Any], chart_name: str = "") -> str:
    sizes = results["sizes"]
    lines = [
        "# Large values stored once: bytes on disk and the cost of a small step (issue 37)",
        "",
        generated(results),
        "",
        f"**Bytes on disk.** {sizes['runs']} runs, each reading the same {sizes['files']} files of"
        f" {sizes['file_bytes']:,} bytes (random letters and digits) as tool results: one model response",
        "with a tool call per file, then the results. What the database grew by, with the content store",
        "off (`content_threshold=None`: every value inline) and on (the default, 4,096): on, each file is",
        "stored once, and each result is an envelope that refers to it.",
        "",
        "| backend | payload written | store off | store on | on / off |",
        "|---|---:|---:|---:|---:|",
    ]
    for backend, data in results["backends"].items():
        disk = data["disk"]
        off, on = disk["off"]["bytes"], disk["on"]["bytes"]
        written = _mb(disk["off"]["payload_bytes"])
        lines.append(f"| {backend} | {written} | {_mb(off)} | {_mb(on)} | {ratio(on / off)} |")
    lines += [
        "",
        f"**A small step.** `run.step` returning `1`, {sizes['steps']:,} steps in one run per setting, the",
        "two runs taking turns step by step (which goes first alternates), so that the machine's load",
        "hits both alike: the median time of a step and its middle half (p25-p75). A value under the",
        "threshold is stored inline exactly as before the content store; what it adds is one",
        "comparison of the value's length.",
        "",
        "| backend | store off, µs/step | store on, µs/step | on / off (medians) |",
        "|---|---:|---:|---:|",
    ]
    for backend, data in results["backends"].items():
        steps = data["step_us"]
        off, on = steps["off"]["median"], steps["on"]["median"]
        lines.append(
            f"| {backend} | {middle_half(steps['off'])} | {middle_half(steps['on'])} | {ratio(on / off)} |"
        )
    lines += ["", "## The machine", "", *machine_lines(results["machine"]), load_line(results, tails=True)]
    lines += [
        "",
        "The step times are measured side by side on a shared machine: the ratio is the figure to",
        "read, not the absolute times. docs/payloads.md explains the content store.",
    ]
    if chart_name:
        lines += ["", f"![bytes on disk and the cost of a small step]({chart_name})"]
    return "\n".join(lines) + "\n"


def chart(results: dict[str, Any]) -> Chart:
    disk, steps = [], []
    for backend, data in results["backends"].items():
        disk.append(
            Group(
                [Bar(f"store {s}", data["disk"][s]["bytes"] / 1e6, _COLORS[s]) for s in SETTINGS],
                title=backend,
            )
        )
        us = data["step_us"]
        bars = [
            Bar(f"store {s}", us[s]["median"], _COLORS[s], low=us[s]["p25"], high=us[s]["p75"])
            for s in SETTINGS
        ]
        steps.append(Group(bars, title=backend, marks=[Mark(us["off"]["median"], "off")]))
    return Chart(
        "The content store: bytes on disk, and a small step",
        [
            Panel(disk, title="Database growth", note="MB, lower is better"),
            Panel(
                steps,
                title="A small step",
                note="µs per step (median, p25-p75), lower is better",
                labels=False,
            ),
        ],
    )


def _mb(value: float) -> str:
    return f"{value / 1e6:,.1f} MB"
