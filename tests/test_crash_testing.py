"""The crash-test kit (docs/crash-testing.md): zincir.testing.crash_test kills a worker handler's real
process right before and right after each write of its run, resumes the run in a new process, and
checks it. The project's examples pass it; a handler whose effect is neither keyed nor probed
fails it, at exactly the boundary where its effect runs twice."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import zincir
from zincir.testing import CrashReport, CrashTestError, EffectLedger, crash_test, effect_ledger, workdir

from .helpers import REPO

ZINCIR = str(Path(sys.executable).parent / "zincir")
TOPICS = {"topics": ["durable logs", "leases", "checkpoints", "verifiers", "signals"]}


@pytest.fixture(autouse=True)
def at_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    """Handler paths are imported as `zincir worker` does: from the working directory."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("ZINCIR_RESEARCH_SECONDS", "0")  # fan_out's researchers: no pretend work


def _clean(report: CrashReport) -> None:
    for boundary in report.failures:
        if boundary.kept is not None:
            shutil.rmtree(Path(boundary.kept).parent, ignore_errors=True)


# -- a broken handler, every boundary -----------------------------------------------------------


async def test_a_charge_without_key_or_probe_runs_twice_at_exactly_one_boundary() -> None:
    report = await crash_test("tests.crash_handlers:double_charger")
    try:
        assert [(b.when, b.commit, b.operation) for b in report.boundaries] == [
            ("before", 1, "record_response"),
            ("after", 1, "record_response"),
            ("before", 2, "start_tool charge-1"),
            ("after", 2, "start_tool charge-1"),
            ("before", 3, "record_tool_result charge-1"),  # charged, the result not recorded
            ("after", 3, "record_tool_result charge-1"),
            ("before", 4, "finish completed"),
            ("after", 4, "finish completed"),
        ]
        assert report.total == 8 and not report.passed
        [failed] = report.failures
        assert failed.index == 5 and failed.label == "before:3:root"
        assert failed.problems == (
            "tool charge (call charge-1 of root) applied its effect twice (once uninterrupted)",
        )
        assert all(b.outcome == "passed" for b in report.boundaries if b is not failed)
        # The duplicate is real: the kept directory holds the card's two charges and the database.
        assert failed.kept is not None and failed.database is not None
        charges = (Path(failed.kept) / "charges.jsonl").read_text().splitlines()
        assert charges == ['{"amount": 5}', '{"amount": 5}']
        assert "SIGKILL before commit 3 of root" in (Path(failed.kept) / "crashed.log").read_text()
        async with zincir.open_database(failed.database) as db:
            [run] = await db.runs()
            assert run.status is zincir.RunStatus.COMPLETED
            kinds = [e.type for e in await db.events(run.id)]
            assert kinds.count(zincir.EventType.TOOL_STARTED) == 2
            assert zincir.EventType.ATTEMPT_LOST in kinds
        table = report.table()
        assert "5  before commit 3 of root  record_tool_result charge-1  failed" in table
        assert "applied its effect twice" in table
        assert "zincir crash-test tests.crash_handlers:double_charger --boundary before:3:root" in table
    finally:
        _clean(report)


def test_the_command_replays_one_boundary_shows_progress_and_exits_non_zero() -> None:
    done = subprocess.run(
        [ZINCIR, "crash-test", "tests.crash_handlers:double_charger", "--boundary", "before:3:root"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "1 boundaries (a sample of 8), 0 passed, 1 failed" in done.stdout
    assert "5  before commit 3 of root  record_tool_result charge-1  failed" in done.stdout
    assert "tool charge (call charge-1 of root) applied its effect twice" in done.stdout
    assert "[##############################] 1/1 before commit 3 of root: failed" in done.stderr
    [kept] = [line.split()[4] for line in done.stdout.splitlines() if line.startswith("boundary 5 kept in ")]
    assert (Path(kept) / "zincir.db").is_file()
    shutil.rmtree(Path(kept).parent)


# -- the examples pass ----------------------------------------------------------------------------


async def _wrote_hello(db: zincir.Database, run_id: str) -> None:
    """durable_agent's own invariant: one published file, with the content asked for."""
    assert (Path(workdir()) / "output" / "call_1.json").read_text() == '{"content": "hello", "ok": true}'
    assert (await db.state(run_id)).run.status is zincir.RunStatus.COMPLETED


async def _paid_once(db: zincir.Database, run_id: str) -> None:
    lines = (Path(workdir()) / "payments.jsonl").read_text().splitlines()
    assert [json.loads(line)["amount"] for line in lines] == [120]


async def _committed_once(db: zincir.Database, run_id: str) -> None:
    """anthropic_agent's: the fix is committed once, on top of the project's first commit."""
    git_log = ["git", "-C", str(Path(workdir()) / "workspace"), "log", "--format=%s"]
    log = await trio.run_process(git_log, capture_stdout=True)
    assert log.stdout.decode().splitlines() == ["Fix calc.add", "Start"]


async def _saved_once(db: zincir.Database, run_id: str) -> None:
    """openai_agent's: one file, with the word asked for, in the run's own directory."""
    [saved] = (Path(workdir()) / "output" / run_id).glob("*.json")
    assert json.loads(saved.read_text()) == {"content": "hello", "ok": True}


# A sample of each example's boundaries keeps the suite fast (each costs a fifth of a second or
# more); `zincir crash-test` runs every one of them, and docs/crash-testing.md has the figures.
EXAMPLES = {
    # handler: (config, role, boundaries, check, boundaries the uninterrupted run passes)
    "examples.durable_agent:handler": (
        {"goal": "Write hello to the file."},
        "example-agent",
        4,
        _wrote_hello,
        16,
    ),
    # Killed before the model's request was recorded, the example used to end its run unpaid.
    "examples.reconcile_payment:handler": (None, "payer", ["before:1:root", "after:3:root"], _paid_once, 8),
    "examples.fan_out:handler": (TOPICS, "lead", 2, None, None),  # how often the lead joins varies
    # The adapter examples, each against its model's stand-in behind the official SDK (each model
    # call is two writes: its mark and its response).
    "examples.anthropic_agent:handler": ({"goal": "Fix calc.add."}, "agent", 3, _committed_once, 42),
    "examples.openai_agent:handler": ({"goal": "Save hello."}, "agent", 3, _saved_once, 18),
}


@pytest.mark.parametrize("handler", list(EXAMPLES))
async def test_the_examples_survive_a_crash_at_their_boundaries(handler: str) -> None:
    config, role, boundaries, check, total = EXAMPLES[handler]
    report = await crash_test(handler, config, role=role, boundaries=boundaries, seed=1, check=check)
    _clean(report)
    assert report.passed, report.table()
    if total is not None:  # a handler that writes the same way every time reaches every boundary
        assert report.total == total
        assert all(b.outcome == "passed" for b in report.boundaries), report.table()
    assert len(report.boundaries) == (boundaries if isinstance(boundaries, int) else len(boundaries))


def test_the_command_passes_the_approval_example_with_a_scripted_approver() -> None:
    done = subprocess.run(
        [ZINCIR, "crash-test", "tests.crash_handlers:approved_refund", "--role", "refund-agent",
         "--boundaries", "3", "--seed", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # How often the wait for the approval looks depends on when the approver decides: 10 or more.
    assert re.search(r"3 boundaries \(a sample of 1\d\), 3 passed, 0 failed, 0 not reached", done.stdout)
    rows = re.findall(r"^ *\d+  (?:before|after) commit \d+ of root .* passed ", done.stdout, re.MULTILINE)
    assert len(rows) == 3, done.stdout


async def test_an_example_survives_on_postgresql(postgres_admin_url: str) -> None:
    report = await crash_test(
        "examples.reconcile_payment:handler", role="payer", backend="postgresql",
        boundaries=["after:2:root", "before:3:root"], check=_paid_once, postgres_url=postgres_admin_url,
    )  # fmt: skip
    assert report.passed, report.table()
    assert [(b.label, b.operation.split()[0], b.outcome) for b in report.boundaries] == [
        ("after:2:root", "start_tool", "passed"),  # the payment starts: its outcome is unknown
        ("before:3:root", "record_tool_result", "passed"),  # paid: the probe finds it
    ]


# -- what the kit refuses, and what it needs ------------------------------------------------------


async def test_a_handler_that_cannot_be_tested_is_refused_with_the_reason() -> None:
    with pytest.raises(CrashTestError, match=r"cannot load 'tests.crash_handlers:nothing_here'"):
        await crash_test("tests.crash_handlers:nothing_here")
    # The uninterrupted run's directory is kept, and its worker's log quoted.
    refusals = [
        (
            "always_fails",
            60.0,
            r"fails by itself \(kept in (\S+)\):\n- run root is failed \(on purpose\), not",
        ),
        ("hangs", 0.5, r"did not end within 0.5 s \(killed\):\n--- the last lines of (\S+)/worker.log"),
    ]
    for handler, timeout, why in refusals:
        with pytest.raises(CrashTestError, match=rf"the uninterrupted run {why}") as refused:
            await crash_test(f"tests.crash_handlers:{handler}", timeout=timeout)
        found = re.search(why, str(refused.value))
        assert found is not None
        kept = Path(found.group(1))
        assert "claimed run" in (kept / "worker.log").read_text()
        shutil.rmtree(kept.parent)
    with pytest.raises(CrashTestError, match=r"passes no boundary after:9:root \(it passes before:1:root"):
        await crash_test("tests.crash_handlers:double_charger", boundaries=["after:9:root"])
    with pytest.raises(zincir.InvalidArgument, match="'module:function'"):
        await crash_test("no_colon")
    with pytest.raises(zincir.InvalidArgument, match="no boundary"):
        await crash_test("tests.crash_handlers:double_charger", boundaries=["count:/tmp/x"])


def test_the_fault_point_is_named_in_the_environment_and_checked() -> None:
    env = {**os.environ, "ZINCIR_CRASH_AT": "sometime"}
    done = subprocess.run([sys.executable, "-c", "import zincir"], env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert (
        "ZINCIR_CRASH_AT='sometime': expected before:N[:RUN], after:N[:RUN] (N >= 1) or count:PATH"
        in done.stderr
    )


def test_the_command_line_loads_the_kit_only_for_crash_test() -> None:
    code = (
        "import sys\nfrom zincir._cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
    )
    code += "print(sorted(m for m in ('zincir.testing', 'trio.testing') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[-1] == "[]"
    assert "crash-test" in done.stdout


# -- the effect ledger -----------------------------------------------------------------------------


async def test_the_effect_ledger_counts_effects_only_inside_a_crash_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ZINCIR_EFFECT_LEDGER", raising=False)
    outside = effect_ledger()
    await outside.record("run:tool_call:c1")  # a no-op
    assert outside.path is None and outside.counts() == {}
    monkeypatch.setenv("ZINCIR_EFFECT_LEDGER", str(tmp_path / "effects.jsonl"))
    inside = effect_ledger()
    await inside.record("run:tool_call:c1")
    inside.record_sync("run:tool_call:c1")
    await inside.record("run:tool_call:c2")
    assert EffectLedger(tmp_path / "effects.jsonl").counts() == {"run:tool_call:c1": 2, "run:tool_call:c2": 1}
    with pytest.raises(zincir.InvalidArgument, match="an effect key must be a non-empty string"):
        await inside.record("")


async def test_a_pending_call_carries_the_key_of_its_effect(db: zincir.Database) -> None:
    async with zincir.open_run(db) as run:
        await run.record_response("", [zincir.ToolCall("c1", "t")], "tool_use")
        [pending] = await run.pending_tools()
        assert pending.effect_key == f"{run.id}:tool_call:c1"
        await run.record_tool_result("c1", None)
        await run.complete()


def test_a_report_shows_no_password() -> None:
    from zincir.testing._crash import without_password

    assert (
        without_password("postgresql://ada:s3cret@db:5432/crash_1")
        == "postgresql://ada:PASSWORD@db:5432/crash_1"
    )
    assert without_password("postgresql://postgres@127.0.0.1/x") == "postgresql://postgres@127.0.0.1/x"
    assert (
        without_password("/tmp/zincir-crash-x/0001-before-1/zincir.db")
        == "/tmp/zincir-crash-x/0001-before-1/zincir.db"
    )
