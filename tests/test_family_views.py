"""A family as zincir tree, zincir cancel, zincir show and the inspector show it, on both backends."""

from __future__ import annotations

import json

import trio

import zincir

from .helpers import scalar, until
from .test_suspension import working
from .test_waiting_views import cli, page


async def three_generations(db: zincir.Database) -> tuple[str, list[str], str]:
    """A root with two children (one completed); the other has a pending grandchild."""
    async with zincir.open_run(db, role="root") as root:
        first = await root.spawn("first", role="researcher")
        # Children are listed oldest first, and two made in the same millisecond by id: let the
        # database's clock pass the first one's creation, so that the second is listed second.
        created = scalar(db, "SELECT created_at FROM agent_runs WHERE id = ?", (first,))
        assert isinstance(created, int)
        while db.clock() <= created:
            await trio.sleep(0.001)
        second = await root.spawn("second", role="coder")
    async with zincir.open_run(db, first) as run:
        await run.complete(result="ok")
    async with zincir.open_run(db, second) as run:
        grandchild = await run.spawn("sub", role="tester")
    return root.id, [first, second], grandchild


async def test_tree_prints_the_family_with_statuses(db: zincir.Database) -> None:
    root, (first, second), grandchild = await three_generations(db)
    shown = cli("tree", root, "--db", db.path)
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines() == [
        f"{root}  running  root",
        f"├─ {first}  completed  researcher",
        f"└─ {second}  running  coder",
        f"   └─ {grandchild}  pending  tester",
    ]
    from_below = cli("tree", grandchild, "--db", db.path, "--depth", "1")
    assert from_below.stdout.splitlines() == [
        f"{root}  running  root  (ancestor)",
        f"{second}  running  coder  (ancestor)",
        f"{grandchild}  pending  tester",
    ]
    narrow = cli("tree", root, "--db", db.path, "--width", "1", "--depth", "1")
    assert narrow.stdout.splitlines()[1:] == [f"├─ {first}  completed  researcher", "└─ … 1 more"]


async def test_cancel_from_the_shell_cancels_the_family(db: zincir.Database) -> None:
    root, (first, second), grandchild = await three_generations(db)
    cancelled = await trio.to_thread.run_sync(cli, "cancel", root, "--reason", "wrong goal", "--db", db.path)
    assert cancelled.exit_code == 0, cancelled.output
    assert cancelled.stdout.strip() == f"cancelled {root}"
    statuses = [(await db.state(r)).run.status.value for r in (root, first, second, grandchild)]
    assert statuses == ["cancelled", "completed", "cancelled", "cancelled"]
    refused = await trio.to_thread.run_sync(cli, "cancel", first, "--reason", "late", "--db", db.path)
    assert refused.exit_code == 1 and "already completed" in refused.stderr


async def test_a_parent_waiting_for_a_child_says_so(db: zincir.Database) -> None:
    async with zincir.open_run(db, role="lead") as lead:
        pass

    async def handler(run: zincir.Run) -> None:
        if (await run.state()).run.role == "lead":
            await run.join(await run.spawn("kid", role="kid"))
        else:
            await run.wait_for_signal("never", "never")

    async with working(db, handler, suspend_after=0, max_concurrency=2):
        await until(lambda: _waiting_for_child(db, lead.id))
    [kid] = [r.id for r in await db.runs(role="kid")]
    data = json.loads(cli("show", "--db", db.path, lead.id, "--json").stdout)
    assert [(a["kind"], a["name"]) for a in data["awaiting"]] == [("child", kid)]
    listed = cli("runs", "--db", db.path, "--status", "waiting")
    assert f"child run {kid}" in listed.stdout
    detail = await page(db, f"/runs/{lead.id}")
    assert f'href="/runs/{kid}"' in detail


async def _waiting_for_child(db: zincir.Database, run_id: str) -> bool:
    return (await db.state(run_id)).run.status is zincir.RunStatus.WAITING and bool(
        [e for e in await db.events(run_id) if e.payload.get("waiting_for", {}).get("kind") == "child"]
    )


async def test_the_inspector_nests_grandchildren_under_their_parents(db: zincir.Database) -> None:
    root, (_, second), grandchild = await three_generations(db)
    detail = await page(db, f"/runs/{root}")
    family = detail[detail.index('id="family"') :]
    family = family[: family.index("</section>")]
    assert family.index(second) < family.index(grandchild)
    assert family.count('<ul class="children">') == 2  # the children, and the grandchild under its parent
    below = await page(db, f"/runs/{grandchild}")
    assert "&rarr;" in below and f'href="/runs/{root}"' in below  # the chain of ancestors
