"""The agent of ``python -m bench.horizon``: one child process (:func:`child`).

The task: ``n`` subtasks; subtask ``i`` writes ``task-<i>.txt`` in a scratch directory with the
first 16 hex digits of ``sha256("horizon:<seed>:<i>")`` (so :func:`check` can verify it), registers
the file in an external ledger (idempotent by key: an upsert keyed by the task's name) and
notifies a reviewer (not idempotent: every call appends a line to the ledger; a repeat is a
duplicated external effect). Subtask ``i`` is done when its claim is in the run's latest accepted
checkpoint.

The model is scripted (no network). What it answers is a deterministic function of the seed and
of the context it is given (the prompt text, which this module renders from the run's events):

* it reads its context: the latest accepted checkpoint in it says which subtasks are done; the
  events after it say whether the next subtask's file was written since the last rejection, and
  whether its reviewer was notified (anywhere in the context);
* its random draws come from ``Random(sha256(seed, prompt))``: the same prompt, the same answer;
* written since the last rejection: it claims the subtask (``submit_checkpoint``); otherwise,
  with probability ``p_false`` it claims it anyway (a false claim), else it does the work: one
  response with ``write_file``, ``register`` and, if not notified yet, ``notify``. The content is
  wrong (one digit changed) with probability ``err_base + err_per_ktoken * prompt_tokens / 1000``
  (at most ``err_max``): context rot;
* it counts tokens as ``ceil(len(text) / 4)`` of the prompt (input) and of its answer's JSON
  (output), and takes ``latency_s + latency_per_ktoken_s * input_tokens / 1000`` to answer.

Every model call appends one line to a meter file (what the provider would bill) before it
answers, so calls whose answer a SIGKILL lost are counted too; then it tells the parent (a
``call`` event with this process's count), which times its SIGKILLs by these events.

Crash durability ``zincir``: the run is found by its role in the database and resumed with plain
``open_run(db, run_id)`` (the dead owner's lease is taken over at once); an interrupted
verification is decided from the stored candidate; unanswered tool intents run again through
``run.execute`` (``notify`` with a reconciler that looks for its reference in the ledger).
``none``: every process start deletes the database first, so the log does not outlive the process
and a restarted run begins at subtask 0 (the scratch directory and the ledger, the outside world,
keep what was done). Context ``full``: every event of the log; ``fresh``: the goal, the latest
accepted checkpoint and the events after it (``run.state()``). Verification ``none``: every claim
is accepted; ``verifier``: a claim is accepted only if every subtask it claims has a measured
artifact (``zincir.artifacts.identify``, taken by the agent loop, not the model) whose SHA-256 is
that of the expected content and that is unchanged (``artifacts.mismatches``).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

import zincir
from zincir import CheckpointState, EventType, Verification, artifacts

from ..harness.child import Channel

ROLE = "horizon-agent"


# -- the task and its deterministic checker -----------------------------------------------------


def task_name(i: int) -> str:
    return f"task-{i:03d}"


def task_index(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def expected_content(seed: int, i: int) -> str:
    return hashlib.sha256(f"horizon:{seed}:{i}".encode()).hexdigest()[:16]


def task_file(scratch: Path, i: int) -> Path:
    return scratch / f"{task_name(i)}.txt"


def goal_text(seed: int, n: int) -> str:
    return (
        f"There are {n} subtasks, task-000 to {task_name(n - 1)}. For subtask i, write the file"
        f" task-<i>.txt containing the first 16 hex digits of sha256('horizon:{seed}:<i>'), register"
        " it, notify the reviewer once, and submit a checkpoint that claims it. Do them in order."
    )


def check(scratch: Path, seed: int, n: int) -> list[int]:
    """The subtasks whose file exists with exactly the expected content."""
    good = []
    for i in range(n):
        try:
            if task_file(scratch, i).read_text() == expected_content(seed, i):
                good.append(i)
        except FileNotFoundError:
            pass
    return good


# -- the ledger: the outside world ----------------------------------------------------------------


def ledger_lines(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def ledger_append(path: Path, entry: dict[str, Any]) -> None:
    with path.open("a") as out:  # one write of one line: a SIGKILL leaves it whole or absent
        out.write(json.dumps(entry, sort_keys=True) + "\n")


def ledger_counts(path: Path) -> dict[str, int]:
    """Duplicated effects: notify lines beyond one per task; and register lines that repeat the
    key's previous digest (the keyed upsert writes a line only when the digest changes)."""
    notify: dict[str, int] = {}
    last: dict[str, str] = {}
    register_lines = register_duplicates = 0
    for entry in ledger_lines(path):
        if entry["op"] == "notify":
            notify[entry["task"]] = notify.get(entry["task"], 0) + 1
        elif entry["op"] == "register":
            register_lines += 1
            register_duplicates += last.get(entry["key"]) == entry["sha256"]
            last[entry["key"]] = entry["sha256"]
    return {
        "notify_lines": sum(notify.values()),
        "notify_duplicates": sum(c - 1 for c in notify.values()),
        "register_lines": register_lines,
        "register_duplicates": register_duplicates,
    }


# -- the scripted model ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelParams:
    p_false: float = 0.05
    err_base: float = 0.01
    err_per_ktoken: float = 0.01
    err_max: float = 0.5
    latency_s: float = 0.005
    latency_per_ktoken_s: float = 0.001

    def error_rate(self, tokens: int) -> float:
        return min(self.err_max, self.err_base + self.err_per_ktoken * tokens / 1000)


def count_tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def render_event(e: zincir.Event) -> str:
    """One event as the model reads it: its kind and what it says (no ids, paths or clocks)."""
    p = e.payload
    body: Any
    if e.type is EventType.LLM_CALL:
        body = {"content": p["content"], "tool_calls": p["tool_calls"]}
    elif e.type is EventType.TOOL_CALL:
        body = {"call_id": p["call_id"], "name": p["name"], "args": p["args"]}
    elif e.type is EventType.TOOL_RESULT:
        body = {"call_id": p["call_id"], "content": p["content"]}
    elif e.type is EventType.CHECKPOINT_PROPOSED:
        body = {
            "round": p["round"],
            "completed": p["state"]["completed"],
            "remaining": p["state"]["remaining"],
        }
    elif e.type in (EventType.CHECKPOINT_ACCEPTED, EventType.CHECKPOINT_REJECTED):
        body = {"verification": p["verification"]}
    else:
        body = None
    text = f"#{e.seq} {e.type.value}"
    return text if body is None else f"{text} {json.dumps(body, sort_keys=True)}"


@dataclass
class Context:
    """What the model is given: the goal, the accepted progress it can see, and events."""

    goal: str
    n: int
    believed: list[str]  # the completed list of the latest accepted checkpoint in the context
    segment: list[zincir.Event]  # the events after that checkpoint
    events: list[zincir.Event]  # every event in the context
    next_seq: int  # the seq the next event will get (names call ids uniquely in the run)
    checkpoint_text: str = ""

    def prompt(self) -> str:
        lines = [f"GOAL: {self.goal}"]
        if self.checkpoint_text:
            lines.append(self.checkpoint_text)
        lines += [render_event(e) for e in self.events]
        return "\n".join(lines)


async def full_context(run: zincir.Run, goal: str, n: int) -> Context:
    """Every recorded event; the model finds the latest accepted checkpoint in them."""
    events = await run.database.events(run.id)
    proposed = {e.payload["checkpoint_id"]: e for e in events if e.type is EventType.CHECKPOINT_PROPOSED}
    believed: list[str] = []
    start = 0
    for k, e in enumerate(events):
        if e.type is EventType.CHECKPOINT_ACCEPTED:
            believed = list(proposed[e.payload["checkpoint_id"]].payload["state"]["completed"])
            start = k + 2  # after its decision and the tool result answering the claim
    return Context(goal, n, believed, events[start:], events, events[-1].seq + 1)


async def fresh_context(run: zincir.Run, goal: str, n: int) -> Context:
    """The goal, the latest accepted checkpoint and the events after it: ``run.state()``."""
    state = await run.state()
    believed: list[str] = []
    text = "CHECKPOINT: none yet"
    next_seq = state.events[-1].seq + 1 if state.events else 0
    if state.checkpoint is not None:
        believed = list(state.checkpoint.state.completed)
        summary = {"completed": believed, "remaining": state.checkpoint.state.remaining}
        text = f"CHECKPOINT (accepted): {json.dumps(summary, sort_keys=True)}"
        if not state.events:
            assert state.checkpoint.decision_event_seq is not None
            next_seq = state.checkpoint.decision_event_seq + 2
    return Context(goal, n, believed, state.events, state.events, next_seq, text)


@dataclass
class Answer:
    content: str
    calls: list[zincir.ToolCall]
    kind: str  # work | work-wrong | claim | false-claim
    task: str
    input_tokens: int
    output_tokens: int


def respond(seed: int, params: ModelParams, ctx: Context) -> Answer:
    """The scripted model: a deterministic function of (seed, the context)."""
    prompt = ctx.prompt()
    digest = hashlib.sha256(f"{seed}\n{prompt}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    u_false, u_err, position = rng.random(), rng.random(), rng.randrange(16)
    done = set(ctx.believed)
    todo = [task_name(i) for i in range(ctx.n) if task_name(i) not in done]
    task = todo[0] if todo else task_name(ctx.n - 1)
    calls_by_id = {e.payload["call_id"]: e.payload for e in ctx.events if e.type is EventType.TOOL_CALL}
    written = False
    for e in ctx.segment:
        if e.type is EventType.TOOL_RESULT:
            call = calls_by_id.get(e.payload["call_id"])
            if call is not None and call["name"] == "write_file" and call["args"]["task"] == task:
                written = True
        elif e.type is EventType.CHECKPOINT_REJECTED:
            written = False
    notified = any(c["name"] == "notify" and c["args"]["task"] == task for c in calls_by_id.values())
    tokens = count_tokens(prompt)

    def call_id(k: int) -> str:
        return f"c{ctx.next_seq}-{k}"

    if written or u_false < params.p_false:
        claimed = sorted(done | {task})
        remaining = [t for t in todo if t != task]
        calls = [
            zincir.ToolCall(
                call_id(0), zincir.SUBMIT_CHECKPOINT, {"completed": claimed, "remaining": remaining}
            )
        ]
        content = f"{task} is done; submitting a checkpoint."
        kind = "claim" if written else "false-claim"
    else:
        text = expected_content(seed, task_index(task))
        wrong = u_err < params.error_rate(tokens)
        if wrong:  # one digit off: the kind of slip a long context invites
            text = text[:position] + format((int(text[position], 16) + 1) % 16, "x") + text[position + 1 :]
        calls = [
            zincir.ToolCall(call_id(0), "write_file", {"task": task, "content": text}),
            zincir.ToolCall(call_id(1), "register", {"task": task}),
        ]
        if not notified:
            calls.append(zincir.ToolCall(call_id(2), "notify", {"task": task}))
        content = f"Working on {task}."
        kind = "work-wrong" if wrong else "work"
    answer_json = json.dumps(
        {"content": content, "tool_calls": [{"id": c.id, "name": c.name, "args": c.args} for c in calls]},
        sort_keys=True,
    )
    return Answer(content, calls, kind, task, tokens, count_tokens(answer_json))


# -- the agent ------------------------------------------------------------------------------------


class Agent:
    def __init__(self, args: dict[str, Any]) -> None:
        self.seed = int(args["seed"])
        self.n = int(args["n"])
        self.durability: str = args["durability"]
        self.context: str = args["context"]
        self.verification: str = args["verification"]
        self.scratch = Path(args["scratch"])
        self.ledger = Path(args["ledger"])
        self.meter = Path(args["meter"])
        self.db = Path(args["db"])
        self.params = ModelParams(**args.get("model", {}))
        self.max_calls = int(args.get("max_calls", 10 * self.n))
        self.goal = goal_text(self.seed, self.n)
        self.run_id = ""
        self.calls = 0  # model calls made by this process
        self.channel: Channel | None = None

    # the tools: real effects in the scratch directory and the ledger

    async def write_file(self, pending: zincir.PendingToolCall) -> Any:
        args = pending.call.args
        path = self.scratch / f"{args['task']}.txt"
        await trio.Path(path).write_text(args["content"])
        return {"ok": True, "task": args["task"], "bytes": len(args["content"])}

    async def register(self, pending: zincir.PendingToolCall) -> Any:
        """Idempotent by key: an upsert keyed by the task; the same digest again writes nothing."""
        task = pending.call.args["task"]
        try:
            data = await trio.Path(self.scratch / f"{task}.txt").read_bytes()
        except FileNotFoundError:
            return {"ok": False, "task": task, "error": "no such file"}
        digest = hashlib.sha256(data).hexdigest()
        lines = await trio.to_thread.run_sync(ledger_lines, self.ledger)
        latest = [e["sha256"] for e in lines if e["op"] == "register" and e["key"] == task]
        if not latest or latest[-1] != digest:
            entry = {"op": "register", "key": task, "sha256": digest}
            await trio.to_thread.run_sync(ledger_append, self.ledger, entry)
        return {"ok": True, "task": task}

    def _reference(self, pending: zincir.PendingToolCall) -> str:
        return f"{self.run_id}:{pending.idempotency_key}"

    async def notify(self, pending: zincir.PendingToolCall) -> Any:
        """Not idempotent: every call appends a line (the reference is there only to look for)."""
        entry = {"op": "notify", "task": pending.call.args["task"], "ref": self._reference(pending)}
        await trio.to_thread.run_sync(ledger_append, self.ledger, entry)
        return {"ok": True, "notified": pending.call.args["task"]}

    async def find_notification(self, pending: zincir.PendingToolCall) -> Any:
        """The reconciler: did this call's line land before the crash?"""
        lines = await trio.to_thread.run_sync(ledger_lines, self.ledger)
        if any(e["op"] == "notify" and e["ref"] == self._reference(pending) for e in lines):
            return {"ok": True, "notified": pending.call.args["task"], "found_by": "reconcile"}
        return None

    # the verification policies

    async def accept_claim(self, state: CheckpointState) -> Verification:
        return Verification(True, {"policy": "accept the claim"})

    async def verify_claim(self, state: CheckpointState) -> Verification:
        """Independent of the model: the measured artifacts against the task's specification."""
        measured = {a["path"]: a for a in state.artifacts}
        changed = {a.path for a in await artifacts.mismatches(state.artifacts)}
        failed = []
        for name in state.completed:
            path = str(task_file(self.scratch, task_index(name)))
            want = hashlib.sha256(expected_content(self.seed, task_index(name)).encode()).hexdigest()
            found = measured.get(path)
            if found is None or found["kind"] != "file" or found["sha256"] != want or path in changed:
                failed.append(name)
        return Verification(not failed, {"failed": failed, "checked": len(state.completed)})

    async def claimed_state(self, args: dict[str, Any]) -> CheckpointState:
        """The model's claim, with the artifacts the loop measured (the model measures nothing)."""
        measured = [
            (await artifacts.identify(task_file(self.scratch, task_index(name)))).to_json()
            for name in args["completed"]
        ]
        return CheckpointState(completed=args["completed"], remaining=args["remaining"], artifacts=measured)

    # the loop

    async def model(self, ctx: Context) -> Answer:
        answer = respond(self.seed, self.params, ctx)
        await trio.sleep(
            self.params.latency_s + self.params.latency_per_ktoken_s * answer.input_tokens / 1000
        )
        entry = {
            "in": answer.input_tokens,
            "out": answer.output_tokens,
            "kind": answer.kind,
            "task": answer.task,
        }
        await trio.to_thread.run_sync(ledger_append, self.meter, entry)  # billed before it answers
        self.calls += 1
        if self.channel is not None:  # the parent times its SIGKILLs by these
            self.channel.emit("call", n=self.calls)
        return answer

    def finished(self, checkpoint: zincir.Checkpoint | None) -> bool:
        return checkpoint is not None and checkpoint.status == "accepted" and not checkpoint.state.remaining

    async def drive(self, run: zincir.Run) -> str:
        verify = self.verify_claim if self.verification == "verifier" else self.accept_claim
        if self.finished((await run.state()).checkpoint):
            await run.complete()
            return "completed"
        candidate = await run.pending_checkpoint()
        if candidate is not None and self.finished(await run.verify_checkpoint(candidate, verify)):
            await run.complete()
            return "completed"
        tools = {"write_file": self.write_file, "register": self.register, "notify": self.notify}
        while True:
            for pending in await run.pending_tools():
                if pending.call.name == zincir.SUBMIT_CHECKPOINT:
                    state = await self.claimed_state(pending.call.args)
                    if self.finished(await run.checkpoint(pending.call.id, state, verify)):
                        await run.complete()
                        return "completed"
                else:
                    probe = self.find_notification if pending.call.name == "notify" else None
                    await run.execute(pending, tools[pending.call.name], reconcile=probe)
            if self.context == "full":
                ctx = await full_context(run, self.goal, self.n)
            else:
                ctx = await fresh_context(run, self.goal, self.n)
            answer = await self.model(ctx)
            usage = {"input_tokens": answer.input_tokens, "output_tokens": answer.output_tokens}
            try:
                await run.record_response(answer.content, answer.calls, "tool_use", usage=usage)
            except zincir.BudgetExceeded:
                await run.fail(f"no end after {self.max_calls} model calls")
                return "gave up"

    async def main(self, ch: Channel) -> None:
        ch.emit("ready")
        go = await trio.to_thread.run_sync(ch.next_command)
        if not go:  # the parent closed stdin: not needed
            return
        ch.emit("go")
        self.channel = ch
        if self.durability == "none":  # the log does not outlive its process
            for suffix in ("", "-wal", "-shm", "-journal"):
                await trio.Path(f"{self.db}{suffix}").unlink(missing_ok=True)
        async with zincir.open_database(self.db) as db:
            found = await db.runs(role=ROLE)
            run_id = found[-1].id if found else None
            if found and found[-1].status in (zincir.RunStatus.COMPLETED, zincir.RunStatus.FAILED):
                outcome = found[-1].status.value
            else:
                budget = zincir.Budget(model_calls=self.max_calls)
                async with zincir.open_run(
                    db, run_id, role=ROLE, provider="scripted", config={"goal": self.goal}, budget=budget
                ) as run:
                    self.run_id = run.id
                    ch.emit("started", run_id=run.id, resumed=run_id is not None)
                    outcome = await self.drive(run)
                run_id = run.id
            assert run_id is not None
            state = await db.state(run_id)
            believed = list(state.checkpoint.state.completed) if state.checkpoint is not None else []
        ch.emit("done", outcome=outcome, believed=believed)


def child(channel: Channel, args: dict[str, Any]) -> None:
    """The agent's process (``bench/harness/child.py``): ready, then the run once told to go."""
    trio.run(Agent(args).main, channel)
