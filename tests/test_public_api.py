"""The public surface is deliberate: this test changes whenever it does."""

from __future__ import annotations

import attrs
import pytest

import zincir

PUBLIC = {
    "Approval", "ApprovalConflict", "ApprovalError", "ApprovalHashMismatch", "ApprovalNotRequested",
    "Backoff", "Budget", "BudgetExceeded", "Checkpoint", "CheckpointNotPending", "CheckpointState",
    "Children", "Clock", "ConflictingResult", "Database", "DatabaseBusy", "DatabaseClosed",
    "DatabaseUnavailable", "Done", "DuplicateToolCall", "DurableState", "ERASED", "EncryptionError",
    "EncryptionKeyInvalid", "EncryptionKeyMissing", "EncryptionUnavailable", "Erased", "Event",
    "EventType", "Handler", "InvalidArgument", "InvalidForkPoint", "KeyProvider", "KeyRing",
    "LeaseLost", "LoopDetected", "MIN_LEASE_TTL", "NoDurableIntent", "NoProgress", "PendingToolCall",
    "PruneReport",
    "ResumeWorker", "Run", "RunCancelled", "RunErased", "RunLeased", "RunNotEnded", "RunNotFound",
    "RunRecord", "RunStatus", "RunTerminal", "RunWaiting", "SUBMIT_CHECKPOINT", "SchemaError", "Spend",
    "StepAlreadyRunning", "StorageError", "Stream", "StreamChunk", "ToolCall", "UnfinishedWork",
    "Usage", "Verification", "Verifier", "VersionMismatch", "WaitTimeout", "ZincirError", "artifacts",
    "cancel_run", "decide_approval", "erase_run", "fork_run", "open_database", "open_run", "prune",
    "raise_budget", "read_stream", "retry_now", "rotate_keys", "send_signal", "set_version",
    "wait_for_end", "wall_clock_ms", "__version__",
}  # fmt: skip


def test_all_is_pinned() -> None:
    assert set(zincir.__all__) == PUBLIC
    assert len(zincir.__all__) == len(PUBLIC)
    for name in zincir.__all__:
        assert hasattr(zincir, name)


def test_every_error_is_a_zincir_error() -> None:
    errors = [getattr(zincir, n) for n in zincir.__all__ if isinstance(getattr(zincir, n), type)]
    errors = [e for e in errors if issubclass(e, Exception)]
    assert len(errors) == 35
    assert all(issubclass(e, zincir.ZincirError) for e in errors)
    assert issubclass(zincir.InvalidArgument, ValueError)
    assert issubclass(zincir.DuplicateToolCall, zincir.InvalidArgument)
    assert issubclass(zincir.InvalidForkPoint, zincir.InvalidArgument)
    assert issubclass(zincir.DatabaseBusy, zincir.StorageError)
    assert issubclass(zincir.DatabaseUnavailable, zincir.StorageError)
    assert issubclass(zincir.WaitTimeout, TimeoutError)


def _instances() -> dict[type, object]:
    """One instance of every public data class, built the way zincir builds them."""
    state = zincir.CheckpointState(completed=["a"], remaining=["b"])
    verification = zincir.Verification(True, ["ok"])
    record = zincir.RunRecord("id", None, "agent", "", zincir.RunStatus.RUNNING, {}, 1, 2)
    event = zincir.Event("id", 0, zincir.EventType.STATE_TRANSITION, {"from": "pending"}, None, 1)
    checkpoint = zincir.Checkpoint(1, "id", 1, "cp", 0, 2, "accepted", state, verification, 1, 2)
    return {
        zincir.ToolCall: zincir.ToolCall("c1", "search", {"q": 1}),
        zincir.PendingToolCall: zincir.PendingToolCall(zincir.ToolCall("c1", "t"), 1, "tool_call:c1", "id:1"),
        zincir.CheckpointState: state,
        zincir.Done: zincir.Done(None),
        zincir.Verification: verification,
        zincir.Checkpoint: checkpoint,
        zincir.Event: event,
        zincir.RunRecord: record,
        zincir.DurableState: zincir.DurableState(record, checkpoint, [event]),
        zincir.Backoff: zincir.Backoff(),
        zincir.Budget: zincir.Budget(tokens=10),
        zincir.Spend: zincir.Spend(),
        zincir.Usage: zincir.Usage(zincir.Spend(), zincir.Budget()),
        zincir.Approval: zincir.Approval("c1", True, "ada", "ok", "0" * 64, 1, 2),
        zincir.artifacts.Artifact: zincir.artifacts.Artifact("file", "a.txt", "0" * 64),
        zincir.StreamChunk: zincir.StreamChunk(0, 1, {"text": "Hel"}, False),
        zincir.PruneReport: zincir.PruneReport(2, {"events": 5, "agent_runs": 2}, 1, 0, 0.1),
    }


def test_every_public_data_class_is_checked_for_frozenness() -> None:
    public = [getattr(zincir, n) for n in zincir.__all__]
    public += [getattr(zincir.artifacts, n) for n in zincir.artifacts.__all__]
    data_classes = {obj for obj in public if isinstance(obj, type) and attrs.has(obj)}
    assert data_classes == set(_instances())


@pytest.mark.parametrize("cls", list(_instances()), ids=lambda cls: cls.__qualname__)
def test_data_classes_are_frozen_attrs(cls: type) -> None:
    instance = _instances()[cls]
    assert type(instance) is cls
    fields = attrs.fields(cls)
    assert fields
    for field in fields:
        before = getattr(instance, field.name)
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            setattr(instance, field.name, "changed")
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            delattr(instance, field.name)
        assert getattr(instance, field.name) is before
    # Frozen attrs classes use slots: no attribute can be added beside the fields either.
    with pytest.raises((attrs.exceptions.FrozenInstanceError, AttributeError)):
        instance.not_a_field = 1  # type: ignore[attr-defined]
    assert not hasattr(instance, "not_a_field")


def test_public_classes_say_they_live_in_zincir() -> None:
    assert zincir.Run.__module__ == "zincir"
    assert zincir.LeaseLost.__module__ == "zincir"
    assert repr(zincir.RunStatus.COMPLETED) == "<RunStatus.COMPLETED: 'completed'>"


TESTING = {
    "Boundary", "CrashReport", "CrashTestError", "EffectLedger", "ScriptExhausted", "ScriptedModel",
    "ScriptedResponse", "crash_test", "database_clock", "effect_ledger", "skipping_clock", "workdir",
}  # fmt: skip


def test_the_test_kit_is_pinned_too_and_needs_no_pytest() -> None:
    import subprocess
    import sys

    import zincir.testing

    assert set(zincir.testing.__all__) == TESTING
    assert zincir.testing.Boundary.__module__ == "zincir.testing"
    assert issubclass(zincir.testing.CrashTestError, zincir.ZincirError)
    assert issubclass(zincir.testing.ScriptExhausted, zincir.ZincirError)
    for cls in (zincir.testing.Boundary, zincir.testing.CrashReport, zincir.testing.ScriptedResponse):
        assert attrs.has(cls) and attrs.fields(cls)
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            object.__new__(cls).__setattr__("seconds", 1)
    # Importing it never imports pytest (only `pytest -p zincir.testing` loads the plugin's module).
    code = (
        "import sys, zincir.testing; print('pytest' in sys.modules, 'zincir.testing._pytest' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["False", "False"]
