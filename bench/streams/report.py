"""Render ``python -m bench.streams``'s results: Markdown, and what its chart shows
(``bench/harness/charts.py`` draws it). Every figure and every verdict comes from the run's JSON."""

from __future__ import annotations

from typing import Any

from ..harness.charts import Bar, Chart, Group, Mark, Panel
from ..harness.reports import generated, load_line, machine_lines, met, server_line

NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
COLORS = {"zincir": "#1f77b4", "dbos": "#d62728"}


def label(key: str) -> str:
    """``zincir-sqlite`` as "zincir, SQLite"."""
    system, _, backend = key.partition("-")
    return f"{system}, {NAMES.get(backend, backend)}"


def _ms(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def conclusions(res: dict[str, Any]) -> list[str]:
    lines = []
    for key, lat in res["latency"].items():
        text = (
            f"- **Latency, {label(key)}**, send in one process → the chunk read by a follower in"
            f" another: p50 **{_ms(lat['p50_ms'])} ms**, p99 {_ms(lat['p99_ms'])} ms"
        )
        if lat.get("target_ms") is not None:
            text += (
                f", against the target p50 ≤ {lat['target_ms']:g} ms (the flush interval + 15 ms):"
                f" {met(lat['p50_ms'] <= lat['target_ms'])}"
            )
        lines.append(text + ".")
    for key, tp in res["throughput"].items():
        one, many = tp["one"], tp["many"]
        commits = "" if many.get("commits") is None else f", {many['commits']:,} commits"
        lines.append(
            f"- **Throughput, {label(key)}**: one stream {one['chunks_per_s']:,.0f} chunks/s"
            f" ({one['chunks']:,} chunks in {one['flushes']:,} flushes);"
            f" {many['streams']} streams at once {many['chunks_per_s']:,.0f} chunks/s in all"
            f" ({many['chunks']:,} chunks in {many['flushes']:,} flushes{commits})."
        )
    sizes = res["sizes"]
    for backend, paced in res["commits"].items():
        asked = paced["streams"] * sizes["paced_rate"]
        lines.append(
            f"- **Commits, zincir, {NAMES[backend]}**: {paced['streams']} streams asked to send"
            f" {asked:,.0f} chunks/s sent {paced['chunks_per_s']:,.0f} (from the first chunk until"
            f" the last was stored), which cost {paced['flushes_per_s']:,.0f} flushes/s and"
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
    add("| system, backend | samples | p50 | p90 | p99 | min | max | target p50 | |")
    add("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for key, lat in res["latency"].items():
        target = lat.get("target_ms")
        verdict = "" if target is None else met(lat["p50_ms"] <= target)
        add(
            f"| {label(key)} | {len(lat['samples_ms']):,} | {_ms(lat['p50_ms'])} | {_ms(lat['p90_ms'])}"
            f" | {_ms(lat['p99_ms'])} | {_ms(lat['min_ms'])} | {_ms(lat['max_ms'])}"
            f" | {'-' if target is None else f'≤ {target:g}'} | {verdict} |"
        )
    add("")
    add(
        "A chunk waits in the writer's buffer until the next flush: at most one per flush interval,"
        " so with chunks arriving steadily, half an interval on average; then a commit, then the"
        " wake-up (PostgreSQL: NOTIFY sent with the commit; SQLite: the follower's watcher thread,"
        " which looks at the file's change counter every 5 ms), then the follower's read. DBOS (where"
        " installed) runs the same gaps in a workflow calling `DBOS.write_stream('tokens', value)`"
        " (a transaction each, no buffer) and reads with `DBOS.read_stream(workflow_id, 'tokens')`,"
        " as shipped: on SQLite its reader polls every second"
        " (`notification_listener_polling_interval_sec`), on PostgreSQL a trigger sends NOTIFY."
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
        " (several flushes of different streams share one), the runs' ends included. DBOS sends"
        f" {sizes['dbos_share']:.0%} as many chunks (each is a transaction of its own), through the same"
        " number of streams (workflows started at once)."
    )
    add("")
    add("| system, backend | streams | chunks | seconds | chunks/s | flushes | commits |")
    add("|---|---:|---:|---:|---:|---:|---:|")
    for key, tp in res["throughput"].items():
        for part in (tp["one"], tp["many"]):
            commits = "-" if part.get("commits") is None else f"{part['commits']:,}"
            add(
                f"| {label(key)} | {part['streams']} | {part['chunks']:,} | {part['seconds']:.2f}"
                f" | {part['chunks_per_s']:,.0f} | {part['flushes']:,} | {commits} |"
            )
    add("")
    add(
        f"Paced: {sizes['many_streams']} streams each asked to send {sizes['paced_rate']:g} chunks/s"
        f" for {sizes['paced_seconds']:g} s with `flush_interval={sizes['flush_interval']:g}`, in one"
        " writer process; the rate sent is the chunks over the time from the first chunk until the"
        " last was stored (below the rate asked when the writer's process, on a loaded machine, is"
        " late with its sends)."
    )
    add("")
    add("| zincir on | chunks/s sent | flushes/s | bound on flushes/s | commits/s | chunks per commit |")
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
    if res.get("missing_peers"):
        add(f"- Not installed, so not measured: {', '.join(res['missing_peers'])}")
    versions = sorted(
        {entry["writer"]["version"] for part in ("throughput", "latency") for entry in res[part].values()}
    )
    if versions:
        add(f"- Versions: {'; '.join(versions)}")
    server = res.get("server")
    if server:
        where = (
            "the server given with `--url`" if res.get("external_server") else "a throwaway server (fsync=on)"
        )
        add(server_line(server, where))
    add(load_line(res, tails=True))
    add("")
    return "\n".join(lines)


def chart(res: dict[str, Any]) -> Chart:
    """Latency per system and backend (p50 solid, p99 behind) with the target; throughput."""
    latency = [
        Bar(label(key), lat["p50_ms"], COLORS.get(lat.get("system", "zincir"), "#888"), behind=lat["p99_ms"],
            text=f"{_ms(lat['p50_ms'])} / {_ms(lat['p99_ms'])}")
        for key, lat in res["latency"].items()
    ]  # fmt: skip
    targets = {lat["target_ms"] for lat in res["latency"].values() if lat.get("target_ms") is not None}
    panels = []
    if latency:
        panels.append(
            Panel([Group(latency)], title="send → follower (ms, log scale)", note="p50 solid, p99 pale",
                  marks=[Mark(t, f"{t:g} ms", "#444") for t in sorted(targets)], log=True, width=260)
        )  # fmt: skip
    throughput = [
        Bar(f"{label(key)}, {part['streams']} stream{'s' if part['streams'] > 1 else ''}",
            part["chunks_per_s"], COLORS.get(tp.get("system", "zincir"), "#888"),
            text=f"{part['chunks_per_s']:,.0f}")
        for key, tp in res["throughput"].items()
        for part in (tp["one"], tp["many"])
    ]  # fmt: skip
    if throughput:
        panels.append(
            Panel([Group(throughput)], title="Throughput (log scale)", note="chunks/s, higher is better",
                  log=True, width=260)
        )  # fmt: skip
    return Chart("Durable streams: how fast, how live", panels)
