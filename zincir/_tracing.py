"""OpenTelemetry spans of runs (docs/tracing.md).

zincir uses ``opentelemetry-api`` only (the extra ``otel``), imported the first time a database
that may trace looks for a tracer: without it zincir imports and runs as before, untraced.

What is traced, each where the work happens (and never for work served from the log: a step
that completed before, a wait that was already over, a child that existed):

========================  ==================================================================
``create_agent {role}``    a run created by ``open_run`` or forked; its context is stored with
                           the run (a fork's links to its source's)
``invoke_agent {role}``    an attempt: an owner's block (``open_run``, or a worker's handler),
                           child of the run's stored context, so every attempt of a run, in
                           any process, is in the run's one trace
``chat {model}``           a model call, from its mark (``start_model_call``) to its recorded
                           reply; without a mark, the recording of the reply
``execute_tool {name}``    ``run.execute``: the probe, the start, the tool and its result
``step {name}``            a step whose function runs
``wait {kind} {name}``     the time a wait (a signal, an approval, a child, a sleep) waited
``checkpoint {round}``     a checkpoint's verification and decision
========================  ==================================================================

A run's trace context is the W3C ``traceparent`` of the span it was created under: the
``create_agent`` span of ``open_run``, and for a child the span that spawned it (so a child's
attempts sit under its parent's). It is written with the run and read back with every lease
(:class:`~zincir._store.Lease`). A fork's is the span that made it (:func:`creating_fork`),
in the caller's trace, linked to its source's. Another new run made inside a span takes its
context from :func:`new_run_context`.

Spans carry no content (a response's text, a tool's arguments and result, a step's result, a
signal's payload, a checkpoint's state, an exception's message) unless the database was opened
with ``trace_content=True``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, final

import trio

from ._errors import InvalidArgument
from ._version import __version__

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanContext, Tracer

    from ._store import ForkOutcome, Lease

__all__ = [
    "ForkSpan",
    "RunTrace",
    "Tracing",
    "context_of",
    "creating_fork",
    "new_run_context",
    "traceparent_of",
]

_TRACEPARENT: Final = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")

_UNSET: Final = object()
_otel: Any = _UNSET


class _OpenTelemetry:
    """The parts of ``opentelemetry-api`` zincir uses, imported once."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import Status, StatusCode

        self.context = context
        self.trace = trace
        self.error = StatusCode.ERROR
        self.Status = Status


def _loaded() -> _OpenTelemetry | None:
    """``opentelemetry-api``, or None when it is not installed (looked for once)."""
    global _otel
    if _otel is _UNSET:
        try:
            _otel = _OpenTelemetry()
        except ImportError:
            _otel = None
    return _otel  # type: ignore[no-any-return]


def _api() -> Any:
    """The ``opentelemetry.trace`` module, or None when it is not installed."""
    otel = _loaded()
    return None if otel is None else otel.trace


def traceparent_of(span_context: SpanContext) -> str | None:
    """The W3C ``traceparent`` of a span context (None: it is not valid, as a no-op span's)."""
    if not span_context.is_valid:
        return None
    flags = int(span_context.trace_flags)
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{flags:02x}"


def context_of(traceparent: str | None) -> Context | None:
    """A context whose span is the (remote) one ``traceparent`` names; None for none (or for a
    value that is not a version-00 ``traceparent``)."""
    api = _api()
    found = None if traceparent is None or api is None else _TRACEPARENT.fullmatch(traceparent)
    if found is None:
        return None
    trace_id, span_id, flags = int(found[1], 16), int(found[2], 16), int(found[3], 16)
    if not trace_id or not span_id:
        return None
    remote = api.SpanContext(trace_id, span_id, is_remote=True, trace_flags=api.TraceFlags(flags))
    context: Context = api.set_span_in_context(api.NonRecordingSpan(remote))
    return context


def _current_traceparent() -> str | None:
    api = _api()
    return None if api is None else traceparent_of(api.get_current_span().get_span_context())


@final
class Tracing:
    """How a database's runs are traced: ``open_database(tracing=..., trace_content=...)``.

    ``tracing``: None (the default) traces when ``opentelemetry-api`` is installed and a global
    tracer provider is set; True traces through the global provider whatever it is (the API's
    proxy until one is set); False never traces; a ``TracerProvider`` traces through it.
    """

    content: bool
    """Whether spans carry content (``trace_content=True``)."""

    def __init__(self, tracing: object = None, content: object = False) -> None:
        if not isinstance(content, bool):
            raise InvalidArgument(f"trace_content must be True or False, not {content!r}")
        if tracing is not None and not isinstance(tracing, bool):
            if not callable(getattr(tracing, "get_tracer", None)):
                raise InvalidArgument(
                    f"tracing must be None, True, False or an OpenTelemetry TracerProvider, not {tracing!r}"
                )
        elif tracing is True and _api() is None:
            raise InvalidArgument(
                "tracing=True needs opentelemetry-api: pip install 'zincir[otel]' (docs/tracing.md)"
            )
        self._setting = tracing
        self.content = content
        self._cached: tuple[object, Tracer] | None = None

    def tracer(self) -> Tracer | None:
        """The tracer to use now; None while tracing is off."""
        setting = self._setting
        if setting is False:
            return None
        if setting is None or setting is True:
            api = _api()
            if api is None:
                return None
            provider = api.get_tracer_provider()
            if setting is None and isinstance(provider, api.ProxyTracerProvider):
                return None  # no provider set: nobody listens
        else:
            provider = setting
        cached = self._cached
        if cached is not None and cached[0] is provider:
            return cached[1]
        tracer: Tracer = provider.get_tracer("zincir", __version__)
        self._cached = (provider, tracer)
        return tracer


def new_run_context(tracing: Tracing) -> str | None:
    """The trace context to store with a new run made inside the current span (a child spawned
    by its parent, a fork): the current span's ``traceparent``. None while tracing is off."""
    return None if tracing.tracer() is None else _current_traceparent()


@contextmanager
def creating_run(tracing: Tracing, run_id: str, role: str, provider: str) -> Iterator[str | None]:
    """The ``create_agent`` span of a run ``open_run`` creates: the block gives the
    ``traceparent`` to store with the run (None while tracing is off) and creates it."""
    attributes: dict[str, Any] = {"gen_ai.agent.name": role}
    if provider:
        attributes["gen_ai.provider.name"] = provider
    with _create_agent(tracing, run_id, f"create_agent {role}", attributes) as span:
        yield None if span is None else traceparent_of(span.get_span_context())


@final
class ForkSpan:
    """The ``create_agent`` span of a fork being made: its ``traceparent`` is stored with the
    fork; :meth:`created` completes it from what the fork found (its source's role, and the
    source's trace, which it links to)."""

    def __init__(self, span: Span) -> None:
        self._span = span
        self.traceparent = traceparent_of(span.get_span_context())

    def created(self, forked: ForkOutcome) -> None:
        span = self._span
        span.update_name(f"create_agent {forked.role}")
        span.set_attribute("gen_ai.agent.name", forked.role)
        if forked.provider:
            span.set_attribute("gen_ai.provider.name", forked.provider)
        span.set_attribute("zincir.fork_seq", forked.fork_seq)
        source = context_of(forked.source_traceparent)
        if source is not None:
            source_span = _loaded().trace.get_current_span(source)  # type: ignore[union-attr]
            span.add_link(source_span.get_span_context(), {"zincir.link": "forked_from"})


@contextmanager
def creating_fork(tracing: Tracing, fork_id: str, source_id: str) -> Iterator[ForkSpan | None]:
    """The ``create_agent`` span of a fork (None while tracing is off): a span of the caller's
    trace, not of the source's: a fork is a new run, made when someone forks, maybe long after
    the source ended; the source is a link (docs/tracing.md)."""
    with _create_agent(tracing, fork_id, "create_agent", {"zincir.forked_from": source_id}) as span:
        yield None if span is None else ForkSpan(span)


@contextmanager
def _create_agent(
    tracing: Tracing, run_id: str, name: str, attributes: dict[str, Any]
) -> Iterator[Span | None]:
    """A ``create_agent`` span of run ``run_id`` for the block (None while tracing is off),
    marked with what ended the block if it raised."""
    tracer = tracing.tracer()
    if tracer is None:
        yield None
        return
    common = {
        "gen_ai.operation.name": "create_agent",
        "gen_ai.conversation.id": run_id,
        "zincir.run.id": run_id,
    }
    span = tracer.start_span(name, attributes={**common, **attributes})
    try:
        yield span
    except BaseException as exc:
        _failed(span, exc, tracing.content)
        raise
    finally:
        span.end()


def _failed(span: Span, exc: BaseException, content: bool) -> None:
    """Mark ``span`` with what ended it: an error (its type; its message and traceback only with
    content), or a cancellation, which is no error (a suspension, a stop, a lost lease)."""
    otel = _loaded()
    if otel is None or not span.is_recording():
        return
    if isinstance(exc, trio.Cancelled):
        span.set_attribute("zincir.cancelled", True)
        return
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    span.set_attribute("error.type", kind)
    if content:
        span.record_exception(exc)
        span.set_status(otel.Status(otel.error, f"{type(exc).__name__}: {exc}"))
    else:
        span.set_status(otel.Status(otel.error, kind))


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)


@final
class RunTrace:
    """The spans of one attempt of a run (one :class:`~zincir.Run`): made only while tracing is
    on (a Run without a tracer has none of this)."""

    def __init__(self, tracer: Tracer, content: bool, lease: Lease, attempt: int | None) -> None:
        otel = _loaded()
        assert otel is not None, "a tracer comes from opentelemetry-api"
        self._otel = otel
        self._tracer = tracer
        self._start_span: Callable[..., Span] = tracer.start_span
        # A span made current, and the current context restored: the API's functions, looked up
        # once (a step's span does both; bench/reports/tracing.md prices every part of it).
        self._in_context = otel.trace.set_span_in_context
        self._attach = otel.context.attach
        self._detach = otel.context.detach
        self.content = content
        self._lease = lease
        self._run_id = lease.run_id
        self._attempt = attempt
        # On every span: the run (a child run's spans share its parent's trace). The epoch and
        # the attempt are the attempt span's: each attribute costs the SDK time on every span.
        self._base: dict[str, Any] = {"zincir.run.id": lease.run_id}
        self._attempt_span: Span | None = None
        self._token: Any = None
        self._model_span: Span | None = None

    # -- the attempt ---------------------------------------------------------------------------

    def start_attempt(self) -> None:
        """Start the attempt's span, under the run's stored context (linked to the caller's
        span, when it is in another trace), and make it the current one until
        :meth:`end_attempt`: the body's spans are its children."""
        trace = self._otel.trace

        lease = self._lease
        attributes: dict[str, Any] = {
            **self._base,
            "zincir.epoch": lease.epoch,
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": lease.role,
            "gen_ai.conversation.id": lease.run_id,
        }
        if lease.provider:
            attributes["gen_ai.provider.name"] = lease.provider
        if self._attempt is not None:
            attributes["zincir.attempt"] = self._attempt
        if self.content:
            attributes["zincir.run.config"] = lease.config_json
        parent = context_of(lease.traceparent)
        links = []
        caller = trace.get_current_span().get_span_context()
        run_trace = None if parent is None else trace.get_current_span(parent).get_span_context().trace_id
        if caller.is_valid and run_trace is not None and caller.trace_id != run_trace:
            links.append(trace.Link(caller, {"zincir.link": "caller"}))
        span = self._tracer.start_span(
            f"invoke_agent {lease.role}", context=parent, attributes=attributes, links=links
        )
        self._attempt_span = span
        self._token = self._otel.context.attach(trace.set_span_in_context(span, parent))
        if not span.is_recording():
            # Sampled out: nothing inside it is made either (a parent-based sampler, the SDK's
            # default, would drop it; any other would orphan it). The attempt's span stays the
            # current one, so that the body's own spans follow its decision too.
            self._start_span = self._nothing

    def _nothing(self, name: str, **ignored: Any) -> Span:
        """What an attempt sampled out starts instead of a span: the API's invalid span, which
        records nothing and is never made current."""
        span: Span = self._otel.trace.INVALID_SPAN
        return span

    def end_attempt(self, outcome: str, error: BaseException | None) -> None:
        """End the attempt's span (the current one again what it was before): ``outcome`` says
        how the block ended; a model call still in flight ends with it, unanswered."""
        self.unanswered("the attempt ended before its reply was recorded")
        span = self._attempt_span
        if span is None:
            return
        self._attempt_span = None
        self._otel.context.detach(self._token)
        span.set_attribute("zincir.outcome", outcome)
        if error is not None:
            _failed(span, error, self.content)
        span.end()

    # -- spans inside it -----------------------------------------------------------------------

    def span(self, name: str, attributes: Mapping[str, Any]) -> _Scope:
        """A span of the current context (the attempt's, or one the body made current), ended
        with the ``with`` block it is given to; the block's own work (a tool, a step's function,
        a verifier) runs inside it, so that its spans are children of it."""
        return _Scope(self, self._start_span(name, attributes={**self._base, **attributes}))

    def step(self, name: str) -> _Scope:
        # The commonest span, made directly: its attributes in one literal, not merged.
        attributes = {"zincir.run.id": self._run_id, "zincir.step.name": name}
        return _Scope(self, self._start_span("step " + name, attributes=attributes))

    def tool(self, call_id: str, name: str, args: Any) -> _Scope:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function",
        }
        if self.content:
            attributes["gen_ai.tool.call.arguments"] = _json(args)
        return self.span(f"execute_tool {name}", attributes)

    def checkpoint(self, checkpoint_id: int, round: int, state: Any) -> _Scope:
        attributes: dict[str, Any] = {"zincir.checkpoint.id": checkpoint_id, "zincir.checkpoint.round": round}
        if self.content:
            attributes["zincir.checkpoint.state"] = _json(state)
        return self.span(f"checkpoint {round}", attributes)

    def start_wait(self, kind: str, name: str, started_ns: int) -> Span:
        """The span of a wait that did not end at its first look, from when it began."""
        attributes = {**self._base, "zincir.wait.kind": kind, "zincir.wait.name": name}
        return self._start_span(f"wait {kind} {name}", attributes=attributes, start_time=started_ns)

    def end_wait(self, span: Span, error: BaseException | None, value: Any = None) -> None:
        if error is not None:
            _failed(span, error, self.content)
        elif self.content and value is not None:
            span.set_attribute("zincir.wait.value", _json(value))
        span.end()

    def set_result(self, span: Span, key: str, value: Any) -> None:
        """A result as content: only with ``trace_content=True``."""
        if self.content:
            span.set_attribute(key, _json(value))

    # -- model calls -----------------------------------------------------------------------------

    def model_call_started(
        self, mark_seq: int, model: str | None, tokens: int | None, cost: float | None
    ) -> None:
        """A mark was placed: its call's span starts (a call in flight before it never got its reply)."""
        self.unanswered("another call was placed before its reply was recorded")
        attributes: dict[str, Any] = {
            **self._base,
            "gen_ai.operation.name": "chat",
            "zincir.mark_seq": mark_seq,
        }
        if model is not None:
            attributes["gen_ai.request.model"] = model
        if self._lease.provider:
            attributes["gen_ai.provider.name"] = self._lease.provider
        if tokens is not None:
            attributes["zincir.request_tokens"] = tokens
        if cost is not None:
            attributes["zincir.request_cost"] = cost
        self._model_span = self._start_span(
            "chat" if model is None else f"chat {model}", attributes=attributes
        )

    @contextmanager
    def model_call(self) -> Iterator[None]:
        """The call in flight as the current span (an instrumented HTTP client's spans nest in it)."""
        span = self._model_span
        if span is None or not span.is_recording():
            yield
            return
        context = self._otel.context
        token = context.attach(self._otel.trace.set_span_in_context(span))
        try:
            yield
        finally:
            context.detach(token)

    def reply_span(self) -> tuple[Span, bool]:
        """The span a reply being recorded ends: its mark's, or (no mark) one of its own, not
        named after its model yet (True)."""
        span = self._model_span
        self._model_span = None
        if span is not None:
            return span, False
        attributes = {**self._base, "gen_ai.operation.name": "chat"}
        if self._lease.provider:
            attributes["gen_ai.provider.name"] = self._lease.provider
        return self._start_span("chat", attributes=attributes), True

    def replied(
        self,
        span: Span,
        unnamed: bool,
        seq: int | None,
        response: Mapping[str, Any],
        tokens: tuple[int, int],
        cost: float,
        error: BaseException | None,
    ) -> None:
        """End a reply's span: its usage and finish reason (and, with content, what it said)."""
        if seq is not None:
            usage = response.get("usage") or {}
            model = usage.get("model")
            if isinstance(model, str):
                span.set_attribute("gen_ai.response.model", model)
                if unnamed:
                    span.update_name(f"chat {model}")
            response_id = usage.get("response_id", usage.get("id"))
            if isinstance(response_id, str):
                span.set_attribute("gen_ai.response.id", response_id)
            span.set_attribute("gen_ai.usage.input_tokens", tokens[0])
            span.set_attribute("gen_ai.usage.output_tokens", tokens[1])
            if cost:
                span.set_attribute("zincir.cost", cost)
            if response["stop_reason"]:
                span.set_attribute("gen_ai.response.finish_reasons", [response["stop_reason"]])
            span.set_attribute("zincir.seq", seq)
            span.set_attribute("zincir.tool_calls", len(response["tool_calls"]))
            if self.content:
                span.set_attribute("gen_ai.output.messages", _json([_output_message(response)]))
        if error is not None:
            _failed(span, error, self.content)
        span.end()

    def unanswered(self, why: str) -> None:
        """End the span of the call in flight, if any: no reply was recorded for it."""
        span = self._model_span
        if span is None:
            return
        self._model_span = None
        span.set_attribute("error.type", "zincir.unanswered")
        span.set_status(self._otel.Status(self._otel.error, f"no reply recorded: {why}"))
        span.end()


@final
class _Scope:
    """A span and the block it covers: the current span inside the block (unless it records
    nothing: a span sampled out has no children worth a context), marked with what ended it."""

    __slots__ = ("_span", "_token", "_trace")

    def __init__(self, trace: RunTrace, span: Span) -> None:
        self._trace = trace
        self._span = span
        self._token: Any = None

    def __enter__(self) -> Span:
        span = self._span
        if span.is_recording():
            trace = self._trace
            self._token = trace._attach(trace._in_context(span))
        return span

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if self._token is not None:
            self._trace._detach(self._token)
        if exc is not None:
            _failed(self._span, exc, self._trace.content)
        self._span.end()


def _output_message(response: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded response as a GenAI output message: its content as text (JSON when it is not
    a string), then its tool calls."""
    content = response["content"]
    parts: list[dict[str, Any]] = []
    if content not in (None, ""):
        parts.append({"type": "text", "content": content if isinstance(content, str) else _json(content)})
    calls: Sequence[Mapping[str, Any]] = response["tool_calls"]
    parts += [{"type": "tool_call", "id": c["id"], "name": c["name"], "arguments": c["args"]} for c in calls]
    return {"role": "assistant", "parts": parts, "finish_reason": response["stop_reason"]}


def now_ns() -> int:
    """Now, as a span's start time (the wall clock in ns, as OpenTelemetry's)."""
    return time.time_ns()
