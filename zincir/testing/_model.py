"""A scripted model: plays a list of responses, one per model call of a run, from the run's log."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, final

import attrs

from .._database import Database
from .._errors import InvalidArgument, ScriptExhausted
from .._json import JSONValue
from .._run import Run
from .._types import EventType, ToolCall

__all__ = ["ScriptedModel", "ScriptedResponse"]


def _calls(calls: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    return tuple(calls)


@attrs.frozen
class ScriptedResponse:
    """One response of a :class:`ScriptedModel`, in the shape :meth:`Run.record_response` takes."""

    content: JSONValue = None
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_calls)
    stop_reason: str = attrs.field(
        default=attrs.Factory(lambda self: "tool_use" if self.tool_calls else "end_turn", takes_self=True)
    )
    """``tool_use`` when there are tool calls, else ``end_turn``, unless given."""
    usage: Mapping[str, Any] | None = None

    @classmethod
    def _coerce(cls, value: object, where: str) -> ScriptedResponse:
        if isinstance(value, ScriptedResponse):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, Mapping):
            unknown = set(value) - {"content", "tool_calls", "stop_reason", "usage"}
            if unknown:
                raise InvalidArgument(f"{where}: a response has no field {sorted(unknown)}")
            fields = dict(value)
            fields["tool_calls"] = [ToolCall._coerce(call, where) for call in value.get("tool_calls", ())]
            return cls(**fields)
        raise InvalidArgument(
            f"{where}: a response is a ScriptedResponse, a string or a mapping, not {value!r}"
        )


@final
class ScriptedModel:
    """A model that says what it is told to, in order: response *k* of a run is the *k*-th of the
    script, *k* being how many model responses the run's log holds already. So a run resumed
    after a crash hears the rest of the script, not its beginning again, as from a real model
    that continues a conversation.

    ``ScriptedModel(["Done."])``, ``ScriptedModel([{"content": "...", "tool_calls": [{"id": "c1",
    "name": "search", "args": {...}}]}, ...])``, or the responses a run recorded:
    ``await ScriptedModel.from_run(db, run_id)``.
    """

    def __init__(self, responses: Sequence[ScriptedResponse | str | Mapping[str, Any]]) -> None:
        if isinstance(responses, str | bytes | Mapping) or not isinstance(responses, Sequence):
            raise InvalidArgument(f"ScriptedModel takes a list of responses, not {responses!r}")
        self.responses = tuple(
            ScriptedResponse._coerce(r, f"ScriptedModel response {i}") for i, r in enumerate(responses)
        )

    def __repr__(self) -> str:
        return f"<zincir.testing.ScriptedModel of {len(self.responses)} responses>"

    @classmethod
    async def from_run(cls, db: Database, run_id: str) -> ScriptedModel:
        """The responses run ``run_id`` recorded, in order (with their usage)."""
        responses = []
        for event in await db.events(run_id):
            if event.type == EventType.LLM_CALL:
                payload = event.payload
                calls = tuple(ToolCall(c["id"], c["name"], c.get("args", {})) for c in payload["tool_calls"])
                content, stop_reason, usage = (
                    payload.get("content"),
                    payload["stop_reason"],
                    payload.get("usage"),
                )
                responses.append(ScriptedResponse(content, calls, stop_reason, usage))
        return cls(responses)

    async def next_response(self, run: Run) -> ScriptedResponse:
        """The response that comes next for ``run``; :class:`ScriptExhausted` after the last."""
        played = sum(e.type == EventType.LLM_CALL for e in await run.database.events(run.id))
        if played >= len(self.responses):
            raise ScriptExhausted(
                f"run {run.id}: the scripted model has no response #{played + 1}:"
                f" it has {len(self.responses)}"
            )
        return self.responses[played]

    async def respond(self, run: Run) -> ScriptedResponse:
        """Record the next response in ``run`` (:meth:`Run.record_response`, with its intents) and
        return it."""
        response = await self.next_response(run)
        await run.record_response(
            response.content, list(response.tool_calls), response.stop_reason, usage=response.usage
        )
        return response
