"""Reads that recovery needs cost O(what they return): pinned by SQLite's query plans.

A plan is deterministic where a timing is not: each hot query must search an index, never
scan a run's whole history.
"""

from __future__ import annotations

import sqlite3

import pytest
import trio

import zincir
from zincir._owner import this_process
from zincir._sqlite._connection import Tx
from zincir._store import Claims, NewChild, _leases, _reads
from zincir._store._ends import cancel_descendants
from zincir._store._leases import _dead_owners_here, _take_from_the_dead
from zincir._store._prune import PruneSpec, _candidates

from .helpers import a_dead_pid


class PlanRecorder:
    """Records the query plan of every statement an operation runs."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.plans: list[tuple[str, list[str]]] = []

    def execute(self, sql: str, params: tuple[object, ...] = ()) -> sqlite3.Cursor:
        if sql.lstrip().upper().startswith(("SELECT", "UPDATE", "WITH")):
            plan = [row[3] for row in self.conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
            self.plans.append((sql, plan))
        return self.conn.execute(sql, params)


async def plans_of(db: zincir.Database, fn: object, *args: object) -> list[tuple[str, list[str]]]:
    def run(tx: Tx) -> list[tuple[str, list[str]]]:
        recorder = PlanRecorder(tx.conn)
        fn(Tx(recorder, tx.now), *args)  # type: ignore[operator,arg-type]
        return recorder.plans

    return await db._write(run)


def assert_indexed(plans: list[tuple[str, list[str]]]) -> None:
    assert plans
    for sql, plan in plans:
        for step in plan:
            assert not step.startswith("SCAN"), f"{sql!r} scans: {plan}"
            assert "TEMP B-TREE" not in step, f"{sql!r} sorts: {plan}"


@pytest.fixture
async def busy_run(db: zincir.Database) -> zincir.Run:
    async def accept(state: zincir.CheckpointState) -> zincir.Verification:
        return zincir.Verification(True, None)

    async with zincir.open_run(db) as run:
        for i in range(20):
            await run.record_response(i, [{"id": f"t{i}", "name": "tool"}], "tool_use")
            await run.record_tool_result(f"t{i}", i)
        await run.record_response("", [{"id": "cp", "name": zincir.SUBMIT_CHECKPOINT}], "x")
        await run.checkpoint("cp", zincir.CheckpointState(), accept)
        await run.record_response("", [{"id": "open", "name": "tool"}], "tool_use")
    return run


@pytest.mark.sqlite_only  # SQLite's EXPLAIN QUERY PLAN
async def test_state_reads_by_index(db: zincir.Database, busy_run: zincir.Run) -> None:
    plans = await plans_of(db, db._store.durable_state, busy_run.id)
    assert_indexed(plans)
    # The events after the checkpoint are a range of the (run_id, seq) index, not the whole run.
    [events] = [plan for sql, plan in plans if "FROM events" in sql]
    assert any("run_id=? AND seq>?" in step for step in events), events


@pytest.mark.sqlite_only
async def test_pending_tools_reads_by_index(db: zincir.Database, busy_run: zincir.Run) -> None:
    async with zincir.open_run(db, busy_run.id) as run:
        plans = await plans_of(db, db._store.pending_tools, run._lease)
    assert_indexed(plans)
    # Only the intents without a result are visited (a partial index), not every intent.
    assert any("idx_tool_intents_pending" in " ".join(plan) for _, plan in plans), plans


@pytest.mark.sqlite_only
async def test_claiming_reads_by_index(db: zincir.Database, busy_run: zincir.Run) -> None:
    plans = await plans_of(db, db._store.claim_due, "probe", 1000, None, 8)
    claim = [plan for sql, plan in plans if "idx_agent_runs_claimable" in sql]
    assert claim
    assert all("USING INDEX idx_agent_runs_claimable" in " ".join(plan) for plan in claim)
    assert_indexed([(sql, plan) for sql, plan in plans if sql.lstrip().startswith("SELECT")])


@pytest.mark.sqlite_only
async def test_suspending_and_the_idle_workers_look_read_by_index(db: zincir.Database) -> None:
    with pytest.raises(zincir.LeaseLost, match="gone"):  # the probe did suspend the run
        async with zincir.open_run(db) as run:
            with trio.move_on_after(0.05):
                await run.wait_for_signal("w", "go")
            plans = await plans_of(db, db._store.suspend, run._lease, [("signal", "w")])
    assert_indexed([(sql, plan) for sql, plan in plans if sql.lstrip().startswith("SELECT")])
    due = await plans_of(db, db._store.next_due_in)
    assert all("USING INDEX idx_agent_runs_claimable" in " ".join(plan) for _, plan in due), due


@pytest.mark.sqlite_only
async def test_family_operations_read_by_index(db: zincir.Database) -> None:
    async with zincir.open_run(db) as root:
        children = [await root.spawn(f"kid-{i}") for i in range(20)]
        for child in children[:5]:
            async with zincir.open_run(db, child) as run:
                await run.spawn("grandkid")
        spawn = await plans_of(
            db, db._store.spawn_children, root._lease, [NewChild("kid-0", "unused", "agent", "", "{}")]
        )
        join = await plans_of(db, db._store.await_child, root._lease, children[0], None)
        joins = await plans_of(db, db._store.join_children, root._lease, children[:3])
        ended = await plans_of(db, db._store.ended_children, children)
        cascade = await plans_of(db, cancel_descendants, root.id, "probe")
    for plans in (spawn, join, joins, ended, cascade):
        assert_indexed([(sql, plan) for sql, plan in plans if sql.lstrip().startswith("SELECT")])
    # The family is walked level by level through the parent index, not by scanning every run.
    assert any("idx_agent_runs_parent" in " ".join(plan) for _, plan in cascade), cascade


@pytest.mark.sqlite_only
async def test_looking_for_dead_owners_of_this_host_reads_only_the_leases_held(
    db: zincir.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(30):
        async with zincir.open_run(db) as run:
            await run.complete()
    async with zincir.open_run(db) as held:
        pass
    # One run still leased by a process of this host that has exited; its leases are read by
    # their holder's key. (Whether they may be taken at once depends on what else runs on this
    # host, which is not this test's business: the look's answer is given.)
    dead = (a_dead_pid(), 1)
    with sqlite3.connect(db.path) as raw:
        raw.execute(
            "UPDATE agent_runs SET lease_owner = 'gone', lease_expires_at = 4102444800000,"
            " lease_host = ?, lease_pid = ?, lease_process_start = ? WHERE id = ?",
            (this_process().host, *dead, held.id),
        )
    async with zincir.open_run(db):
        looked = await plans_of(db, _dead_owners_here)
        monkeypatch.setattr(_leases, "_dead_owners_here", lambda tx: [dead])
        claims = Claims()
        taken = await plans_of(db, _take_from_the_dead, "probe", 1000, None, 8, claims)
    assert [lease.run_id for lease, _ in claims.leased] == [held.id]
    assert_indexed(looked + taken)
    [the_look] = [plan for sql, plan in looked if sql.startswith("SELECT") and "lease_host = ?" in sql]
    assert "USING INDEX idx_agent_runs_leased (lease_host=?)" in " ".join(the_look), looked
    [by_holder] = [plan for sql, plan in taken if sql.startswith("SELECT") and "lease_pid = ?" in sql]
    index = "USING INDEX idx_agent_runs_leased (lease_host=? AND lease_pid=? AND lease_process_start=?)"
    assert index in " ".join(by_holder), taken


@pytest.mark.sqlite_only
async def test_streams_read_and_write_by_key(db: zincir.Database) -> None:
    with pytest.raises(zincir.LeaseLost, match="gone"):  # the probe did end the run
        async with zincir.open_run(db) as run:
            for name in ("answer", "progress"):
                async with run.stream(name, flush_interval=60.0) as out:
                    for i in range(50):
                        await out.send(i)
            flush = await plans_of(db, db._store.flush_stream, run._lease, "answer", "probe", ["1"], False)
            page = await plans_of(db, db._store.stream_page, run.id, "answer", 10, 20)
            ended = await plans_of(db, db._store.finish, run._lease, zincir.RunStatus.COMPLETED, "{}", None)
    for plans in (flush, page, ended):
        assert_indexed([(sql, plan) for sql, plan in plans if sql.lstrip().startswith("SELECT")])
    # The latest attempt is the last entry of the stream's key, not a sort of its attempts; the
    # chunks after an offset are a range of the chunks' key.
    assert any("PRIMARY KEY (run_id=? AND name=?)" in " ".join(p) for s, p in flush if "FROM streams" in s)
    [chunks] = [p for s, p in page if "FROM stream_chunks" in s]
    assert any("run_id=? AND name=? AND chunk_offset>?" in step for step in chunks), chunks
    assert any("FROM streams" in sql for sql, _ in ended)  # the end looks for followers to wake


@pytest.mark.sqlite_only
async def test_claiming_by_version_reads_each_versions_range_of_its_index(db: zincir.Database) -> None:
    for i in range(40):  # due runs of three versions and of none, interleaved
        async with zincir.open_run(db, version=(None, "v1", "v2", "v3")[i % 4]):
            pass
    for versions in (("v2",), (None, "v1")):
        plans = await plans_of(db, db._store.claim_due, "probe", 1000, None, 30, versions)
        claims = [plan for sql, plan in plans if "idx_agent_runs_version_claimable" in sql]
        assert len(claims) == len(versions), plans
        for plan in claims:  # one range per version, in the order claimed (then the wall end's lookup)
            range_of_one_version = (
                "USING INDEX idx_agent_runs_version_claimable (version=? AND next_attempt_at<?)"
            )
            assert plan[0] == f"SEARCH agent_runs {range_of_one_version}", plan
        assert_indexed([(sql, plan) for sql, plan in plans if sql.lstrip().startswith("SELECT")])
    due = await plans_of(db, db._store.next_due_in, (None, "v1"))
    assert len(due) == 2 and all("idx_agent_runs_version_claimable" in " ".join(plan) for _, plan in due), due
    skipped = await plans_of(db, db._store.skipped_for_version, ("v1",))
    assert all("USING INDEX idx_agent_runs_claimable" in " ".join(plan) for _, plan in skipped), skipped


@pytest.mark.sqlite_only
async def test_steps_are_read_and_written_by_their_key_alone(db: zincir.Database) -> None:
    """steps is WITHOUT ROWID (schema 17): its rows are its primary key's b-tree, so a step's
    commit writes one page, and every read of it searches that key (no second lookup by rowid)."""

    async def one() -> int:
        return 1

    async with zincir.open_run(db) as run:
        for i in range(5):
            await run.step(f"s{i}", one)
        plans = await plans_of(db, db._store.step_result, run.id, "s3")
        plans += await plans_of(db, _reads.completed_step_names, run.id)
    assert_indexed(plans)
    assert all(any("USING PRIMARY KEY" in step for step in plan) for _, plan in plans), plans

    def schema(tx: Tx) -> str:
        return str(tx.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'steps'").fetchone()[0])

    assert (await db._write(schema)).rstrip().endswith("WITHOUT ROWID")


@pytest.mark.sqlite_only
async def test_a_prune_batch_finds_its_runs_by_a_seek_past_the_cursor(db: zincir.Database) -> None:
    """Runs that ended in the same millisecond: the next few after a cursor among them are a
    range of the index on (status, updated_at, id), not all of them sorted (schema 19)."""
    for _ in range(30):
        async with zincir.open_run(db) as run:
            await run.complete()

    def end_together(tx: Tx) -> list[tuple[int, str]]:
        tx.conn.execute("UPDATE agent_runs SET updated_at = 1000")
        return list(tx.conn.execute("SELECT updated_at, id FROM agent_runs ORDER BY id"))

    ended = await db._write(end_together)
    spec = PruneSpec(("completed",), (2**62, ""), 5)
    recorder: list[list[tuple[int, str]]] = []

    def candidates(tx: Tx) -> None:
        recorder.append(_candidates(tx, spec, ended[10])[0])

    plans = await plans_of(db, candidates)
    assert recorder == [ended[11:16]]
    assert_indexed(plans)
    [(_, plan)] = plans
    assert plan == [
        "SEARCH agent_runs USING COVERING INDEX idx_agent_runs_status_activity"
        " ((status,updated_at,id)>(?,?,?) AND (status,updated_at,id)<(?,?,?))"
    ], plan
