"""Smoke test of ``python -m bench.horizon`` (issue 20) at tiny sizes: two of its eight
combinations, one seed, two SIGKILLs per killed run, real child processes.

It checks what the benchmark exists to show, so it fails if the agent, the kills or the counting
break: resumed by zincir (fresh context, verifier), a twice-killed run still finishes every subtask
verified, with no duplicated external effect and about the model calls of an uninterrupted run;
restarted from scratch, the same kills cost repeated model calls and repeated the non-idempotent
tool. Plus the scripted model's and the checker's own promises, in-process.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.horizon.agent import (
    Context,
    ModelParams,
    check,
    expected_content,
    respond,
    task_file,
)
from bench.horizon.runner import kill_plan, main

N = 8


def test_zincir_resume_keeps_its_work_and_effects_where_a_restart_from_scratch_repeats_them(
    tmp_path: Path,
) -> None:
    out = tmp_path / "report-horizon.md"
    assert min(u for u, _ in kill_plan(0, 2)) > 0.1  # seed 0 kills late enough for work to be lost
    combos = "none-fresh-verifier,zincir-fresh-verifier"
    argv = ["--subtasks", str(N), "--seeds", "1", "--kills", "2", "--only", combos, "-q"]
    assert main([*argv, "--out", str(out), "--dir", str(tmp_path)]) == 0

    results = json.loads(out.with_suffix(".json").read_text())
    combos_run = results["combinations"]
    assert set(combos_run) == {"none-fresh-verifier", "zincir-fresh-verifier"}

    zincir = combos_run["zincir-fresh-verifier"]
    [killed] = zincir["trials"]
    [base] = zincir["uninterrupted"]
    assert base["correct"] and base["processes"] == 1 and base["kills_landed"] == 0
    assert killed["kills_landed"] >= 1 and killed["processes"] == killed["kills_landed"] + 1
    assert killed["outcome"] == "completed" and killed["correct"]
    assert killed["verified"] == N and killed["falsely_believed"] == 0
    assert killed["duplicates"] == 0 and killed["keyed_duplicates"] == 0
    assert killed["notify_lines"] == N
    # Each kill can lose at most the model call in flight; the resumed model may also draw anew.
    assert killed["model_calls"] <= base["model_calls"] + 2 * killed["kills_landed"] + 2

    scratch = combos_run["none-fresh-verifier"]
    [lost] = scratch["trials"]
    [scratch_base] = scratch["uninterrupted"]
    assert lost["kills_landed"] == 2  # a run from scratch never gets far enough to dodge a kill
    assert lost["correct"] and lost["falsely_believed"] == 0  # the verifier still holds...
    assert lost["model_calls"] > scratch_base["model_calls"]  # ...but lost work was paid twice
    assert lost["model_calls"] > killed["model_calls"]
    assert lost["duplicates"] > 0 and lost["keyed_duplicates"] == 0

    report = out.read_text()
    assert report.startswith("# A long-horizon agent under SIGKILLs")
    assert f"`python -m bench.horizon {' '.join(argv)}`" in report
    assert str(tmp_path) not in report
    assert "## Reading the numbers" in report and "**1 of 1**" in report
    assert f"**{killed['duplicates']}** over 1" in report  # the conclusion quotes the measured figures
    assert out.with_suffix(".svg").read_text().startswith("<svg")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "report-horizon.json",
        "report-horizon.md",
        "report-horizon.svg",
    ]


def _context(n: int, believed: list[str], events_text: str = "") -> Context:
    ctx = Context("goal", n, believed, [], [], 7, events_text)
    return ctx


def test_the_scripted_model_is_a_function_of_seed_and_context_and_rots_with_length() -> None:
    params = ModelParams()
    assert params.error_rate(0) == params.err_base
    assert params.error_rate(10_000) > params.error_rate(1_000)
    assert params.error_rate(10**9) == params.err_max

    short = _context(3, ["task-000"])
    first, again = respond(5, params, short), respond(5, params, short)
    assert (first.kind, first.calls, first.input_tokens) == (again.kind, again.calls, again.input_tokens)
    assert first.task == "task-001"  # it takes the next subtask its accepted checkpoint leaves
    long = _context(3, ["task-000"], "x" * 400_000)
    assert respond(5, params, long).input_tokens > 100_000 > first.input_tokens

    # Over many prompts, a long one makes it write wrong files far more often.
    def wrong_share(padding: int) -> float:
        answers = [respond(s, params, _context(3, [], "x" * padding)) for s in range(400)]
        work = [a for a in answers if a.kind.startswith("work")]
        return sum(a.kind == "work-wrong" for a in work) / len(work)

    assert wrong_share(0) < 0.05 < 0.25 < wrong_share(160_000)
    always_lies = ModelParams(p_false=1.0)
    assert respond(5, always_lies, short).kind == "false-claim"


def test_the_checker_accepts_only_the_expected_content(tmp_path: Path) -> None:
    task_file(tmp_path, 0).write_text(expected_content(1, 0))
    task_file(tmp_path, 1).write_text(expected_content(1, 1)[:-1] + "!")
    task_file(tmp_path, 2).write_text(expected_content(2, 2))  # another seed's answer
    assert check(tmp_path, 1, 4) == [0]
