"""Smoke test of ``python -m bench.recovery`` (issue 18): zincir only, tiny sizes, both backends.

The peers (DBOS, LangGraph) are not installed in the test environment and the bench must not need
them: they are imported only in the child processes that host them. SQLite files go to tmp_path;
PostgreSQL is the test suite's server, passed with ``--url``. Nothing here judges speed beyond
"recovered long before the 30 s lease would have expired": only that every configuration ran,
counted its ledger and wrote the report.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from bench.recovery.runner import main


def test_zincirs_duplicates_and_recovery_time_on_both_backends(
    tmp_path: Path, postgres_admin_url: str
) -> None:
    out = tmp_path / "report-recovery.md"
    peers_before = {m for m in sys.modules if m.split(".")[0] in ("dbos", "langgraph")}

    argv = ["--quick", "--systems", "zincir", "--url", postgres_admin_url, "--out", str(out)]
    # One kill per recovery configuration (--quick's two cost 10 s more): each still has its
    # dead owner taken over, timed and reported.
    assert main([*argv, "--dir", str(tmp_path), "--kills", "2", "--recovery-kills", "1", "-q"]) == 0

    assert {m for m in sys.modules if m.split(".")[0] in ("dbos", "langgraph")} == peers_before
    report = out.read_text()
    assert report.startswith("# Crash duplicates and recovery time")
    assert "`python -m bench.recovery --quick --systems zincir --kills 2 --recovery-kills 1 -q`" in report
    assert str(tmp_path) not in report  # the paths given are not part of the command shown
    for heading in (
        "## Reading the numbers",
        "## 1. Duplicated",
        "## 2. Recovery time",
        "## How it is measured",
    ):
        assert heading in report
    results = json.loads(out.with_suffix(".json").read_text())
    sizes = results["sizes"]

    dups = results["duplicates"]
    assert set(dups) == {"zincir-reconcile", "zincir-plain"}
    for entry in dups.values():
        assert entry["kills"] == len(entry["trials"]) == 2
        assert entry["never_completed"] == 0 and entry["missing"] == 0
        assert entry["retries_on_run_leased"] == 0  # no force, and no wait for the lease either
        for trial in entry["trials"]:
            assert trial["completed"] and trial["lines"] == trial["duplicates"] + entry["effects_per_run"]
    assert dups["zincir-reconcile"]["duplicates"] == 0
    assert "Duplicates with reconcile: 0" in report

    rec = results["recovery"]
    kinds = ("worker-1.0", "worker-0.1", "open_run")
    assert set(rec) == {f"zincir-{b}-{k}" for b in ("sqlite", "postgresql") for k in kinds}
    for key, entry in rec.items():
        seconds = [t["seconds"] for t in entry["trials"]]
        assert len(seconds) == sizes["recovery_kills"], key
        assert all(math.isfinite(s) and 0 < s < 15 for s in seconds), (key, seconds)  # not the 30 s TTL
        st = entry["seconds"]
        assert st["min"] <= st["p10"] <= st["median"] <= st["p90"] <= st["max"], key
        assert entry["takeovers"] == len(seconds), key  # each a lease_taken_over of a dead owner
        assert entry["label"] in report
        if key.endswith("open_run"):
            assert entry["retries_on_run_leased"] == 0
            assert 0 < entry["startup_s"]["median"] < st["median"]

    assert out.with_suffix(".svg").read_text().startswith("<svg")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "report-recovery.json",
        "report-recovery.md",
        "report-recovery.svg",
    ]
