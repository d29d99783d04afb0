"""The public surface is deliberate: this test changes whenever it does."""

from __future__ import annotations

import attrs
import pytest

import zincir

PUBLIC = {
    "Backoff", "Checkpoint", "CheckpointNotPending", "CheckpointState", "Clock", "ConflictingResult",
    "Database", "DatabaseBusy", "DatabaseClosed", "DuplicateToolCall", "DurableState", "Event",
    "EventType", "Handler", "InvalidArgument", "LeaseLost", "MIN_LEASE_TTL", "NoDurableIntent",
    "PendingToolCall", "ResumeWorker", "Run", "RunLeased", "RunNotFound", "RunRecord", "RunStatus",
    "RunTerminal", "SUBMIT_CHECKPOINT", "SchemaError", "StepAlreadyRunning", "StorageError", "ToolCall",
    "UnfinishedWork", "Verification", "Verifier", "ZincirError", "__version__", "artifacts",
    "open_database", "open_run", "wall_clock_ms",
}  # fmt: skip


def test_all_is_pinned() -> None:
    assert set(zincir.__all__) == PUBLIC
    assert len(zincir.__all__) == len(PUBLIC)
    for name in zincir.__all__:
        assert hasattr(zincir, name)


def test_every_error_is_a_zincir_error() -> None:
    errors = [getattr(zincir, n) for n in zincir.__all__ if isinstance(getattr(zincir, n), type)]
    errors = [e for e in errors if issubclass(e, Exception)]
    assert len(errors) == 16
    assert all(issubclass(e, zincir.ZincirError) for e in errors)
    assert issubclass(zincir.InvalidArgument, ValueError)
    assert issubclass(zincir.DuplicateToolCall, zincir.InvalidArgument)
    assert issubclass(zincir.DatabaseBusy, zincir.StorageError)


@pytest.mark.parametrize(
    "cls",
    [zincir.ToolCall, zincir.PendingToolCall, zincir.CheckpointState, zincir.Verification, zincir.Checkpoint,
     zincir.Event, zincir.RunRecord, zincir.DurableState, zincir.Backoff],
)  # fmt: skip
def test_data_classes_are_frozen_attrs(cls: type) -> None:
    assert attrs.has(cls)
    assert cls.__setattr__ is not object.__setattr__  # frozen classes refuse assignment


def test_public_classes_say_they_live_in_zincir() -> None:
    assert zincir.Run.__module__ == "zincir"
    assert zincir.LeaseLost.__module__ == "zincir"
    assert repr(zincir.RunStatus.COMPLETED) == "<RunStatus.COMPLETED: 'completed'>"
