"""The Markdown of ``python -m bench.tracing``."""

from __future__ import annotations

from typing import Any

from ..harness.reports import generated, load_line, machine_lines

SERIES = (
    "off",
    "on (SDK, no-op exporter)",
    "on (SDK, sampled out)",
    "on (API no-op provider)",
    "off + a bare SDK span",
)
TARGET = 1.10


def _cell(series: dict[str, Any]) -> str:
    reps = series["reps"]
    return f"{series['median']:.0f} ({min(reps):.0f} to {max(reps):.0f})"


def render(results: dict[str, Any], chart_name: str = "") -> str:
    """The report's Markdown (it has no chart)."""
    off, sdk, sampled_out, api, bare = SERIES
    lines = [
        "# What tracing adds to a step (issue 38)",
        "",
        generated(results),
        "",
        f"Per backend and rep, one database with five runs, one per series, taking {results['steps']}",
        "steps each in turns (rotating order); every step timed; "
        f"{results['reps']} reps after a warm-up. µs per step:",
        "the median of every step (the range of the reps' medians); each series ÷ off.",
        "",
        f"| backend | {off} | {sdk} | ÷ off | target ≤ {TARGET:.2f} | {sampled_out} | ÷ off"
        f" | {api} | ÷ off | {bare} | ÷ off | SDK on ÷ bare |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for backend, data in results["backends"].items():
        s = data["series"]
        base = s[off]["median"]
        on_ratio = s[sdk]["median"] / base
        verdict = "met" if on_ratio <= TARGET else "missed"
        lines.append(
            f"| {backend} | {_cell(s[off])} | {_cell(s[sdk])} | {on_ratio:.3f} | {verdict}"
            f" | {_cell(s[sampled_out])} | {s[sampled_out]['median'] / base:.3f}"
            f" | {_cell(s[api])} | {s[api]['median'] / base:.3f}"
            f" | {_cell(s[bare])} | {s[bare]['median'] / base:.3f}"
            f" | {s[sdk]['median'] / s[bare]['median']:.3f} |"
        )
    lines += [
        "",
        "*off*: `open_database(tracing=False)`. *on (SDK, no-op exporter)*: tracing through an",
        "OpenTelemetry SDK `TracerProvider` with a `BatchSpanProcessor` whose exporter drops every",
        "batch: each step's span is made, recorded, ended and queued as in production. *on (SDK,",
        "sampled out)*: the same SDK with the `ALWAYS_OFF` sampler: a run that a ratio sampler did",
        "not pick (zincir asks the sampler about each attempt, and makes nothing inside one sampled",
        "out). *on (API no-op provider)*: the API's `NoOpTracerProvider`, whose spans record",
        "nothing: zincir's own instrumentation without the SDK's. *off + a bare SDK span*: tracing",
        "off, and the bench wraps each `run.step` in one SDK span of its own (two attributes, made",
        "current, ended), in the same loop: what the SDK charges for one span per step, caches as",
        "cold as a real step leaves them. *SDK on ÷ bare*: what zincir adds beyond that span. A step",
        "is `run.step(name, fn)` with a trivial `fn`, committed durably (SQLite: WAL,",
        "synchronous=FULL, on the disk of `--dir`).",
        "",
        "## Machine",
        "",
        *machine_lines(results["machine"]),
        load_line(results),
        "",
    ]
    return "\n".join(lines)
