"""Smoke test of ``python -m bench`` (issue 9): the zincir-only part of every comparison, tiny.

The peers (dbos, langgraph) are not installed in the test environment, and the bench must not
need them: they are imported only in the child processes that host them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.compare.runner import main


def test_the_zincir_part_of_every_comparison_runs_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    peers_before = {m for m in sys.modules if m.split(".")[0] in ("dbos", "langgraph")}

    # --no-profile: bench.micro.profile_step measures a step's inline path and, by design, refuses to
    # when a busy disk keeps steps off it; nothing here checks the profile.
    argv = ["--quick", "--systems", "zincir,raw", "--no-profile", "--out", str(out), "--dir", str(tmp_path)]
    assert main([*argv, "-q"]) == 0

    assert {m for m in sys.modules if m.split(".")[0] in ("dbos", "langgraph")} == peers_before
    report = out.read_text()
    for heading in ("## Machine", "## 1. Per-step", "## 2. Concurrent", "## 3. Crash", "## 4. Two processes"):
        assert heading in report
    results = json.loads(out.with_suffix(".json").read_text())
    sizes = results["sizes"]

    settings = results["settings"]["zincir"]
    assert settings["journal_mode"] == "wal"
    assert settings["synchronous"] == "FULL"

    per_step = results["per_step"]["us_per_step"]
    assert len(per_step["zincir"]) == len(per_step["raw sqlite3"]) == sizes["step_reps"]
    assert all(v > 0 for v in per_step["zincir"] + per_step["raw sqlite3"])

    concurrent = results["concurrent"]["steps_per_s"]
    assert set(concurrent) == {"zincir", "raw sqlite3"}  # raw: the batched-insert ceiling
    assert len(concurrent["zincir"]) == len(concurrent["raw sqlite3"]) == sizes["conc_reps"]
    assert all(v > 0 for v in concurrent["zincir"] + concurrent["raw sqlite3"])

    crash = results["crash"]["zincir"]
    assert crash["kills"] == sizes["crash_kills"]
    assert crash["dups_keyed"] == 0
    assert crash["never_completed"] == 0
    assert crash["missing"] == 0
    for trial in crash["trials"]:
        assert trial["completed"]
        assert trial["keyed_steps"] == trial["keyed_rows"] == sizes["crash_steps"] // 10

    multi = results["multi"]["zincir"]
    assert multi["lock_errors_raised"] == multi["lock_errors_logged"] == multi["failed_runs"] == 0
    assert all(v > 0 for v in multi["steps_per_s"])
    assert all(rep["completed_runs"] == sizes["multi_procs"] * sizes["multi_runs"] for rep in multi["reps"])

    # Nothing left behind in the scratch directory but the report.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.md"]
