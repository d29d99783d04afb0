"""Smoke test of ``python -m bench.encryption`` (issue 37): tiny sizes, both backends, the report's
shape. Nothing here judges speed: only that both settings and both workloads ran on both
backends, and that the report and its chart were written."""

from __future__ import annotations

from pathlib import Path

from bench.encryption.runner import main

from .helpers import run_bench_study


def test_the_encryption_bench_measures_both_settings_on_both_backends(
    tmp_path: Path, postgres_admin_url: str
) -> None:
    report, results = run_bench_study(main, tmp_path, postgres_admin_url, "encryption.md")
    assert report.startswith("# Encryption at rest")
    assert set(results["backends"]) == {"SQLite", "PostgreSQL"}
    for backend, data in results["backends"].items():
        assert data["step"]["on"]["n"] == 20 and data["round"]["off"]["n"] == 10, backend
        assert all(data[w][s]["min"] > 0 for w in ("step", "round") for s in ("off", "on"))
        assert f"| {backend} | a small step |" in report
    assert (tmp_path / "encryption.svg").read_text().startswith("<svg")
