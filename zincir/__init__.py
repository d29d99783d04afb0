"""zincir: durable, resumable execution for long-horizon AI agents, on Trio, with SQLite or PostgreSQL.

Applications keep their own model client, tools and loop; zincir records every model
response, tool intent and tool result in an append-only per-run log, holds a fenced lease so
two processes never both write one run, and lets a fresh context continue from the latest
checkpoint that an independent verifier accepted.
"""

from . import artifacts
from ._budget import Budget, Spend, Usage
from ._children import Children
from ._crypto import ERASED, Erased, KeyProvider, KeyRing
from ._database import Clock, Database, open_database, wall_clock_ms
from ._ends import wait_for_end
from ._erasure import erase_run, rotate_keys
from ._errors import (
    ApprovalConflict,
    ApprovalError,
    ApprovalHashMismatch,
    ApprovalNotRequested,
    BudgetExceeded,
    CheckpointNotPending,
    ConflictingResult,
    DatabaseBusy,
    DatabaseClosed,
    DatabaseUnavailable,
    DuplicateToolCall,
    EncryptionError,
    EncryptionKeyInvalid,
    EncryptionKeyMissing,
    EncryptionUnavailable,
    InvalidArgument,
    InvalidForkPoint,
    LeaseLost,
    LoopDetected,
    NoDurableIntent,
    NoProgress,
    RunCancelled,
    RunErased,
    RunLeased,
    RunNotEnded,
    RunNotFound,
    RunTerminal,
    RunWaiting,
    SchemaError,
    StepAlreadyRunning,
    StorageError,
    UnfinishedWork,
    VersionMismatch,
    WaitTimeout,
    ZincirError,
)
from ._forks import fork_run
from ._inbox import cancel_run, decide_approval, raise_budget, retry_now, send_signal, set_version
from ._ownership import open_run
from ._prune import PruneReport, prune
from ._run import Run
from ._store import SUBMIT_CHECKPOINT
from ._streams import Stream, StreamChunk, read_stream
from ._types import (
    Approval,
    Checkpoint,
    CheckpointState,
    Done,
    DurableState,
    Event,
    EventType,
    PendingToolCall,
    RunRecord,
    RunStatus,
    ToolCall,
    Verification,
    Verifier,
)
from ._validation import MIN_LEASE_TTL
from ._version import __version__
from ._worker import Backoff, Handler, ResumeWorker

__all__ = [
    "ERASED",
    "MIN_LEASE_TTL",
    "SUBMIT_CHECKPOINT",
    "Approval",
    "ApprovalConflict",
    "ApprovalError",
    "ApprovalHashMismatch",
    "ApprovalNotRequested",
    "Backoff",
    "Budget",
    "BudgetExceeded",
    "Checkpoint",
    "CheckpointNotPending",
    "CheckpointState",
    "Children",
    "Clock",
    "ConflictingResult",
    "Database",
    "DatabaseBusy",
    "DatabaseClosed",
    "DatabaseUnavailable",
    "Done",
    "DuplicateToolCall",
    "DurableState",
    "EncryptionError",
    "EncryptionKeyInvalid",
    "EncryptionKeyMissing",
    "EncryptionUnavailable",
    "Erased",
    "Event",
    "EventType",
    "Handler",
    "InvalidArgument",
    "InvalidForkPoint",
    "KeyProvider",
    "KeyRing",
    "LeaseLost",
    "LoopDetected",
    "NoDurableIntent",
    "NoProgress",
    "PendingToolCall",
    "PruneReport",
    "ResumeWorker",
    "Run",
    "RunCancelled",
    "RunErased",
    "RunLeased",
    "RunNotEnded",
    "RunNotFound",
    "RunRecord",
    "RunStatus",
    "RunTerminal",
    "RunWaiting",
    "SchemaError",
    "Spend",
    "StepAlreadyRunning",
    "StorageError",
    "Stream",
    "StreamChunk",
    "ToolCall",
    "UnfinishedWork",
    "Usage",
    "Verification",
    "Verifier",
    "VersionMismatch",
    "WaitTimeout",
    "ZincirError",
    "__version__",
    "artifacts",
    "cancel_run",
    "decide_approval",
    "erase_run",
    "fork_run",
    "open_database",
    "open_run",
    "prune",
    "raise_budget",
    "read_stream",
    "retry_now",
    "rotate_keys",
    "send_signal",
    "set_version",
    "wait_for_end",
    "wall_clock_ms",
]

# Public objects say they live in "zincir", not in the private module that defines them.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and _obj.__module__.startswith("zincir._"):
        _obj.__module__ = "zincir"
del _name, _obj
