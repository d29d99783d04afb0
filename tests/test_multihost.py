"""scripts/multihost.py: three `zincir worker` hosts in network namespaces, one SIGKILLed."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "multihost.py"
RUNS = 80
TTL_MS = 3000


@contextlib.contextmanager
def one_at_a_time() -> Iterator[None]:
    """Hold this machine's multi-host lock: the script's three hosts and their server load the
    machine, and its takeover times are asserted, so two runs (from two pytest -n workers, or
    two test sessions) never overlap."""
    with (Path(tempfile.gettempdir()) / "zincir-multihost.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run_script(*options: str) -> tuple[int, str, dict[str, Any]]:
    # Without ZINCIR_TEST_POSTGRES_URL the script starts its own server, listening on the veths.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZINCIR_", "MULTIHOST_"))}
    with one_at_a_time():
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


def namespaces_left(output: str) -> set[str]:
    """The network namespaces that the run which printed ``output`` made and did not remove
    (named zmh-<its random suffix>-<host>): anyone else's are no concern of this test."""
    made = set(re.findall(r"\b(zmh-[0-9a-f]+)-[0-9]+ ", output))
    assert made, f"the script named no namespace:\n{output}"
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {
        name for name in (line.split()[0] for line in listing.splitlines()) if name.rsplit("-", 1)[0] in made
    }


@pytest.mark.timeout(170)
def test_a_killed_host_loses_nothing_and_duplicates_nothing() -> None:
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
    assert namespaces_left(output) == set(), "the script left network namespaces behind"


@pytest.mark.timeout(170)
def test_the_duplicate_effect_check_catches_a_handler_without_the_idempotency_key() -> None:
    # The tool waits 300 ms between its effect and its result, so the kill lands there.
    code, output, figures = run_script("--broken-handler", "--confirm-ms", "300")
    assert code == 1, output
    assert figures["duplicated_effects"] >= 1, output
    assert figures["ledger_rows"] > RUNS
    assert "VIOLATION: duplicated effect: run " in output
