"""A small durable agent: one file-writing tool, a verified checkpoint, and crash recovery.

Run it:                      .venv/bin/python examples/durable_agent.py
Resume after a crash:        ZINCIR_RESUME=1 .venv/bin/python examples/durable_agent.py
Crash-test it:               .venv/bin/zincir crash-test examples.durable_agent:handler

The "model" is scripted so the demo runs offline; a real one (see openai_agent.py) plugs
into the same loop. Every model response, tool intent and tool result is recorded by zincir;
the file tool is idempotent, so a tool re-run after a crash never writes twice; progress
counts once a verifier checked the file's content.

Environment:
  ZINCIR_DATABASE_PATH   database file, or a postgresql:// URL (default zincir.db)
  ZINCIR_OUTPUT_DIR      where the tool writes (default output)
  ZINCIR_RESUME=1        resume every pending or running demo run instead of creating one. This
                         fences the previous owner (force=True): only do it once you know
                         that process is dead.
  ZINCIR_SLEEP_S         a durable cool-down (seconds) between the tool and the checkpoint
  ZINCIR_PAUSE_BEFORE_TOOL_MS, ZINCIR_PAUSE_AFTER_TOOL_MS, ZINCIR_PAUSE_IN_VERIFY_MS,
  ZINCIR_PAUSE_AFTER_CHECKPOINT_MS
                         pauses at the crash boundaries that scripts/crash_kill_resume.sh kills at
                         (they pause on the resume path too, wherever it passes the boundary)
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import trio

import zincir
from zincir import CheckpointState, Verification, artifacts
from zincir.testing import effect_ledger

GOAL = "Write hello to the file."
ROLE = "example-agent"


async def pause(boundary: str) -> None:
    milliseconds = int(os.environ.get(f"ZINCIR_PAUSE_{boundary}_MS", "0"))
    if milliseconds:
        print(f"pausing {milliseconds} ms at {boundary.lower()}", flush=True)
        await trio.sleep(milliseconds / 1000)


# -- the tool ------------------------------------------------------------------------------------


def publish_once(out: Path, call_id: str, content: Any, effect_key: str | None = None) -> dict[str, Any]:
    """Write ``<out>/<call_id>.json`` exactly once: temp file, fsync, then a hard link, which
    fails if another attempt published first (then that attempt's content wins). The link is the
    effect: a crash test's ledger counts it (``effect_key``; a no-op outside a crash test)."""
    final = out / f"{call_id}.json"
    temp = out / f".{call_id}.{uuid.uuid4().hex}.tmp"
    with temp.open("w") as f:
        json.dump({"content": content, "ok": True}, f)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(temp, final)
        if effect_key is not None:
            effect_ledger().record_sync(effect_key)
        directory = os.open(out, os.O_RDONLY)
        try:
            os.fsync(directory)  # the new name itself must survive power loss
        finally:
            os.close(directory)
    except FileExistsError:
        pass
    finally:
        temp.unlink()
    result: dict[str, Any] = json.loads(final.read_text())
    return result


def remove_leftovers(out: Path, call_id: str) -> None:
    for temp in out.glob(f".{call_id}.*.tmp"):
        temp.unlink(missing_ok=True)


def read_published(out: Path, call_id: str) -> dict[str, Any] | None:
    try:
        result: dict[str, Any] = json.loads((out / f"{call_id}.json").read_text())
    except FileNotFoundError:
        return None
    return result


async def write_file(
    out: Path, call_id: str, args: dict[str, Any], effect_key: str | None = None
) -> dict[str, Any]:
    """The idempotent tool: its idempotency key is the call id, which names the file."""
    existing = await trio.to_thread.run_sync(read_published, out, call_id)
    if existing is not None:
        return existing
    # A crash between creating a temp file and publishing it leaves the temp file behind.
    # Only the lease holder runs this call id, so any leftover is a dead attempt's.
    await trio.to_thread.run_sync(remove_leftovers, out, call_id)
    await pause("BEFORE_TOOL")
    result = await trio.to_thread.run_sync(publish_once, out, call_id, args.get("content"), effect_key)
    await pause("AFTER_TOOL")
    return result


# -- the verifier --------------------------------------------------------------------------------


async def verify(state: CheckpointState) -> Verification:
    """Accept only if every artifact still has the content that was measured, and no work
    is left."""
    await pause("IN_VERIFY")
    changed = await artifacts.mismatches(state.artifacts)
    passed = not changed and not state.remaining and bool(state.artifacts)
    return Verification(passed, {"changed": [a.path for a in changed], "remaining": state.remaining})


# -- the scripted model --------------------------------------------------------------------------


def next_response(events: list[zincir.Event]) -> tuple[str, list[zincir.ToolCall]]:
    """What the model says next, given the log: write the file, then submit a checkpoint.

    Call ids are unique per response, so a rejected checkpoint's retry cannot collide.
    """
    responses = sum(e.type == zincir.EventType.LLM_CALL for e in events)
    call_id = f"call_{responses + 1}"
    if not write_calls(events, with_result=True):
        return "I'll write the file.", [zincir.ToolCall(call_id, "write_file", {"content": "hello"})]
    return "The file is written; submitting a checkpoint.", [
        zincir.ToolCall(call_id, zincir.SUBMIT_CHECKPOINT, {})
    ]


def write_calls(events: list[zincir.Event], *, with_result: bool) -> list[str]:
    calls = [
        e.payload["call_id"]
        for e in events
        if e.type == zincir.EventType.TOOL_CALL and e.payload["name"] == "write_file"
    ]
    if not with_result:
        return calls
    answered = {e.payload["call_id"] for e in events if e.type == zincir.EventType.TOOL_RESULT}
    return [c for c in calls if c in answered]


async def checkpoint_state(events: list[zincir.Event], out: Path) -> CheckpointState:
    """The state the agent claims: what it did, and the measured identity of what it wrote."""
    files = [out / f"{call_id}.json" for call_id in write_calls(events, with_result=True)]
    return CheckpointState(
        completed=["Wrote the requested file"],
        remaining=[],
        artifacts=[(await artifacts.identify(path)).to_json() for path in files],
        evidence=["write_file returned ok"],
    )


# -- the durable loop ----------------------------------------------------------------------------


async def finish_if_done(run: zincir.Run, checkpoint: zincir.Checkpoint | None) -> bool:
    if checkpoint is not None and checkpoint.status == "accepted" and not checkpoint.state.remaining:
        await pause("AFTER_CHECKPOINT")
        await run.complete()
        return True
    return False


async def drive(run: zincir.Run, out: Path) -> None:
    """Continue the run from whatever its log says, until it completes."""
    if await finish_if_done(run, (await run.state()).checkpoint):
        return
    candidate = await run.pending_checkpoint()
    # A crash interrupted a verification: decide the stored candidate now.
    if candidate is not None and await finish_if_done(run, await run.verify_checkpoint(candidate, verify)):
        return
    for _ in range(10):  # a bound on model rounds, as any real loop should have
        for pending in await run.pending_tools():  # intents whose results never got recorded
            call = pending.call
            if call.name == "write_file":
                result = await write_file(out, call.id, call.args, pending.effect_key)
                await run.record_tool_result(call.id, result)
            elif call.name == zincir.SUBMIT_CHECKPOINT and pending.response_tool_count == 1:
                await run.sleep("cool-down", float(os.environ.get("ZINCIR_SLEEP_S", "0")))
                events = (await run.state()).events
                decided = await run.checkpoint(call.id, await checkpoint_state(events, out), verify)
                if await finish_if_done(run, decided):
                    return
        content, calls = next_response((await run.state()).events)
        await run.record_response(content, calls, "tool_use", usage={"input_tokens": 0, "output_tokens": 0})
    await run.fail("no accepted checkpoint after 10 model rounds")


async def handler(run: zincir.Run) -> None:
    """The same loop as a worker handler (``zincir worker``, ``zincir crash-test``); it writes to
    ZINCIR_OUTPUT_DIR (default: output, in the working directory)."""
    out = await trio.Path(os.environ.get("ZINCIR_OUTPUT_DIR", "output")).absolute()
    await out.mkdir(parents=True, exist_ok=True)
    await drive(run, Path(out))


def print_run(state: zincir.DurableState, all_events: list[zincir.Event]) -> None:
    run = state.run
    print(f"run {run.id}  status={run.status.value}  role={run.role}  goal={run.config.get('goal')!r}")
    for event in all_events:
        payload = json.dumps(event.payload, sort_keys=True)
        print(f"  #{event.seq:<3} {event.type.value:<20} {payload[:90]}{'…' if len(payload) > 90 else ''}")


async def in_flight(db: zincir.Database, role: str) -> list[str]:
    """The ids of the unfinished runs with ``role``: only this program's runs, since other
    applications may share the database file."""
    runs = [
        run
        for status in ("running", "pending", "waiting")
        for run in await db.runs(status=status, role=role, limit=100_000)
    ]
    return [run.id for run in runs]


async def main(db_path: str, out: Path) -> None:
    async with zincir.open_database(db_path) as db:
        run_ids: list[str | None] = [None]  # None: start a new run
        if os.environ.get("ZINCIR_RESUME"):
            run_ids = list(await in_flight(db, ROLE))
            print(f"resuming {len(run_ids)} run(s)", flush=True)
        for run_id in run_ids:
            async with zincir.open_run(
                db,
                run_id,
                role=ROLE,
                provider="scripted-model",
                config={"goal": GOAL},
                force=run_id is not None,  # resuming: the previous owner is known to be dead
            ) as run:
                print(f"run {run.id} (epoch {run.epoch})", flush=True)
                await drive(run, out)
            print_run(await db.state(run.id), await db.events(run.id))


if __name__ == "__main__":
    # Absolute, so that the artifact paths in checkpoints hold from any working directory.
    output = Path(os.environ.get("ZINCIR_OUTPUT_DIR", "output")).absolute()
    output.mkdir(parents=True, exist_ok=True)
    trio.run(main, os.environ.get("ZINCIR_DATABASE_PATH", "zincir.db"), output)
