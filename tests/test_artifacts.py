"""Artifacts bound to content, and a verifier that rejects artifacts changed after proposal."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import trio

import zincir
from zincir import CheckpointState, Verification, artifacts


async def test_a_file_is_identified_by_its_content(tmp_path: Path) -> None:
    path = tmp_path / "report.md"
    path.write_text("v1")
    first = await artifacts.identify(path)
    assert first.kind == "file"
    assert first.sha256 == "3bfc269594ef649228e9a74bab00f042efc91d5acc6fbee31a382e80d42388fe"
    assert await artifacts.identify(path) == first
    assert artifacts.Artifact.from_json(first.to_json()) == first
    path.write_text("v2")
    assert await artifacts.mismatches([first.to_json()]) == [first]


async def test_a_tree_changes_with_any_name_or_content(tmp_path: Path) -> None:
    root = tmp_path / "out"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "sub" / "b.txt").write_text("b")
    base = await artifacts.identify(root)
    assert base.kind == "tree"
    (root / "sub" / "b.txt").rename(root / "sub" / "c.txt")
    renamed = await artifacts.identify(root)
    assert renamed != base
    (root / "sub" / "c.txt").rename(root / "sub" / "b.txt")
    assert await artifacts.identify(root) == base
    (root / "a.txt").write_text("A")
    assert await artifacts.identify(root) != base


async def test_a_missing_path_is_measured_as_missing(tmp_path: Path) -> None:
    gone = await artifacts.identify(tmp_path / "nothing")
    assert gone.kind == "missing"
    # Nothing was there to measure, so a verifier must not accept it.
    assert await artifacts.mismatches([gone]) == [gone]


def git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


async def test_a_git_workspace_is_its_commit_plus_its_changes(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    (tmp_path / "main.py").write_text("print(1)\n")
    git(tmp_path, "add", "main.py")
    git(tmp_path, "commit", "-qm", "first")
    clean = await artifacts.identify(tmp_path)
    assert clean.kind == "git" and clean.commit is not None and len(clean.commit) == 40
    (tmp_path / "main.py").write_text("print(2)\n")
    edited = await artifacts.identify(tmp_path)
    assert edited.commit == clean.commit and edited.sha256 != clean.sha256
    (tmp_path / "main.py").write_text("print(1)\n")
    (tmp_path / "new.py").write_text("x = 1\n")
    untracked = await artifacts.identify(tmp_path)
    assert untracked.sha256 not in (clean.sha256, edited.sha256)
    (tmp_path / "new.py").unlink()
    assert await artifacts.identify(tmp_path) == clean


async def content_verifier(state: CheckpointState) -> Verification:
    """The README's pattern: accept only if every measured artifact is unchanged."""
    changed = await artifacts.mismatches(state.artifacts)
    return Verification(not changed, {"changed": [a.path for a in changed]})


async def test_a_checkpoint_whose_artifact_changed_after_proposal_is_rejected(
    db: zincir.Database, tmp_path: Path
) -> None:
    output = tmp_path / "answer.txt"
    output.write_text("42")
    async with zincir.open_run(db) as run:
        for round, tamper in enumerate([True, False], start=1):
            state = CheckpointState(
                completed=["answer"], artifacts=[(await artifacts.identify(output)).to_json()]
            )
            call_id = f"checkpoint-{round}"
            await run.record_response(
                "", [zincir.ToolCall(call_id, zincir.SUBMIT_CHECKPOINT, state.to_json())], "x"
            )

            async def verify(state: CheckpointState, tamper: bool = tamper) -> Verification:
                if tamper:  # the file changes between proposal and verification
                    await trio.to_thread.run_sync(output.write_text, "43")
                return await content_verifier(state)

            decided = await run.checkpoint(call_id, state, verify)
            assert decided.status == ("rejected" if tamper else "accepted")
            if tamper:
                assert decided.verification == Verification(False, {"changed": [str(output)]})
        await run.complete()


async def test_the_readme_verifier_rejects_a_claim_made_of_labels(
    db: zincir.Database, tmp_path: Path
) -> None:
    report = tmp_path / "report.md"
    report.write_text("# findings")
    measured = (await artifacts.identify(report)).to_json()
    claims = {
        "labels only": ["wrote report.md"],
        "a label beside a measured file": [measured, "also wrote summary.md"],
        "a label dressed as an identity": [{"path": str(report)}],
        "measured only": [measured],
    }
    async with zincir.open_run(db) as run:
        decided = {}
        for number, (claim, artifact_list) in enumerate(claims.items()):
            state = CheckpointState(completed=["the report"], artifacts=artifact_list)
            call_id = f"checkpoint-{number}"
            call = zincir.ToolCall(call_id, zincir.SUBMIT_CHECKPOINT, state.to_json())
            await run.record_response("", [call], "tool_use")
            decided[claim] = await run.checkpoint(call_id, state, content_verifier)
        await run.complete()
    assert {claim: checkpoint.status for claim, checkpoint in decided.items()} == {
        "labels only": "rejected",
        "a label beside a measured file": "rejected",
        "a label dressed as an identity": "rejected",
        "measured only": "accepted",
    }
    verification = decided["a label beside a measured file"].verification
    assert verification == Verification(False, {"changed": ["also wrote summary.md"]})


async def test_mismatches_reports_each_label_as_unverified(tmp_path: Path) -> None:
    assert await artifacts.mismatches(["wrote it", 7]) == [
        artifacts.Artifact("label", "wrote it", ""),
        artifacts.Artifact("label", "7", ""),
    ]


async def test_special_files_are_named_not_read(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    os.mkfifo(root / "pipe")  # reading it would block forever
    with trio.fail_after(5):
        tree = await artifacts.identify(root)
    assert tree.kind == "tree"
    with pytest.raises(zincir.InvalidArgument, match="neither a regular file nor a directory"):
        await artifacts.identify(root / "pipe")


async def test_a_git_workspace_git_cannot_describe_is_an_invalid_argument(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")  # no commit: HEAD does not exist yet
    with pytest.raises(zincir.InvalidArgument, match="cannot measure"):
        await artifacts.identify(tmp_path)
