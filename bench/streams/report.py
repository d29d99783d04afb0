"""Render ``python -m bench.streams``'s results: Markdown, and what its chart shows
(``bench/harness/charts.py`` draws it). Every figure and every verdict comes from the run's JSON."""

from __future__ import annotations

from typing import Any

from ..harness.charts import Bar, Chart, Group, Mark, Panel
from ..harness.reports import generated, machine_lines, met

NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
COLORS = {"sqlite": "#1f77b4", "postgresql": "#9467bd"}


def _ms(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def conclusions(res: dict[str, Any]) -> list[str]:
    lines = []
    for backend, lat in res["latency"].items():
        lines.append(
            f"- **Latency, {NAMES[backend]}**, send in one process → the chunk read by a follower in"
            f" another: p50 **{_ms(lat['p50_ms'])} ms**, p99 {_ms(lat['p99_ms'])} ms, against the target"
            f" p50 ≤ {lat['target_ms']:g} ms (the flush interval + 15 ms):"
            f" {met(lat['p50_ms'] <= lat['target_ms'])}."
        )
    for backend, tp in res["throughput"].items():
        one, many = tp["one"], tp["many"]
        lines.append(
            f"- **Throughput, {NAMES[backend]}**: one stream {one['chunks_per_s']:,.0f} chunks/s"
            f" ({one['chunks']:,} chunks in {one['flushes']:,} flushes);"
            f" {many['streams']} streams at once {many['chunks_per_s']:,.0f} chunks/s in all"
            f" ({many['chunks']:,} chunks in {many['flushes']:,} flushes, {many['commits']:,} commits)."
        )
    for backend, paced in res["commits"].items():
        lines.append(
            f"- **Commits, {NAMES[backend]}**: {paced['streams']} streams offering"
            f" {paced['chunks_per_s']:,.0f} chunks/s cost {paced['flushes_per_s']:,.0f} flushes/s and"
            f" {paced['commits_per_s']:,.0f} commits/s (the flush interval bounds the flushes at"
            f" {paced['bound_per_s']:,.0f}/s: one per stream per interval), a commit per"
            f" {paced['chunks'] / max(1, paced['commits']):,.0f} chunks."
        )
    return lines


def render(res: dict[str, Any], chart_name: str) -> str:
    sizes = res["sizes"]
    lines: list[str] = []
    add = lines.append
    add("# Durable streams: throughput, commits and live latency (issue 36)")
    add("")
    add(generated(res, also=" (or `--render` the JSON beside this file)"))
    add("")
    add(f"![throughput and latency of zincir's streams]({chart_name})")
    add("")
    add("## Reading the numbers")
    add("")
    lines.extend(conclusions(res) or ["- Nothing was measured."])
    add("")
    add("## Latency: `send` in one process → the chunk in a follower in another")
    add("")
    add(
        f"A writer process owns a run and sends {sizes['latency_chunks']:,} chunks through"
        f" `run.stream('tokens', flush_interval={sizes['flush_interval']:g})`, each after a gap drawn"
        f" uniformly from 0 to {sizes['latency_gap_ms']:g} ms (about"
        f" {2000 / sizes['latency_gap_ms']:,.0f} chunks/s, an LLM's tokens), each carrying"
        " `time.monotonic()` taken just before its `send`. A follower process reads the stream with"
        " `zincir.read_stream(db, run_id, 'tokens', follow=True)` and notes the time each chunk"
        f" arrives. The first {sizes['warmup_chunks']} chunks are a warm-up, discarded."
    )
    add("")
    add("| backend | samples | p50 | p90 | p99 | min | max | target p50 | |")
    add("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for backend, lat in res["latency"].items():
        add(
            f"| {NAMES[backend]} | {len(lat['samples_ms']):,} | {_ms(lat['p50_ms'])} | {_ms(lat['p90_ms'])}"
            f" | {_ms(lat['p99_ms'])} | {_ms(lat['min_ms'])} | {_ms(lat['max_ms'])} | ≤ {lat['target_ms']:g}"
            f" | {met(lat['p50_ms'] <= lat['target_ms'])} |"
        )
    add("")
    add(
        "A chunk waits in the writer's buffer until the next flush: at most one per flush interval,"
        " so with chunks arriving steadily, half an interval on average; then a commit, then the"
        " wake-up (PostgreSQL: NOTIFY sent with the commit; SQLite: the follower's watcher thread,"
        " which looks at the file's change counter every 5 ms), then the follower's read."
    )
    add("")
    add("## Throughput and commits")
    add("")
    add(
        f"Chunks of {len(sizes['chunk_text']) + 2} bytes of JSON sent as fast as one writer process can:"
        f" through one stream ({sizes['one_stream_chunks']:,} chunks), and through"
        f" {sizes['many_streams']} streams of {sizes['many_streams']} runs at once"
        f" ({sizes['many_stream_chunks']:,} chunks each). Timed from the first `send` until the last"
        " stream's block ended (its last chunk stored). Flushes: `flush_stream` writes, each one"
        " fenced transaction's worth of chunks of one stream; commits: the database's group commits"
        " (several flushes of different streams share one), the runs' ends included."
    )
    add("")
    add("| backend | streams | chunks | seconds | chunks/s | flushes | commits |")
    add("|---|---:|---:|---:|---:|---:|---:|")
    for backend, tp in res["throughput"].items():
        for part in (tp["one"], tp["many"]):
            add(
                f"| {NAMES[backend]} | {part['streams']} | {part['chunks']:,} | {part['seconds']:.2f}"
                f" | {part['chunks_per_s']:,.0f} | {part['flushes']:,} | {part['commits']:,} |"
            )
    add("")
    add(
        f"Paced: {sizes['many_streams']} streams each sending {sizes['paced_rate']:g} chunks/s for"
        f" {sizes['paced_seconds']:g} s with `flush_interval={sizes['flush_interval']:g}`."
    )
    add("")
    add("| backend | chunks/s offered | flushes/s | bound on flushes/s | commits/s | chunks per commit |")
    add("|---|---:|---:|---:|---:|---:|")
    for backend, paced in res["commits"].items():
        add(
            f"| {NAMES[backend]} | {paced['chunks_per_s']:,.0f} | {paced['flushes_per_s']:,.0f}"
            f" | {paced['bound_per_s']:,.0f} | {paced['commits_per_s']:,.0f}"
            f" | {paced['chunks'] / max(1, paced['commits']):,.0f} |"
        )
    add("")
    add("## Machine and server")
    add("")
    lines += machine_lines(res["machine"])
    server = res.get("server")
    if server:
        where = (
            "the server given with `--url`" if res.get("external_server") else "a throwaway server (fsync=on)"
        )
        add(
            f"- PostgreSQL {server.get('server_version', '?')}: {where}; "
            + ", ".join(f"{k}={server[k]}" for k in server if k != "server_version")
        )
    add(
        f"- Load average {res['loadavg_start'][0]:.1f} at the start, {res['loadavg_end'][0]:.1f} at the"
        f" end on {res['machine']['cpu_count']} cores: the machine is shared, so tails (p99) are noisy."
    )
    add("")
    return "\n".join(lines)


def chart(res: dict[str, Any]) -> Chart:
    """Latency per backend (p50 solid, p99 behind) with the target; throughput per backend."""
    latency = [
        Bar(
            NAMES[b],
            lat["p50_ms"],
            COLORS[b],
            behind=lat["p99_ms"],
            text=f"{_ms(lat['p50_ms'])} / {_ms(lat['p99_ms'])}",
        )
        for b, lat in res["latency"].items()
    ]
    target = [
        Mark(lat["target_ms"], f"{lat['target_ms']:g} ms", "#444")
        for lat in list(res["latency"].values())[:1]
    ]
    panels = []
    if latency:
        panels.append(
            Panel(
                [Group(latency)],
                title="send → follower (ms)",
                note="p50 solid, p99 pale",
                marks=target,
                width=260,
            )
        )
    throughput = [
        Bar(f"{NAMES[b]}, {part['streams']} stream{'s' if part['streams'] > 1 else ''}", part["chunks_per_s"],
            COLORS[b], text=f"{part['chunks_per_s']:,.0f}")
        for b, tp in res["throughput"].items()
        for part in (tp["one"], tp["many"])
    ]  # fmt: skip
    if throughput:
        panels.append(
            Panel([Group(throughput)], title="Throughput", note="chunks/s, higher is better", width=260)
        )
    return Chart("Durable streams: how fast, how live", panels)
