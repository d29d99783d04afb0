"""Smoke test of ``python -m bench.budget`` (issue 17): tiny sizes, both backends, the report's shape."""

from __future__ import annotations

import json
from pathlib import Path

from bench.budget.runner import main

from .postgres_server import fresh_database


def test_the_budget_bench_reports_both_backends(tmp_path: Path, postgres_admin_url: str) -> None:
    out = tmp_path / "report-budget.md"
    with fresh_database(postgres_admin_url) as url:
        assert main(["--quick", "--url", url, "--dir", str(tmp_path), "--out", str(out), "-q"]) == 0
    report = out.read_text()
    assert "| SQLite |" in report and "| PostgreSQL |" in report
    results = json.loads(out.with_suffix(".json").read_text())
    for data in results["backends"].values():
        assert {k: len(v) for k, v in data.items()} == {"without": 2, "with": 2, "with loop detection": 2}
        assert all(x > 0 for series in data.values() for x in series)
