"""The Markdown report of ``python -m bench.horizon`` and what its chart shows, from its JSON figures.

Every number in the text is computed here from the results; nothing is typed in by hand.
"""

from __future__ import annotations

import statistics
from typing import Any

from ..harness.charts import Bar, Chart, Group, Panel

DIMENSIONS = {
    "durability": ("none", "zincir"),
    "context": ("full", "fresh"),
    "verification": ("none", "verifier"),
}
NAMES = {
    ("durability", "none"): "no durability",
    ("durability", "zincir"): "zincir resume",
    ("context", "full"): "full history",
    ("context", "fresh"): "fresh context",
    ("verification", "none"): "no verifier",
    ("verification", "verifier"): "verifier",
}


def _num(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def _cell(st: dict[str, float], digits: int = 0, scale: float = 1.0, unit: str = "") -> str:
    med, lo, hi = st["median"] * scale, st["min"] * scale, st["max"] * scale
    if lo == hi:
        return f"{_num(med, digits)}{unit}"
    return f"{_num(med, digits)}{unit} ({_num(lo, digits)}-{_num(hi, digits)})"


def _combos(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    combos: dict[str, dict[str, Any]] = r["combinations"]
    return combos


def _pairs(r: dict[str, Any], dim: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(a, b) for every two combinations that differ only in ``dim`` (a: its first value)."""
    combos = list(_combos(r).values())
    first, second = DIMENSIONS[dim]
    out = []
    for a in combos:
        if a[dim] != first:
            continue
        for b in combos:
            if b[dim] == second and all(a[d] == b[d] for d in DIMENSIONS if d != dim):
                out.append((a, b))
    return out


def _trials(entries: list[dict[str, Any]], metric: str) -> list[float]:
    return [t[metric] for e in entries for t in e["trials"]]


def _base(entries: list[dict[str, Any]], metric: str) -> list[float]:
    """``metric`` of every uninterrupted run of ``entries``."""
    return [t[metric] for e in entries for t in e["uninterrupted"]]


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _more(a: float, b: float, more: str = "more", fewer: str = "fewer") -> str:
    return more if a > b else (fewer if a < b else "as many")


def _tag(e: dict[str, Any]) -> str:
    """A combination's context and verification, e.g. ``fresh/verifier``."""
    return f"{e['context']}/{'verifier' if e['verification'] == 'verifier' else 'no verifier'}"


def _reading(r: dict[str, Any]) -> list[str]:
    s = r["sizes"]
    n = s["subtasks"]
    combos = _combos(r)
    lines: list[str] = []
    best = combos.get("zincir-fresh-verifier")
    if best is not None:
        b = best["summary"]
        lines.append(
            f"- **zincir resume + fresh context + verifier** finished all {n} subtasks verified in"
            f" **{b['correct']} of {b['seeds']}** killed runs ({sum(_trials([best], 'kills_landed')):.0f}"
            f" SIGKILLs landed in all, a median of {b['kills_landed']['median']:.0f} per run),"
            f" with **{b['duplicates']['max']:.0f}** duplicated external effects at most,"
            f" {b['falsely_believed']['max']:.0f} subtasks falsely believed done at most, a median of"
            f" {b['model_calls']['median']:.0f} model calls ({b['model_calls_uninterrupted']['median']:.0f}"
            f" uninterrupted) and {b['tokens']['median']:,.0f} tokens."
        )
    pairs = _pairs(r, "durability")
    if pairs:
        none = [a for a, _ in pairs]
        zin = [b for _, b in pairs]
        extra_none = [e["summary"]["extra_calls"]["median"] for e in none]
        extra_zin = [e["summary"]["extra_calls"]["median"] for e in zin]
        dup_none, dup_zin = _trials(none, "duplicates"), _trials(zin, "duplicates")
        wall_none = [
            t["wall_s"] / u["wall_s"]
            for e in none
            for t, u in zip(e["trials"], e["uninterrupted"], strict=True)
        ]
        wall_zin = [
            t["wall_s"] / u["wall_s"]
            for e in zin
            for t, u in zip(e["trials"], e["uninterrupted"], strict=True)
        ]
        lines.append(
            f"- **Crash durability.** The same SIGKILLs cost a run without durability a median of"
            f" **{_med(extra_none):.0f}** extra model calls (median per combination: "
            + ", ".join(f"{_tag(e)} {_num(x)}" for e, x in zip(none, extra_none, strict=True))
            + f") and **{_med(wall_none):.2f}x** its uninterrupted wall time; resumed by zincir,"
            f" **{_med(extra_zin):.0f}** extra calls ("
            + ", ".join(f"{_tag(e)} {_num(x)}" for e, x in zip(zin, extra_zin, strict=True))
            + f") and {_med(wall_zin):.2f}x. Restarting from scratch repeated the non-idempotent"
            f" `notify`: **{sum(dup_none):,.0f}** duplicated effects over {len(dup_none)} killed runs"
            f" (median {_med(dup_none):.0f} per run); zincir's resume, with `run.execute(...,"
            f" reconcile=probe)`, **{sum(dup_zin):.0f}** over {len(dup_zin)}."
        )
    pairs = _pairs(r, "context")
    if pairs:
        full = [a for a, _ in pairs]
        fresh = [b for _, b in pairs]
        tok_ratio = [
            a["summary"]["tokens"]["median"] / b["summary"]["tokens"]["median"]
            for a, b in pairs
            if b["summary"]["tokens"]["median"]
        ]
        wrong_full, wrong_fresh = _base(full, "wrong_writes"), _base(fresh, "wrong_writes")
        prompt_full, prompt_fresh = _base(full, "max_prompt_tokens"), _base(fresh, "max_prompt_tokens")
        fb = [
            (a, a["summary"]["falsely_believed"]["median"], b["summary"]["falsely_believed"]["median"])
            for a, b in pairs
            if a["verification"] == "none"
        ]
        calls = [
            (a, _med(_base([a], "model_calls")), _med(_base([b], "model_calls")))
            for a, b in pairs
            if a["verification"] == "verifier"
        ]
        text = (
            f"- **Context strategy.** Uninterrupted, the full history grew to a median largest prompt"
            f" of {_med(prompt_full):,.0f} tokens against {_med(prompt_fresh):,.0f} for a fresh context;"
            f" killed, it used **{_med(tok_ratio):.0f}x** the tokens (median over the {len(tok_ratio)}"
            " pairs of combinations that differ only in context). Its error rate growing with its"
            f" prompt, the model wrote a wrong file a median of **{_med(wrong_full):.0f}** times per"
            f" uninterrupted run with the full history, **{_med(wrong_fresh):.0f}** in a fresh context."
        )
        if fb:
            text += (
                " Without a verifier those wrong files stayed believed done: in the killed runs a median of "
                + " and ".join(
                    f"{x:.0f} (full) vs {y:.0f} (fresh) subtasks falsely believed done with"
                    f" {NAMES[('durability', a['durability'])]}"
                    for a, x, y in fb
                )
                + "."
            )
        if calls:
            x, y = calls[-1][1], calls[-1][2]
            text += (
                " With a verifier they were caught and redone, which cost model calls: a median of"
                f" {x:.0f} (full) vs {y:.0f} (fresh) per uninterrupted run."
            )
        lines.append(text)
    pairs = _pairs(r, "verification")
    if pairs:
        nov = [a for a, _ in pairs]
        ver = [b for _, b in pairs]
        ok_nov, ok_ver = sum(e["summary"]["correct"] for e in nov), sum(e["summary"]["correct"] for e in ver)
        runs_nov, runs_ver = sum(e["summary"]["seeds"] for e in nov), sum(e["summary"]["seeds"] for e in ver)
        fb_nov, fb_ver = _trials(nov, "falsely_believed"), _trials(ver, "falsely_believed")
        fc = _base(nov + ver, "false_claims")
        call_ratio = [_med(_base([b], "model_calls")) / _med(_base([a], "model_calls")) for a, b in pairs]
        lines.append(
            f"- **Verification policy.** The model made a median of {_med(fc):.0f} false claims per"
            f" uninterrupted run (probability {s['model']['p_false']:.2f} per subtask attempt)."
            " Accepting its claims,"
            f" **{ok_nov} of {runs_nov}** killed runs ended with all {n} subtasks right, and a run"
            f" believed a median of **{_med(fb_nov):.0f}** (at most {max(fb_nov):.0f}) subtasks done"
            f" that were not. With the independent verifier, **{ok_ver} of {runs_ver}** did, with"
            f" {sum(fb_ver):.0f} subtasks falsely believed done in all; the price was"
            f" {_med(call_ratio):.2f}x the model calls of an uninterrupted run (median over the pairs)."
        )
    keyed = sum(_trials(list(combos.values()), "keyed_duplicates"))
    runs = sum(e["summary"]["seeds"] for e in combos.values())
    lines.append(
        f"- The tool that is idempotent by key (`register`, an upsert keyed by the subtask) repeated"
        f" itself **{keyed:.0f}** times in the {runs} killed runs, even those restarted from scratch"
        + (": only the tool without a key duplicates." if keyed == 0 else ".")
    )
    gave_up = sum(t["outcome"] == "gave up" for e in combos.values() for t in e["trials"])
    if gave_up:
        lines.append(f"- {gave_up} killed runs gave up at the model-call budget.")
    return lines


def render(r: dict[str, Any], chart_name: str) -> str:
    m, s = r["machine"], r["sizes"]
    n, seeds, p = s["subtasks"], s["seeds"], s["model"]
    combos = _combos(r)
    out = [
        "# A long-horizon agent under SIGKILLs: crash durability x context x verification",
        "",
        f"Generated by `{r['command']}` — do not edit by hand, rerun it.",
        f"Commit {m['commit']}"
        + (" (with uncommitted changes to zincir/ or this benchmark)" if m["dirty"] else "")
        + f", {m['date']}, Python {m['python']},"
        f" {m['cpus']} CPUs, {m['platform']}; took {r['wall_seconds'] / 60:.1f} min.",
        "",
        f"A task of {n} subtasks, done by a scripted model, in every combination of three dimensions;"
        f" {seeds} seed{'s' if seeds != 1 else ''}; in each killed run the agent's process is SIGKILLed"
        f" {s['kills']} times at seeded random moments and replaced by a fresh process. Median over"
        " the seeds, with the range (min-max) in brackets.",
        "",
        "## Reading the numbers",
        "",
        *_reading(r),
        "",
        "## Killed runs, per combination",
        "",
        "| crash durability | context | verification | completed correctly | falsely believed done"
        " | duplicated effects | model calls | model tokens | wall time | kills landed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in combos.values():
        su = e["summary"]
        out.append(
            f"{_dimensions(e)} | **{su['correct']} of {su['seeds']}**"
            f" | {_cell(su['falsely_believed'])} | {_cell(su['duplicates'])} | {_cell(su['model_calls'])}"
            f" | {_cell(su['tokens'], 0, 1e-3, 'k')} | {_cell(su['wall_s'], 1, 1.0, ' s')}"
            f" | {_cell(su['kills_landed'])} |"
        )
    out += [
        "",
        "*Completed correctly*: the run completed and the checker found all"
        f" {n} files with the expected content. *Falsely believed done*: subtasks in the run's final"
        " accepted checkpoint whose file the checker rejects. *Duplicated effects*: `notify` lines in"
        " the ledger beyond one per subtask. *Model calls* and *tokens*: every call the scripted model"
        " answered, as its meter counts them — calls whose answer a SIGKILL lost included. *Wall time*:"
        " the agent processes' working time, summed (imports excluded: each replacement was started"
        " before the kill). *Kills landed*: SIGKILLs that hit a process still working (a resumed run"
        " may finish before the next one is due; so may a restart from scratch whose verifier accepts"
        " a file an earlier process wrote, since the outside world kept it).",
        "",
        f"![per combination]({chart_name})",
        "",
        "## The same runs uninterrupted",
        "",
        "| crash durability | context | verification | completed correctly | falsely believed done"
        " | model calls | model tokens | wall time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in combos.values():
        su = e["summary"]
        out.append(
            f"{_dimensions(e)}"
            f" | {su['correct_uninterrupted']} of {su['seeds']}"
            f" | {_cell(su['falsely_believed_uninterrupted'])} | {_cell(su['model_calls_uninterrupted'])}"
            f" | {_cell(su['tokens_uninterrupted'], 0, 1e-3, 'k')}"
            f" | {_cell(su['wall_s_uninterrupted'], 1, 1.0, ' s')} |"
        )
    out += [
        "",
        "A seed's uninterrupted run is the same with either crash-durability setting, up to wall time:"
        " the model is deterministic and nothing is lost.",
        "",
        "## What the model did in the killed runs",
        "",
        "| crash durability | context | verification | extra model calls (killed - uninterrupted)"
        " | wrong files written | false claims | largest prompt (tokens) |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in combos.values():
        su = e["summary"]
        out.append(
            f"{_dimensions(e)} | {_cell(su['extra_calls'])}"
            f" | {_cell(su['wrong_writes'])} | {_cell(su['false_claims'])}"
            f" | {_cell(su['max_prompt_tokens'])} |"
        )
    out += [
        "",
        "The model's draws depend on its whole prompt, and a resumed log holds a few events an"
        " uninterrupted one does not (`lease_taken_over`, a repeated `tool_started`), so after a resume"
        " its later draws differ: extra calls of a resumed run can be below zero.",
        "",
        "## How it is built",
        "",
        f"- **The task.** Subtask *i* of {n}: write `task-<i>.txt` in a scratch directory with the first 16"
        " hex digits of `sha256('horizon:<seed>:<i>')`, `register` it in an external ledger and"
        " `notify` a reviewer once, then claim it with a checkpoint. The checker (`check()` in"
        " `bench/horizon/agent.py`) reads the files. The ledger is a JSON-lines file outside the zincir"
        " database: `register` is idempotent by key (an upsert keyed by the subtask: it writes a line"
        " only when the file's digest changed), `notify` is not (every call appends a line).",
        "- **The scripted model** (no network) is a deterministic function of the seed and of the"
        " prompt it is given (the goal, and the run's events rendered as text; its random draws come"
        " from `sha256(seed, prompt)`). From the latest accepted checkpoint in its prompt it takes the"
        " next subtask; if that subtask's file was written since the last rejection, it claims it"
        f" (`submit_checkpoint`); otherwise with probability {p['p_false']:.2f} it claims it anyway (a false"
        " claim), else it does the work in one response (`write_file`, `register`, and `notify` unless"
        " its prompt shows it notified already). The content is one digit off with probability"
        f" {p['err_base']:.2f} + {p['err_per_ktoken']:.3f} per 1,000 prompt tokens, at most"
        f" {p['err_max']:.2f} (context rot). Tokens: ⌈characters / 4⌉ of the prompt and of the answer's"
        f" JSON. It answers after {p['latency_s'] * 1e3:.0f} ms + {p['latency_per_ktoken_s'] * 1e3:.0f} ms"
        " per 1,000 prompt tokens, and appends one line to a meter file before answering, so a call"
        " whose answer was lost to a SIGKILL still counts.",
        "- **The agent loop** records each answer with `run.record_response` (with its token usage,"
        f" under a `Budget(model_calls={10 * n})`), runs every pending intent through"
        " `run.execute(pending, tool, reconcile=...)` — `notify` with a reconciler that looks for the"
        " call's reference (`<run id>:<idempotency key>`) in the ledger — and answers a claim with"
        " `run.checkpoint(call_id, state, verify)`, the state carrying the artifacts the loop measured"
        " (`zincir.artifacts.identify`) for every claimed file. It completes the run when a checkpoint"
        " with nothing remaining is accepted.",
        "- **Crash durability.** *zincir*: a replacement process finds the run by its role and takes it"
        " with plain `open_run(db, run_id)` (the dead owner is taken over at once), decides an"
        " interrupted verification (`pending_checkpoint()`), runs the unanswered intents and goes on."
        " *none*: the replacement deletes the database first — the log does not outlive its process —"
        " and starts the task again from subtask 0; the files and the ledger, the outside world, keep"
        " what was done. Both use the same code and the same SQLite database (WAL, synchronous=FULL).",
        "- **Context strategy.** *full history*: the prompt is the goal and every recorded event"
        " (`db.events(run_id)`). *fresh*: the goal, the latest accepted checkpoint and the events after"
        " it (`run.state()`).",
        "- **Verification policy.** *none*: every claim is accepted. *verifier*: a claim is accepted"
        " only if every subtask it claims has a measured artifact that is a file whose SHA-256 is that"
        " of the expected content and that is unchanged since it was measured (`artifacts.mismatches`).",
        f"- **Kills.** Per seed and combination, one uninterrupted run (*C* model calls in *T* s), then"
        f" a run whose process is SIGKILLed {s['kills']} times: the *k*-th process"
        " *v<sub>k</sub>·T/C* s after its own model call number *round(u<sub>k</sub>·C)*, with"
        " *u<sub>k</sub>* uniform in [0.05, 0.95) and *v<sub>k</sub>* in [0, 1) from the seed (the same"
        " for every combination of a seed): counted in calls, the kills fall at the same progress on a"
        " loaded machine. The combinations run in a rotated order per seed.",
        "",
    ]
    return "\n".join(out)


def _dimensions(e: dict[str, Any]) -> str:
    """A table row's first three cells: the combination's crash durability, context, verification."""
    return " | ".join(
        ["", *(NAMES[(dim, e[dim])] for dim in ("durability", "context", "verification"))]
    ).lstrip()


def _short(e: dict[str, Any]) -> str:
    d = "zincir" if e["durability"] == "zincir" else "no dur."
    v = "verifier" if e["verification"] == "verifier" else "no verif."
    return f"{d} · {e['context']} · {v}"


def chart(r: dict[str, Any]) -> Chart:
    """Five panels, one bar per combination: runs completed correctly, and the medians (with a
    min-max whisker) of subtasks falsely believed done, duplicated effects, model calls and model
    tokens."""
    combos = list(_combos(r).values())
    seeds = r["sizes"]["seeds"]

    def color(e: dict[str, Any]) -> str:
        good = e["durability"] == "zincir" and e["context"] == "fresh" and e["verification"] == "verifier"
        return "#2e8b57" if good else "#4a7ab5"

    def panel(title: str, metric: str, scale: float = 1.0) -> Panel:
        bars = []
        for e in combos:
            st = e["summary"][metric]
            med = st["median"] * scale
            text = f"{med:,.0f}" if metric != "tokens" or med >= 10 else f"{med:,.1f}"
            bars.append(Bar(_short(e), med, color(e), st["min"] * scale, st["max"] * scale, text=text))
        return Panel([Group(bars)], title=title, labels=False, width=110)

    correct = [
        Bar(_short(e), e["summary"]["correct"], color(e), text=f"{e['summary']['correct']}") for e in combos
    ]
    return Chart(
        f"Long-horizon agent, {r['sizes']['subtasks']} subtasks, {r['sizes']['kills']} SIGKILLs per run:"
        f" median over {seeds} seed{'s' if seeds != 1 else ''} (whiskers: min-max)",
        [
            Panel([Group(correct)], title=f"completed correctly (of {seeds})", top=float(seeds), width=110),
            panel("falsely believed done", "falsely_believed"),
            panel("duplicated effects", "duplicates"),
            panel("model calls", "model_calls"),
            panel("model tokens (thousands)", "tokens", 1e-3),
        ],
    )
