"""``python -m bench``: zincir side by side with DBOS Transact and LangGraph on SQLite (issue 9).

Runs the four comparisons and writes a Markdown report (default ``bench/reports/compare.md``) plus the
raw figures as JSON beside it:

1. per-step overhead: one run of 1,000 sequential no-op durable steps (zincir, DBOS as shipped
   and with WAL, LangGraph ``durability="sync"``, raw sqlite3 one commit per step);
2. 50 runs x 100 steps concurrently in one process;
3. crash duplicates: 30 SIGKILLs per system of a 200-step workflow with an external ledger;
4. two processes x 8 runs x 200 steps on one file: "database is locked" errors, throughput.

Every system runs in its own child process (``bench/systems/``); the peers are imported only
there, so without them installed the zincir-only parts still run (``--systems zincir,raw``).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from ..harness import study
from ..systems.common import RECOVERY
from . import comparisons
from .comparisons import ALL_SPECS, CRASH_SPECS, MULTI_SPECS, Sizes
from .report import render

SYSTEM_KEYS = {"zincir": "zincir", "raw": "raw", "dbos": "dbos", "langgraph": "langgraph"}
COMPARISONS = ("1", "2", "3", "4")


NOTES = [
    "All systems write through SQLite at synchronous=FULL (checked above). zincir, raw sqlite3,"
    " LangGraph and 'DBOS (WAL)' use WAL; 'DBOS (as shipped)' keeps SQLite's rollback journal"
    " (DBOS sets no journal mode), which is why it is measured twice. WAL for DBOS is enabled"
    " through its engine options: `db_engine_kwargs={'creator': ...}` returns connections on which"
    " `PRAGMA journal_mode=WAL` and `synchronous=FULL` were run; DBOS's own connect hook still makes"
    " transactions IMMEDIATE with busy_timeout=30000. Comparison 3 uses the WAL variant;"
    " comparison 4 runs both.",
    "Durability is not identical even at equal PRAGMAs. zincir and DBOS return from a step only"
    " after the COMMIT that records its result; zincir commits concurrent runs' steps together"
    " (group commit), DBOS commits each step alone. LangGraph's `durability='sync'` persists"
    " checkpoints synchronously at superstep boundaries, but a `@task`'s writes are handed to a"
    " background executor: the entrypoint sees the task's result before that write commits."
    " raw sqlite3 is one INSERT + COMMIT per step, no workflow bookkeeping at all.",
    "Steps are no-ops, so the figures are pure per-step overhead of each durability layer. The"
    " per-step and concurrency figures are measured in long-lived child processes, one per system"
    " (imports, DBOS launch and database creation are outside the timing); zincir runs under"
    " Trio, DBOS and LangGraph with their synchronous APIs.",
    "Crash trials kill at a random moment in the steady part of the run; a duplicate needs the"
    " kill to land between the ledger's COMMIT and the step's own COMMIT, so plain-append"
    " duplicates are expected for every system (that is at-least-once); the keyed ledger shows"
    " whether the key the system hands a step is stable across the restart. The duplicate rate"
    " without a key grows with that window: LangGraph's is wide because a task's write is"
    " committed in the background while the entrypoint already runs the next task (a kill can"
    " find a ledger task executed but not yet saved). 'Median recovery' is the restarted"
    " process's time from opening the database to the run's completion; DBOS's includes its"
    " workflow handle polling the status table (about once a second).",
    "No system retried a step or a run on behalf of the benchmark: a `database is locked` that"
    " reaches the application fails that run and is counted; internal retries are counted from"
    " the system's log (DBOS logs each retry; zincir logs a heartbeat that met a busy file).",
]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = study.parser("python -m bench", __doc__, "compare.md")
    add = parser.add_argument
    add(
        "--systems",
        default="zincir,raw,dbos,langgraph",
        help="comma-separated subset of zincir,raw,dbos,langgraph (missing peers are skipped)",
    )
    add("--only", default="1,2,3,4", help="comma-separated comparisons to run (1-4)")
    add("--seed", type=int, default=9, help="seed of the kill moments (comparison 3)")
    add("--kills", type=int, help="SIGKILLs per system in comparison 3 (default 30)")
    add("--reps", type=int, help="repetitions of comparisons 1 and 2 (after the warm-up)")
    add("--no-profile", action="store_true", help="skip the profile of a zincir step")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    out = Path(args.out)
    if study.redraw(args, render):
        return 0
    sizes = Sizes.quick() if args.quick else Sizes()
    study.override(sizes, args, kills="crash_kills")
    if args.reps is not None:
        sizes.step_reps = sizes.conc_reps = args.reps
    wanted = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(wanted) - set(SYSTEM_KEYS)
    if unknown:
        raise SystemExit(f"unknown systems: {', '.join(sorted(unknown))}")
    only = {c.strip() for c in args.only.split(",") if c.strip()}
    if only - set(COMPARISONS):
        raise SystemExit("--only takes numbers from 1 to 4")
    missing_peers = [s for s in wanted if not study.installed(s)]
    specs = [s for s in ALL_SPECS if s.system in wanted and s.system not in missing_peers]
    crash_specs = [s for s in specs if s.label in CRASH_SPECS]
    multi_specs = [s for s in specs if s.label in MULTI_SPECS]

    started = time.perf_counter()
    log = study.progress(args.quiet)
    if missing_peers:
        log(f"not installed, skipped: {', '.join(missing_peers)}")
    with study.scratch(args.dir, "zincir-bench-", keep=args.keep, log=log) as workdir:
        results = study.begin(
            "python -m bench",
            argv,
            workdir,
            kept=args.keep,
            quick=args.quick,
            sizes=asdict(sizes),
            seed=args.seed,
            missing_peers=missing_peers,
            peers=[s.label for s in specs if s.peer],
            recovery={s.label: RECOVERY[s.system] for s in crash_specs},
            notes=NOTES,
            settings={},
            per_step={"us_per_step": {}},
            concurrent={"steps_per_s": {}},
            crash={},
            multi={},
        )
        if only & {"1", "2"}:
            log("1 + 2: starting one process per system")
            settings, per_step, concurrent = comparisons.run_steps_and_concurrency(
                specs, sizes, workdir, log, do_steps="1" in only, do_concurrent="2" in only
            )
            results.update(settings=settings, per_step=per_step, concurrent=concurrent)
        else:
            results["settings"] = comparisons.settings_only(specs, workdir)
        if "1" in only and "zincir" in wanted and not args.no_profile:
            log("profile of a zincir step: python -m bench.micro.profile_step")
            results["profile"] = comparisons.run_profile(sizes, workdir)
        if "3" in only:
            results["crash"] = comparisons.run_crash(
                crash_specs, sizes, workdir, random.Random(args.seed), log
            )
        if "4" in only:
            results["multi"] = comparisons.run_multi(multi_specs, sizes, workdir, log)
    study.finish(out, results, render, None, started=started, log=log)
    return 0
