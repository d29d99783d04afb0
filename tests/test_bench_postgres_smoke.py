"""Smoke test of ``python -m bench.postgres`` (issue 13): zincir's part of every comparison, tiny.

DBOS (the peer) is not installed in the test environment, and the bench must not need it: it is
imported only in the child process that hosts it. The server is the test suite's (a throwaway
one, or ``ZINCIR_TEST_POSTGRES_URL``), passed with ``--url``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.harness.server import postmaster_pid
from bench.postgres.runner import main


def test_zincirs_part_of_every_postgres_comparison_runs_and_reports(
    tmp_path: Path, postgres_admin_url: str
) -> None:
    out = tmp_path / "report-postgres.md"
    peers_before = {m for m in sys.modules if m.split(".")[0] == "dbos"}

    argv = ["--quick", "--systems", "zincir", "--url", postgres_admin_url, "--out", str(out)]
    assert main([*argv, "--dir", str(tmp_path), "--worker-runs", "30", "-q"]) == 0

    assert {m for m in sys.modules if m.split(".")[0] == "dbos"} == peers_before
    report = out.read_text()
    for heading in (
        "## Machine",
        "## 1. Per-step",
        "## 2. Concurrent",
        "## 3. zincir on PostgreSQL",
        "## 4. Worker",
    ):
        assert heading in report
    results = json.loads(out.with_suffix(".json").read_text())
    sizes = results["sizes"]

    assert results["settings"]["zincir (PostgreSQL)"]["server_version"]
    assert results["settings"]["zincir (SQLite)"]["synchronous"] == "FULL"

    for workload in (results["per_step"]["us_per_step"], results["concurrent"]["steps_per_s"]):
        assert set(workload) == {"zincir (PostgreSQL)", "zincir (SQLite)"}
        assert all(len(v) == sizes["step_reps"] and all(x > 0 for x in v) for v in workload.values())

    profile = results["profile"]
    local = postmaster_pid(postgres_admin_url) is not None  # its server's CPU can be read
    for workload in ("sequential", "concurrent", "worker"):
        assert profile[workload]["statements_per_step"] > 0
        # Read where it can be (in clock ticks of 10 ms: at these sizes it may round to 0).
        server = profile[workload]["server_cpu_us_per_step"]
        assert (server is not None and server >= 0) if local else server is None, server
        # No COMMIT is required: a lone write is an implicit transaction (no BEGIN or COMMIT
        # statement, its sync commits it), and only group commits send COMMIT.
        assert profile[workload]["by_kind"]

    workers = results["workers"]
    assert set(workers["per_s"]) == {str(p) for p in sizes["worker_procs"]}
    for procs, trials in workers["trials"].items():
        for trial in trials:
            assert trial["per_s"] > 0
            assert sum(trial["handled_per_process"]) == sizes["worker_runs"] == 30
            assert len(trial["handled_per_process"]) == int(procs)
            # A claim and a completion update each run's row (pg_stat_user_tables, read once
            # the workers' sessions ended), and the report says which share of that was HOT.
            assert trial["row_updates_per_run"] >= 2
            assert 0 <= trial["hot_share"] <= 1

    assert out.with_suffix(".svg").read_text().startswith("<svg")
    # Nothing left behind in the scratch directory but the report.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "report-postgres.json",
        "report-postgres.md",
        "report-postgres.svg",
    ]
