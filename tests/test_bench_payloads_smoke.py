"""Smoke test of ``python -m bench.payloads`` (issue 37): tiny sizes, both backends, the report's
shape. Nothing here judges speed: only that both settings ran on both backends, that the store
on took less room than off for files read again and again, and that the report was written."""

from __future__ import annotations

from pathlib import Path

from bench.payloads.runner import main

from .helpers import run_bench_study


def test_the_payloads_bench_measures_both_settings_on_both_backends(
    tmp_path: Path, postgres_admin_url: str
) -> None:
    report, results = run_bench_study(main, tmp_path, postgres_admin_url, "payloads.md")
    assert report.startswith("# Large values stored once")
    assert set(results["backends"]) == {"SQLite", "PostgreSQL"}
    for backend, data in results["backends"].items():
        disk = data["disk"]
        assert 0 <= disk["on"]["bytes"] < disk["off"]["bytes"], backend
        for setting in ("off", "on"):
            summary = data["step_us"][setting]
            assert summary["n"] == 20 and 0 < summary["min"] <= summary["median"] <= summary["max"]
        assert f"| {backend} |" in report
    assert (tmp_path / "payloads.svg").read_text().startswith("<svg")
