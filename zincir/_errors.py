"""The errors zincir raises, all in one tree.

::

    ZincirError
    ├── InvalidArgument           (also a ValueError) the caller passed something unusable
    │   ├── DuplicateToolCall     a tool call id is repeated in a response or reused in a run
    │   └── InvalidForkPoint      a fork's seq or checkpoint is not in the run, or splits a write
    ├── RunNotFound               no run has that id
    ├── RunTerminal               the run is completed or failed; it can never be written again
    ├── RunLeased                 another owner holds an active lease on the run
    ├── RunWaiting                the run is suspended on a wait: only what it awaits moves it
    ├── VersionMismatch           the run belongs to another version of the agent
    ├── LeaseLost                 this owner was fenced, or its lease expired
    ├── NoDurableIntent           a tool result names a call that has no recorded intent
    ├── ConflictingResult         a tool call already has a different result
    ├── CheckpointNotPending      the checkpoint call or candidate cannot be proposed or decided
    ├── StepAlreadyRunning        the same step name is already running in this run
    ├── UnfinishedWork            complete() while tool intents or a candidate are open
    ├── WaitTimeout               a named wait passed its deadline (also a TimeoutError)
    ├── ApprovalError             an approval cannot be requested or decided as asked
    │   ├── ApprovalNotRequested  the tool call has no approval request
    │   ├── ApprovalConflict      it was already decided differently, or timed out
    │   └── ApprovalHashMismatch  the approver saw other arguments than the intent's
    ├── CrashTestError            zincir.testing.crash_test cannot test the handler as asked
    ├── ScriptExhausted           zincir.testing.ScriptedModel has no response left for the run
    ├── SchemaError               the file is not a zincir database, or is newer than this code
    ├── EncryptionError           encryption at rest cannot do what was asked
    │   ├── EncryptionUnavailable the cryptography package is not installed (extra "crypto")
    │   ├── EncryptionKeyMissing  an encrypted value or database was read without its key
    │   └── EncryptionKeyInvalid  the key given is not the one the data was encrypted with
    ├── RunErased                 the run's key was erased: its payloads are gone for good
    ├── RunNotEnded               the run (or a fork that reads its history) has not ended
    └── StorageError              the database could not do what was asked (disk full, I/O)
        ├── DatabaseBusy          another process held the write lock too long; worth a retry
        ├── DatabaseUnavailable   the connection to the server failed; zincir reconnects
        └── DatabaseClosed        the database was closed before the operation was submitted

Every operation that raises leaves the database as it was: nothing is half-written.
"""

from __future__ import annotations

__all__ = [
    "ApprovalConflict",
    "ApprovalError",
    "ApprovalHashMismatch",
    "ApprovalNotRequested",
    "CheckpointNotPending",
    "ConflictingResult",
    "CrashTestError",
    "DatabaseBusy",
    "DatabaseClosed",
    "DatabaseUnavailable",
    "DuplicateToolCall",
    "EncryptionError",
    "EncryptionKeyInvalid",
    "EncryptionKeyMissing",
    "EncryptionUnavailable",
    "InvalidArgument",
    "InvalidForkPoint",
    "LeaseLost",
    "NoDurableIntent",
    "RunErased",
    "RunLeased",
    "RunNotEnded",
    "RunNotFound",
    "RunTerminal",
    "RunWaiting",
    "SchemaError",
    "ScriptExhausted",
    "StepAlreadyRunning",
    "StorageError",
    "UnfinishedWork",
    "VersionMismatch",
    "WaitTimeout",
    "ZincirError",
]


class ZincirError(Exception):
    """Base class of every error zincir raises on purpose."""


class InvalidArgument(ZincirError, ValueError):
    """An argument cannot be used: wrong type, out of range, not JSON, or too large."""


class DuplicateToolCall(InvalidArgument):
    """A tool call id is empty, repeated within one response, or already used in the run."""


class InvalidForkPoint(InvalidArgument):
    """A fork's point is not in the source run (a seq past its end or below 0, a checkpoint round
    it never accepted), or falls inside what one write of it recorded together (a model response
    and its tool calls, a checkpoint's decision and its tool result)."""


class RunNotFound(ZincirError, LookupError):
    """No run has the given id."""


class RunTerminal(ZincirError):
    """The run is completed, failed or cancelled, so it cannot be leased or written."""


class RunCancelled(RunTerminal):
    """The run was cancelled (:func:`zincir.cancel_run`, or with its parent): its owner's block
    was stopped and the run ended ``cancelled``."""


class RunLeased(ZincirError):
    """Another owner holds an active lease on the run (use ``force=True`` only if it is dead)."""


class RunWaiting(ZincirError):
    """The run is suspended (``waiting``) for a signal, an approval, a child, a sleep or its budget:
    it is not backing off, so :func:`zincir.retry_now` cannot make it due; what it awaits, or
    :func:`zincir.cancel_run`, can."""


class VersionMismatch(ZincirError):
    """The run belongs to another version of the agent than the code that asked to resume it;
    :func:`zincir.set_version` moves a run to another version on purpose (docs/versions.md)."""


class LeaseLost(ZincirError):
    """This owner no longer holds the run's lease: it was fenced, or the lease expired."""


class NoDurableIntent(ZincirError):
    """A tool result was offered for a call id that has no recorded intent in the run."""


class ConflictingResult(ZincirError):
    """The tool call already has a recorded result that differs from the one offered."""


class CheckpointNotPending(ZincirError):
    """The checkpoint cannot be proposed or decided in the run's current state."""


class StepAlreadyRunning(ZincirError):
    """The same durable step name is already running in this run."""


class UnfinishedWork(ZincirError):
    """The run cannot complete: tool intents have no result, or a candidate is undecided."""


class BudgetExceeded(ZincirError):
    """A limit of the run's :class:`~zincir.Budget` is reached (``limit`` names it). The response
    that reached it is recorded; under a worker the run waits until the budget is raised."""

    limit: str

    def __init__(self, message: str, limit: str = "") -> None:
        super().__init__(message)
        self.limit = limit


def only_budget_exceeded(exc: BaseException) -> BudgetExceeded | None:
    """``exc`` if it is a :class:`BudgetExceeded`, or the first of a group (from a nursery of
    tasks that each spent) holding nothing else; otherwise None."""
    if isinstance(exc, BudgetExceeded):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        exceeded, rest = exc.split(BudgetExceeded)
        if exceeded is not None and rest is None:
            return only_budget_exceeded(exceeded.exceptions[0])
    return None


class LoopDetected(BudgetExceeded):
    """A tool call of the latest response was made with the same arguments
    ``max_identical_tool_calls`` times since the latest accepted checkpoint (the window that
    an accepted checkpoint resets). ``call_id`` and ``tool`` name that call."""

    call_id: str | None
    tool: str | None

    def __init__(
        self, message: str, limit: str = "", *, call_id: str | None = None, tool: str | None = None
    ) -> None:
        super().__init__(message, limit)
        self.call_id = call_id
        self.tool = tool


class NoProgress(BudgetExceeded):
    """``max_responses_without_progress`` responses since the latest accepted checkpoint."""


class WaitTimeout(ZincirError, TimeoutError):
    """A named wait passed its stored deadline; every later call with that name raises it too."""


class ApprovalError(ZincirError):
    """An approval cannot be requested or decided as asked."""


class ApprovalNotRequested(ApprovalError):
    """The tool call has no approval request (yet): only a requested approval can be decided."""


class ApprovalConflict(ApprovalError):
    """The approval was already decided the other way, or its request timed out."""


class ApprovalHashMismatch(ApprovalError):
    """The ``args_hash`` given is not the intent's: the approver saw other arguments."""


class CrashTestError(ZincirError):
    """A crash test cannot be made: the handler cannot be loaded, or its uninterrupted run does
    not complete, or breaks an invariant by itself (``zincir.testing.crash_test``)."""


class ScriptExhausted(ZincirError):
    """A scripted model (``zincir.testing.ScriptedModel``) was asked for more responses than it has."""


class SchemaError(ZincirError):
    """The file is not a zincir database, or its schema is newer than this code."""


class EncryptionError(ZincirError):
    """Encryption at rest cannot do what was asked (docs/payloads.md#encryption-and-erasure)."""


class EncryptionUnavailable(EncryptionError):
    """Encryption was asked for, and the ``cryptography`` package is not installed:
    ``pip install 'zincir[crypto]'``."""


class EncryptionKeyMissing(EncryptionError):
    """An encrypted database, or an encrypted value, was read without the key it needs (no key
    given, or a key provider that does not have the key id the data names)."""


class EncryptionKeyInvalid(EncryptionError):
    """The key given is not the one the data was encrypted with (or the stored value was
    altered): nothing was decrypted, and nothing was written."""


class RunErased(ZincirError):
    """The run's key was erased (``zincir.erase_run``): its payloads cannot be read, ever."""


class RunNotEnded(ZincirError):
    """The run has not ended (or a fork of it that has not ended still reads its history), so it
    cannot be erased yet."""


class StorageError(ZincirError):
    """The database could not complete the operation (for example the disk is full)."""


class DatabaseBusy(StorageError):
    """Another connection held the write lock past the busy timeout (or, on PostgreSQL, a row
    this operation needed); nothing was written, and retrying may succeed."""


class TransientConflict(DatabaseBusy):
    """Not public: a conflict with another transaction that ends in milliseconds (a row held
    NOWAIT, a deadlock or serialization failure the server broke). zincir retries these itself."""


class DatabaseUnavailable(StorageError):
    """The connection to the database server failed. The operation did not commit, or (when
    the connection failed during COMMIT, as the message says) whether it did is unknown."""


class DatabaseClosed(StorageError):
    """The database was closed before the operation was submitted."""
