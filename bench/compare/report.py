"""Render the results as Markdown. Every number here comes from the run that wrote the file."""

from __future__ import annotations

from typing import Any

from ..harness.reports import fmt, generated, median, met, ratio
from ..systems.common import LEDGER_EVERY

CEILING = "raw sqlite3"  # in comparison 2, the batched-insert ceiling


def render(res: dict[str, Any], chart_name: str = "") -> str:
    """The report's Markdown (it has no chart: ``chart_name`` is not used)."""
    sizes = res["sizes"]
    machine = res["machine"]
    settings: dict[str, dict[str, Any]] = res["settings"]
    peers: list[str] = res["peers"]
    lines: list[str] = []
    add = lines.append

    add("# zincir vs DBOS Transact vs LangGraph, on SQLite, side by side")
    add("")
    add(generated(res))
    add("")
    add("## Machine")
    add("")
    add(f"- CPU: {machine['cpu_count']} x {machine['cpu_model']}; kernel {machine['kernel']}")
    add(
        f"- Python {machine['python']} ({machine['python_impl']}); SQLite library {machine['sqlite']}"
        " (every system here goes through Python's `sqlite3` module, so all use this one library)"
    )
    kept = "kept" if res.get("kept") else "a temporary directory, deleted afterwards"
    add(f"- Databases in `{machine['workdir']}` ({kept}) on {machine['filesystem']}")
    if res.get("missing_peers"):
        add(
            f"- Not installed, so not measured: {', '.join(res['missing_peers'])}"
            " (install the `bench` extra in a separate virtualenv, see `bench/README.md`)"
        )
    add("")
    add("## Durability settings each system actually used")
    add("")
    add("Queried with `PRAGMA` on the connection each system writes through, after it opened its file.")
    add("")
    add("| system | version | journal_mode | synchronous | busy_timeout | how a step is committed |")
    add("|---|---|---|---|---|---|")
    for label, s in settings.items():
        add(
            f"| {label} | {s['version']} | {s['journal_mode']} | {s['synchronous']} |"
            f" {s['busy_timeout_ms']} ms | {s['notes']} |"
        )
    add("")

    # -- 1 ----------------------------------------------------------------------------------
    us = {label: median(v) for label, v in res["per_step"]["us_per_step"].items()}
    z = us.get("zincir", float("nan"))
    add(f"## 1. Per-step overhead: one run of {sizes['step_n']:,} sequential no-op durable steps")
    add("")
    add(
        f"Median of {sizes['step_reps']} runs per system after {sizes['warmups']} warm-up run(s), the"
        " systems interleaved (rotated order each repetition), each in its own long-lived process."
        " The time covers the whole run: start, every step, completion."
    )
    add("")
    add("| system | µs/step (median) | min - max | zincir ÷ system (below 1: zincir is faster) |")
    add("|---|---:|---:|---:|")
    for label, values in res["per_step"]["us_per_step"].items():
        add(
            f"| {label} | {fmt(us[label])} | {fmt(min(values))} - {fmt(max(values))} |"
            f" {ratio(z / us[label])} |"
        )
    add("")

    profile = res.get("profile")
    if profile:
        add_profile(add, profile)

    # -- 2 ----------------------------------------------------------------------------------
    sps = {label: median(v) for label, v in res["concurrent"]["steps_per_s"].items()}
    zc = sps.get("zincir", float("nan"))
    add(
        f"## 2. Concurrent runs: {sizes['conc_runs']} runs x {sizes['conc_steps']} steps at once, one process"
    )
    add("")
    add(
        "zincir: one Trio task per run, each with its own `open_run` on one `Database` (group"
        " commit). DBOS: `DBOS.start_workflow` for every run (its thread pool), then every handle's"
        " `get_result()`. LangGraph: one thread per run (`ThreadPoolExecutor`), all sharing one"
        f" `SqliteSaver`. raw sqlite3: the same number of rows of the per-step table, 100 per"
        " transaction (step i of every run, then step i + 1), one connection: the ceiling a group"
        " commit approaches (it starts and completes no runs; zincir's time includes that)."
        f" Median of {sizes['conc_reps']} repetitions after {sizes['warmups']} warm-up(s)."
    )
    add("")
    add("| system | steps/s (median) | min - max | zincir ÷ system (above 1: zincir is faster) |")
    add("|---|---:|---:|---:|")
    for label, values in res["concurrent"]["steps_per_s"].items():
        shown = f"{label}, 100 rows per transaction (the ceiling)" if label == CEILING else label
        add(
            f"| {shown} | {fmt(sps[label])} | {fmt(min(values))} - {fmt(max(values))} |"
            f" {ratio(zc / sps[label])} |"
        )
    add("")

    # -- 3 ----------------------------------------------------------------------------------
    crash = res["crash"]
    effects = sizes["crash_steps"] // LEDGER_EVERY
    add(
        f"## 3. Crash duplicates: {sizes['crash_kills']} SIGKILLs per system of a {sizes['crash_steps']}-step"
        f" workflow with {effects} ledger appends"
    )
    add("")
    add(
        f"Every {LEDGER_EVERY}th step appends to an external ledger (a separate SQLite file), in one"
        " ledger transaction, twice: once keyed (`INSERT OR IGNORE` on a unique key built from what the"
        " system hands the step: zincir `run.id` + step name, DBOS `DBOS.workflow_id` + `DBOS.step_id`,"
        " LangGraph the thread id + step index) and once as a plain append. Each trial starts a fresh"
        " workflow in a child process, SIGKILLs it at a uniformly random moment within the time an"
        " uninterrupted run takes (median of calibration runs), then restarts a second process that"
        " lets the run finish. *Duplicates* = ledger lines beyond one per logical step; *missing* ="
        " ledger steps never performed; *never completed* = runs not completed after the restart."
    )
    add("")
    add(
        "| system | uninterrupted run | kills (mid-run) | dups, plain append | trials with a dup |"
        " dups, with key | missing | never completed | median recovery |"
    )
    add("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, r in crash.items():
        add(
            f"| {label} | {median(r['calibration_seconds']) * 1e3:.0f} ms |"
            f" {r['kills']} ({r['killed_mid_run']}) |"
            f" {r['dups_plain']} | {r['trials_with_plain_dup']} | {r['dups_keyed']} | {r['missing']} |"
            f" {r['never_completed']} | {r['recovery_seconds']:.2f} s |"
        )
    add("")
    add("How each system was recovered:")
    add("")
    for label, how in res["recovery"].items():
        if label in crash:
            add(f"- **{label}**: {how} (outcomes: {', '.join(crash[label]['how'])}).")
    add("")

    # -- 4 ----------------------------------------------------------------------------------
    multi = res["multi"]
    add(
        f"## 4. Two processes on one file: {sizes['multi_procs']} processes x {sizes['multi_runs']} runs x"
        f" {sizes['multi_steps']} steps"
    )
    add("")
    add(
        "Both processes open the same fresh file (one after the other), then start their runs at the"
        " same moment; each process runs its runs concurrently the way comparison 2 does. Throughput"
        " = completed steps of both processes ÷ wall time from the start signal to the last answer."
        f" Median of {sizes['multi_reps']} repetition(s) after {sizes['warmups']} warm-up(s); errors are"
        " summed over every repetition, warm-up included. *Raised* = `database is locked` errors that"
        " reached the application; *logged* = ones the system logged while retrying internally."
    )
    add("")
    add(
        "| system | steps/s (median) | lock errors raised | lock errors logged | failed runs / runs |"
        " zincir ÷ system |"
    )
    add("|---|---:|---:|---:|---:|---:|")
    zm = median(multi["zincir"]["steps_per_s"]) if "zincir" in multi else float("nan")
    for label, r in multi.items():
        m = median(r["steps_per_s"])
        add(
            f"| {label} | {fmt(m)} | {r['lock_errors_raised']} | {r['lock_errors_logged']} |"
            f" {r['failed_runs']} / {r['runs']} | {ratio(zm / m)} |"
        )
    errors = {label: r["errors"] for label, r in multi.items() if r["errors"]}
    if errors:
        add("")
        add("Errors seen (first few):")
        add("")
        for label, errs in errors.items():
            for e in errs:
                quoted = e.replace("`", "'")[:240]
                add(f"- {label}: `{quoted}`")
    add("")

    # -- targets ------------------------------------------------------------------------------
    add("## Targets of issue 9")
    add("")
    peer_us = {label: us[label] for label in peers if label in us}
    best_peer = min(peer_us, key=lambda label: peer_us[label]) if peer_us else None
    peer_sps = {label: sps[label] for label in peers if label in sps}
    best_conc = max(peer_sps, key=lambda label: peer_sps[label]) if peer_sps else None
    raw = us.get("raw sqlite3")
    rows: list[tuple[str, str, bool | None]] = []
    if best_peer is not None:
        r1 = z / peer_us[best_peer]
        rows.append(
            (
                f"1. zincir ≤ 0.35x the best peer ({best_peer}, {fmt(peer_us[best_peer])} µs/step)",
                ratio(r1),
                r1 <= 0.35,
            )
        )
    if raw is not None:
        r2 = z / raw
        rows.append(
            (f"1. zincir ≤ 2.5x raw sqlite3 one commit per step ({fmt(raw)} µs/step)", ratio(r2), r2 <= 2.5)
        )
    if best_conc is not None:
        r3 = zc / peer_sps[best_conc]
        rows.append(
            (
                f"2. zincir ≥ 10x the best peer at 50 runs ({best_conc}, {fmt(peer_sps[best_conc])} steps/s)",
                ratio(r3),
                r3 >= 10,
            )
        )
    if "zincir" in crash:
        c = crash["zincir"]
        rows.append(
            (
                "3. zincir: zero duplicates with the idempotency key",
                str(c["dups_keyed"]),
                c["dups_keyed"] == 0,
            )
        )
        rows.append(
            (
                "3. zincir: zero runs lost (never completed)",
                str(c["never_completed"]),
                c["never_completed"] == 0,
            )
        )
    if "zincir" in multi:
        m = multi["zincir"]
        rows.append(
            (
                "4. zincir: zero `database is locked` errors with two processes",
                str(m["lock_errors_raised"] + m["lock_errors_logged"]),
                m["lock_errors_raised"] + m["lock_errors_logged"] == 0,
            )
        )
    add("| target | measured | |")
    add("|---|---:|---|")
    for name, value, ok in rows:
        add(f"| {name} | {value} | {met(ok)} |")
    add("")
    add_issue_14_targets(add, z, raw, us.get("LangGraph"), zc, sps.get(CEILING))
    add(
        "Reference figures from issue 9 (same machine class): LangGraph sync ≈ 870 µs/step,"
        " DBOS ≈ 1,100 µs/step with WAL and 1,750 as shipped, raw sqlite3 ≈ 135 µs/step;"
        " 50 x 100 concurrent: both peers ≈ 450-900 steps/s."
    )
    add("")
    add("## Notes on fairness")
    add("")
    for note in res["notes"]:
        add(f"- {note}")
    add("")
    return "\n".join(lines)


def add_issue_14_targets(
    add: Any, z: float, raw: float | None, langgraph: float | None, zc: float, ceiling: float | None
) -> None:
    rows: list[tuple[str, str, bool]] = []
    if raw is not None:
        rows.append(("1. zincir ≤ 1.5x raw sqlite3 one commit per step", ratio(z / raw), z / raw <= 1.5))
    if langgraph is not None:
        rows.append(
            ('1. zincir ≤ 0.3x LangGraph `durability="sync"`', ratio(z / langgraph), z / langgraph <= 0.3)
        )
    if ceiling is not None:
        rows.append(
            (
                "2. zincir ≥ 0.7x raw sqlite3 at 100 rows per transaction (the ceiling)",
                ratio(zc / ceiling),
                zc / ceiling >= 0.7,
            )
        )
    if not rows:
        return
    add("Issue 14's targets, from the same run:")
    add("")
    add("| target | measured | |")
    add("|---|---:|---|")
    for name, value, ok in rows:
        add(f"| {name} | {value} | {met(ok)} |")
    add("")


def add_legs(add: Any, legs: dict[str, dict[str, dict[str, float]]]) -> None:
    z, zt, raw, trio = legs["zincir"], legs["zincir_thread"], legs["raw"], legs["trio"]
    add(
        "The same step leg by leg (`bench/micro/legs.py`; mean µs per step, median over the repetitions):"
        " its write inline on the Trio thread, as a lone write runs, and sent to the writer thread,"
        " as when that is busy (every crossing between the threads stamped); beside the raw loop"
        " and a bare Trio task <-> thread ping-pong:"
    )
    add("")
    add("| leg | zincir, inline | zincir, writer thread | raw sqlite3 | bare ping-pong |")
    add("|---|---:|---:|---:|---:|")
    rows = (
        ("1. `run.step` until it hands its request on", "run_step_python", "run_step_python", "python", None),
        ("2. one pass of Trio's scheduler (gathering a batch)", "gather", None, None, None),
        ("2. queued -> the writer thread has it (wake-up 1)", None, "pickup", None, "there"),
        ("3. BEGIN IMMEDIATE", "begin", "begin", "begin", None),
        ("4. the step's SQL (lease check + INSERT)", "sql", "sql", "sql", None),
        ("5. COMMIT (fsync)", "commit", "commit", "commit", None),
        ("6. after COMMIT -> reply handed to Trio", None, "to_reply", None, None),
        ("7. reply -> Trio runs the wake callback (wake-up 2)", None, "wake", None, "wake"),
        ("8. until `run.step` returned", "resume", "resume", None, "resume"),
    )

    def cell(case: dict[str, dict[str, float]], key: str | None) -> str:
        return "" if key is None else f"{case[key]['mean']:.1f}"

    for label, zk, ztk, rk, tk in rows:
        add(f"| {label} | {cell(z, zk)} | {cell(zt, ztk)} | {cell(raw, rk)} | {cell(trio, tk)} |")
    total = {name: sum(v["mean"] for v in case.values()) for name, case in legs.items()}
    add(
        f"| all | {total['zincir']:.1f} | {total['zincir_thread']:.1f} | {total['raw']:.1f} |"
        f" {total['trio']:.1f} |"
    )
    add("")


def add_profile(add: Any, profile: dict[str, Any]) -> None:
    med = profile["us_per_step"]
    add("### Where a zincir step's time goes")
    add("")
    add(
        f"`python -m bench.micro.profile_step` (median of {profile['reps']} x {profile['n']:,} sequential"
        " steps per layer, layers interleaved, WAL + FULL, in its own process):"
    )
    add("")
    add("| layer | µs/step |")
    add("|---|---:|")
    for key, label in profile["labels"].items():
        add(f"| {key}. {label} | {med[key]:.1f} |")
    add(f"| B - A: zincir's schema and SQL for a step, beyond a bare INSERT | {med['B'] - med['A']:.1f} |")
    add(f"| D - B: the hand-off (inline: one pass of Trio's scheduler) | {med['D'] - med['B']:.1f} |")
    add(f"| E - D: `Run.step`'s own Python (validation, JSON, bookkeeping) | {med['E'] - med['D']:.1f} |")
    add("")
    if "legs" in profile:
        add_legs(add, profile["legs"])
    lines = [line for line in profile["output"].splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), None)
    if start is not None:
        add("<details><summary>cProfile of layer E, Trio thread only (own time)</summary>")
        add("")
        add("```")
        for line in lines[start : start + 14]:
            add(line.rstrip()[:150])
        add("```")
        add("")
        add("</details>")
        add("")
