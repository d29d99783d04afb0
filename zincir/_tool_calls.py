"""The model's half of :class:`~zincir._run.Run`: recording the model's responses with a durable
intent for each tool call, marking a model call in flight, and running the pending tool calls
(started, reconciled, their results recorded).

A base class of :class:`~zincir._run.Run`, kept apart because it is its own concern (how a tool
call is made at most once where it can be, and recorded exactly once: docs/agent-loop.md); it
declares the attributes it uses, and the few methods of the run it calls, for type checking.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ._budget import MAX_COST, CountedCall, debit_of, exceeded_error
from ._errors import DuplicateToolCall, InvalidArgument
from ._json import JSONValue, decode, dump_trusted
from ._run_support import _RunCore
from ._store import IntentRow, args_hash
from ._types import Done, PendingToolCall, ToolCall
from ._validation import check_async_callable, check_call_id, check_int, check_name, check_text


class _ToolCalls(_RunCore):
    """What the model's responses and the tools' calls need: :class:`~zincir._run.Run` inherits
    it (see the module's docstring)."""

    _started_calls: set[str]

    if TYPE_CHECKING:  # the run's own, which these methods call too

        @property
        def epoch(self) -> int:
            raise NotImplementedError

        @property
        def fencing_token(self) -> str:
            raise NotImplementedError

        @contextmanager
        def _active(self) -> Iterator[None]:
            raise NotImplementedError

    async def record_response(
        self,
        content: JSONValue,
        tool_calls: Sequence[ToolCall | Mapping[str, Any]],
        stop_reason: str,
        *,
        usage: Mapping[str, Any] | None = None,
    ) -> int:
        """Record one model response and a durable intent for each tool call, atomically.

        Tool call ids must be non-empty, unique within the response and new to the run.
        ``usage`` (token counts and the like) is stored with the response. Returns the seq
        of the ``llm_call`` event; its intents follow it in order.
        """
        if isinstance(tool_calls, str | bytes | Mapping) or not isinstance(tool_calls, Sequence):
            raise InvalidArgument(
                f"run {self.id}: tool_calls must be a list of tool calls (empty for none), not {tool_calls!r}"
            )
        calls = [ToolCall._coerce(c, f"run {self.id}") for c in tool_calls]
        seen: set[str] = set()
        for call in calls:
            if not isinstance(call.id, str) or not call.id:
                raise DuplicateToolCall(
                    f"run {self.id}: a tool call id must be a non-empty string, not {call.id!r}"
                )
            check_call_id(call.id, f"run {self.id}: tool call id")
            if call.id in seen:
                raise DuplicateToolCall(
                    f"run {self.id}: tool call id {call.id!r} appears twice in one response"
                )
            seen.add(call.id)
            check_name(call.name, f"run {self.id}: the name of tool call {call.id!r}")
        if not isinstance(stop_reason, str):
            raise InvalidArgument(f"run {self.id}: stop_reason must be a string, not {stop_reason!r}")
        response: dict[str, Any] = {
            "content": content,
            "stop_reason": stop_reason,
            "tool_calls": [{"args": c.args, "id": c.id, "name": c.name} for c in calls],
        }
        if usage is not None:
            if not isinstance(usage, Mapping):
                raise InvalidArgument(f"run {self.id}: usage must be a mapping, not {usage!r}")
            response["usage"] = dict(usage)
        llm_payload = self._encode(response, "the model response")
        intents = [
            IntentRow(
                c.id,
                c.name,
                self._encode(
                    {"args": c.args, "call_id": c.id, "name": c.name, "response_tool_count": len(calls)},
                    f"tool call {c.id!r}",
                ),
            )
            for c in calls
        ]
        counted = tuple(CountedCall(c, args_hash(c.name, c.args)) for c in calls)
        debit = debit_of(usage, counted, f"run {self.id}")
        trace = self._trace
        if trace is None:
            seq, reached = await self._write(self._store.record_response, llm_payload, intents, debit)
        else:
            span, unnamed = trace.reply_span()
            try:
                seq, reached = await self._write(self._store.record_response, llm_payload, intents, debit)
            except BaseException as exc:
                trace.replied(span, unnamed, None, response, (0, 0), 0.0, exc)
                raise
            tokens = (debit.input_tokens, debit.output_tokens)
            trace.replied(span, unnamed, int(seq), response, tokens, debit.cost, None)
        if reached is not None:  # recorded and debited all the same: it was paid for
            raise exceeded_error(self.id, reached)
        return int(seq)

    async def start_model_call(
        self, request_tokens: int | None = None, *, model: str | None = None, cost: float | None = None
    ) -> int:
        """Mark durably that a model call is about to be sent; returns the seq of the mark
        (its ``model_call_started`` event). Call it right before the request leaves; the
        :meth:`record_response` of its reply closes it. The adapters place it for you.

        ``request_tokens`` is the request's size in tokens (an estimate will do), ``model`` the
        model asked, ``cost`` what the request's input would cost: if the reply is never
        recorded (the process dies while the call is in flight, or the call fails and the next
        one is placed), the call is charged to the run's budget by these, once, and a
        ``model_call_lost`` event says so: at this owner's next mark, or when the next owner
        takes the run (docs/adapters.md). Raises :class:`BudgetExceeded` (and places no mark)
        while a limit of the run's budget is reached, so a spent budget costs no further call.
        """
        where = f"run {self.id}"
        if request_tokens is not None:
            check_int(request_tokens, f"{where}: request_tokens", minimum=0)
        if model is not None:
            check_text(model, f"{where}: the model")
        if cost is not None and (
            isinstance(cost, bool) or not isinstance(cost, int | float) or not 0 <= cost <= MAX_COST
        ):
            raise InvalidArgument(f"{where}: cost must be a number from 0 to {MAX_COST:g}, not {cost!r}")
        mark = dump_trusted(
            {"cost": cost, "epoch": self.epoch, "model": model, "request_tokens": request_tokens}
        )
        if self._trace is not None:  # the call in flight before (if any) is over, answered or not
            self._trace.unanswered("another call was placed before its reply was recorded")
        seq, reached = await self._write(self._store.start_model_call, mark)
        if reached is not None:
            raise exceeded_error(self.id, reached)
        if self._trace is not None:
            self._trace.model_call_started(int(seq), model, request_tokens, cost)
        return int(seq)

    @contextmanager
    def _in_model_call(self) -> Iterator[None]:
        """Around a model call after its mark: no suspension meanwhile (it is work), and with
        tracing on, the call's span is the current one (an instrumented HTTP client's spans nest
        in it). The adapters' ``create`` uses it."""
        with self._active():
            if self._trace is None:
                yield
            else:
                with self._trace.model_call():
                    yield

    async def pending_tools(self) -> list[PendingToolCall]:
        """The tool intents that have no result yet, oldest first: run them (again). In a
        fork, an intent copied from its source keeps the source's ``effect_key`` (the run where
        its effect belongs: docs/forks.md)."""
        rows = await self._read(self._store.pending_tools)
        pending = []
        for payload_json, count, started, last_started_at, effect_run in rows:
            payload = decode(payload_json)
            call = ToolCall(payload["call_id"], payload["name"], payload["args"])
            key = f"tool_call:{call.id}"
            pending.append(
                PendingToolCall(
                    call, count, key, self.fencing_token, started, last_started_at, f"{effect_run}:{key}"
                )
            )
        return pending

    async def start_tool(self, call_id: str) -> int:
        """Record that the tool of pending intent ``call_id`` is about to run (``tool_started``,
        with its attempt number), so that after a crash :attr:`PendingToolCall.started` tells a
        call that never began from one whose outcome is unknown. Returns the attempt (1, 2, ...)."""
        check_call_id(call_id, f"run {self.id}: call_id")
        attempt: int = await self._write(self._store.start_tool, call_id)
        self._started_calls.add(call_id)
        return attempt

    async def execute(
        self,
        pending: PendingToolCall,
        fn: Callable[[PendingToolCall], Awaitable[JSONValue]],
        *,
        reconcile: Callable[[PendingToolCall], Awaitable[JSONValue | Done | None]] | None = None,
    ) -> JSONValue:
        """Run a pending tool call once more and record its result; returns the result.

        ``pending`` comes from this owner's :meth:`pending_tools` (another run's or owner's is
        InvalidArgument). A call started before (``pending.started > 0``, or started through
        this run since, by an earlier ``execute`` whose tool raised) may have had its effect: with
        ``reconcile``, ``await reconcile(pending)`` looks first. A result it returns means the
        effect happened: it is recorded without running ``fn``, its ``tool_result`` marked
        ``"reconciled": true``; :class:`Done` wraps a result that is itself None
        (``Done(None)``). A plain None means the effect did not happen, and ``fn`` runs. Without
        ``reconcile``, ``fn`` runs again (at-least-once: make it idempotent by
        ``pending.idempotency_key``). The start is recorded before ``fn`` runs.
        """
        if not isinstance(pending, PendingToolCall):
            raise InvalidArgument(f"run {self.id}: execute() takes a PendingToolCall, not {pending!r}")
        self._check_usable()  # an owner that lost its lease says so first, whatever it is given
        if pending.fencing_token != self.fencing_token:
            raise InvalidArgument(
                f"run {self.id}: tool call {pending.call.id!r} was read by {pending.fencing_token!r}, not"
                f" by this owner ({self.fencing_token}): take it from this run's pending_tools()"
            )
        check_async_callable(fn, f"run {self.id}: the tool of {pending.call.id!r}")
        if reconcile is not None:
            check_async_callable(reconcile, f"run {self.id}: the reconciler of {pending.call.id!r}")
        if self._trace is None:
            return await self._execute(pending, fn, reconcile, None)
        with self._trace.tool(pending.call.id, pending.call.name, pending.call.args) as span:
            return await self._execute(pending, fn, reconcile, span)

    async def _execute(
        self,
        pending: PendingToolCall,
        fn: Callable[[PendingToolCall], Awaitable[JSONValue]],
        reconcile: Callable[[PendingToolCall], Awaitable[JSONValue | Done | None]] | None,
        span: Any,
    ) -> JSONValue:
        # Started before this snapshot was taken, or since (an earlier execute that failed).
        started_before = pending.started > 0 or pending.call.id in self._started_calls
        if started_before and reconcile is not None:
            found = await reconcile(pending)
            if found is not None:
                result = found.value if isinstance(found, Done) else found
                seq = await self._record_result(pending.call.id, result, reconciled=True)
                if span is not None:
                    self._traced_result(span, seq, result, reconciled=True)
                return result
        attempt = await self.start_tool(pending.call.id)
        if span is not None:
            span.set_attribute("zincir.tool.attempt", attempt)
        result = await fn(pending)
        seq = await self._record_result(pending.call.id, result, reconciled=False)
        if span is not None:
            self._traced_result(span, seq, result, reconciled=False)
        return result

    def _traced_result(self, span: Any, seq: int, result: JSONValue, *, reconciled: bool) -> None:
        assert self._trace is not None
        span.set_attribute("zincir.seq", seq)
        span.set_attribute("zincir.reconciled", reconciled)
        self._trace.set_result(span, "gen_ai.tool.call.result", result)

    async def record_tool_result(self, call_id: str, content: JSONValue) -> None:
        """Record a tool's result. Repeating the identical result is a no-op."""
        await self._record_result(call_id, content, reconciled=False)

    async def _record_result(self, call_id: str, content: JSONValue, *, reconciled: bool) -> int:
        check_call_id(call_id, f"run {self.id}: call_id")
        result: dict[str, JSONValue] = {"call_id": call_id, "content": content}
        if reconciled:  # found by a probe, not returned by the tool: the log says so
            result["reconciled"] = True
        payload = self._encode(result, f"the result of {call_id!r}")
        seq: int = await self._write(self._store.record_tool_result, call_id, payload)
        return seq
