"""OpenTelemetry: a span per attempt, model response, tool execution, step, wait and checkpoint
decision, in the run's one trace across attempts, children and processes (a SIGKILL and a resume
included); nothing traced again for work served from the log; no content unless asked."""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import StatusCode

import zincir
from zincir._tracing import traceparent_of

from .helpers import running_python, scalar, until

SECRET = "S3CRET"
CLAIM = {"completed": [SECRET], "remaining": [], "artifacts": [], "failed_attempts": [], "evidence": []}


class Spans:
    """A tracer provider whose finished spans are kept in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    @property
    def finished(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.finished if s.name.startswith(prefix)]

    def one(self, name: str) -> ReadableSpan:
        [span] = [s for s in self.finished if s.name == name]
        return span

    def clear(self) -> None:
        self.exporter.clear()


@pytest.fixture
def spans() -> Iterator[Spans]:
    kept = Spans()
    yield kept
    kept.provider.shutdown()


@contextlib.asynccontextmanager
async def traced(target: str, spans: Spans, *, content: bool = False) -> AsyncIterator[zincir.Database]:
    async with zincir.open_database(target, tracing=spans.provider, trace_content=content) as db:
        yield db


async def ok(pending: zincir.PendingToolCall) -> Any:
    return {"ok": pending.call.name, "secret": SECRET}


async def passes(state: zincir.CheckpointState) -> zincir.Verification:
    return zincir.Verification(True, [f"checked {SECRET}"])


async def echo(value: Any) -> Any:
    return value


async def signal_when_waiting(db: zincir.Database, run_id: str) -> None:
    """Send signal ``go`` once the run's wait ``w`` is recorded: the wait waits (it does not end
    at its first look)."""
    await until(lambda: _waiting(db, run_id))
    await zincir.send_signal(db, run_id, "go", {"payload": SECRET})


async def _waiting(db: zincir.Database, run_id: str) -> bool:
    return bool(scalar(db, "SELECT count(*) FROM waits WHERE run_id = ? AND name = 'w'", (run_id,)))


async def every_kind_of_work(db: zincir.Database) -> tuple[str, str]:
    """One attempt that marks and records a response, runs a tool, decides a checkpoint, runs a
    step, sleeps, waits for a signal that comes later, and spawns a child, which a second block
    completes. (run id, child id)."""
    async with zincir.open_run(db, config={"goal": SECRET}, provider="anthropic") as run:
        await run.start_model_call(120, model="claude-x", cost=0.5)
        calls = [
            zincir.ToolCall("c1", "grep", {"q": SECRET}),
            zincir.ToolCall("cp", zincir.SUBMIT_CHECKPOINT, {}),
        ]
        usage = {"input_tokens": 100, "output_tokens": 7, "model": "claude-x-2025", "response_id": "msg_1"}
        await run.record_response(f"said {SECRET}", calls, "tool_use", usage=usage)
        tool, _ = await run.pending_tools()
        await run.execute(tool, ok)
        await run.checkpoint("cp", CLAIM, passes)
        await run.step("fetch", echo, {"got": SECRET})
        await run.sleep("nap", 0.01)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(signal_when_waiting, db, run.id)
            await run.wait_for_signal("w", "go")
        child = await run.spawn("helper", role="helper")
    async with zincir.open_run(db, child) as helper:
        await helper.complete()
    return run.id, child


def attrs_of(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


async def test_an_attempt_traces_its_work_in_the_runs_one_trace(db_target: str, spans: Spans) -> None:
    async with traced(db_target, spans) as db:
        run_id, child_id = await every_kind_of_work(db)
        log = await db.events(run_id)
    events = {e.type.value: e.seq for e in log}
    [tool_result] = [e.seq for e in log if e.type == "tool_result" and e.payload["call_id"] == "c1"]
    created = spans.one("create_agent agent")
    attempt, child_attempt = (
        s for s in spans.named("invoke_agent") if attrs_of(s)["zincir.run.id"] in (run_id, child_id)
    )
    if attrs_of(attempt)["zincir.run.id"] == child_id:
        attempt, child_attempt = child_attempt, attempt
    assert {s.context.trace_id for s in spans.finished} == {created.context.trace_id}  # one trace
    assert created.parent is None and parent_of(attempt) == created.context.span_id
    assert parent_of(child_attempt) == attempt.context.span_id  # spawned inside the parent's attempt
    assert attrs_of(created) == {
        "gen_ai.operation.name": "create_agent",
        "gen_ai.agent.name": "agent",
        "gen_ai.conversation.id": run_id,
        "zincir.run.id": run_id,
        "gen_ai.provider.name": "anthropic",
    }
    assert attrs_of(attempt) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "agent",
        "gen_ai.conversation.id": run_id,
        "gen_ai.provider.name": "anthropic",
        "zincir.run.id": run_id,
        "zincir.epoch": 1,
        "zincir.outcome": "released",
    }
    assert attrs_of(child_attempt)["zincir.outcome"] == "completed"
    assert attrs_of(child_attempt)["gen_ai.agent.name"] == "helper"
    inside = [
        "chat claude-x",
        "execute_tool grep",
        "checkpoint 1",
        "step fetch",
        "wait sleep nap",
        "wait signal w",
    ]
    for name in inside:
        span = spans.one(name)
        assert parent_of(span) == attempt.context.span_id, name
        assert attrs_of(span)["zincir.run.id"] == run_id
    chat = attrs_of(spans.one("chat claude-x"))
    assert chat == {
        "zincir.run.id": run_id,
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "claude-x",
        "gen_ai.provider.name": "anthropic",
        "zincir.mark_seq": events["model_call_started"],
        "zincir.request_tokens": 120,
        "zincir.request_cost": 0.5,
        "gen_ai.response.model": "claude-x-2025",
        "gen_ai.response.id": "msg_1",
        "gen_ai.usage.input_tokens": 100,
        "gen_ai.usage.output_tokens": 7,
        "gen_ai.response.finish_reasons": ("tool_use",),
        "zincir.seq": events["llm_call"],
        "zincir.tool_calls": 2,
    }
    tool = attrs_of(spans.one("execute_tool grep"))
    assert tool["gen_ai.operation.name"] == "execute_tool" and tool["gen_ai.tool.call.id"] == "c1"
    assert (tool["zincir.tool.attempt"], tool["zincir.reconciled"]) == (1, False)
    assert tool["zincir.seq"] == tool_result
    decided = attrs_of(spans.one("checkpoint 1"))
    assert (
        decided["zincir.checkpoint.passed"] is True and decided["zincir.seq"] == events["checkpoint_accepted"]
    )
    assert attrs_of(spans.one("wait signal w"))["zincir.wait.kind"] == "signal"
    assert all(s.status.status_code is StatusCode.UNSET for s in spans.finished)


async def test_work_served_from_the_log_is_not_traced_again(db_target: str, spans: Spans) -> None:
    async with traced(db_target, spans) as db:
        run_id, child_id = await every_kind_of_work(db)
        before = spans.finished
        spans.clear()
        async with zincir.open_run(db, run_id) as again:  # a handler restarted from the top
            assert await again.step("fetch", echo, {"again": True}) == {"got": SECRET}
            await again.sleep("nap", 0.01)
            assert await again.wait_for_signal("w", "go") == {"payload": SECRET}
            assert await again.spawn("helper", role="helper") == child_id
            assert await again.join(child_id)
            await again.complete()
    [attempt] = spans.finished  # the attempt alone: nothing it did was new work
    assert attempt.name == "invoke_agent agent" and attrs_of(attempt)["zincir.epoch"] == 2
    assert attempt.context.trace_id == before[0].context.trace_id
    created = next(s for s in before if s.name == "create_agent agent")
    assert parent_of(attempt) == created.context.span_id
    assert attrs_of(attempt)["zincir.outcome"] == "completed"


def all_text(span: ReadableSpan) -> str:
    values = [*attrs_of(span).values(), span.status.description or "", span.name]
    for event in span.events:
        values += [event.name, *dict(event.attributes or {}).values()]
    return json.dumps(values, default=str)


async def broken(_: Any) -> Any:
    raise RuntimeError(f"the tool failed on {SECRET}")


@pytest.mark.parametrize("content", [False, True])
async def test_spans_carry_no_content_unless_asked(db_target: str, spans: Spans, content: bool) -> None:
    async with traced(db_target, spans, content=content) as db:
        run_id, _ = await every_kind_of_work(db)
        async with zincir.open_run(db, run_id) as run:
            with pytest.raises(RuntimeError):
                await run.step("breaks", broken, None)
    leaked = {s.name for s in spans.finished if SECRET in all_text(s)}
    if not content:
        assert leaked == set()
        failed = spans.one("step breaks")
        assert failed.status.status_code is StatusCode.ERROR
        assert attrs_of(failed)["error.type"] == "builtins.RuntimeError" and failed.events == ()
        return
    assert leaked == {
        "invoke_agent agent",
        "chat claude-x",
        "execute_tool grep",
        "checkpoint 1",
        "step fetch",
        "wait signal w",
        "step breaks",
    }
    assert json.loads(attrs_of(spans.one("step fetch"))["zincir.step.result"]) == {"got": SECRET}
    tool = attrs_of(spans.one("execute_tool grep"))
    assert json.loads(tool["gen_ai.tool.call.arguments"]) == {"q": SECRET}
    assert json.loads(tool["gen_ai.tool.call.result"]) == {"ok": "grep", "secret": SECRET}
    [message] = json.loads(attrs_of(spans.one("chat claude-x"))["gen_ai.output.messages"])
    assert message["parts"][0] == {"type": "text", "content": f"said {SECRET}"}
    assert message["parts"][1] == {
        "type": "tool_call",
        "id": "c1",
        "name": "grep",
        "arguments": {"q": SECRET},
    }
    assert json.loads(attrs_of(spans.one("wait signal w"))["zincir.wait.value"]) == {"payload": SECRET}
    assert spans.one("step breaks").events[0].name == "exception"


async def test_a_call_without_a_reply_ends_its_span_unanswered(db_target: str, spans: Spans) -> None:
    async with traced(db_target, spans) as db, zincir.open_run(db) as run:
        await run.start_model_call(10, model="first")
        await run.start_model_call(10, model="second")
        await run.record_response("plain", [], "end_turn", usage={"output_tokens": 1})  # closes "second"
        await run.record_response("no mark", [], "end_turn", usage={"model": "named-later"})
        await run.start_model_call(10, model="third")  # in flight when the block ends
    first, third = spans.one("chat first"), spans.one("chat third")
    for span in (first, third):
        assert span.status.status_code is StatusCode.ERROR
        assert attrs_of(span)["error.type"] == "zincir.unanswered"
    assert "another call was placed" in (first.status.description or "")
    assert "the attempt ended" in (third.status.description or "")
    assert spans.one("chat second").status.status_code is StatusCode.UNSET
    assert attrs_of(spans.one("chat named-later"))["gen_ai.response.model"] == "named-later"


async def test_a_fork_is_made_in_its_callers_trace_linked_to_its_source(db_target: str, spans: Spans) -> None:
    async with traced(db_target, spans) as db:
        async with zincir.open_run(db, provider="anthropic") as run:
            await run.record_response("r", [], "end_turn")
        source = spans.one("create_agent agent")
        spans.clear()
        with spans.provider.get_tracer("app").start_as_current_span("operator") as operator:
            at = (await db.events(run.id))[-1].seq
            fork_id = await zincir.fork_run(db, run.id, at)
        stored = scalar(db, "SELECT traceparent FROM agent_runs WHERE id = ?", (fork_id,))
        async with zincir.open_run(db, fork_id) as fork:  # any process: it reads the stored context
            await fork.step("b", echo, 2)
    created, attempt = spans.one("create_agent agent"), spans.one("invoke_agent agent")
    trace_id = operator.get_span_context().trace_id
    assert {s.context.trace_id for s in spans.finished} == {trace_id} != source.context.trace_id
    assert parent_of(created) == operator.get_span_context().span_id
    assert stored == traceparent_of(created.context)
    assert parent_of(attempt) == created.context.span_id
    assert parent_of(spans.one("step b")) == attempt.context.span_id
    [link] = created.links
    assert link.context.span_id == source.context.span_id and link.context.trace_id == source.context.trace_id
    assert dict(link.attributes or {}) == {"zincir.link": "forked_from"}
    assert attrs_of(created) == {
        "gen_ai.operation.name": "create_agent",
        "gen_ai.agent.name": "agent",
        "gen_ai.conversation.id": fork_id,
        "gen_ai.provider.name": "anthropic",
        "zincir.run.id": fork_id,
        "zincir.forked_from": run.id,
        "zincir.fork_seq": at,
    }


class AttemptsSampledOut(Sampler):
    """Samples a run's creation and drops its attempts, parent-based otherwise; records what it
    was asked about (a span's name, and whether its parent was sampled)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, bool]] = []

    def should_sample(self, parent_context: Any, trace_id: int, name: str, *args: Any, **kw: Any) -> Any:
        parent = trace.get_current_span(parent_context).get_span_context()
        parent_sampled = parent.is_valid and parent.trace_flags.sampled
        self.asked.append((name, parent_sampled))
        sampled = name.startswith("create_agent") or (parent_sampled and not name.startswith("invoke_agent"))
        return SamplingResult(Decision.RECORD_AND_SAMPLE if sampled else Decision.DROP, kw.get("attributes"))

    def get_description(self) -> str:
        return "AttemptsSampledOut"


async def test_an_attempt_sampled_out_makes_no_span_inside_it(db_target: str) -> None:
    sampler = AttemptsSampledOut()
    kept = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(kept))

    async def own_work(value: Any) -> Any:
        with provider.get_tracer("app").start_as_current_span("own work"):
            return value

    try:
        async with zincir.open_database(db_target, tracing=provider) as db, zincir.open_run(db) as run:
            await run.step("a", own_work, 1)
            await run.start_model_call(10, model="m")
            await run.record_response("r", [zincir.ToolCall("c1", "grep", {})], "tool_use")
            [tool] = await run.pending_tools()
            await run.execute(tool, ok)
            await run.sleep("nap", 0.01)
    finally:
        provider.shutdown()
    assert [s.name for s in kept.get_finished_spans()] == ["create_agent agent"]
    # Asked about the run and its attempt only; the body's own span sees its parent sampled out.
    assert sampler.asked == [("create_agent agent", False), ("invoke_agent agent", True), ("own work", False)]


async def test_the_adapter_makes_its_call_inside_the_calls_span(db_target: str, spans: Spans) -> None:
    import anthropic
    import httpx2

    from zincir.adapters import anthropic as za

    from .test_adapters import TEXT, anthropic_message

    seen: list[int] = []

    def provider(request: Any) -> Any:
        seen.append(trace.get_current_span().get_span_context().span_id)
        return httpx2.Response(200, json=anthropic_message(TEXT).to_dict(mode="json"))

    async with (
        traced(db_target, spans) as db,
        zincir.open_run(db, config={"goal": "g"}) as run,
        httpx2.AsyncClient(transport=httpx2.MockTransport(provider)) as http,
        anthropic.AsyncAnthropic(api_key="k", base_url="http://api.invalid", http_client=http) as client,
    ):
        await za.create(
            run, client, model="claude-sonnet-4-5", max_tokens=64, messages=za.messages(await run.state())
        )
    chat = spans.one("chat claude-sonnet-4-5")
    assert seen == [chat.context.span_id]
    assert attrs_of(chat)["gen_ai.response.model"] == "claude-sonnet-4-5-20250929"
    assert attrs_of(chat)["gen_ai.usage.input_tokens"] == 1200


async def test_a_suspended_attempt_ends_its_wait_cancelled_and_the_resumed_one_serves_it(
    db_target: str, spans: Spans
) -> None:
    from .test_suspension import working

    async def handler(run: zincir.Run) -> None:
        await run.wait_for_signal("w", "go")
        await run.complete()

    async with traced(db_target, spans) as db:
        async with zincir.open_run(db) as run:
            pass  # left for the worker
        async with working(db, handler, suspend_after=0):
            await until(lambda: _status_is(db, run.id, zincir.RunStatus.WAITING))
            await zincir.send_signal(db, run.id, "go")
            await until(lambda: _status_is(db, run.id, zincir.RunStatus.COMPLETED))
    first, second = sorted(spans.named("invoke_agent"), key=lambda s: attrs_of(s)["zincir.epoch"])[1:]
    assert (attrs_of(first)["zincir.outcome"], attrs_of(second)["zincir.outcome"]) == (
        "suspended",
        "completed",
    )
    assert attrs_of(first)["zincir.attempt"] == attrs_of(second)["zincir.attempt"] == 1  # given back
    [wait] = spans.named("wait")  # the first attempt's; the second found the signal at its first look
    assert parent_of(wait) == first.context.span_id and attrs_of(wait)["zincir.cancelled"] is True
    assert wait.status.status_code is StatusCode.UNSET and first.status.status_code is StatusCode.UNSET


async def _status_is(db: zincir.Database, run_id: str, status: zincir.RunStatus) -> bool:
    return (await db.state(run_id)).run.status is status


# -- across processes --------------------------------------------------------------------------------


# Its spans go to a file, one JSON line each, written as each span ends (a SIGKILL loses only the
# spans that had not ended). "kill": step a, then step b kills the process. "resume": a worker
# claims the run (the dead owner's lease at once, or after it expires) and the handler runs
# from the top: step a is served from the log, step b runs, the run completes.
OWNER = """
    import json, os, signal, sys, trio, zincir
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class ToFile(SpanExporter):
        def __init__(self, path):
            self.out = open(path, "a")
        def export(self, spans):
            for s in spans:
                parent = None if s.parent is None else s.parent.span_id
                line = {"name": s.name, "trace": s.context.trace_id, "span": s.context.span_id,
                        "parent": parent, "attributes": dict(s.attributes)}
                self.out.write(json.dumps(line) + "\\n")
            self.out.flush()
            return SpanExportResult.SUCCESS

    async def a():
        return "a"

    async def b():
        if sys.argv[3] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        return "b"

    async def handler(run):
        await run.step("a", a)
        await run.step("b", b)
        await run.complete()

    async def main():
        target, run_id, mode, path = sys.argv[1:]
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(ToFile(path)))
        async with zincir.open_database(target, tracing=provider) as db:
            if mode == "kill":
                async with zincir.open_run(db, run_id, lease_ttl=3) as run:
                    await handler(run)
            else:
                await zincir.ResumeWorker(db, handler, lease_ttl=3, poll_interval=0.05, until_idle=True).run()
        provider.shutdown()

    trio.run(main)
"""


def read_spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_a_run_resumed_after_a_sigkill_continues_its_trace_in_a_new_process(
    db_target: str, spans: Spans, tmp_path: Path
) -> None:
    async with traced(db_target, spans) as db, zincir.open_run(db) as run:
        pass  # created (and its context stored) here; left for the processes below
    created = spans.one("create_agent agent")
    killed, resumed = tmp_path / "killed.jsonl", tmp_path / "resumed.jsonl"
    with running_python(OWNER, db_target, run.id, "kill", str(killed)) as proc:
        _, err = await trio.to_thread.run_sync(proc.communicate)
    assert proc.returncode == -signal.SIGKILL, err
    with running_python(OWNER, db_target, run.id, "resume", str(resumed)) as proc:
        _, err = await trio.to_thread.run_sync(proc.communicate)
    assert proc.returncode == 0, err
    first, second = read_spans(killed), read_spans(resumed)
    # The killed attempt's own span never ended: only its finished step reached the file.
    assert [s["name"] for s in first] == ["step a"]
    assert sorted(s["name"] for s in second) == ["invoke_agent agent", "step b"]  # step a: served
    assert {s["trace"] for s in first + second} == {created.context.trace_id}  # one trace
    [attempt] = [s for s in second if s["name"] == "invoke_agent agent"]
    assert attempt["parent"] == created.context.span_id
    assert attempt["attributes"]["zincir.attempt"] == 1 and attempt["attributes"]["zincir.epoch"] == 3
    assert attempt["attributes"]["zincir.outcome"] == "completed"
    [step_b] = [s for s in second if s["name"] == "step b"]
    assert step_b["parent"] == attempt["span"]
    # Step a ran in the killed attempt: under that attempt's span (which never reached the file).
    assert first[0]["attributes"] == {"zincir.run.id": run.id, "zincir.step.name": "a"}
    assert first[0]["parent"] not in {None, attempt["span"], created.context.span_id}
    assert scalar_status(db_target, run.id) == "completed"


def scalar_status(target: str, run_id: str) -> object:
    import sqlite3

    if target.startswith("postgresql"):
        import psycopg

        with psycopg.connect(target) as conn:
            row = conn.execute("SELECT status FROM agent_runs WHERE id = %s", (run_id,)).fetchone()
            return None if row is None else row[0]
    with contextlib.closing(sqlite3.connect(target)) as conn:
        return conn.execute("SELECT status FROM agent_runs WHERE id = ?", (run_id,)).fetchone()[0]


# -- on and off --------------------------------------------------------------------------------------

GLOBAL = """
    import sys, trio, zincir
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    async def main():
        exporter = InMemorySpanExporter()
        if sys.argv[2] != "unset":
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
        tracing = {"default": None, "off": False, "on": True, "unset": None}[sys.argv[2]]
        async with zincir.open_database(sys.argv[1], tracing=tracing) as db:
            async with zincir.open_run(db) as run:
                await run.step("s", trio.sleep, 0)
        print(sorted(s.name for s in exporter.get_finished_spans()))

    trio.run(main)
"""


@pytest.mark.parametrize(
    ("setting", "names"),
    [("default", ["create_agent agent", "invoke_agent agent", "step s"]), ("off", []), ("unset", [])],
)
def test_a_global_provider_turns_tracing_on_unless_it_is_off(
    tmp_path: Path, setting: str, names: list[str]
) -> None:
    with running_python(GLOBAL, str(tmp_path / "z.db"), setting) as proc:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == repr(names)


WITHOUT_OTEL = """
    import sys, trio

    class NoOpenTelemetry:
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ImportError(f"{name} is not installed here")

    sys.meta_path.insert(0, NoOpenTelemetry())
    import zincir

    async def main():
        async with zincir.open_database(sys.argv[1]) as db, zincir.open_run(db) as run:
            await run.step("s", trio.sleep, 0)
            await run.start_model_call(5)
            await run.record_response("ok", [], "end_turn")
        try:
            async with zincir.open_database(sys.argv[1], tracing=True):
                pass
        except zincir.InvalidArgument as exc:
            print("refused:", exc)
        print("opentelemetry imported:", any(m.startswith("opentelemetry") for m in sys.modules))

    trio.run(main)
"""


def test_zincir_runs_without_opentelemetry_and_says_what_tracing_needs(tmp_path: Path) -> None:
    with running_python(WITHOUT_OTEL, str(tmp_path / "z.db")) as proc:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.splitlines() == [
        "refused: tracing=True needs opentelemetry-api: pip install 'zincir[otel]' (docs/tracing.md)",
        "opentelemetry imported: False",
    ]


@pytest.mark.parametrize(
    "kwargs",
    [{"tracing": "yes"}, {"tracing": object()}, {"trace_content": 1}, {"trace_content": None}],
    # Ids that are the same in every xdist worker (an object's repr is not).
    ids=["tracing-text", "tracing-object", "trace_content-int", "trace_content-none"],
)
async def test_bad_tracing_settings_are_invalid(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(zincir.InvalidArgument):
        async with zincir.open_database(tmp_path / "z.db", **kwargs):
            pass
    assert not (tmp_path / "z.db").exists()
