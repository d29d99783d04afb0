"""Smoke test of ``python -m bench.forks`` (issue 33): tiny sizes, both backends, the report's shape."""

from __future__ import annotations

from pathlib import Path

from bench.forks.runner import main

from .helpers import run_bench_study


def test_the_forks_bench_reports_both_backends(tmp_path: Path, postgres_admin_url: str) -> None:
    report, results = run_bench_study(main, tmp_path, postgres_admin_url, "forks.md")
    assert "| SQLite | 100 |" in report and "| PostgreSQL | 100 |" in report
    for sizes in results["backends"].values():
        assert set(sizes) == {"10", "100"}
        for data in sizes.values():
            assert len(data["ms"]) == 2 and all(ms > 0 for ms in data["ms"])
            assert all(grown >= 0 for grown in data["bytes"])  # a small fork may fit in free pages
        assert sum(sizes["100"]["bytes"]) > 0
