"""``python -m bench.fanout``: fan-out/fan-in of child runs, zincir vs DBOS child workflows (issue 16).

One parent fans out to 1,000 children with no-op bodies and fans back in; timed from the parent's
first spawn to the parent's completion, on SQLite and on PostgreSQL, in one run:

* zincir: one worker process, ``ResumeWorker(max_concurrency=64, suspend_after=30.0)``, one
  handler for parents and children. The parent run exists (pending) before the clock starts;
  its handler fans out in the durable nursery: ``nursery.spawn_soon`` per child (the children
  are created 100 per transaction), the block's end joins them (100 per transaction), and the
  parent completes with the sum of the results in ``nursery.records``. The primary figure: the
  way zincir's README fans out. A second configuration awaits ``run.spawn`` per child and then
  ``run.join`` of each, a commit each, one after another. A third spawns (then joins) from 64
  Trio tasks at once, which zincir's named spawns allow and its group commit batches.
* DBOS Transact: a parent workflow that calls ``DBOS.start_workflow`` per child and
  ``get_result()`` on each handle, in a process with ``max_executor_threads=64`` (at most 64
  workflows at once, the parent included, as in zincir's worker); otherwise as shipped. On SQLite
  also with the file switched to WAL + synchronous=FULL (zincir's settings), as a second figure.

Per backend: median seconds of ``--reps`` repetitions after a warm-up, min and max, children/s,
and zincir ÷ DBOS in throughput against issue 16's target (≥ 3x). The configurations of a
backend live in long-lived child processes (one per system, each with its own database, opened
before anything is timed) and take turns in a rotated order, so that drift hits them alike.

Writes ``bench/reports/fanout.md``, the figures as JSON beside it and a chart (SVG).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..harness import study
from ..harness.machine import source_changes
from ..harness.processes import ChildProcess
from ..harness.server import (
    create_database,
    drop_database,
    postgres_server,
    postmaster_pid,
    server_cpu,
    server_settings,
    xact_commits,
)
from .report import chart, render

BACKENDS = ("sqlite", "postgresql")
SYSTEMS = ("zincir", "dbos")
TARGET_RATIO = 3.0


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    system: str
    process: str  # configurations of one process share it (and its database)
    style: str | None  # zincir's fan-in style
    how: str
    primary: bool
    backends: tuple[str, ...] = BACKENDS


CONFIGS = (
    Config(
        "zincir",
        "zincir, nursery",
        "zincir",
        "zincir",
        "nursery",
        "`ResumeWorker` handler: `async with run.children() as nursery:` `nursery.spawn_soon(...)` per"
        " child (created 100 per transaction; the block's end joins them, 100 per transaction), then"
        " `run.complete(result=...)` from `nursery.records`",
        True,
    ),
    Config(
        "zincir-explicit",
        "zincir, spawn + join one at a time",
        "zincir",
        "zincir",
        "explicit",
        "`run.spawn` per child, then `run.join` of each in order: a commit each, one after another",
        False,
    ),
    Config(
        "zincir-concurrent",
        "zincir, concurrent spawns + joins",
        "zincir",
        "zincir",
        "concurrent",
        "`run.spawn` from 64 Trio tasks at once (one writer's group commit batches them), then `run.join`"
        " likewise",
        False,
    ),
    Config(
        "dbos",
        "DBOS, start_workflow + get_result",
        "dbos",
        "dbos",
        None,
        "workflow: `DBOS.start_workflow(child)` per child, then `handle.get_result()` of each in order",
        True,
    ),
    Config(
        "dbos-wal",
        "DBOS (WAL), start_workflow + get_result",
        "dbos",
        "dbos-wal",
        None,
        "as DBOS, with the SQLite file in WAL, synchronous=FULL (a connection creator)",
        False,
        ("sqlite",),
    ),
)
CONFIG_KEYS = tuple(c.key for c in CONFIGS)


@dataclass
class Sizes:
    children: int = 1000
    reps: int = 3
    warmup_children: int = 100  # one warm-up fan-out per configuration, not counted
    max_concurrency: int = 64  # zincir's ResumeWorker(max_concurrency=...), DBOS's max_executor_threads
    suspend_after: float = 30.0  # zincir's ResumeWorker(suspend_after=...): its default
    poll_interval: float = 1.0  # zincir's ResumeWorker(poll_interval=...): its default
    writers: int | None = None  # zincir's PostgreSQL writer connections (None: zincir's default)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(children=50, reps=1, warmup_children=10)


# -- one backend's processes, and a trial measured around them ---------------------------------------


class Host:
    """The running processes of one backend, and how to time one configuration's trial."""

    def __init__(self, backend: str, postmaster: int | None) -> None:
        self.backend = backend
        self.postmaster = postmaster
        self.children: dict[str, ChildProcess] = {}
        self.targets: dict[str, str] = {}
        self.facts: dict[str, Any] = {}

    def trial(
        self, config: Config, children: int, *, profile: bool = False, measure: bool = True
    ) -> dict[str, Any]:
        child = self.children[config.process]
        target = self.targets[config.process]
        postgres = self.backend == "postgresql" and measure
        commits0 = xact_commits(target) if postgres else None
        server0 = server_cpu(self.postmaster) if self.postmaster and measure else None
        arguments: dict[str, Any] = {"children": children, "profile": profile}
        if config.style is not None:
            arguments["style"] = config.style
        answer: dict[str, Any] = child.call("fanout", timeout=max(600.0, children), **arguments)
        if server0 is not None and self.postmaster:
            answer["server_cpu_seconds"] = server_cpu(self.postmaster) - server0
        if commits0 is not None:
            time.sleep(1.2)  # backends report to pg_stat_database about once a second
            answer["xact_commits"] = xact_commits(target) - commits0
        expected = {"children": children, "sum": children}
        if answer["result"] != expected:
            raise RuntimeError(
                f"{config.label}: the parent ended with {answer['result']!r}, not {expected!r}"
            )
        answer["per_s"] = children / answer["seconds"]
        return answer


# -- the command ------------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = study.parser("python -m bench.fanout", __doc__, "fanout.md", server=True)
    add = parser.add_argument
    study.subsets(parser, systems=SYSTEMS, configs=CONFIG_KEYS, backends=BACKENDS)
    add("--children", type=int, help="children per fan-out (1,000; --quick: 50, 1 rep)")
    add("--reps", type=int, help="timed repetitions per configuration (3)")
    add("--warmup", type=int, help="children in each configuration's warm-up fan-out (100; 0: none)")
    add("--max-concurrency", type=int, help="zincir's max_concurrency and DBOS's max_executor_threads (64)")
    add("--suspend-after", type=float, help="zincir's ResumeWorker(suspend_after=...) (30.0)")
    study.writers(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    out = Path(args.out)
    if study.redraw(args, render, chart):
        return 0
    sizes = Sizes.quick() if args.quick else Sizes()
    study.override(
        sizes,
        args,
        children="children",
        reps="reps",
        warmup="warmup_children",
        max_concurrency="max_concurrency",
        suspend_after="suspend_after",
        writers="writers",
    )
    if sizes.children < 1 or sizes.reps < 1 or sizes.warmup_children < 0:
        raise SystemExit("--children and --reps must be at least 1, --warmup at least 0")
    systems = study.choices(args.systems, SYSTEMS, "systems")
    wanted = study.choices(args.configs, CONFIG_KEYS, "configurations")
    backends = study.choices(args.backends, BACKENDS, "backends")
    missing = [s for s in systems if not study.installed(s)]

    started = time.perf_counter()
    log = study.progress(args.quiet)

    skipped: dict[str, str] = {}
    plan: dict[str, list[Config]] = {}
    for backend in backends:
        for config in CONFIGS:
            if config.key not in wanted or config.system not in systems or backend not in config.backends:
                continue
            if config.system in missing:
                skipped[f"{config.key}-{backend}"] = f"{config.system} is not installed"
                continue
            plan.setdefault(backend, []).append(config)
    for key, why in skipped.items():
        log(f"skipped {key}: {why}")

    tag = uuid.uuid4().hex[:8]
    wall_start = time.time()
    with study.scratch(args.dir, "zincir-bench-fanout-", keep=args.keep, log=log) as workdir:
        results = study.begin(
            "python -m bench.fanout",
            argv,
            workdir,
            quick=args.quick,
            sizes=asdict(sizes),
            target_ratio=TARGET_RATIO,
            configs={c.key: {**asdict(c), "backends": list(c.backends)} for c in CONFIGS},
            external_server=bool(args.url),
            missing_peers=missing,
            skipped=skipped,
            processes={},
            warmup={},
            trials={},
            profile={},
        )
        with contextlib.ExitStack() as stack:
            admin_url = None
            if "postgresql" in plan:
                admin_url = stack.enter_context(postgres_server(args.url, workdir, log))
                results["server"] = server_settings(admin_url)
            for backend, configs in plan.items():
                run_backend(backend, configs, sizes, workdir, admin_url, tag, results, log)
    results["source_changes"] = source_changes(wall_start, results["machine"].get("zincir_commit", ""))
    if results["source_changes"]:
        log(f"zincir's source changed during the run: {results['source_changes']}")
    study.finish(out, results, render, chart, started=started, log=log)
    return 0


def run_backend(
    backend: str,
    configs: list[Config],
    sizes: Sizes,
    workdir: Path,
    admin_url: str | None,
    tag: str,
    results: dict[str, Any],
    log: study.Log,
) -> None:
    host = Host(backend, postmaster_pid(admin_url) if backend == "postgresql" and admin_url else None)
    databases: list[str] = []
    processes = list(dict.fromkeys(c.process for c in configs))
    try:
        for process in processes:
            if backend == "sqlite":
                target = str(workdir / f"{process}.sqlite")
            else:
                assert admin_url is not None
                dbname = f"bench_fanout_{process.replace('-', '_')}_{tag}"
                target = create_database(admin_url, dbname)
                databases.append(dbname)
            system = "zincir" if process == "zincir" else "dbos"
            if system == "zincir":
                options: dict[str, Any] = {
                    "max_concurrency": sizes.max_concurrency,
                    "suspend_after": sizes.suspend_after,
                    "poll_interval": sizes.poll_interval,
                    "writers": sizes.writers,
                }
            else:
                options = {"threads": sizes.max_concurrency, "wal": process == "dbos-wal"}
            host.targets[process] = target
            host.children[process] = ChildProcess(
                f"bench.fanout.{system}:child",
                {"target": target, "options": options},
                workdir / f"{process}-{backend}.log",
                f"{system} ({backend})",
            )
        for process in processes:  # all started (and importing) at once; opened one by one
            host.children[process].ready()
            host.facts[process] = host.children[process].call("open", timeout=180)
        results["processes"][backend] = host.facts
        log(f"{backend}: processes open: {', '.join(processes)}")

        if sizes.warmup_children:
            for config in configs:
                profile = config.system == "zincir" and config.primary
                answer = host.trial(config, sizes.warmup_children, profile=profile, measure=False)
                results["warmup"][f"{config.key}-{backend}"] = answer
                if profile:
                    results["profile"][backend] = {
                        "children": sizes.warmup_children,
                        "seconds": answer["seconds"],
                        **answer.pop("profile", {}),
                    }
                log(
                    f"{backend}: warm-up, {config.label}: {sizes.warmup_children} children in"
                    f" {answer['seconds']:.2f} s"
                )
        for rep in range(sizes.reps):
            for config in study.rotated(configs, rep):
                answer = host.trial(config, sizes.children)
                results["trials"].setdefault(f"{config.key}-{backend}", []).append(answer)
                log(
                    f"{backend}: rep {rep + 1}/{sizes.reps}, {config.label}: {sizes.children:,} children in"
                    f" {answer['seconds']:.2f} s ({answer['per_s']:,.0f}/s; spawns"
                    f" {answer['spawn_seconds']:.2f} s,"
                    f" CPU {answer['cpu_seconds']:.1f} s"
                    + (
                        f", server CPU {answer['server_cpu_seconds']:.1f} s"
                        if "server_cpu_seconds" in answer
                        else ""
                    )
                    + ")"
                )
        for config in configs:
            trials = results["trials"][f"{config.key}-{backend}"]
            median = statistics.median(t["seconds"] for t in trials)
            log(
                f"{backend}: {config.label}: median {median:.2f} s, {sizes.children / median:,.0f} children/s"
            )
    finally:
        for child in host.children.values():
            child.close()
        for dbname in databases:
            assert admin_url is not None
            with contextlib.suppress(Exception):
                drop_database(admin_url, dbname)
