import os

import trio

import zincir


async def main() -> None:
    async with zincir.open_database("zincir.db") as db:
        resume = os.environ.get("ZINCIR_RESUME")  # continue this program's unfinished runs instead
        run_ids = [r.id for r in await db.runs(status="running", role="quickstart")] if resume else [None]
        for run_id in run_ids:
            async with zincir.open_run(db, run_id, role="quickstart") as run:
                print("run", run.id, flush=True)
                while True:
                    for pending in await run.pending_tools():  # after a crash too: run them again
                        print("tool", pending.call.id, flush=True)
                        await trio.sleep(1)  # your tool, keyed by pending.effect_key
                        await run.record_tool_result(pending.call.id, {"counted": pending.call.args["n"]})
                    events = (await run.state()).events  # the log: build your prompt from it
                    asked = sum(e.type == "tool_call" for e in events)
                    if asked == 3:  # your model says it is done
                        break
                    call = zincir.ToolCall(f"call-{asked}", "count", {"n": asked})  # your model's answer
                    await run.record_response(f"Counting {asked}.", [call], "tool_use")
                await run.complete()


if __name__ == "__main__":
    trio.run(main)
