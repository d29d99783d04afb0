"""Smoke test of ``python -m bench.streams`` (issue 36): tiny sizes, both backends.

SQLite files go to tmp_path; PostgreSQL is the test suite's server, passed with ``--url``.
Nothing here judges speed: only that every part ran on both backends, measured what it says
(every chunk followed, flushes fewer than chunks) and wrote the report.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from bench.streams.runner import main


def test_streams_throughput_commits_and_latency_run_on_both_backends(
    tmp_path: Path, postgres_admin_url: str
) -> None:
    out = tmp_path / "report-streams.md"
    assert (
        main(["--quick", "--url", postgres_admin_url, "--out", str(out), "--dir", str(tmp_path), "-q"]) == 0
    )

    report = out.read_text()
    assert report.startswith("# Durable streams")
    for heading in ("## Reading the numbers", "## Latency", "## Throughput and commits"):
        assert heading in report
    results = json.loads(out.with_suffix(".json").read_text())
    sizes = results["sizes"]
    # DBOS is not installed in the test environment: zincir's parts run, and it says so.
    assert results["missing_peers"] == ["dbos"]
    assert set(results["throughput"]) == set(results["latency"]) == {"zincir-sqlite", "zincir-postgresql"}
    assert set(results["commits"]) == {"sqlite", "postgresql"}
    for tp in results["throughput"].values():
        assert tp["one"]["chunks"] == sizes["one_stream_chunks"]
        assert tp["many"]["chunks"] == sizes["many_streams"] * sizes["many_stream_chunks"]
        for part in (tp["one"], tp["many"]):
            assert part["chunks_per_s"] > 0 and 0 < part["flushes"] < part["chunks"]
    for paced in results["commits"].values():
        assert 0 < paced["flushes"] < paced["chunks"]
    for lat in results["latency"].values():
        assert len(lat["samples_ms"]) == sizes["latency_chunks"]
        assert all(math.isfinite(x) and x > 0 for x in lat["samples_ms"])
        assert 0 < lat["min_ms"] <= lat["p50_ms"] <= lat["p99_ms"] <= lat["max_ms"]
        assert lat["target_ms"] == sizes["flush_interval"] * 1e3 + 15
    assert out.with_suffix(".svg").read_text().startswith("<svg")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "report-streams.json",
        "report-streams.md",
        "report-streams.svg",
    ]
