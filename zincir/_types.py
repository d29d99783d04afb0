"""The data zincir hands out: frozen attrs classes and string enums.

Timestamps are integer Unix milliseconds; run ids are canonical lowercase UUID strings.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

from ._errors import InvalidArgument
from ._json import MAX_DEPTH, JSONValue, encode

__all__ = [
    "Approval",
    "Checkpoint",
    "CheckpointState",
    "Done",
    "DurableState",
    "Event",
    "EventType",
    "PendingToolCall",
    "RunRecord",
    "RunStatus",
    "ToolCall",
    "Verification",
    "Verifier",
]


class RunStatus(enum.StrEnum):
    """Where a run is in its life. ``completed``, ``failed`` and ``cancelled`` are terminal; a
    ``waiting`` run is suspended: no process holds it until what it waits for arrives or its
    deadline passes."""

    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


class EventType(enum.StrEnum):
    """The kinds of event in a run's log."""

    STATE_TRANSITION = "state_transition"
    LLM_CALL = "llm_call"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    CHECKPOINT_PROPOSED = "checkpoint_proposed"
    CHECKPOINT_ACCEPTED = "checkpoint_accepted"
    CHECKPOINT_REJECTED = "checkpoint_rejected"
    ATTEMPT_FAILED = "attempt_failed"
    SIGNAL_RECEIVED = "signal_received"
    WAIT_TIMED_OUT = "wait_timed_out"
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_DECIDED = "approval_decided"
    CHILD_SPAWNED = "child_spawned"
    CHILD_JOINED = "child_joined"
    BUDGET_EXCEEDED = "budget_exceeded"
    LOOP_DETECTED = "loop_detected"
    NO_PROGRESS = "no_progress"
    TOOL_STARTED = "tool_started"
    LEASE_TAKEN_OVER = "lease_taken_over"
    ATTEMPT_LOST = "attempt_lost"
    FORKED = "forked"
    VERSION_CHANGED = "version_changed"
    MODEL_CALL_STARTED = "model_call_started"
    MODEL_CALL_LOST = "model_call_lost"


@attrs.frozen
class ToolCall:
    """A tool call the model asked for. ``id`` is unique within the run."""

    id: str
    name: str
    args: JSONValue = attrs.field(factory=dict)

    @classmethod
    def _coerce(cls, value: ToolCall | Mapping[str, Any], where: str) -> ToolCall:
        if isinstance(value, ToolCall):
            return value
        if not isinstance(value, Mapping):
            raise InvalidArgument(f"{where}: a tool call must be a ToolCall or a mapping, not {value!r}")
        missing = {"id", "name"} - value.keys()
        if missing:
            raise InvalidArgument(f"{where}: tool call {value!r} lacks {sorted(missing)}")
        return cls(value["id"], value["name"], value.get("args", {}))


@attrs.frozen
class PendingToolCall:
    """A tool intent with no result yet: run it (again) and record its result.

    Hand ``idempotency_key`` (or ``effect_key``) and ``fencing_token`` to tools whose effect
    must happen once.
    """

    call: ToolCall
    response_tool_count: int
    """How many tool calls the model response that asked for this one contained."""
    idempotency_key: str
    """``tool_call:<call id>``: stable across crashes and owners, unique within the run."""
    fencing_token: str
    """The current owner's token, ``<run id>:<epoch>``; a higher epoch fences a lower one."""
    started: int = 0
    """How often its tool was started before (:meth:`Run.start_tool`): 0 means it never began
    and is safe to run; more means its outcome is unknown (see :meth:`Run.execute`)."""
    last_started_at: int | None = None
    """When it was last started (Unix ms), if ever."""
    effect_key: str = attrs.field(
        default=attrs.Factory(
            lambda self: f"{self.fencing_token.rpartition(':')[0]}:{self.idempotency_key}", takes_self=True
        )
    )
    """``<run id>:tool_call:<call id>``: the key of the call's effect in the world, unique across
    runs (hand it to a service shared by several runs, or to :func:`zincir.testing.effect_ledger`).
    The run is the one where the effect belongs: in a fork, the source's (its source's, for a
    fork of a fork) for an intent the fork copied, so a keyed tool never repeats the source's
    effect."""


def _check_data(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Refuse at once what could not be stored as a JSON object and read back the same: a key
    that is not a string (JSON would turn ``1`` into ``"1"``), NaN, a value of another type."""
    if not isinstance(value, dict):
        raise InvalidArgument(f"CheckpointState.data must be a dict (a JSON object), not {value!r}")
    found = _non_text_key(value)
    if found is not None:
        where, key = found
        raise InvalidArgument(
            f"CheckpointState.data must be a JSON object, whose keys are strings: {where} has the"
            f" key {key!r} ({type(key).__name__})"
        )
    encode(value, what="CheckpointState.data", limit=sys.maxsize)  # NaN, sets, objects, depth


def _non_text_key(value: dict[Any, Any]) -> tuple[str, object] | None:
    """Where the first key that is not a string is (``data['a'][0]``), and that key."""
    stack: list[tuple[object, str, int]] = [(value, "data", 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > MAX_DEPTH:  # too deep (or a cycle): encode() says so
            continue
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return where, key
                stack.append((child, f"{where}[{key!r}]", depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((child, f"{where}[{i}]", depth + 1) for i, child in enumerate(item))
    return None


@attrs.frozen
class Done:
    """What a reconcile probe (:meth:`Run.execute`) returns to say "the effect happened, and
    this is its result", when the result is None: ``return zincir.Done(None)``. A probe's plain
    None means the effect did not happen; any other value is the result, as ``Done(value)``."""

    value: JSONValue = None


@attrs.frozen
class CheckpointState:
    """The semantic progress an agent claims at a checkpoint."""

    completed: list[str] = attrs.field(factory=list)
    remaining: list[str] = attrs.field(factory=list)
    artifacts: list[JSONValue] = attrs.field(factory=list)
    """Labels, or content identities from :mod:`zincir.artifacts`."""
    failed_attempts: list[str] = attrs.field(factory=list)
    evidence: list[str] = attrs.field(factory=list)
    data: dict[str, JSONValue] = attrs.field(factory=dict, validator=_check_data)
    """Free-form JSON of the agent's own (an object): what it needs to continue from this
    checkpoint that the lists do not say, such as a commit id. Stored, verified and handed
    back with the rest; a checkpoint stored before this field existed reads as ``{}``."""

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, value: Any) -> CheckpointState:
        """Build from a mapping with the five list fields and, optionally, ``data`` (an
        object; ``{}`` when it is absent), and nothing else (the intent's ``args``)."""
        lists = [f.name for f in attrs.fields(cls) if f.name != "data"]
        if not isinstance(value, Mapping) or set(value) - {"data"} != set(lists):
            raise InvalidArgument(
                f"a checkpoint state needs exactly the lists {lists} (and optionally 'data'), got {value!r}"
            )
        for name in lists:
            if not isinstance(value[name], list):
                raise InvalidArgument(f"checkpoint state field {name!r} must be a list")
        data = value.get("data", {})
        if not isinstance(data, Mapping):
            raise InvalidArgument(f"checkpoint state field 'data' must be an object, not {data!r}")
        return cls(**{name: list(value[name]) for name in lists}, data=dict(data))


@attrs.frozen
class Verification:
    """A verifier's decision on a checkpoint candidate, with the evidence it used."""

    passed: bool
    evidence: JSONValue = None


Verifier = Callable[[CheckpointState], Awaitable[Verification]]


@attrs.frozen
class Checkpoint:
    """A checkpoint candidate, or the decision a verifier made on it."""

    id: int
    run_id: str
    round: int
    tool_call_id: str
    based_on_event_seq: int
    decision_event_seq: int | None
    status: str
    """``candidate``, ``accepted`` or ``rejected``."""
    state: CheckpointState
    verification: Verification | None
    created_at: int
    decided_at: int | None


@attrs.frozen
class Event:
    """One entry of a run's append-only log."""

    run_id: str
    seq: int
    type: EventType
    payload: JSONValue
    idempotency_key: str | None
    created_at: int


@attrs.frozen
class RunRecord:
    """A run as stored. ``updated_at`` is its last event or status change (not heartbeats);
    ``result`` is what it completed with (:meth:`Run.complete`), None until then. ``version``
    is the version of the agent the run belongs to (None: none), ``fingerprints`` what shaped
    it, as its creator named them ({} if none; docs/versions.md)."""

    id: str
    parent_run_id: str | None
    role: str
    provider: str
    status: RunStatus
    config: JSONValue
    created_at: int
    updated_at: int
    result: JSONValue = None
    forked_from: str | None = None
    """The run this one was forked from (:func:`zincir.fork_run`); None for a run that is no fork."""
    fork_seq: int | None = None
    """The last seq of ``forked_from`` that the fork copied (its events ``0..fork_seq``)."""
    version: str | None = None
    fingerprints: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen
class Approval:
    """A request to approve one tool intent, and the decision on it (``approved`` is None
    while it is open). ``args_hash`` is the SHA-256 of the canonical JSON of the intent's name
    and args as recorded: what the approver saw is exactly what the tool gets."""

    call_id: str
    approved: bool | None
    by: str | None
    reason: str | None
    args_hash: str
    requested_at: int
    decided_at: int | None


@attrs.frozen
class DurableState:
    """What a fresh model context continues from: the latest accepted checkpoint (if any)
    and every event recorded after its decision."""

    run: RunRecord
    checkpoint: Checkpoint | None
    events: list[Event]
