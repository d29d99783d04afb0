"""scripts/multihost.py: three `zincir worker` hosts in network namespaces, one SIGKILLed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "multihost.py"
RUNS = 80
TTL_MS = 3000


def run_script(*options: str) -> tuple[int, str, dict[str, Any]]:
    # Without ZINCIR_TEST_POSTGRES_URL the script starts its own server, listening on the veths.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZINCIR_", "MULTIHOST_"))}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--runs", str(RUNS), "--timeout", "90", *options],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    output = result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, f"exit {result.returncode}, no RESULT line:\n{output}"
    return result.returncode, output, json.loads(lines[0].removeprefix("RESULT "))


def namespaces() -> set[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in listing.splitlines() if line.startswith("zmh-")}


@pytest.mark.timeout(170)
def test_a_killed_host_loses_nothing_and_duplicates_nothing() -> None:
    before = namespaces()
    code, output, figures = run_script()
    assert code == 0, output
    assert figures["violations"] == 0, output
    assert figures["completed"] == RUNS
    assert figures["ledger_rows"] == RUNS
    assert figures["duplicated_effects"] == 0
    # Every host worked, and the dead one was killed mid-work: its runs were taken over.
    assert set(figures["completions_by_host"]) == {"host0", "host1", "host2"}, output
    assert figures["victim_in_flight_at_kill"] >= 1
    # (A run the dead host completed just before dying counts as in flight but is not taken over.)
    assert 1 <= figures["taken_over"] <= figures["victim_in_flight_at_kill"]
    assert figures["lease_ttl_ms"] == TTL_MS
    # Taken over once the lease had expired (on the server's clock), and not long after.
    assert figures["min_takeover_after_lease_expiry_ms"] >= 0
    assert figures["min_takeover_delay_after_kill_ms"] >= TTL_MS // 2
    assert figures["max_takeover_delay_after_kill_ms"] <= TTL_MS + 2000, output
    assert namespaces() <= before, "the script left network namespaces behind"


@pytest.mark.timeout(170)
def test_the_duplicate_effect_check_catches_a_handler_without_the_idempotency_key() -> None:
    # The tool waits 300 ms between its effect and its result, so the kill lands there.
    code, output, figures = run_script("--broken-handler", "--confirm-ms", "300")
    assert code == 1, output
    assert figures["duplicated_effects"] >= 1, output
    assert figures["ledger_rows"] > RUNS
    assert "VIOLATION: duplicated effect: run " in output
