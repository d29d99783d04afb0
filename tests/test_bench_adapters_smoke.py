"""Smoke test of ``python -m bench.adapters`` (issue 38): tiny sizes, both backends, the report's shape."""

from __future__ import annotations

from pathlib import Path

from bench.adapters.report import SERIES
from bench.adapters.runner import main

from .helpers import run_bench_study


def test_the_adapters_bench_reports_both_backends(tmp_path: Path, postgres_admin_url: str) -> None:
    report, results = run_bench_study(main, tmp_path, postgres_admin_url, "report-adapters.md")
    assert "| SQLite |" in report and "| PostgreSQL |" in report
    for data in results["backends"].values():
        assert set(data) == set(SERIES)
        for series in data.values():
            assert series["calls"] == 20 * 2 and len(series["reps"]) == 2  # 20 pairs a rep, 2 reps
            assert series["median"] > 0 and all(x > 0 for x in series["reps"])
    # The scratch databases are gone; only the report and its figures remain.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report-adapters.json", "report-adapters.md"]
