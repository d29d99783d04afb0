"""The Markdown of ``python -m bench.tracing``."""

from __future__ import annotations

from typing import Any

from ..harness.reports import generated, load_line, machine_lines

SERIES = ("off", "on (SDK, no-op exporter)", "on (API no-op provider)")
TARGET = 1.10


def _cell(series: dict[str, Any]) -> str:
    reps = series["reps"]
    return f"{series['median']:.0f} ({min(reps):.0f} to {max(reps):.0f})"


def render(results: dict[str, Any], chart_name: str = "") -> str:
    """The report's Markdown (it has no chart)."""
    off, sdk, api = SERIES
    lines = [
        "# What tracing adds to a step (issue 38)",
        "",
        generated(results),
        "",
        f"Per backend and rep, one database with three runs, one per series, taking {results['steps']}",
        "steps each in turns (rotating order); every step timed; "
        f"{results['reps']} reps after a warm-up. µs per step:",
        "the median of every step (the range of the reps' medians).",
        "",
        f"| backend | {off} | {sdk} | on ÷ off | {api} | ÷ off | target ≤ {TARGET:.2f} | SDK span alone |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for backend, data in results["backends"].items():
        s = data["series"]
        on_ratio = s[sdk]["median"] / s[off]["median"]
        api_ratio = s[api]["median"] / s[off]["median"]
        verdict = "met" if on_ratio <= TARGET else "missed"
        lines.append(
            f"| {backend} | {_cell(s[off])} | {_cell(s[sdk])} | {on_ratio:.3f} | {_cell(s[api])}"
            f" | {api_ratio:.3f} | {verdict} | {data['sdk_span_alone']:.0f} |"
        )
    lines += [
        "",
        "*off*: `open_database(tracing=False)`. *on (SDK, no-op exporter)*: tracing through an",
        "OpenTelemetry SDK `TracerProvider` with a `BatchSpanProcessor` whose exporter drops every",
        "batch: each step's span is made, recorded, ended and queued as in production. *on (API",
        "no-op provider)*: the API's `NoOpTracerProvider`, whose spans record nothing: what zincir's",
        "own instrumentation costs, without the SDK's. A step is `run.step(name, fn)` with a trivial",
        "`fn`, committed durably (SQLite: WAL, synchronous=FULL, on the disk of `--dir`).",
        "*SDK span alone*: µs of the SDK's own span as a step's is made (two attributes, made",
        "current, ended), in a loop in the same process after the reps: the median. It is what the",
        "SDK adds to each step before anything else runs.",
        "",
        "## Machine",
        "",
        *machine_lines(results["machine"]),
        load_line(results),
        "",
    ]
    return "\n".join(lines)
