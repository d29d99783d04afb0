"""The Markdown and the chart of ``python -m bench.encryption``."""

from __future__ import annotations

from typing import Any

from ..harness.charts import Bar, Chart, Group, Mark, Panel
from ..harness.reports import generated, load_line, machine_lines, middle_half, ratio

SETTINGS = ("off", "on")
"""Encryption at rest off (no key) and on (``encryption_key=...``)."""

WORKLOADS = {"step": "a small step", "round": "a tool round"}

TARGET = 1.15
"""The most a step may cost with encryption on, as a multiple of its cost off."""

_COLORS = {"off": "#9aa5b1", "on": "#4a7ab5"}


def render(results: dict[str, Any], chart_name: str = "") -> str:
    sizes = results["sizes"]
    lines = [
        "# Encryption at rest: what it costs a step (issue 37)",
        "",
        generated(results),
        "",
        "Two databases per backend, one without encryption (off) and one opened with",
        "`encryption_key=...` (on: every payload AES-256-GCM under the run's own key, see",
        "docs/payloads.md#encryption-and-erasure), and two workloads, each in one run per setting, the",
        "two runs taking turns step by step (which goes first alternates) so that the machine's load",
        "hits both alike:",
        "",
        f"- **a small step**: `run.step` returning `1`, {sizes['steps']:,} per setting (its result is",
        "  encrypted: the smallest write there is);",
        "- **a tool round**: a model response of about 1 KB asking for one tool call, the pending",
        f"  intent read back, and a tool result of about 2 KB, {sizes['rounds']:,} per setting.",
        "",
        f"The median time (and the middle half, p25-p75) and the ratio on / off; the target is {TARGET}",
        "at most.",
        "",
        "| backend | workload | off, µs | on, µs | on / off (medians) | within target |",
        "|---|---|---:|---:|---:|---|",
    ]
    for backend, data in results["backends"].items():
        for workload, name in WORKLOADS.items():
            times = data[workload]
            factor = times["on"]["median"] / times["off"]["median"]
            within = "yes" if factor <= TARGET else "no"
            cells = [backend, name, *(middle_half(times[s]) for s in SETTINGS), ratio(factor), within]
            lines.append(f"| {' | '.join(cells)} |")
    lines += ["", "## The machine", "", *machine_lines(results["machine"]), load_line(results, tails=True)]
    lines += [
        "",
        "The times are measured side by side on a shared machine: the ratio is the figure to read,",
        "not the absolute times. What encryption adds to a write: an HMAC and an AES-GCM pass over",
        "each payload and a base64 text a third larger than the ciphertext; to a read, a lookup of",
        "the run's key row (so that an erasure is seen at once) and the decryption.",
    ]
    if chart_name:
        lines += ["", f"![the cost of a step with encryption on and off]({chart_name})"]
    return "\n".join(lines) + "\n"


def chart(results: dict[str, Any]) -> Chart:
    panels = []
    for workload, name in WORKLOADS.items():
        groups = []
        for backend, data in results["backends"].items():
            us = data[workload]
            bars = [
                Bar(s, us[s]["median"], _COLORS[s], low=us[s]["p25"], high=us[s]["p75"]) for s in SETTINGS
            ]
            target = Mark(us["off"]["median"] * TARGET, f"{TARGET}x off")
            groups.append(Group(bars, title=backend, marks=[target]))
        panels.append(Panel(groups, title=name.capitalize(), note="µs (median, p25-p75), lower is better"))
    return Chart("Encryption at rest: a step on and off", panels)
