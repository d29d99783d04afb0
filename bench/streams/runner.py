"""``python -m bench.streams``: durable streams, how fast and how live (issue 36).

On SQLite and on PostgreSQL, each configuration in child processes of its own:

* **throughput**: chunks per second through one stream and through 100 streams at once (one
  writer process, 100 runs, each with ``run.stream("tokens")``), every chunk sent as fast as the
  writer can; with the flushes (fenced writes) and commits that took;
* **commits**: 100 streams each sending 100 chunks per second (10,000 chunks/s asked) for a
  few seconds: the writes and commits per second that streaming costs, which the flush interval
  bounds (at most one flush per stream per interval), not the chunks;
* **latency**: a writer process sends chunks (at random gaps, about 100 per second: an LLM's
  tokens), each carrying ``time.monotonic()`` taken just before its ``send``; a follower in
  another process (``zincir.read_stream(..., follow=True)``) notes when each arrives. p50 and
  p99 against the target p50 ≤ flush interval + 15 ms.

Side by side, where DBOS Transact is installed (``--systems``): its ``DBOS.write_stream`` in a
workflow and ``DBOS.read_stream`` in another process, on the same backends, for throughput and
latency (a DBOS stream stores each value in a transaction of its own: its commits are its chunks).

Writes ``bench/reports/streams.md``, its figures as JSON and a chart beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..harness import study
from ..harness.processes import ChildProcess
from ..harness.server import postgres_server, scratch_database, server_settings
from ..signals.report import summarize
from .report import chart, render

BACKENDS = ("sqlite", "postgresql")
SYSTEMS = ("zincir", "dbos")
PARTS = ("throughput", "commits", "latency")
TARGET_MARGIN_MS = 15.0  # the target: p50 <= flush interval + this


@dataclass
class StreamSizes:
    flush_interval: float = 0.05  # run.stream()'s default
    one_stream_chunks: int = 50_000
    many_streams: int = 100
    many_stream_chunks: int = 2_000  # each
    paced_rate: float = 100.0  # chunks per second per stream
    paced_seconds: float = 5.0
    chunk_text: str = "token-12"  # 10 bytes of JSON: an LLM token or so
    latency_chunks: int = 2_000  # per backend
    latency_gap_ms: float = 20.0  # gaps uniform in [0, this]: about 100 chunks/s
    warmup_chunks: int = 20  # the first latencies of a follower, discarded
    writers: int | None = None  # zincir's PostgreSQL writer connections (None: zincir's default)
    dbos_share: float = 0.02  # DBOS's throughput trials send this share of the chunks (a commit each)

    @classmethod
    def quick(cls) -> StreamSizes:
        return cls(
            one_stream_chunks=500,
            many_streams=10,
            many_stream_chunks=50,
            paced_seconds=1.0,
            latency_chunks=60,
            warmup_chunks=5,
        )


def start(system: str, role: str, target: str, log_path: Path, options: dict[str, Any]) -> ChildProcess:
    args = {"role": role, "target": target, "options": options}
    return ChildProcess(f"bench.streams.{system}:child", args, log_path, f"{system} {role}")


def throughput(
    system: str, target: str, sizes: StreamSizes, workdir: Path, name: str, log: study.Log
) -> dict[str, Any]:
    writer = start(system, "writer", target, workdir / f"{name}.log", {"writers": sizes.writers})
    share = 1.0 if system == "zincir" else sizes.dbos_share
    try:
        writer.ready()
        info = writer.call("open")
        common = {"flush_interval": sizes.flush_interval, "chunk_text": sizes.chunk_text}
        chunks = max(1, round(sizes.one_stream_chunks * share))
        one = writer.call("throughput", streams=1, chunks=chunks, timeout=900, **common)
        log(f"   {name}: one stream: {one['chunks_per_s']:,.0f} chunks/s, {one['flushes']} flushes")
        chunks = max(1, round(sizes.many_stream_chunks * share))
        many = writer.call("throughput", streams=sizes.many_streams, chunks=chunks, timeout=900, **common)
        log(
            f"   {name}: {many['streams']} streams: {many['chunks_per_s']:,.0f} chunks/s,"
            f" {many['flushes']} flushes"
        )
    finally:
        writer.close()
    return {"system": system, "one": one, "many": many, "writer": info}


def commits(target: str, sizes: StreamSizes, workdir: Path, name: str, log: study.Log) -> dict[str, Any]:
    writer = start("zincir", "writer", target, workdir / f"{name}.log", {"writers": sizes.writers})
    try:
        writer.ready()
        writer.call("open")
        paced = writer.call(
            "paced",
            streams=sizes.many_streams,
            rate=sizes.paced_rate,
            seconds=sizes.paced_seconds,
            flush_interval=sizes.flush_interval,
            chunk_text=sizes.chunk_text,
            timeout=600,
        )
    finally:
        writer.close()
    paced["flushes_per_s"] = paced["flushes"] / paced["seconds"]
    paced["commits_per_s"] = paced["commits"] / paced["seconds"]
    paced["bound_per_s"] = sizes.many_streams / sizes.flush_interval
    log(
        f"   {name}: {paced['chunks_per_s']:,.0f} chunks/s sent by {sizes.many_streams} streams:"
        f" {paced['flushes_per_s']:,.0f} flushes/s, {paced['commits_per_s']:,.0f} commits/s"
    )
    return paced


def latency(
    system: str, target: str, sizes: StreamSizes, workdir: Path, name: str, rng: random.Random, log: study.Log
) -> dict[str, Any]:
    log_path = workdir / f"{name}.log"
    writer = start(system, "writer", target, log_path, {"writers": sizes.writers})
    follower = start(system, "follower", target, log_path, {"writers": sizes.writers})
    try:
        writer.ready()
        follower.ready()
        info = writer.call("open")
        follower.call("open")
        run_id = writer.call("create")
        follower.call("follow", run_id=run_id)
        total = sizes.warmup_chunks + sizes.latency_chunks
        gaps = [rng.uniform(0, sizes.latency_gap_ms / 1e3) for _ in range(total)]
        started = time.perf_counter()
        writer.call("write", run_id=run_id, gaps=gaps, flush_interval=sizes.flush_interval, timeout=900)
        followed = follower.expect("followed", timeout=120, id=run_id)
    finally:
        for proc in (writer, follower):
            proc.close()
    samples = list(followed["latencies_ms"])
    if len(samples) != total:
        raise RuntimeError(f"{name}: the follower saw {len(samples)} chunks of {total}")
    samples = samples[sizes.warmup_chunks :]
    stats = summarize(samples)
    target_ms = sizes.flush_interval * 1e3 + TARGET_MARGIN_MS
    log(
        f"   {name}: p50 {stats['p50_ms']:.1f} ms, p99 {stats['p99_ms']:.1f} ms"
        f" (target p50 ≤ {target_ms:g} ms)"
    )
    return {
        "system": system,
        "samples_ms": samples,
        **stats,
        "target_ms": target_ms if system == "zincir" else None,
        "seconds": time.perf_counter() - started,
        "writer": info,
    }


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = study.parser("python -m bench.streams", __doc__, "streams.md", server=True)
    add = parser.add_argument
    study.subsets(parser, systems=SYSTEMS, backends=BACKENDS, only=PARTS)
    add("--flush-interval", type=float, help="run.stream(flush_interval=...) (0.05)")
    add("--chunks", type=int, help="latency samples per backend (2,000)")
    study.writers(parser)
    add("--seed", type=int, default=36, help="seed of the gaps between chunks (the same for every system)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    out = Path(args.out)
    if study.redraw(args, render, chart):
        return 0
    sizes = StreamSizes.quick() if args.quick else StreamSizes()
    study.override(sizes, args, flush_interval="flush_interval", chunks="latency_chunks", writers="writers")
    backends = study.choices(args.backends, BACKENDS, "backends")
    systems = study.choices(args.systems, SYSTEMS, "systems")
    missing = [system for system in systems if not study.installed(system)]
    systems = [system for system in systems if system not in missing]
    parts = study.choices(args.only, PARTS, "parts")
    started = time.perf_counter()
    log = study.progress(args.quiet)
    tag = uuid.uuid4().hex[:8]
    with study.scratch(args.dir, "zincir-bench-streams-", keep=args.keep, log=log) as workdir:
        results = study.begin(
            "python -m bench.streams",
            argv,
            workdir,
            quick=args.quick,
            sizes=asdict(sizes),
            seed=args.seed,
            external_server=bool(args.url),
            missing_peers=missing,
            throughput={},
            commits={},
            latency={},
        )
        with contextlib.ExitStack() as stack:
            admin_url = (
                stack.enter_context(postgres_server(args.url, workdir, log))
                if "postgresql" in backends
                else None
            )
            if admin_url is not None:
                results["server"] = server_settings(admin_url)

            @contextlib.contextmanager
            def database(name: str, backend: str) -> Iterator[str]:
                if backend == "sqlite":
                    yield str(workdir / f"{name}.sqlite")
                    return
                assert admin_url is not None
                with scratch_database(admin_url, f"bench_streams_{name.replace('-', '_')}_{tag}") as url:
                    yield url

            for backend in backends:
                for system in systems if "throughput" in parts else ():
                    key = f"{system}-{backend}"
                    log(f"throughput, {key}: one stream, then {sizes.many_streams} at once")
                    with database(f"throughput-{key}", backend) as target:
                        results["throughput"][key] = throughput(
                            system, target, sizes, workdir, f"throughput-{key}", log
                        )
                if "commits" in parts and "zincir" in systems:
                    log(
                        f"commits, {backend}: {sizes.many_streams} streams at {sizes.paced_rate:g} chunks/s"
                        f" each for {sizes.paced_seconds:g} s"
                    )
                    with database(f"commits-{backend}", backend) as target:
                        results["commits"][backend] = commits(
                            target, sizes, workdir, f"commits-{backend}", log
                        )
                for system in systems if "latency" in parts else ():
                    key = f"{system}-{backend}"
                    log(f"latency, {key}: {sizes.latency_chunks} chunks, a writer and a follower process")
                    with database(f"latency-{key}", backend) as target:
                        results["latency"][key] = latency(
                            system,
                            target,
                            sizes,
                            workdir,
                            f"latency-{key}",
                            random.Random(f"{args.seed}-{backend}"),
                            log,
                        )
    study.finish(out, results, render, chart, started=started, log=log)
    return 0
