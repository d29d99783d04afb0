"""Render ``python -m bench.prune``'s results: Markdown, and what its chart shows
(``bench/harness/charts.py`` draws it). Every figure and every verdict comes from the run's JSON."""

from __future__ import annotations

import math
from typing import Any

from ..harness.charts import Bar, Chart, Group, Mark, Panel
from ..harness.reports import generated, load_line, machine_lines, met, server_line

NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
TARGET = 2.0  # the writer's p99 during the prune, at most this times its p99 without


def _pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def figures(data: dict[str, Any]) -> dict[str, float]:
    """What a backend's run comes to: throughput, and the writer without and during the prune."""
    ms = data["writer_ms"]
    without = ms["before"] + ms["after"]
    seconds = max(data["seconds"], 1e-9)
    return {
        "runs_per_s": data["runs"] / seconds,
        "rows_per_s": data["total_rows"] / seconds,
        "p50_without": _pct(without, 0.5),
        "p99_without": _pct(without, 0.99),
        "p50_during": _pct(ms["during"], 0.5),
        "p99_during": _pct(ms["during"], 0.99),
        "steps_without": len(without),
        "steps_during": len(ms["during"]),
    }


def conclusions(res: dict[str, Any]) -> list[str]:
    lines = []
    for backend, data in res["backends"].items():
        f = figures(data)
        ratio = f["p99_during"] / f["p99_without"]
        lines.append(
            f"- **{NAMES[backend]}**: pruned {data['runs']:,} runs ({data['total_rows']:,} rows) in"
            f" {data['seconds']:.1f} s, **{f['runs_per_s']:,.0f} runs/s, {f['rows_per_s']:,.0f} rows/s**,"
            f" in {data['batches']:,} transactions. The live writer's step: p50 {f['p50_without']:.1f} ms"
            f" and p99 {f['p99_without']:.1f} ms without the prune, p50 {f['p50_during']:.1f} ms and"
            f" p99 {f['p99_during']:.1f} ms during it: p99 **{ratio:.2f}x** against the target"
            f" ≤ {TARGET:g}x, {met(ratio <= TARGET)}."
        )
    return lines


def render(res: dict[str, Any], chart_name: str) -> str:
    lines: list[str] = []
    add = lines.append
    add("# Prune: throughput, and a live writer meanwhile")
    add("")
    add(generated(res, full=f"full sizes: {res['runs']:,} runs"))
    add("")
    add(f"![prune throughput and the writer's latency]({chart_name})")
    add("")
    add("## What it shows")
    add("")
    lines += conclusions(res)
    add("")
    add("## How it was measured")
    add("")
    add(
        f"Each backend's database held {res['runs']:,} ended runs, written in bulk with SQL"
        " (`bench/prune/seed.py`): each with 10 events (a state transition, nine model responses of"
        " about 200 bytes), a step, a signal and its audit row; every tenth run has a child it joined"
        " (a family, pruned together). All ended 60 days ago; `zincir.prune(db,"
        " finished_before=now - 30 days)` deleted them in batches (runs per batch in the table),"
        " one transaction each. Meanwhile a writer in another process owned a"
        " live run and made a durable step (`run.step`) every 5 ms; its latency was measured for"
        f" {res['baseline_s']:g} s before the prune, during the whole prune, and for"
        f' {res["baseline_s"]:g} s after ("without" is before and after together).'
    )
    add("")
    add("| backend | runs | rows | seconds | runs/s | rows/s | per batch | batches | size before | after |")
    add("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for backend, data in res["backends"].items():
        f = figures(data)
        add(
            f"| {NAMES[backend]} | {data['runs']:,} | {data['total_rows']:,} | {data['seconds']:.1f}"
            f" | {f['runs_per_s']:,.0f} | {f['rows_per_s']:,.0f} | {data.get('batch_size', res.get('batch'))}"
            f" | {data['batches']:,}"
            f" | {data['bytes_before'] / 1e6:,.1f} MB | {data['bytes_after'] / 1e6:,.1f} MB |"
        )
    add("")
    add("| backend | writer's steps without / during | p50 without | p50 during | p99 without | p99 during |")
    add("|---|---:|---:|---:|---:|---:|")
    for backend, data in res["backends"].items():
        f = figures(data)
        add(
            f"| {NAMES[backend]} | {f['steps_without']:,} / {f['steps_during']:,} | {f['p50_without']:.1f} ms"
            f" | {f['p50_during']:.1f} ms | {f['p99_without']:.1f} ms | {f['p99_during']:.1f} ms |"
        )
    sizing = res.get("sizing")
    if sizing:
        add("")
        add(
            f"Sizing on SQLite (seeded files of 1,000 runs, differing by 20 events or 20 steps per run):"
            f" a run with one event, one step, one signal and its audit row takes"
            f" {sizing['run_bytes']:,.0f} bytes; each further event of a"
            f" ~{sizing['event_payload_bytes']}-byte payload {sizing['event_bytes']:,.0f} bytes;"
            f" each further step {sizing['step_bytes']:,.0f} bytes"
            " (pages and indexes included)."
        )
    add("")
    add("## Machine and server")
    add("")
    lines += machine_lines(res["machine"])
    server = res.get("server")
    if server:
        add(server_line(server, "a throwaway server (fsync=on), or the one given with `--url`"))
    add(load_line(res, tails=True))
    add("")
    return "\n".join(lines)


def chart(res: dict[str, Any]) -> Chart:
    """Runs pruned per second per backend; the writer's p50 (p99 behind) without and during."""
    throughput = []
    latency = []
    for backend, data in res["backends"].items():
        f = figures(data)
        name = NAMES[backend]
        throughput.append(Bar(name, f["runs_per_s"], text=f"{f['runs_per_s']:,.0f} runs/s"))
        latency.append(
            Group(
                [
                    Bar("without", f["p50_without"], "#888", behind=f["p99_without"],
                        text=f"{f['p50_without']:.1f} / {f['p99_without']:.1f}"),
                    Bar("during", f["p50_during"], behind=f["p99_during"],
                        text=f"{f['p50_during']:.1f} / {f['p99_during']:.1f}"),
                ],
                title=name,
                marks=[Mark(TARGET * f["p99_without"], f"{TARGET:g}x p99")],
            )
        )  # fmt: skip
    return Chart(
        "Prune: throughput, and a live writer's step latency",
        [
            Panel([Group(throughput)], title="Prune throughput", note="runs/s, higher is better"),
            Panel(latency, title="Writer's step (ms)", note="p50 solid, p99 pale; target p99 ≤ 2x"),
        ],
    )
