"""Smoke test of ``python -m bench.signals`` (issue 15): zincir's configurations, tiny, both backends.

The peers (DBOS, LangGraph) are not installed in the test environment and the bench must not need
them: they are imported only in the child processes that host them. SQLite files go to tmp_path;
PostgreSQL is the test suite's server, passed with ``--url``. Nothing here judges speed: only that
every configuration ran, measured positive latencies and wrote the report.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from bench.signals.runner import main


def test_zincirs_signal_latency_and_throughput_run_on_both_backends(
    tmp_path: Path, postgres_admin_url: str
) -> None:
    out = tmp_path / "report-signals.md"
    peers_before = {m for m in sys.modules if m.split(".")[0] in ("dbos", "langgraph")}

    argv = ["--quick", "--systems", "zincir", "--url", postgres_admin_url, "--out", str(out)]
    assert main([*argv, "--dir", str(tmp_path), "--runs", "30", "-q"]) == 0

    assert {m for m in sys.modules if m.split(".")[0] in ("dbos", "langgraph")} == peers_before
    report = out.read_text()
    assert report.startswith("# Signal latency")
    assert "python -m bench.signals --quick --systems zincir" in report
    for heading in ("## Reading the numbers", "## Latency", "## Throughput", "## How it is measured"):
        assert heading in report
    results = json.loads(out.with_suffix(".json").read_text())
    sizes = results["sizes"]

    assert results["skipped"] == {}  # every zincir configuration, on both backends, ran
    assert set(results["latency"]) == {
        "zincir-sqlite-inprocess", "zincir-postgresql-inprocess",
        "zincir-sqlite-suspended", "zincir-postgresql-suspended",
    }  # fmt: skip
    for key, entry in results["latency"].items():
        assert len(entry["samples_ms"]) == sizes["samples"], key
        assert all(isinstance(x, float) and x > 0 and math.isfinite(x) for x in entry["samples_ms"]), key
        assert 0 < entry["min_ms"] <= entry["p50_ms"] <= entry["p99_ms"] <= entry["max_ms"], key
        assert entry["target_ms"] == (50.0 if entry["suspended"] else 10.0)
        assert entry["label"] in report

    assert set(results["throughput"]) == {"sqlite", "postgresql"}
    for tp in results["throughput"].values():
        assert tp["runs"] == tp["completed"] == 30
        assert tp["seconds"] > 0 and tp["per_s"] > 0
        assert tp["max_concurrency"] == 256
        assert all(v is None or v >= 0 for v in tp["cpu_seconds"].values())

    assert out.with_suffix(".svg").read_text().startswith("<svg")
    # Nothing left behind in the scratch directory but the report.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "report-signals.json",
        "report-signals.md",
        "report-signals.svg",
    ]
