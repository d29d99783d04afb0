"""scripts/crash_kill_resume.sh: kill -9 the demo at every crash boundary, resume, check the log."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "crash_kill_resume.sh"
BOUNDARIES = [
    "before-effect",
    "after-effect",
    "in-verification",
    "after-acceptance",
    "during-sleep",
    "concurrent-writers",
]


@pytest.mark.timeout(200)
def test_crash_kill_resume_script_passes_every_boundary(backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "sqlite":
        assert shutil.which("sqlite3"), (
            "the crash script needs the sqlite3 shell (scripts/setup.sh installs it)"
        )
        options: list[str] = []
    else:
        options = ["--postgres", request.getfixturevalue("postgres_admin_url")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZINCIR_")}
    env["PYTHON"] = sys.executable
    result = subprocess.run(
        ["bash", str(SCRIPT), *options],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    report = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, report
    lines = result.stdout.splitlines()
    for boundary in BOUNDARIES:
        passed = [line for line in lines if line.startswith(f"PASS: {boundary}:")]
        assert len(passed) == 1, f"expected one PASS line for {boundary}\n{report}"
    assert not [line for line in lines if line.startswith("FAIL")], report
    assert lines[-1] == "PASS: all crash boundaries recovered", report
