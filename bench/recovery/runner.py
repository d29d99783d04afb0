"""``python -m bench.recovery``: duplicated effects and recovery time after a SIGKILL (issue 18).

1. **Duplicates.** A workflow of ``--steps`` steps whose every ``--every``-th step calls a
   non-idempotent tool: a plain append of one line to a ledger file (no key). Per system,
   ``--kills`` runs are each SIGKILLed at a random (seeded) moment, a fresh process finishes the
   run, and the ledger's duplicated and missing lines are counted. Systems: zincir with
   ``run.execute(pending, tool, reconcile=probe)`` (the probe looks for the call's line), zincir
   with ``run.execute`` and no reconciler, DBOS ``@DBOS.step``, LangGraph ``@task``; SQLite, WAL
   + synchronous=FULL for all. zincir's restarted process takes the run with plain
   ``open_run(run_id)``: no ``force``.
2. **Recovery time.** A zincir run making steady progress under the default ``lease_ttl=30`` is
   SIGKILLed; the clock starts when this (parent) process sends the SIGKILL (a same-host
   takeover may come before the reaping: a zombie is dead) and stops when the run
   made progress again (a step that was not recorded before the kill ran and is durable), in the
   recovering process (CLOCK_MONOTONIC is one clock for the whole machine). Recovered by (a) a
   ``ResumeWorker`` already running in another process, ``poll_interval`` 1.0 s and 0.1 s, (b) a
   process started after the kill that calls plain ``open_run(run_id)``, retrying on
   ``RunLeased``; on SQLite and PostgreSQL. DBOS, for comparison: a process started after the
   kill whose ``DBOS.launch()`` recovers the workflow.

Writes ``bench/reports/recovery.md`` with the figures as JSON and a chart (SVG) beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..harness import study
from ..harness.machine import brief
from ..harness.processes import ChildProcess
from ..harness.reports import shown_command, write_outputs
from ..harness.server import postgres_server, scratch_database
from .ledger import ledger_counts, tool_steps
from .report import chart, render

RECOVERY_TARGET_S = 1.0


@dataclass
class Sizes:
    kills: int = 30
    steps: int = 100
    every: int = 10
    calibration: int = 2
    recovery_kills: int = 10
    pace: float = 0.02
    kill_after: tuple[float, float] = (0.2, 0.7)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(kills=3, steps=30, calibration=1, recovery_kills=2)


@dataclass(frozen=True)
class DupConfig:
    key: str
    label: str
    system: str
    reconcile: bool = False
    how: str = ""


DUP_CONFIGS = (
    DupConfig(
        "zincir-reconcile",
        "zincir, execute + reconcile",
        "zincir",
        True,
        "`run.execute(pending, append, reconcile=probe)`; the probe reads the ledger for the call id",
    ),
    DupConfig(
        "zincir-plain",
        "zincir, execute without reconcile",
        "zincir",
        False,
        "`run.execute(pending, append)`: a started call runs again (at-least-once)",
    ),
    DupConfig("dbos", "DBOS", "dbos", how="`@DBOS.step` in a `@DBOS.workflow`; recovered by `DBOS.launch()`"),
    DupConfig(
        "langgraph",
        "LangGraph",
        "langgraph",
        how='`@task` in an `@entrypoint`, `durability="sync"`; resumed with `invoke(None, config)`',
    ),
)


@dataclass(frozen=True)
class RecConfig:
    key: str
    label: str
    system: str
    backend: str
    recoverer: str  # worker | reopen | relaunch
    poll: float = 0.0
    target: bool = True  # judged against the 1 s target


def rec_configs(backends: Sequence[str], systems: Sequence[str]) -> list[RecConfig]:
    out = []
    for backend in backends:
        name = "SQLite" if backend == "sqlite" else "PostgreSQL"
        out += [
            RecConfig(
                f"zincir-{backend}-worker-1.0",
                f"zincir, {name}, ResumeWorker poll 1.0 s",
                "zincir",
                backend,
                "worker",
                1.0,
            ),
            RecConfig(
                f"zincir-{backend}-worker-0.1",
                f"zincir, {name}, ResumeWorker poll 0.1 s",
                "zincir",
                backend,
                "worker",
                0.1,
            ),
            RecConfig(
                f"zincir-{backend}-open_run",
                f"zincir, {name}, new process + open_run(run_id)",
                "zincir",
                backend,
                "reopen",
            ),
        ]
    if "dbos" in systems and "sqlite" in backends:
        out.append(
            RecConfig(
                "dbos-sqlite-launch",
                "DBOS, SQLite, new process + DBOS.launch()",
                "dbos",
                "sqlite",
                "relaunch",
                target=False,
            )
        )
    return out


# -- child processes ------------------------------------------------------------------------


def start(system: str, mode: str, args: dict[str, Any], log_path: Path) -> ChildProcess:
    """A child process of ``system`` in the role ``mode`` (see ``bench/recovery/<system>.py``)."""
    return ChildProcess(
        f"bench.recovery.{system}:child", {**args, "mode": mode}, log_path, f"{system} {mode}"
    )


@contextlib.contextmanager
def spawned(*procs: ChildProcess | None) -> Iterator[None]:
    try:
        yield
    finally:
        for p in procs:
            if p is not None:
                p.close(timeout=30)


# -- 1: duplicates --------------------------------------------------------------------------


def dup_trial(cfg: DupConfig, sizes: Sizes, work: Path, trial: str, delay: float | None) -> dict[str, Any]:
    args = {
        "db": str(work / f"dup-{cfg.key}.sqlite"),
        "ledger": str(work / f"dup-{cfg.key}-{trial}.ledger"),
        "trial": trial,
        "steps": sizes.steps,
        "every": sizes.every,
        "reconcile": cfg.reconcile,
    }
    log_path = work / f"dup-{cfg.key}.log"
    first = start(cfg.system, "dup-run", args, log_path)
    second = start(cfg.system, "dup-resume", args, log_path) if delay is not None else None
    out: dict[str, Any] = {"trial": trial, "delay": delay}
    with spawned(first, second):
        first.expect("ready")
        if second is not None:
            second.expect("ready")
        first.send("go")
        started = first.expect("started")["at"]
        if second is None:
            out["seconds"] = first.expect("done", timeout=600)["at"] - started
        else:
            assert delay is not None
            time.sleep(max(0.0, started + delay - time.monotonic()))
            out["killed"] = not first.has_pending("done")
            first.kill()
            second.send("go")
            try:
                result = second.expect("result", timeout=300)
                out.update({k: v for k, v in result.items() if k not in ("event", "at")})
            except (TimeoutError, RuntimeError) as exc:
                out.update(completed=False, how=f"failed: {str(exc).splitlines()[0][:200]}")
    out.update(ledger_counts(args["ledger"], tool_steps(sizes.steps, sizes.every)))
    return out


def run_duplicates(
    configs: list[DupConfig], sizes: Sizes, work: Path, rng: random.Random, log: study.Log
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for cfg in configs:
        calib = [dup_trial(cfg, sizes, work, f"cal{k}", None)["seconds"] for k in range(sizes.calibration)]
        window = statistics.median(calib)
        log(
            f"1. {cfg.label}: an uninterrupted run takes {window * 1e3:.0f} ms;"
            f" {sizes.kills} kills at U(0, that)"
        )
        trials = []
        for k in range(sizes.kills):
            t = dup_trial(cfg, sizes, work, f"t{k}", rng.uniform(0, window))
            trials.append(t)
            if t["duplicates"] or t["missing"] or not t.get("completed"):
                log(
                    f"   trial {k}: killed at {t['delay'] * 1e3:.0f} ms, {t.get('how')}: "
                    f"{t['duplicates']} duplicated, {t['missing']} missing, completed {t.get('completed')}"
                )
        results[cfg.key] = r = {
            "label": cfg.label,
            "system": cfg.system,
            "how": cfg.how,
            "reconcile": cfg.reconcile,
            "calibration_seconds": calib,
            "kills": len(trials),
            "killed_mid_run": sum(bool(t.get("killed")) for t in trials),
            "duplicates": sum(t["duplicates"] for t in trials),
            "trials_with_duplicate": sum(t["duplicates"] > 0 for t in trials),
            "missing": sum(t["missing"] for t in trials),
            "never_completed": sum(not t.get("completed") for t in trials),
            "effects_per_run": len(tool_steps(sizes.steps, sizes.every)),
            "outcomes": sorted({str(t.get("how")) for t in trials}),
            "trials": trials,
        }
        if cfg.system == "zincir":
            r["started_before_found"] = sum(t.get("started_before", 0) for t in trials)
            r["retries_on_run_leased"] = sum(t.get("retries", 0) for t in trials)
            r["takeovers"] = sum(t.get("takeovers", 0) for t in trials)
        log(
            f"1. {cfg.label}: {r['kills']} kills ({r['killed_mid_run']} mid-run):"
            f" {r['duplicates']} duplicated lines in {r['trials_with_duplicate']} runs,"
            f" {r['missing']} missing,"
            f" {r['never_completed']} never completed"
        )
    return results


# -- 2: recovery time -----------------------------------------------------------------------


def _stats(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    if not s:
        return {}
    q = statistics.quantiles(s, n=10, method="inclusive") if len(s) > 1 else [s[0]] * 9
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "p10": q[0], "p90": q[-1]}


def rec_trial(
    cfg: RecConfig, sizes: Sizes, db: str, work: Path, k: int, delay: float, worker: ChildProcess | None
) -> dict[str, Any]:
    log_path = work / f"rec-{cfg.key}.log"
    victim_args: dict[str, Any] = {
        "db": db,
        "pace": sizes.pace,
        "max_steps": 100_000,
        "workflow_id": f"victim-{k}",
    }
    victim = start(cfg.system, "victim", victim_args, log_path)
    out: dict[str, Any] = {"delay": delay}
    recoverer: ChildProcess | None = None
    with spawned(victim):
        victim.expect("ready")
        victim.send("go")
        run_id = victim.expect("started")["run_id"]
        time.sleep(delay)
        killed = victim.kill()
    if worker is not None:
        claimed = worker.expect("claimed", timeout=120, run_id=run_id)
        progress = worker.expect("progress", timeout=60, run_id=run_id)
        ended = worker.expect("ended", timeout=60, run_id=run_id)
        out.update(claim_s=claimed["at"] - killed)
    else:
        mode = "relaunch" if cfg.system == "dbos" else "reopen"
        recoverer = start(cfg.system, mode, {"db": db, "run_id": run_id, "max_steps": 100_000}, log_path)
        with spawned(recoverer):
            opened = recoverer.expect("opened", timeout=120)
            owned = recoverer.expect("owned", timeout=180)
            progress = recoverer.expect("progress", timeout=60)
            ended = recoverer.expect("ended", timeout=60)
            boot = recoverer.seen["boot"]["at"]
            imported = recoverer.seen["imported"]["at"]
        out.update(
            interpreter_s=boot - killed,
            import_s=imported - boot,
            startup_s=opened["at"] - killed,
            takeover_s=progress["at"] - opened["at"],
            owned_s=owned["at"] - killed,
            retries=owned.get("retries", 0),
        )
    out.update(
        seconds=progress["at"] - killed,
        step=progress.get("step"),
        takeovers=ended.get("takeovers"),
        reason=ended.get("reason"),
    )
    return out


def recovery_trials(
    cfg: RecConfig, sizes: Sizes, db: str, work: Path, rng: random.Random, log: study.Log
) -> list[dict[str, Any]]:
    """``--recovery-kills`` kills of a run recovered as ``cfg`` says; for a ResumeWorker, one
    that runs in its own process throughout."""
    worker = None
    if cfg.recoverer == "worker":
        worker = start(
            cfg.system,
            "worker",
            {"db": db, "poll": cfg.poll, "max_steps": 100_000},
            work / f"rec-{cfg.key}.log",
        )
    trials = []
    with spawned(worker):
        if worker is not None:
            worker.expect("ready")
        for k in range(sizes.recovery_kills):
            trials.append(rec_trial(cfg, sizes, db, work, k, rng.uniform(*sizes.kill_after), worker))
            log(f"   {cfg.label} kill {k + 1}/{sizes.recovery_kills}: {trials[-1]['seconds'] * 1e3:.0f} ms")
    return trials


def run_recovery(
    configs: list[RecConfig], sizes: Sizes, work: Path, pg_url: str | None, rng: random.Random, log: study.Log
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for cfg in configs:
        with contextlib.ExitStack() as stack:
            if cfg.backend == "postgresql":
                assert pg_url is not None
                dbname = f"bench_recovery_{cfg.key.replace('-', '_').replace('.', '')}"
                db = stack.enter_context(scratch_database(pg_url, dbname))
            else:
                db = str(work / f"rec-{cfg.key}.sqlite")
            trials = recovery_trials(cfg, sizes, db, work, rng, log)
        seconds = [t["seconds"] for t in trials]
        results[cfg.key] = r = {**asdict(cfg), "trials": trials, "seconds": _stats(seconds)}
        for part in ("claim_s", "interpreter_s", "import_s", "startup_s", "takeover_s"):
            values = [t[part] for t in trials if part in t]
            if values:
                r[part] = _stats(values)
        r["retries_on_run_leased"] = sum(t.get("retries", 0) for t in trials)
        r["takeovers"] = sum(t.get("takeovers") or 0 for t in trials)
        r["reasons"] = sorted({str(t["reason"]).split(",")[0] for t in trials if t.get("reason")})[:2]
        log(
            f"2. {cfg.label}: median {r['seconds']['median'] * 1e3:.0f} ms"
            f" (min {r['seconds']['min'] * 1e3:.0f}, max {r['seconds']['max'] * 1e3:.0f})"
            f" over {len(trials)} kills"
        )
    return results


# -- the command line -----------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = study.parser("python -m bench.recovery", __doc__.split("\n\n")[0], "recovery.md", server=True)
    add = parser.add_argument
    add("--systems", default="zincir,dbos,langgraph", help="subset of zincir,dbos,langgraph")
    add("--backends", default="sqlite,postgresql", help="recovery time on sqlite,postgresql")
    add("--only", default="1,2", help="1 (duplicates), 2 (recovery time)")
    add("--kills", type=int, help="kills per system in 1")
    add("--recovery-kills", type=int, help="kills per configuration in 2")
    add("--seed", type=int, default=18, help="seed of the kill moments (18)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    out = Path(args.out)
    if study.redraw(args, render, chart):
        return 0
    raw_argv = list(sys.argv[1:] if argv is None else argv)
    sizes = Sizes.quick() if args.quick else Sizes()
    study.override(sizes, args, kills="kills", recovery_kills="recovery_kills")
    log = study.progress(args.quiet)
    wanted = [s.strip() for s in args.systems.split(",") if s.strip()]
    skipped: dict[str, str] = {}
    systems = []
    for s in wanted:
        if study.installed(s):
            systems.append(s)
        else:
            skipped[s] = f"`{s}` is not installed in this interpreter ({sys.executable})"
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    parts = {p.strip() for p in args.only.split(",")}
    rng = random.Random(args.seed)
    started = time.monotonic()
    results: dict[str, Any] = {
        "command": shown_command("python -m bench.recovery", raw_argv),
        "machine": brief("zincir"),
        "sizes": asdict(sizes),
        "skipped": skipped,
        "duplicates": {},
        "recovery": {},
        "targets": {"duplicates_with_reconcile": 0, "recovery_s": RECOVERY_TARGET_S},
    }
    with study.scratch(args.dir, "bench-recovery-", keep=args.keep, log=log) as work:
        if "1" in parts:
            configs = [c for c in DUP_CONFIGS if c.system in systems]
            log(f"1. duplicates: {', '.join(c.label for c in configs)}")
            results["duplicates"] = run_duplicates(configs, sizes, work, rng, log)
        if "2" in parts:
            configs2 = rec_configs(backends, systems)
            with contextlib.ExitStack() as stack:
                pg_url = None
                if "postgresql" in backends:
                    pg_url = stack.enter_context(postgres_server(args.url, work, log))
                results["recovery"] = run_recovery(configs2, sizes, work, pg_url, rng, log)
    results["wall_seconds"] = time.monotonic() - started
    write_outputs(out, results, render, chart)
    log(f"wrote {out} (+ .json, .svg) in {results['wall_seconds']:.0f} s")
    return 0
