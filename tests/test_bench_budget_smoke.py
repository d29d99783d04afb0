"""Smoke test of ``python -m bench.budget`` (issue 17): tiny sizes, both backends, the report's shape."""

from __future__ import annotations

from pathlib import Path

from bench.budget.runner import main

from .helpers import run_bench_study


def test_the_budget_bench_reports_both_backends(tmp_path: Path, postgres_admin_url: str) -> None:
    report, results = run_bench_study(main, tmp_path, postgres_admin_url, "report-budget.md")
    assert "| SQLite |" in report and "| PostgreSQL |" in report
    for data in results["backends"].values():
        assert {k: len(v) for k, v in data.items()} == {"without": 2, "with": 2, "with loop detection": 2}
        assert all(x > 0 for series in data.values() for x in series)
