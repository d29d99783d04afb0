"""Smoke test of ``python -m bench.fanout`` (issue 16): zincir's fan-outs, tiny, on both backends.

DBOS is not installed in the test environment, and the bench must not need it: a peer is imported
only in the child process that hosts it. SQLite files go to tmp_path; PostgreSQL is the test
suite's server, passed with ``--url``. Nothing here judges speed: only that every zincir
configuration fanned out and in on both backends, with positive figures, and that the report,
its JSON and its chart were written.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from bench.fanout.runner import main

ZINCIR_CONFIGS = ("zincir", "zincir-explicit", "zincir-concurrent")


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and value > 0 and math.isfinite(value)


def test_zincirs_fan_out_and_in_runs_on_both_backends(tmp_path: Path, postgres_admin_url: str) -> None:
    out = tmp_path / "report-fanout.md"
    peers_before = {m for m in sys.modules if m.split(".")[0] == "dbos"}

    argv = ["--quick", "--systems", "zincir", "--url", postgres_admin_url, "--out", str(out)]
    assert main([*argv, "--dir", str(tmp_path), "-q"]) == 0

    assert {m for m in sys.modules if m.split(".")[0] == "dbos"} == peers_before
    report = out.read_text()
    assert report.startswith("# Fan-out/fan-in of child runs")
    assert "python -m bench.fanout --quick --systems zincir" in report
    for heading in ("## Reading the numbers", "## Figures", "## Phases and costs", "## How it is measured"):
        assert heading in report
    results = json.loads(out.with_suffix(".json").read_text())
    sizes = results["sizes"]
    assert sizes["children"] == 50 and sizes["reps"] == 1 and sizes["max_concurrency"] == 64

    expected = {f"{key}-{backend}" for key in ZINCIR_CONFIGS for backend in ("sqlite", "postgresql")}
    assert set(results["trials"]) == expected
    for key, trials in results["trials"].items():
        assert len(trials) == sizes["reps"], key
        for trial in trials:
            assert trial["status"] == "completed", key
            assert trial["result"] == {"children": 50, "sum": 50}, key
            assert trial["starts"] >= 1, key
            for figure in ("seconds", "per_s", "spawn_seconds", "cpu_seconds"):
                assert _positive(trial[figure]), (key, figure)
            assert trial["join_seconds"] >= 0 and trial["complete_seconds"] > 0, key
            assert trial["spawn_seconds"] + trial["join_seconds"] <= trial["seconds"], key
            writers = [v for k, v in trial["threads"].items() if k.startswith("writer")]
            assert writers and sum(w["transactions"] for w in writers) > 0, key
            by_thread = trial["thread_cpu_seconds"]  # the Trio thread always works; so does a writer
            assert by_thread["trio"] > 0 and by_thread["writer"] >= 0, key
            assert sum(by_thread.values()) <= trial["cpu_seconds"] + 0.05, key
            if key.endswith("postgresql"):
                assert trial["xact_commits"] > 0, key
    for backend in ("sqlite", "postgresql"):  # the primary configuration's warm-up is profiled
        assert sum(results["profile"][backend]["statements"].values()) > 0, backend
    assert "zincir, nursery" in report and "zincir, spawn + join one at a time" in report
    assert "DBOS was not measured" in report
    assert "By thread, in ms of CPU per child: " in report

    assert out.with_suffix(".svg").read_text().startswith("<svg")
    # Nothing left behind in the scratch directory but the report.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "report-fanout.json",
        "report-fanout.md",
        "report-fanout.svg",
    ]
