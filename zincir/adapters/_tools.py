"""Executing a run's pending tool intents, whichever SDK asked for them (docs/adapters.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .. import (
    SUBMIT_CHECKPOINT,
    CheckpointState,
    Done,
    InvalidArgument,
    PendingToolCall,
    Run,
    Verifier,
)

__all__ = ["Claim", "Probe", "Tool", "run_tools"]

JSONValue = Any

Tool = Callable[[PendingToolCall], Awaitable[JSONValue]]
"""A tool: ``await tool(pending)`` applies the call (``pending.call.args``) and returns its result."""

Probe = Callable[[PendingToolCall], Awaitable[JSONValue | Done | None]]
"""A reconcile probe (:meth:`Run.execute`): the result of an effect that already happened, or None."""

Claim = Callable[[PendingToolCall], Awaitable[CheckpointState]]
"""Turns a ``submit_checkpoint`` call into the state it claims (measuring its artifacts, say)."""


async def run_tools(
    run: Run,
    tools: Mapping[str, Tool],
    *,
    reconcile: Mapping[str, Probe] | None = None,
    claim: Claim | None = None,
    verify: Verifier | None = None,
) -> dict[str, JSONValue]:
    """Execute every pending tool intent of ``run`` and record its result; returns the results
    by call id, in the order they were recorded.

    - A call of a tool in ``tools`` runs through :meth:`Run.execute`, with the probe of
      ``reconcile`` for that tool name, if any: the start is recorded first, and a call that
      started before a crash is probed before it runs again.
    - A call of a tool that ``tools`` does not have is answered with ``{"error": ...}``, so the
      model reads what went wrong instead of the run stopping.
    - ``submit_checkpoint`` calls come last (a checkpoint is decided once its sibling calls have
      results): ``claim(pending)`` builds the claimed state and :meth:`Run.checkpoint` has
      ``verify`` decide it; their result is ``{"accepted": ..., "verification": ...}``. A candidate
      whose verification a crash interrupted is decided first. Both are needed once the model
      can call ``submit_checkpoint``.

    Tools run one after another, in the order the model asked for them.
    """
    if not isinstance(tools, Mapping):
        raise InvalidArgument(f"run {run.id}: tools must be a mapping of tool names to async functions")
    probes = reconcile or {}
    results: dict[str, JSONValue] = {}
    if verify is not None:
        candidate = await run.pending_checkpoint()
        if candidate is not None:  # a crash interrupted its verification: decide the stored one
            decided = await run.verify_checkpoint(candidate, verify)
            results[decided.tool_call_id] = _decision(decided.status, decided.verification)
    pending = await run.pending_tools()
    # A checkpoint is decided once its sibling calls have results: those run first (in log order).
    pending.sort(key=lambda p: p.call.name == SUBMIT_CHECKPOINT)
    claims = [p.call.id for p in pending if p.call.name == SUBMIT_CHECKPOINT]
    if claims and (claim is None or verify is None):  # refused before anything runs
        raise InvalidArgument(
            f"run {run.id}: {SUBMIT_CHECKPOINT} calls {claims!r} are pending: pass claim= and verify="
            " to run_tools to decide them"
        )
    for item in pending:
        call = item.call
        if call.name == SUBMIT_CHECKPOINT and claim is not None and verify is not None:  # (checked above)
            decided = await run.checkpoint(call.id, await claim(item), verify)
            results[call.id] = _decision(decided.status, decided.verification)
        elif call.name in tools:
            results[call.id] = await run.execute(item, tools[call.name], reconcile=probes.get(call.name))
        else:
            error = {"error": f"there is no tool named {call.name!r}; use one of {sorted(tools)!r}"}
            await run.record_tool_result(call.id, error)
            results[call.id] = error
    return results


def _decision(status: str, verification: Any) -> JSONValue:
    """The result that answers a decided ``submit_checkpoint`` call, as the log has it."""
    evidence = None if verification is None else verification.evidence
    passed = status == "accepted"
    return {"accepted": passed, "verification": {"evidence": evidence, "passed": passed}}
