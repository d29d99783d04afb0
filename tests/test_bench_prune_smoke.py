"""Smoke test of ``python -m bench.prune`` (issue 37): tiny sizes, both backends, the report's shape."""

from __future__ import annotations

from pathlib import Path

from bench.prune.runner import main

from .helpers import run_bench_study


def test_the_prune_bench_reports_both_backends(tmp_path: Path, postgres_admin_url: str) -> None:
    report, results = run_bench_study(main, tmp_path, postgres_admin_url, "prune.md")
    assert "| SQLite | 300 |" in report and "| PostgreSQL | 300 |" in report
    for data in results["backends"].values():
        assert data["runs"] == data["runs_seeded"] == 300  # every tenth run's child included
        assert data["rows"]["events"] == 3000 and data["kept_for_family"] == 0
        assert all(data["writer_ms"][phase] for phase in ("before", "during", "after"))
    sqlite = results["backends"]["sqlite"]
    assert sqlite["bytes_after"] < sqlite["bytes_before"] / 2
    assert results["sizing"]["event_bytes"] > 200
