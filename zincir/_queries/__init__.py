"""Read-only queries over a zincir database, shared by ``zincir ui`` and the CLI.

Everything here is plain synchronous code over one :class:`ReadOnly` connection opened by
:func:`open_readonly`. The package knows no backend: each backend package brings its own
connection and its :class:`Dialect` (:mod:`zincir._sqlite._readonly`,
:mod:`zincir._postgres._readonly`, both built on :mod:`zincir._sql`) -- how it opens, checks
the schema, looks up its catalog, and reads an INTEGER column -- and the statements here are
written once over that. Nothing writes: SQLite is opened with ``mode=ro`` and PostgreSQL in
read-only transactions, so the database itself refuses writes, and no function issues one.
Every list is bounded (keyset pagination), so a run with a million events costs one page,
never the whole log. Rows are normalised before they leave the package: a value of the wrong
type stored in a column never fails a read (see :mod:`._values`).

This module gives the package's names to its callers (the inspector, the CLI, the tests).
One module holds each concern:

==================  ==========================================================================
``_connect``        opening a database read-only; one snapshot per read
``_values``         stored values normalised (:class:`Malformed`), bounded column SQL, JSON text
``_keys``           run ids, keyset cursors, and the checks of a caller's arguments
``_runs``           the runs list and its counts, one run in detail, a run's family
``_events``         the event log, one bounded page at a time
``_progress``       checkpoints, durable steps, tool calls
``_calls``          model calls in flight, and those lost (their reply never recorded)
``_waits``          what runs wait for: waits, approvals, children, sleeps, budgets
``_budgets``        spend against limits, and that spend in words
``_diff``           two runs' trajectories compared (a run and its fork)
``_outsiders``      the audit trail of outsiders' writes
``_streams``        a run's durable streams and their chunks
``_export``         the JSON views of all these records
==================  ==========================================================================
"""

from __future__ import annotations

from .._budget import Usage
from .._sql import KEY_CHARS, Cursor, Dialect, ReadOnly
from .._target import display_target
from ._budgets import budget_lines, budgets_of, spend_text
from ._calls import ModelCall, ModelCalls, model_call_to_json, model_calls
from ._connect import REQUIRED_TABLES, Reader, open_readonly, read_snapshot
from ._diff import DiffItem, DiffSide, RunDiff, SpendSum, diff_runs, side_by_side
from ._events import SCAN_WINDOW, EventPage, EventRow, event_types, get_event, iter_events, list_events
from ._export import (
    awaiting_to_json,
    checkpoint_to_json,
    event_to_json,
    intent_to_json,
    outsider_action_to_json,
    run_to_json,
    step_to_json,
    stream_chunk_to_json,
    timer_to_json,
)
from ._keys import (
    DEFAULT_PAGE,
    LATEST,
    MAX_PAGE,
    RUN_STATUSES,
    RunCursor,
    decode_key,
    encode_key,
    key_json,
    parse_cursor,
    parse_run_id,
    resolve_run_id,
)
from ._outsiders import OutsiderAction, list_outsider_actions
from ._progress import (
    CheckpointRow,
    IntentRow,
    StepRow,
    candidate_checkpoint,
    get_checkpoint,
    get_step,
    list_checkpoints,
    list_intents,
    list_steps,
    reconciled_results,
    verification_interrupted,
)
from ._runs import (
    CHILD_COUNT_CAP,
    NO_VERSION,
    STATUS_COUNT_CAP,
    FamilyNode,
    Fork,
    RunDetail,
    RunPage,
    RunSummary,
    count_runs,
    end_reason,
    family_tree,
    get_run,
    list_runs,
)
from ._streams import (
    STREAMS_SHOWN,
    StreamAttemptRow,
    StreamChunkRow,
    StreamRow,
    iter_chunks_of,
    iter_stream_chunks,
    list_stream_chunks,
    list_streams,
)
from ._values import MAX_INT, MAX_JSON_DEPTH, Int, Malformed, OptInt, json_value, parse_json, raw_value
from ._versions import (
    LIVE_COUNT_CAP,
    LIVE_STATUSES,
    MAX_VERSIONS,
    Draining,
    VersionCounts,
    count_versions,
    draining_versions,
)
from ._waits import (
    ApprovalRequest,
    Awaiting,
    TimerRow,
    get_approval_request,
    list_awaiting,
    list_open_approvals,
    list_timers,
)

__all__ = [
    "CHILD_COUNT_CAP",
    "DEFAULT_PAGE",
    "KEY_CHARS",
    "LATEST",
    "LIVE_COUNT_CAP",
    "LIVE_STATUSES",
    "MAX_INT",
    "MAX_JSON_DEPTH",
    "MAX_PAGE",
    "MAX_VERSIONS",
    "NO_VERSION",
    "REQUIRED_TABLES",
    "RUN_STATUSES",
    "SCAN_WINDOW",
    "STATUS_COUNT_CAP",
    "STREAMS_SHOWN",
    "ApprovalRequest",
    "Awaiting",
    "CheckpointRow",
    "Cursor",
    "Dialect",
    "DiffItem",
    "DiffSide",
    "Draining",
    "EventPage",
    "EventRow",
    "FamilyNode",
    "Fork",
    "Int",
    "IntentRow",
    "Malformed",
    "ModelCall",
    "ModelCalls",
    "OptInt",
    "OutsiderAction",
    "ReadOnly",
    "Reader",
    "RunCursor",
    "RunDetail",
    "RunDiff",
    "RunPage",
    "RunSummary",
    "SpendSum",
    "StepRow",
    "StreamAttemptRow",
    "StreamChunkRow",
    "StreamRow",
    "TimerRow",
    "Usage",
    "VersionCounts",
    "awaiting_to_json",
    "budget_lines",
    "budgets_of",
    "candidate_checkpoint",
    "checkpoint_to_json",
    "count_runs",
    "count_versions",
    "decode_key",
    "diff_runs",
    "display_target",
    "draining_versions",
    "encode_key",
    "end_reason",
    "event_to_json",
    "event_types",
    "family_tree",
    "get_approval_request",
    "get_checkpoint",
    "get_event",
    "get_run",
    "get_step",
    "intent_to_json",
    "iter_chunks_of",
    "iter_events",
    "iter_stream_chunks",
    "json_value",
    "key_json",
    "list_awaiting",
    "list_checkpoints",
    "list_events",
    "list_intents",
    "list_open_approvals",
    "list_outsider_actions",
    "list_runs",
    "list_steps",
    "list_stream_chunks",
    "list_streams",
    "list_timers",
    "model_call_to_json",
    "model_calls",
    "open_readonly",
    "outsider_action_to_json",
    "parse_cursor",
    "parse_json",
    "parse_run_id",
    "raw_value",
    "read_snapshot",
    "reconciled_results",
    "resolve_run_id",
    "run_to_json",
    "side_by_side",
    "spend_text",
    "step_to_json",
    "stream_chunk_to_json",
    "timer_to_json",
    "verification_interrupted",
]
