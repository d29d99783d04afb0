"""``python -m bench.horizon``: a long-horizon agent under SIGKILLs, three dimensions (issue 20).

A synthetic task of ``--subtasks`` subtasks (each writes a file a deterministic checker verifies,
registers it in an external ledger — idempotent by key — and notifies a reviewer — not
idempotent), done by a scripted model whose errors grow with the context it is given and which
sometimes claims a subtask it did not do (``bench/horizon/agent.py`` documents the model). Three
switchable dimensions, all 8 combinations:

* crash durability: ``none`` (a killed run restarts from scratch) / ``zincir`` (resume from the log);
* context strategy: ``full`` (every recorded event) / ``fresh`` (goal + latest accepted checkpoint);
* verification policy: ``none`` (accept the claim) / ``verifier`` (measured artifacts checked).

Per seed and combination: one uninterrupted run (``C`` model calls in ``T`` seconds), then one run
whose child processes are SIGKILLed ``--kills`` times: the k-th process ``v * T / C`` s after its own
model call number ``round(u * C)`` (``u`` uniform in [0.05, 0.95), ``v`` in [0, 1), seeded, the same
for every combination of a seed), so that the kills fall at the same progress however loaded the
machine is. Each killed process is replaced by a fresh one (started, and done importing,
beforehand). Writes
``bench/reports/horizon.md``, its figures as JSON and a chart (SVG) beside it.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..harness import study
from ..harness.machine import brief
from ..harness.processes import ChildProcess
from ..harness.reports import shown_command, write_outputs
from .agent import ModelParams, check, ledger_counts, ledger_lines, task_index
from .report import chart, render


@dataclass(frozen=True)
class Combo:
    durability: str  # none | zincir
    context: str  # full | fresh
    verification: str  # none | verifier

    @property
    def key(self) -> str:
        return f"{self.durability}-{self.context}-{self.verification}"

    @property
    def label(self) -> str:
        durability = "zincir resume" if self.durability == "zincir" else "no durability"
        verification = "verifier" if self.verification == "verifier" else "no verifier"
        return f"{durability}, {self.context} context, {verification}"


COMBOS = tuple(
    Combo(d, c, v) for d in ("none", "zincir") for c in ("full", "fresh") for v in ("none", "verifier")
)


@dataclass
class Sizes:
    subtasks: int = 40
    seeds: int = 6
    kills: int = 3
    model: ModelParams = field(default_factory=ModelParams)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(subtasks=8, seeds=1, kills=2)


def kill_plan(seed: int, kills: int) -> list[tuple[float, float]]:
    """Per kill, (u, v): the k-th process is killed after ``round(u * C)`` of its own model calls
    (``C``: the uninterrupted run's), ``v * T / C`` s into that call's round (``T``: its duration).
    The same for every combination of a seed."""
    rng = random.Random(f"horizon-kills:{seed}")
    return [(rng.uniform(0.05, 0.95), rng.random()) for _ in range(kills)]


def kill_moments(plan: list[tuple[float, float]], base: dict[str, Any]) -> list[tuple[int, float]]:
    calls = max(1, int(base["model_calls"]))
    return [(max(1, round(u * calls)), v * base["wall_s"] / calls) for u, v in plan]


# -- child processes ------------------------------------------------------------------------------


def start(args: dict[str, Any], log_path: Path) -> ChildProcess:
    """One agent process (``bench/horizon/agent.py``); it waits for a ``go`` command."""
    return ChildProcess("bench.horizon.agent:child", args, log_path, "the agent")


def until(agent: ChildProcess, timeout: float, *, calls: int) -> dict[str, Any]:
    """The first ``call`` event numbered ``calls`` or more, or ``done``, whichever comes first."""
    stop = time.monotonic() + timeout
    while True:
        message = agent.event(stop - time.monotonic(), f"model call {calls}")
        if message["event"] == "done" or (message["event"] == "call" and message["n"] >= calls):
            return message


# -- one trial ------------------------------------------------------------------------------------


def run_trial(
    combo: Combo, seed: int, sizes: Sizes, work: Path, tag: str, kills: list[tuple[int, float]]
) -> dict[str, Any]:
    """One run of the task; for each ``(calls, offset)`` of ``kills`` in turn, the process is
    SIGKILLed ``offset`` s after its own model call number ``calls`` (unless it finished first) and
    replaced by a fresh one; then the checker and the ledger. No kills: uninterrupted."""
    here = work / f"{combo.key}-seed{seed}-{tag}"
    scratch = here / "scratch"
    scratch.mkdir(parents=True)
    args = {
        "seed": seed,
        "n": sizes.subtasks,
        "durability": combo.durability,
        "context": combo.context,
        "verification": combo.verification,
        "scratch": str(scratch),
        "ledger": str(here / "ledger.jsonl"),
        "meter": str(here / "meter.jsonl"),
        "db": str(here / "zincir.db"),
        "model": asdict(sizes.model),
    }
    log_path = here / "agent.log"
    timeout = 60.0 + 3.0 * sizes.subtasks
    wall = 0.0
    landed = 0
    processes = 0
    done: dict[str, Any] | None = None
    current = start(args, log_path)
    spare: ChildProcess | None = None
    try:
        current.expect("ready", timeout=120)
        for kill in [*kills, None]:
            spare = start(args, log_path) if kill is not None else None
            if spare is not None:
                spare.expect("ready", timeout=120)  # the replacement is up before the kill
            current.send("go")
            processes += 1
            began = current.expect("go", timeout=60)["at"]
            try:
                if kill is None:
                    done = current.expect("done", timeout=timeout)
                else:
                    reached = until(current, timeout, calls=kill[0])
                    done = reached if reached["event"] == "done" else current.expect("done", timeout=kill[1])
                wall += done["at"] - began
            except TimeoutError:
                if kill is None:
                    raise
                current.kill()
                finished = [m for m in current.unread_events() if m.get("event") == "done"]
                if finished:  # it ended just before the kill: the kill did not land
                    done = finished[-1]
                    wall += done["at"] - began
                else:
                    wall += time.monotonic() - began
                    landed += 1
            current.close()
            if done is not None:
                break
            assert spare is not None
            current, spare = spare, None
    finally:
        for p in (current, spare):
            if p is not None:
                p.kill()
                p.close()
    assert done is not None
    good = set(check(scratch, seed, sizes.subtasks))
    believed = [task_index(name) for name in done["believed"]]
    meter = ledger_lines(here / "meter.jsonl")
    counts = ledger_counts(here / "ledger.jsonl")
    return {
        "seed": seed,
        "kills": kills,
        "kills_landed": landed,
        "processes": processes,
        "outcome": done["outcome"],
        "verified": len(good),
        "correct": done["outcome"] == "completed" and len(good) == sizes.subtasks,
        "believed": len(believed),
        "falsely_believed": sum(i not in good for i in believed),
        "duplicates": counts["notify_duplicates"],
        "keyed_duplicates": counts["register_duplicates"],
        "notify_lines": counts["notify_lines"],
        "model_calls": len(meter),
        "input_tokens": sum(m["in"] for m in meter),
        "output_tokens": sum(m["out"] for m in meter),
        "tokens": sum(m["in"] + m["out"] for m in meter),
        "max_prompt_tokens": max((m["in"] for m in meter), default=0),
        "wrong_writes": sum(m["kind"] == "work-wrong" for m in meter),
        "false_claims": sum(m["kind"] == "false-claim" for m in meter),
        "wall_s": wall,
    }


# -- the whole benchmark --------------------------------------------------------------------------

METRICS = (
    "falsely_believed",
    "duplicates",
    "keyed_duplicates",
    "model_calls",
    "tokens",
    "wall_s",
    "kills_landed",
    "wrong_writes",
    "false_claims",
    "max_prompt_tokens",
)


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(trials: list[dict[str, Any]], base: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "seeds": len(trials),
        "correct": sum(t["correct"] for t in trials),
        "correct_uninterrupted": sum(t["correct"] for t in base),
    }
    for metric in METRICS:
        out[metric] = spread([t[metric] for t in trials])
    for metric in ("model_calls", "tokens", "wall_s", "falsely_believed", "duplicates"):
        out[f"{metric}_uninterrupted"] = spread([t[metric] for t in base])
    out["extra_calls"] = spread(
        [t["model_calls"] - b["model_calls"] for t, b in zip(trials, base, strict=True)]
    )
    return out


def run_all(
    combos: Sequence[Combo], seeds: Sequence[int], sizes: Sizes, work: Path, log: study.Log
) -> dict[str, Any]:
    results: dict[str, Any] = {
        c.key: {"label": c.label, **asdict(c), "trials": [], "uninterrupted": []} for c in combos
    }
    total = len(combos) * len(seeds)
    k = 0
    for s, seed in enumerate(seeds):
        plan = kill_plan(seed, sizes.kills)
        order = list(combos[s % len(combos) :]) + list(combos[: s % len(combos)])  # drift hits all alike
        for combo in order:
            k += 1
            base = run_trial(combo, seed, sizes, work, "uninterrupted", [])
            killed = run_trial(combo, seed, sizes, work, "killed", kill_moments(plan, base))
            results[combo.key]["uninterrupted"].append(base)
            results[combo.key]["trials"].append(killed)
            log(
                f"[{k}/{total}] seed {seed}, {combo.label}: uninterrupted {base['wall_s']:.1f} s,"
                f" {base['model_calls']} calls; {killed['kills_landed']} kills landed:"
                f" {'correct' if killed['correct'] else 'NOT correct'}"
                f" ({killed['verified']}/{sizes.subtasks} verified,"
                f" {killed['falsely_believed']} falsely believed), {killed['duplicates']} duplicated,"
                f" {killed['model_calls']} calls, {killed['tokens']:,} tokens, {killed['wall_s']:.1f} s"
            )
    for entry in results.values():
        entry["summary"] = summarize(entry["trials"], entry["uninterrupted"])
    return results


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = study.parser("python -m bench.horizon", __doc__.split("\n\n")[0], "horizon.md")
    add = parser.add_argument
    add("--subtasks", type=int, help="subtasks per run (default 40)")
    add("--seeds", type=int, help="seeds 0..N-1 (default 6)")
    add("--kills", type=int, help="SIGKILLs per killed run (default 3)")
    add("--only", help="comma-separated combination keys, e.g. zincir-fresh-verifier")
    opts = parser.parse_args(argv)
    out = Path(opts.out)

    log = study.progress(opts.quiet)
    if study.redraw(opts, render, chart):
        return 0

    sizes = Sizes.quick() if opts.quick else Sizes()
    study.override(sizes, opts, subtasks="subtasks", seeds="seeds", kills="kills")
    combos = list(COMBOS)
    if opts.only:
        wanted = opts.only.split(",")
        unknown = set(wanted) - {c.key for c in COMBOS}
        if unknown:
            parser.error(f"unknown combinations: {', '.join(sorted(unknown))}")
        combos = [c for c in COMBOS if c.key in wanted]
    started = time.monotonic()
    with study.scratch(opts.dir, "horizon-", keep=opts.keep, log=log) as work:
        log(
            f"bench.horizon: {len(combos)} combinations x {sizes.seeds} seeds, {sizes.subtasks} subtasks,"
            f" {sizes.kills} SIGKILLs per killed run; files in {work}"
        )
        per_combo = run_all(combos, list(range(sizes.seeds)), sizes, work, log)
    results = {
        "command": shown_command("python -m bench.horizon", argv),
        "machine": brief("zincir", "bench/horizon"),
        "sizes": asdict(sizes),
        "wall_seconds": time.monotonic() - started,
        "combinations": per_combo,
    }
    write_outputs(out, results, render, chart)
    names = f"{out}, {out.with_suffix('.json').name} and {out.with_suffix('.svg').name}"
    log(f"wrote {names} in {results['wall_seconds']:.0f} s")
    return 0
