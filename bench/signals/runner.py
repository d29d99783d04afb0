"""``python -m bench.signals``: how fast a signal sent by one process wakes a run waiting in another.

Latency (issue 15): a waiting process and a sending process, both children of this one. The
sender records ``time.monotonic()`` just before it sends; the waiter records it the instant its
wait returned (CLOCK_MONOTONIC is one clock for every process of the machine). p50 / p99 for:

* zincir on SQLite and on PostgreSQL, a run waiting **in-process**: an ``open_run`` block blocked
  in ``run.wait_for_signal``; the sender calls ``zincir.send_signal``;
* zincir on SQLite and on PostgreSQL, a **suspended** run: a ``ResumeWorker(suspend_after=0.0,
  poll_interval=1.0)`` whose handler waits; the run is suspended (status ``waiting``, no lease)
  before the signal is sent, and the latency ends when ``wait_for_signal`` returns in the handler
  that re-claimed it;
* DBOS Transact ``DBOS.recv`` woken by ``DBOS.send``, on SQLite and on PostgreSQL;
* LangGraph ``interrupt()`` resumed by ``graph.invoke(Command(resume=...))`` in another process
  (SqliteSaver): from the start of that call until the code after ``interrupt()`` runs.

Each round arms ``--lanes`` waits, and once they are all waiting the sender signals each one at
its own uniformly random moment within ``--spread`` seconds, so that a send falls at a random
phase of any polling loop (zincir's, DBOS's) rather than right after the wait began.

Throughput: 10,000 runs, each handled by a ResumeWorker whose handler waits for one signal and
completes; once all are suspended, a sender process signals all of them at once (many concurrent
Trio tasks); the time from the first send until the last run completed, and runs/s.

Writes ``bench/reports/signals.md``, the figures as JSON beside it and a chart (SVG).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..harness import study
from ..harness.processes import ChildProcess, process_cpu
from ..harness.server import (
    postgres_server,
    postmaster_pid,
    scratch_database,
    server_cpu,
    server_settings,
    xact_commits,
)
from .report import chart, render, summarize

BACKENDS = ("sqlite", "postgresql")
SYSTEMS = ("zincir", "dbos", "langgraph")
PARTS = ("latency", "throughput")
IN_PROCESS_TARGET_MS = 10.0
SUSPENDED_TARGET_MS = 50.0


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    system: str
    backend: str
    waiter: str  # the waiting process's role
    how: str  # what the wait is, for the report
    target_ms: float | None = None
    suspended: bool = False


IN_PROCESS_HOW = "`open_run` block in `run.wait_for_signal`; sender `zincir.send_signal`"
SUSPENDED_HOW = (
    "`ResumeWorker(suspend_after=0.0, poll_interval=1.0)` handler in `run.wait_for_signal`,"
    " suspended before the send; latency ends in the re-claimed handler"
)
DBOS_HOW = (
    "workflow in `DBOS.recv(topic, timeout_seconds=600)`; sender `DBOS.send(workflow_id, message, topic)`"
)
CONFIGS = (
    Config(
        "zincir-sqlite-inprocess",
        "zincir, SQLite, in-process wait",
        "zincir",
        "sqlite",
        "inprocess",
        IN_PROCESS_HOW,
        IN_PROCESS_TARGET_MS,
    ),
    Config(
        "zincir-postgresql-inprocess",
        "zincir, PostgreSQL, in-process wait",
        "zincir",
        "postgresql",
        "inprocess",
        IN_PROCESS_HOW,
        IN_PROCESS_TARGET_MS,
    ),
    Config(
        "zincir-sqlite-suspended",
        "zincir, SQLite, suspended run",
        "zincir",
        "sqlite",
        "worker",
        SUSPENDED_HOW,
        SUSPENDED_TARGET_MS,
        suspended=True,
    ),
    Config(
        "zincir-postgresql-suspended",
        "zincir, PostgreSQL, suspended run",
        "zincir",
        "postgresql",
        "worker",
        SUSPENDED_HOW,
        SUSPENDED_TARGET_MS,
        suspended=True,
    ),
    Config(
        "dbos-sqlite",
        "DBOS, SQLite, recv",
        "dbos",
        "sqlite",
        "waiter",
        DBOS_HOW,
    ),
    Config(
        "dbos-postgresql",
        "DBOS, PostgreSQL, recv",
        "dbos",
        "postgresql",
        "waiter",
        DBOS_HOW,
    ),
    Config(
        "langgraph-sqlite",
        "LangGraph, SQLite, interrupt + resume",
        "langgraph",
        "sqlite",
        "waiter",
        "node in `interrupt()`, graph run ended (SqliteSaver); sender"
        " `graph.invoke(Command(resume=value), config)`: a resume by re-invocation",
    ),
)


@dataclass
class SignalSizes:
    samples: int = 200  # latency samples per configuration, after the warm-up
    lanes: int = 10  # waits armed at once in a round
    spread: float = 1.0  # each send at a uniformly random moment within this many seconds
    warmup_rounds: int = 1
    throughput_runs: int = 10_000
    max_concurrency: int = 256  # the throughput worker's ResumeWorker(max_concurrency=...)
    senders: int = 128  # concurrent Trio tasks sending in the throughput trial
    fill_concurrency: int = 64  # runs created at once while filling the throughput trial
    worker_poll: float = 1.0  # ResumeWorker(poll_interval=...)
    writers: int | None = None  # zincir's PostgreSQL writer connections (None: zincir's default)

    @classmethod
    def quick(cls) -> SignalSizes:
        return cls(samples=6, lanes=3, spread=0.2, throughput_runs=50, senders=16, fill_concurrency=16)


# -- the child processes ---------------------------------------------------------------------------


def start(system: str, role: str, target: str, log_path: Path, options: dict[str, Any]) -> ChildProcess:
    """A child process in one of ``system``'s roles (see ``bench/signals/<system>.py``)."""
    args = {"role": role, "target": target, "options": options}
    return ChildProcess(f"bench.signals.{system}:child", args, log_path, f"{system} {role}")


def resumed_at(waiter: ChildProcess, ids: list[str], timeout: float) -> dict[str, float]:
    """Wait for a ``resumed`` event of every id; their instants by id."""
    deadline = time.monotonic() + timeout
    seen: dict[str, float] = {}
    want = set(ids)
    while not want <= seen.keys():
        message = waiter.event(deadline - time.monotonic(), "resumed")
        if message["event"] == "resumed" and message["id"] in want:
            seen[message["id"]] = float(message["t"])
    return seen


# -- one latency configuration ----------------------------------------------------------------------


def latency_config(
    config: Config, target: str, sizes: SignalSizes, workdir: Path, rng: random.Random, log: study.Log
) -> dict[str, Any]:
    options = {
        "max_concurrency": max(32, 2 * sizes.lanes),
        "poll_interval": sizes.worker_poll,
        "writers": sizes.writers,
    }
    log_path = workdir / f"{config.key}.log"
    started = time.perf_counter()
    # Both processes start (and import) at once; they open the database one after the other, the
    # waiter first (it creates the schema).
    waiter = start(config.system, config.waiter, target, log_path, options)
    sender = start(config.system, "sender", target, log_path, {"writers": sizes.writers})
    try:
        waiter.ready()
        sender.ready()
        waiter_info = waiter.call("open")
        sender_info = sender.call("open")
        rounds = sizes.warmup_rounds + math.ceil(sizes.samples / sizes.lanes)
        samples: list[float] = []
        arm_ms: list[float] = []
        for r in range(rounds):
            t0 = time.perf_counter()
            ids = waiter.call("arm", n=sizes.lanes, tag=f"r{r}", timeout=180)
            arm_ms.append((time.perf_counter() - t0) * 1e3)
            targets = [[run_id, rng.uniform(0, sizes.spread)] for run_id in ids]
            answer = sender.call("send", targets=targets, timeout=sizes.spread + 120)
            if all(isinstance(v, list) for v in answer.values()):  # the sender saw the resume itself
                sent = {k: v[0] for k, v in answer.items()}
                resumed = {k: v[1] for k, v in answer.items()}
            else:
                sent = answer
                resumed = resumed_at(waiter, ids, timeout=120)
            latencies = [(resumed[i] - sent[i]) * 1e3 for i in ids]
            if r >= sizes.warmup_rounds:
                samples.extend(latencies)
            if r + 1 == rounds or (r - sizes.warmup_rounds + 1) % 5 == 0 or r < sizes.warmup_rounds:
                what = (
                    "warm-up"
                    if r < sizes.warmup_rounds
                    else f"round {r - sizes.warmup_rounds + 1}/{rounds - sizes.warmup_rounds}"
                )
                log(
                    f"   {config.label}: {what}:"
                    f" {', '.join(f'{x:.1f}' for x in sorted(latencies))} ms"
                    f" (armed in {arm_ms[-1]:.0f} ms)"
                )
        samples = samples[: sizes.samples]
    finally:
        for proc in (sender, waiter):
            proc.close()
    stats = summarize(samples)
    return {
        "label": config.label,
        "system": config.system,
        "backend": config.backend,
        "suspended": config.suspended,
        "how": config.how,
        "target_ms": config.target_ms,
        "samples_ms": samples,
        **stats,
        "arm_ms_median": sorted(arm_ms)[len(arm_ms) // 2],
        "seconds": time.perf_counter() - started,
        "waiter": waiter_info,
        "sender": sender_info,
    }


# -- the throughput trial ---------------------------------------------------------------------------


def _cpu(worker: ChildProcess, sender: ChildProcess, postmaster: int | None) -> dict[str, float | None]:
    return {
        "worker": process_cpu(worker.pid),
        "sender": process_cpu(sender.pid),
        "server": None if postmaster is None else server_cpu(postmaster),
    }


def throughput_trial(
    backend: str, target: str, sizes: SignalSizes, workdir: Path, log: study.Log
) -> dict[str, Any]:
    log_path = workdir / f"throughput-{backend}.log"
    options = {
        "max_concurrency": sizes.max_concurrency,
        "poll_interval": sizes.worker_poll,
        "suspend_after": 0.0,
        "writers": sizes.writers,
    }
    worker = start("zincir", "worker", target, log_path, options)
    sender = start("zincir", "sender", target, log_path, {"writers": sizes.writers})
    n = sizes.throughput_runs
    postmaster = postmaster_pid(target) if backend == "postgresql" else None
    try:
        worker.ready()
        sender.ready()
        worker.call("open")
        sender.call("open")
        fill = worker.call(
            "fill", n=n, tag=backend, concurrency=sizes.fill_concurrency, timeout=max(300.0, n / 10)
        )
        log(
            f"   throughput, {backend}: {n:,} runs created in {fill['create_seconds']:.1f} s, all"
            f" suspended after {fill['suspended_seconds']:.1f} s; signalling them all"
        )
        commits_before = xact_commits(target) if backend == "postgresql" else None
        cpu_before = _cpu(worker, sender, postmaster)
        blast = sender.call("blast", ids=fill["ids"], concurrency=sizes.senders, timeout=max(300.0, n / 10))
        done = worker.expect("all_done", timeout=max(300.0, n / 10))
        cpu_after = _cpu(worker, sender, postmaster)
        commits = None
        if commits_before is not None:
            time.sleep(1.5)  # backends report their counters to pg_stat_database about once a second
            commits = xact_commits(target) - commits_before
        completed = worker.call("count", status="completed")
    finally:
        for proc in (sender, worker):
            proc.close()
    seconds = float(done["t"]) - float(blast["t_first"])
    result = {
        "backend": backend,
        "runs": n,
        "completed": completed,
        "seconds": seconds,
        "per_s": n / seconds,
        "send_seconds": float(blast["t_all_sent"]) - float(blast["t_first"]),
        "create_seconds": fill["create_seconds"],
        "suspended_seconds": fill["suspended_seconds"],
        "max_concurrency": sizes.max_concurrency,
        "senders": sizes.senders,
        "poll_interval": sizes.worker_poll,
        # CPU seconds used from just before the first send until the last completion (the sender
        # finished earlier): the worker process, the sender process, PostgreSQL's processes.
        # PostgreSQL: transactions committed in the trial's database meanwhile (every client's).
        "commits": commits,
        "cpu_seconds": {
            k: None if cpu_after[k] is None or cpu_before[k] is None else cpu_after[k] - cpu_before[k]
            for k in cpu_before
        },
    }
    log(
        f"   throughput, {backend}: all {n:,} resumed and completed {seconds:.2f} s after the first send"
        f" ({result['per_s']:,.0f} runs/s; the sends took {result['send_seconds']:.2f} s)"
    )
    return result


# -- the command ------------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = study.parser("python -m bench.signals", __doc__, "signals.md", server=True)
    add = parser.add_argument
    study.subsets(parser, systems=SYSTEMS, backends=BACKENDS)
    add("--only", default=",".join(PARTS), help="latency, throughput or both")
    add("--samples", type=int, help="latency samples per configuration after the warm-up (200)")
    add("--lanes", type=int, help="waits armed at once per round (10)")
    add("--spread", type=float, help="each send at a random moment within this many seconds (1.0)")
    add("--runs", type=int, help="runs in the throughput trial (10,000)")
    add("--max-concurrency", type=int, help="the throughput worker's max_concurrency (256)")
    add("--senders", type=int, help="concurrent sending tasks in the throughput trial (128)")
    study.writers(parser)
    add("--seed", type=int, default=15, help="seed of the send moments")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    out = Path(args.out)
    if study.redraw(args, render, chart):
        return 0
    sizes = SignalSizes.quick() if args.quick else SignalSizes()
    study.override(
        sizes,
        args,
        samples="samples",
        lanes="lanes",
        spread="spread",
        runs="throughput_runs",
        max_concurrency="max_concurrency",
        senders="senders",
        writers="writers",
    )
    systems = study.choices(args.systems, SYSTEMS, "systems")
    backends = study.choices(args.backends, BACKENDS, "backends")
    parts = study.choices(args.only, PARTS, "parts")
    missing = [s for s in systems if not study.installed(s)]
    rng = random.Random(args.seed)

    started = time.perf_counter()
    log = study.progress(args.quiet)

    skipped: dict[str, str] = {}
    configs: list[Config] = []
    if "latency" in parts:
        for config in CONFIGS:
            if config.system not in systems or config.backend not in backends:
                continue
            if config.system in missing:
                skipped[config.key] = f"{config.system} is not installed"
            else:
                configs.append(config)
    tp_backends = [b for b in backends if "throughput" in parts and "zincir" in systems]
    for key, why in skipped.items():
        log(f"skipped {key}: {why}")

    needs_pg = any(c.backend == "postgresql" for c in configs) or "postgresql" in tp_backends
    tag = uuid.uuid4().hex[:8]
    with study.scratch(args.dir, "zincir-bench-signals-", keep=args.keep, log=log) as workdir:
        results = study.begin(
            "python -m bench.signals",
            argv,
            workdir,
            quick=args.quick,
            sizes=asdict(sizes),
            seed=args.seed,
            external_server=bool(args.url),
            missing_peers=missing,
            skipped=skipped,
            latency={},
            throughput={},
        )
        with contextlib.ExitStack() as stack:
            admin_url = stack.enter_context(postgres_server(args.url, workdir, log)) if needs_pg else None
            if admin_url is not None:
                results["server"] = server_settings(admin_url)

            @contextlib.contextmanager
            def database(name: str, backend: str) -> Iterator[str]:
                if backend == "sqlite":
                    yield str(workdir / f"{name}.sqlite")
                    return
                assert admin_url is not None
                with scratch_database(admin_url, f"bench_signals_{name.replace('-', '_')}_{tag}") as url:
                    yield url

            for config in configs:
                log(
                    f"latency: {config.label}: {sizes.samples} samples,"
                    f" {sizes.lanes} waits at a time, sends spread over {sizes.spread:g} s"
                )
                with database(config.key, config.backend) as db_target:
                    result = latency_config(config, db_target, sizes, workdir, rng, log)
                results["latency"][config.key] = result
                log(
                    f"latency: {config.label}: p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms"
                    f" ({len(result['samples_ms'])} samples, {result['seconds']:.0f} s)"
                )
            for backend in tp_backends:
                log(
                    f"throughput, {backend}: {sizes.throughput_runs:,} runs, ResumeWorker("
                    f"max_concurrency={sizes.max_concurrency}, suspend_after=0.0,"
                    f" poll_interval={sizes.worker_poll!r}), {sizes.senders} sending tasks"
                )
                with database(f"throughput-{backend}", backend) as db_target:
                    results["throughput"][backend] = throughput_trial(backend, db_target, sizes, workdir, log)

    study.finish(out, results, render, chart, started=started, log=log)
    return 0
