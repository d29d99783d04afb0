"""examples/reconcile_payment.py as the README runs it: killed right after the payment, then run
again: the probe finds the payment and nothing is paid twice; on both backends."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import trio

from .helpers import REPO
from .test_approval_example import database  # noqa: F401 - the fixture


async def test_a_payment_killed_before_its_result_is_reconciled_not_repeated(
    database: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    bank = tmp_path / "payments.jsonl"
    env = {**os.environ, "ZINCIR_DATABASE_PATH": database, "ZINCIR_PAYMENTS": str(bank)}
    command = [sys.executable, "examples/reconcile_payment.py"]
    crashed = await trio.run_process(
        command, cwd=REPO, env={**env, "ZINCIR_CRASH_AFTER_EFFECT": "1"}, capture_stdout=True, check=False
    )
    assert crashed.returncode == -9
    assert b"started 0 time(s) before" in crashed.stdout
    again = await trio.run_process(command, cwd=REPO, env=env, capture_stdout=True, capture_stderr=True)
    out = again.stdout.decode()
    assert "started 1 time(s) before" in out and "'found_by': 'reconcile'" in out and "completed" in out
    assert [json.loads(line)["amount"] for line in bank.read_text().splitlines()] == [120]
