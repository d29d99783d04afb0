"""The parent side of the main comparison: starts the systems in child processes and runs the four
comparisons.

The parent never imports a peer: it only talks to its children (each hosting one system of
``bench/systems/``) over pipes, and reads the crash ledger with plain ``sqlite3``.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..harness.processes import ChildError, ChildProcess, run_module
from ..harness.reports import median
from ..harness.study import Log, rotated
from ..systems.common import LEDGER_EVERY, ledger_counts


@dataclass(frozen=True)
class Spec:
    """One system configuration under test."""

    label: str
    system: str  # module in bench: zincir, raw, dbos, langgraph
    variant: str = ""
    peer: bool = False  # a peer (not zincir, not the raw floor)


ALL_SPECS = (
    Spec("zincir", "zincir"),
    Spec("raw sqlite3", "raw"),
    Spec("DBOS (as shipped)", "dbos", "default", peer=True),
    Spec("DBOS (WAL)", "dbos", "wal", peer=True),
    Spec("LangGraph", "langgraph", peer=True),
)
# Comparison 3 uses each system at WAL + FULL (DBOS through its engine option); comparison 4
# also runs DBOS as shipped, where a rollback journal makes lock contention likelier.
CRASH_SPECS = ("zincir", "DBOS (WAL)", "LangGraph")
MULTI_SPECS = ("zincir", "DBOS (as shipped)", "DBOS (WAL)", "LangGraph")


@dataclass
class Sizes:
    step_n: int = 1000
    step_reps: int = 7
    conc_runs: int = 50
    conc_steps: int = 100
    conc_reps: int = 5
    crash_kills: int = 30
    crash_steps: int = 200
    crash_calibration: int = 3
    multi_procs: int = 2
    multi_runs: int = 8
    multi_steps: int = 200
    multi_reps: int = 5
    warmups: int = 1
    profile_n: int = 2000
    profile_reps: int = 5

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            step_n=100,
            step_reps=2,
            conc_runs=10,
            conc_steps=20,
            conc_reps=2,
            crash_kills=3,
            crash_steps=40,
            crash_calibration=1,
            multi_runs=2,
            multi_steps=20,
            multi_reps=1,
            warmups=1,
            profile_n=200,
            profile_reps=2,
        )


def start_child(
    spec: Spec, db_path: Path | str, log_path: Path, options: dict[str, Any] | None = None
) -> ChildProcess:
    """A child process hosting ``spec``'s system, its database at ``db_path``."""
    args = {"variant": spec.variant, "path": str(db_path), "options": options or {}}
    return ChildProcess(f"bench.systems.{spec.system}:child", args, log_path, spec.label)


def run_profile(sizes: Sizes, workdir: Path) -> dict[str, Any]:
    """zincir's per-step cost peeled into layers (``python -m bench.micro.profile_step``)."""
    out = workdir / "profile.json"
    argv = ("--n", str(sizes.profile_n), "--reps", str(sizes.profile_reps), "--dir", str(workdir))
    return run_module("bench.micro.profile_step", *argv, "--json", str(out), out=out, timeout=600)


# -- 1 and 2: per-step overhead and concurrent runs, in one set of long-lived children -------


def settings_only(specs: list[Spec], workdir: Path) -> dict[str, dict[str, Any]]:
    """Open each system once, only to report its durability settings."""
    settings = {}
    for i, spec in enumerate(specs):
        child = start_child(
            spec, workdir / f"settings-{i}-{spec.system}.sqlite", workdir / f"settings-{i}.log"
        )
        try:
            child.ready()
            settings[spec.label] = child.call("open")
        finally:
            child.close()
    return settings


def run_steps_and_concurrency(
    specs: list[Spec],
    sizes: Sizes,
    workdir: Path,
    log: Log,
    *,
    do_steps: bool = True,
    do_concurrent: bool = True,
    paths: dict[str, str] | None = None,
    options: dict[str, dict[str, Any]] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Returns (settings per label, comparison 1 results, comparison 2 results).

    ``paths`` (by label) replaces a system's default SQLite file, e.g. with a PostgreSQL URL
    (``bench.postgres``); ``options`` (by label) are passed to its child.
    """
    children: dict[str, ChildProcess] = {}
    settings: dict[str, dict[str, Any]] = {}
    try:
        for i, spec in enumerate(specs):
            path = (paths or {}).get(spec.label) or str(workdir / f"steps-{i}-{spec.system}.sqlite")
            children[spec.label] = start_child(
                spec, path, workdir / f"steps-{i}.log", (options or {}).get(spec.label)
            )
        for label, child in children.items():
            child.ready()
            settings[label] = s = child.call("open")
            if "journal_mode" in s:
                log(f"   {label}: {s['journal_mode']}, synchronous={s['synchronous']}")
            else:
                log(
                    f"   {label}: PostgreSQL {s['server_version']}, fsync={s['fsync']},"
                    f" synchronous_commit={s['synchronous_commit']}"
                )

        # 1. Each rep runs every system once, in a rotated order, so that drift in the disk or
        # the machine hits them all alike; the first `warmups` reps are thrown away.
        per_step: dict[str, list[float]] = {label: [] for label in children} if do_steps else {}
        labels = list(children)
        for rep in range(sizes.warmups + sizes.step_reps if do_steps else 0):
            warm = rep < sizes.warmups
            for label in rotated(labels, rep):
                seconds = children[label].call("per_step", n=sizes.step_n)
                if not warm:
                    per_step[label].append(seconds / sizes.step_n * 1e6)
            log(
                f"1. {'warm-up' if warm else f'rep {rep - sizes.warmups + 1}/{sizes.step_reps}'}: "
                + ", ".join(f"{label} {v[-1]:.0f}" for label, v in per_step.items() if v and not warm)
                + (" us/step" if not warm else "")
            )

        # 2. Concurrent runs; the raw loop writes the same rows 100 per transaction (the ceiling).
        conc_labels = [s.label for s in specs]
        concurrent: dict[str, list[float]] = {label: [] for label in conc_labels} if do_concurrent else {}
        total = sizes.conc_runs * sizes.conc_steps
        for rep in range(sizes.warmups + sizes.conc_reps if do_concurrent else 0):
            warm = rep < sizes.warmups
            for label in rotated(conc_labels, rep):
                seconds = children[label].call(
                    "concurrent", timeout=900, runs=sizes.conc_runs, steps=sizes.conc_steps
                )
                if not warm:
                    concurrent[label].append(total / seconds)
            log(
                f"2. {'warm-up' if warm else f'rep {rep - sizes.warmups + 1}/{sizes.conc_reps}'}: "
                + ", ".join(f"{label} {v[-1]:,.0f}" for label, v in concurrent.items() if v and not warm)
                + (" steps/s" if not warm else "")
            )
    finally:
        for child in children.values():
            child.close()
    return settings, {"us_per_step": per_step}, {"steps_per_s": concurrent}


# -- 3: crash duplicates -------------------------------------------------------------------------


def crash_trial(
    spec: Spec, sizes: Sizes, workdir: Path, trial: str, delay: float | None, log_path: Path
) -> dict[str, Any]:
    """Start the crash workflow in one child; SIGKILL it ``delay`` s after it started (None: let
    it finish); then let a second child (started beforehand, already imported) recover it."""
    db = workdir / f"crash-{spec.system}.sqlite"
    ledger = str(workdir / f"crash-{spec.system}-ledger.sqlite")
    first = start_child(spec, db, log_path, {"executor_id": "local"})
    second = None
    if delay is not None:
        second = start_child(spec, db, log_path, {"ledger": ledger, "trial": trial, "executor_id": "local"})
    out: dict[str, Any] = {"trial": trial, "delay": delay}
    try:
        first.ready()
        first.call("open")
        first.send("crash_run", trial=trial, steps=sizes.crash_steps, ledger_path=ledger)
        first.expect("started", timeout=120)
        started = time.perf_counter()
        if delay is None:
            first.result(timeout=600)
            out["seconds"] = time.perf_counter() - started
            out["killed"] = False
            first.close()
        else:
            time.sleep(delay)
            finished_first = first.proc.poll() is not None or first.has_answer()
            first.kill()
            out["killed"] = not finished_first
            assert second is not None
            second.ready()
            t0 = time.perf_counter()
            second.call("open", timeout=120)
            timeout = max(30.0, 30 * sizes.crash_steps / 200)
            try:
                resumed = second.call(
                    "crash_resume", timeout=timeout, trial=trial, steps=sizes.crash_steps, ledger_path=ledger
                )
                out.update(completed=bool(resumed["completed"]), how=resumed["how"])
            except (TimeoutError, ChildError) as exc:
                out.update(completed=False, how=f"failed: {str(exc).splitlines()[0][:200]}")
            out["recovery_seconds"] = time.perf_counter() - t0
            second.close()
    finally:
        for child in (first, second):
            if child is not None:
                if child.proc.poll() is None:
                    child.kill()
                child.close()
    counts = ledger_counts(ledger, trial)
    effects = sizes.crash_steps // LEDGER_EVERY
    out.update(counts)
    out["dups_plain"] = counts["plain_rows"] - counts["plain_steps"]
    out["dups_keyed"] = counts["keyed_rows"] - counts["keyed_steps"]
    out["missing"] = effects - counts["plain_steps"]
    return out


def run_crash(specs: list[Spec], sizes: Sizes, workdir: Path, rng: random.Random, log: Log) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for spec in specs:
        log_path = workdir / f"crash-{spec.system}.log"
        calib = [
            crash_trial(spec, sizes, workdir, f"cal{k}", None, log_path)["seconds"]
            for k in range(sizes.crash_calibration)
        ]
        window = median(calib)
        log(f"3. {spec.label}: an uninterrupted run takes {window * 1e3:.0f} ms; killing at U(0, that)")
        trials = []
        for k in range(sizes.crash_kills):
            delay = rng.uniform(0, window)
            trial = crash_trial(spec, sizes, workdir, f"t{k}", delay, log_path)
            trials.append(trial)
            if trial["dups_plain"] or trial["dups_keyed"] or not trial.get("completed") or trial["missing"]:
                log(
                    f"   {spec.label} trial {k}: kill at {delay * 1e3:.1f} ms, {trial['how']},"
                    f" plain dups {trial['dups_plain']}, keyed dups {trial['dups_keyed']},"
                    f" missing {trial['missing']}, completed {trial.get('completed')}"
                )
        results[spec.label] = {
            "calibration_seconds": calib,
            "trials": trials,
            "kills": len(trials),
            "killed_mid_run": sum(t["killed"] for t in trials),
            "never_completed": sum(not t.get("completed") for t in trials),
            "dups_plain": sum(t["dups_plain"] for t in trials),
            "dups_keyed": sum(t["dups_keyed"] for t in trials),
            "trials_with_plain_dup": sum(t["dups_plain"] > 0 for t in trials),
            "missing": sum(t["missing"] for t in trials),
            "recovery_seconds": median([t["recovery_seconds"] for t in trials]) if trials else 0.0,
            "how": sorted({t["how"] for t in trials}),
        }
        r = results[spec.label]
        log(
            f"3. {spec.label}: {r['kills']} kills ({r['killed_mid_run']} mid-run):"
            f" plain dups {r['dups_plain']}, keyed dups {r['dups_keyed']},"
            f" never completed {r['never_completed']}, missing {r['missing']}"
        )
    return results


# -- 4: two processes on one file ----------------------------------------------------------------


def run_multi(specs: list[Spec], sizes: Sizes, workdir: Path, log: Log) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for spec in specs:
        reps: list[dict[str, Any]] = []
        for rep in range(sizes.warmups + sizes.multi_reps):
            db = workdir / f"multi-{spec.system}-{rep}.sqlite"
            log_path = workdir / f"multi-{spec.system}.log"
            children = [
                start_child(spec, db, log_path, {"executor_id": f"proc{p}"}) for p in range(sizes.multi_procs)
            ]
            try:
                for child in children:  # create the file in one process, then open it in the other
                    child.ready()
                    child.call("open")
                start = time.perf_counter()
                for child in children:
                    child.send("multi", runs=sizes.multi_runs, steps=sizes.multi_steps)
                answers = [child.result(timeout=900) for child in children]
                wall = time.perf_counter() - start
            finally:
                for child in children:
                    child.close()
            completed = sum(a["completed_runs"] for a in answers)
            rep_result = {
                "wall": wall,
                "steps_per_s": completed * sizes.multi_steps / wall,
                "completed_runs": completed,
                "failed_runs": sum(a["failed_runs"] for a in answers),
                "lock_errors_raised": sum(a["lock_errors_raised"] for a in answers),
                "lock_errors_logged": sum(a.get("lock_errors_logged", 0) for a in answers),
                "errors": [e for a in answers for e in a["errors"]][:4],
                "warm_up": rep < sizes.warmups,
            }
            reps.append(rep_result)
            log(
                f"4. {spec.label} {'warm-up' if rep_result['warm_up'] else f'rep {rep - sizes.warmups + 1}'}:"
                f" {rep_result['steps_per_s']:,.0f} steps/s, {rep_result['completed_runs']} runs completed,"
                f" lock errors raised {rep_result['lock_errors_raised']},"
                f" logged {rep_result['lock_errors_logged']}"
            )
        counted = [r for r in reps if not r["warm_up"]]
        results[spec.label] = {
            "reps": reps,
            "steps_per_s": [r["steps_per_s"] for r in counted],
            # Errors count in every repetition, the warm-up included: none may be hidden.
            "lock_errors_raised": sum(r["lock_errors_raised"] for r in reps),
            "lock_errors_logged": sum(r["lock_errors_logged"] for r in reps),
            "failed_runs": sum(r["failed_runs"] for r in reps),
            "runs": sum(sizes.multi_procs * sizes.multi_runs for _ in reps),
            "errors": [e for r in reps for e in r["errors"]][:4],
        }
    return results
