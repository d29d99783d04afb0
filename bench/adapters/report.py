"""The Markdown of ``python -m bench.adapters``."""

from __future__ import annotations

from typing import Any

from ..harness.reports import generated, load_line, machine_lines

SERIES = ("record_response (Anthropic)", "za.record", "record_response (OpenAI)", "zo.record")
TARGET = 1.10


def _cell(series: dict[str, Any]) -> str:
    reps = series["reps"]
    return f"{series['median']:.0f} ({min(reps):.0f} to {max(reps):.0f})"


def render(results: dict[str, Any], chart_name: str = "") -> str:
    """The report's Markdown (it has no chart)."""
    lines = [
        "# What the adapters add to `record_response` (issue 38)",
        "",
        generated(results),
        "",
        f"Per SDK and rep, one run of {results['responses']} pairs of responses, one of each pair through",
        "each series, in alternating order; each response's tool call answered; only the recording",
        f"call timed; {results['reps']} reps after a warm-up. µs per response: the median of every call",
        "(the range of the reps' medians).",
        "",
        "| backend | record_response (Anthropic) | `za.record` | ratio | record_response (OpenAI) |"
        f" `zo.record` | ratio | target ≤ {TARGET:.2f} |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for backend, data in results["backends"].items():
        cells, ratios = [], []
        for plain, adapter in ((SERIES[0], SERIES[1]), (SERIES[2], SERIES[3])):
            ratio = data[adapter]["median"] / data[plain]["median"]
            ratios.append(ratio)
            cells += [_cell(data[plain]), _cell(data[adapter]), f"{ratio:.3f}"]
        verdict = "met" if max(ratios) <= TARGET else "missed"
        lines.append(f"| {backend} | {' | '.join(cells)} | {verdict} |")
    lines += [
        "",
        "*record_response*: given exactly what the adapter passes it for that response (the content",
        "blocks or the message as JSON, the tool calls, the stop reason, the usage with model, response",
        "id and cost). *za.record* / *zo.record*: given the SDK's `Message` / `ChatCompletion`, with a",
        "price table; they turn it into those arguments (the SDK's `to_dict`, the tool calls, the",
        "cost) and call `record_response`. The responses: a thinking block of about 700 characters",
        "with a signature of 435, a text block and a `tool_use` block (Anthropic); a message with",
        "content and one function call (OpenAI).",
        "",
        "The conversion alone (the adapter's work with a stand-in run that stores nothing, best of 5",
        f"passes): {results['conversion_alone']['anthropic']:.1f} µs per Anthropic response,"
        f" {results['conversion_alone']['openai']:.1f} µs per OpenAI response.",
        "",
        "## Machine",
        "",
        *machine_lines(results["machine"]),
        load_line(results),
        "",
    ]
    return "\n".join(lines)
