"""Smoke test of ``python -m bench.floor`` (issue 14): every series runs, stores what it claims,
and the report carries the ratios and the chart."""

from __future__ import annotations

import json
from pathlib import Path

from bench.floor.runner import SERIES, main


def test_the_floor_bench_measures_every_series_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "report-floor.md"

    assert main(["--reps", "1", "--dir", str(tmp_path), "--out", str(out), "-q"]) == 0

    results = json.loads(out.with_suffix(".json").read_text())["results"]
    assert set(results) == set(SERIES)
    assert all(len(values) == 1 and values[0] > 0 for values in results.values())
    report = out.read_text()
    for row in ("the ceiling) | ", "execute per write | ", "executemany per batch | ", "run.step | "):
        assert row in report
    assert "1.00x" in report  # the ceiling against itself
    assert out.with_suffix(".svg").read_text().count("<rect x=") == len(SERIES)  # a bar each
    # The scratch databases are gone; only the report, its figures and its chart remain.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "report-floor.json",
        "report-floor.md",
        "report-floor.svg",
    ]
