"""What every study's runner shares: its command line's common options, its progress on stderr,
its scratch directory, what its report records first and last, the order of a repetition, and
which peers are installed."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .charts import Chart
from .machine import describe, now
from .reports import REPORTS, read_results, shown_command, write_outputs

Log = Callable[[str], None]
T = TypeVar("T")

# The module each system needs; zincir and raw sqlite3 are always there.
_PEER_MODULES = {"dbos": "dbos", "langgraph": "langgraph.checkpoint.sqlite"}


def parser(
    prog: str, description: str | None, report: str, *, quick: bool = True, server: bool = False
) -> argparse.ArgumentParser:
    """A study's command line with the options every study has: ``--out`` (default
    ``bench/reports/<report>``), ``--dir``, ``--keep``, ``-q``, ``--render``; ``--quick`` and
    ``--url`` (a PostgreSQL server) where the study has them."""
    command = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = command.add_argument
    if quick:
        add("--quick", action="store_true", help="tiny sizes: a smoke run, not a measurement")
    if server:
        add("--url", help="a PostgreSQL superuser URL (default: start a throwaway server)")
    add(
        "--out",
        default=str(REPORTS / report),
        help=f"the Markdown report (default: bench/reports/{report}); its figures (.json) and chart (.svg)"
        " go beside it",
    )
    add("--dir", help="where the run's databases, files and server data go (default: the current directory)")
    add("--keep", action="store_true", help="keep them (and the child processes' logs) afterwards")
    add("-q", "--quiet", action="store_true", help="no progress on stderr")
    add("--render", metavar="JSON", help="measure nothing: redraw --out (and its chart) from a run's JSON")
    return command


def subsets(command: argparse.ArgumentParser, **names: Sequence[str]) -> None:
    """For each keyword, an option ``--<keyword>`` that picks a comma-separated subset of its
    names (all of them by default); ``choices`` checks what was given."""
    for option, allowed in names.items():
        listed = ",".join(allowed)
        command.add_argument(f"--{option}", default=listed, help=f"comma-separated subset of {listed}")


def database_options(command: argparse.ArgumentParser) -> None:
    """``--backends`` (sqlite, postgresql or both) and ``--url`` (a database to use instead of a
    throwaway server), for a study that measures in one database per backend
    (``server.backend_target``)."""
    command.add_argument("--backends", default="sqlite,postgresql", help="sqlite, postgresql or both")
    command.add_argument("--url", help="a PostgreSQL database URL to use instead of a throwaway server")


def writers(command: argparse.ArgumentParser) -> None:
    """``--writers N``: zincir's PostgreSQL writer connections, for a study that opens zincir
    on PostgreSQL in its children."""
    command.add_argument(
        "--writers", type=int, help="zincir's PostgreSQL writer connections (default: zincir's)"
    )


def redraw(
    args: argparse.Namespace,
    render: Callable[[dict[str, Any], str], str],
    chart: Callable[[dict[str, Any]], Chart] | None = None,
) -> bool:
    """With ``--render JSON``: redraw ``--out`` (and its chart) from a run's figures, measure
    nothing, and say so."""
    if not args.render:
        return False
    write_outputs(Path(args.out), read_results(args.render), render, chart, json_too=False)
    return True


def override(sizes: Any, args: argparse.Namespace, **fields: str) -> None:
    """Set each of ``sizes``' fields (the values) that an option (the names) was given for."""
    for option, field in fields.items():
        if getattr(args, option) is not None:
            setattr(sizes, field, getattr(args, option))


def progress(quiet: bool) -> Log:
    """A log of the run's progress on stderr, each line with the seconds since it started."""
    started = time.perf_counter()

    def log(message: str) -> None:
        if not quiet:
            print(f"[{time.perf_counter() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

    return log


def choices(text: str, allowed: Sequence[str], what: str) -> list[str]:
    """The items of a comma-separated option; SystemExit on one not ``allowed``."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(items) - set(allowed))
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (choose from {', '.join(allowed)})")
    return items


def installed(system: str) -> bool:
    """Whether ``system`` can run here (a peer lives in its own virtualenv, see bench/README.md)."""
    module = _PEER_MODULES.get(system)
    if module is None:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@contextlib.contextmanager
def scratch(where: str | None, prefix: str, *, keep: bool, log: Log) -> Iterator[Path]:
    """A new directory under ``where`` (default: the current one, so that the disk is the one
    the reader cares about, not a tmpfs) for a run's databases and logs; deleted afterwards
    unless ``keep``."""
    base = Path(where or ".")
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=base)).resolve()
    try:
        yield workdir
    finally:
        if keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def rotated(items: Sequence[T], k: int) -> list[T]:
    """Repetition ``k``'s order: rotated by ``k``, so that drift in the disk or the machine hits
    every configuration alike."""
    k %= len(items)
    return [*items[k:], *items[:k]]


async def taking_turns(
    subjects: dict[str, T], work: Callable[[T, int], Awaitable[object]], count: int
) -> dict[str, list[float]]:
    """The time in µs of each ``work(subject, i)``, i from 0 to ``count - 1``, the subjects taking
    turns call by call (which goes first alternates, so that a load that comes and goes hits them
    alike), after a warm-up call each (i = -1)."""
    times: dict[str, list[float]] = {name: [] for name in subjects}
    for subject in subjects.values():
        await work(subject, -1)
    for i in range(count):
        for name in rotated(list(subjects), i):
            started = time.perf_counter()
            await work(subjects[name], i)
            times[name].append((time.perf_counter() - started) * 1e6)
    return times


def begin(program: str, argv: Sequence[str] | None, workdir: Path, **fields: Any) -> dict[str, Any]:
    """What a run's results record first: the command as a reader would rerun it, the date, the
    machine and the disk of ``workdir``, the load average; then ``fields``."""
    return {
        "command": shown_command(program, sys.argv[1:] if argv is None else argv),
        "date": now(),
        "machine": describe(workdir),
        "loadavg_start": os.getloadavg(),
        **fields,
    }


@contextlib.contextmanager
def running(
    program: str,
    argv: Sequence[str] | None,
    args: argparse.Namespace,
    prefix: str,
    render: Callable[[dict[str, Any], str], str],
    chart: Callable[[dict[str, Any]], Chart] | None = None,
    **fields: Any,
) -> Iterator[tuple[Path, dict[str, Any], Log]]:
    """One run of a study: its progress log, a scratch directory (``prefix``), the results begun
    with ``fields`` (and ``quick``); yields them, and writes the report once the body is done."""
    log = progress(args.quiet)
    started = time.perf_counter()
    with scratch(args.dir, prefix, keep=args.keep, log=log) as workdir:
        results = begin(program, argv, workdir, quick=args.quick, **fields)
        yield workdir, results, log
        finish(Path(args.out), results, render, chart, started=started, log=log)


def finish(
    out: Path,
    results: dict[str, Any],
    render: Callable[[dict[str, Any], str], str],
    chart: Callable[[dict[str, Any]], Chart] | None,
    *,
    started: float,
    log: Log,
) -> None:
    """Record the run's duration and the load average at its end; write the report, its figures
    and its chart."""
    results["total_seconds"] = time.perf_counter() - started
    results["loadavg_end"] = os.getloadavg()
    write_outputs(out, results, render, chart)
    chart_too = " and chart (.svg)" if chart else ""
    log(f"wrote {out} with its figures (.json){chart_too} in {results['total_seconds']:.0f} s")
