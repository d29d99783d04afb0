"""Smoke test of ``python -m bench.tracing`` (issue 38): tiny sizes, both backends, the report's shape."""

from __future__ import annotations

from pathlib import Path

import opentelemetry.sdk  # noqa: F401 - the test extra installs it: a missing one fails here

from bench.tracing.report import SERIES
from bench.tracing.runner import main

from .helpers import run_bench_study


def test_the_tracing_bench_reports_both_backends(tmp_path: Path, postgres_admin_url: str) -> None:
    report, results = run_bench_study(main, tmp_path, postgres_admin_url, "report-tracing.md")
    assert "| SQLite |" in report and "| PostgreSQL |" in report
    for data in results["backends"].values():
        assert set(data["series"]) == set(SERIES)
        for series in data["series"].values():
            assert series["steps"] == 20 * 2 and len(series["reps"]) == 2  # 20 steps a rep, 2 reps
            assert series["median"] > 0 and all(x > 0 for x in series["reps"])
        # The traced series' spans reached the exporter: its attempts and steps (and the warm-up's).
        assert data["exported_spans"] >= 2 * (20 + 2)
    # The scratch databases are gone; only the report and its figures remain.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report-tracing.json", "report-tracing.md"]
