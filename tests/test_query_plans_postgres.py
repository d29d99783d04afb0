"""Reads that recovery needs cost O(what they return) on PostgreSQL too: pinned by its plans.

The counterpart of test_query_plans.py (SQLite). One big run of ~29,000 events (tool calls,
checkpoint rounds, received signals, steps) among 5,000 other runs in every state is written
by zincir and, for volume, by COPY in zincir's own row format; then VACUUM ANALYZE (as
autovacuum would). Each store operation then runs for real, and every statement it sends is
first EXPLAINed on the same connection, in the same transaction, with the same parameters.
No plan may scan a zincir table sequentially or sort. On PostgreSQL 16 and later the generic
plan of each statement is checked too (on a connection of its own: a zincir connection is in
pipeline mode, which cannot send a statement with placeholders and no values): psycopg
prepares a statement after its fifth execution, and the server may then run it with a
generic plan.
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg
import pytest
import trio

import zincir
from tests.helpers import a_dead_pid
from tests.postgres_server import fresh_database
from zincir._owner import this_process
from zincir._postgres._pipe import Pending
from zincir._postgres._store import finish_runs
from zincir._postgres._tx import Tx
from zincir._store import Claims, NewChild, WaitOutcome, _leases
from zincir._store._ends import cancel_descendants
from zincir._store._leases import _dead_owners_here, _take_from_the_dead
from zincir._store._prune import PruneSpec, _candidates

BIG_TURNS = 10_000  # about 29,000 events in the big run
OTHER_RUNS = 5_000
STEP_COUNT = 300  # the big run's completed steps, of ~9,300
# zincir's tables: none may be read by a sequential scan on a recovery path.
TABLES = frozenset({"agent_runs", "events", "tool_intents", "checkpoints", "steps", "signals", "waits"})
STATE = zincir.CheckpointState(completed=["parse"], remaining=["write"])
VERIFIED = {"evidence": None, "passed": True}


def _json(value: object) -> str:
    """Compact JSON with sorted keys, as zincir stores it."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


# --------------------------------------------------------------------------- bulk history


@attrs.define
class _Bulk:
    """Rows for COPY, in zincir's format: every event its projection rows point at."""

    now: int
    ids: dict[str, Iterator[int]]
    rows: dict[str, list[tuple[Any, ...]]] = attrs.Factory(dict)

    def add(self, table: str, *row: Any) -> None:
        self.rows.setdefault(table, []).append(row)

    def next_id(self, table: str) -> int:
        return next(self.ids[table])


@attrs.define
class _Log:
    """One run's log, appended after ``seq`` (its last seq), and the rows that project it."""

    bulk: _Bulk
    run_id: str
    seq: int

    def event(self, type: str, payload: object, key: str | None = None) -> int:
        self.seq += 1
        self.bulk.add("events", self.run_id, self.seq, type, _json(payload), key, self.bulk.now)
        return self.seq

    def response(self, calls: list[tuple[str, str, dict[str, Any]]]) -> list[int]:
        """An llm_call and its tool_call intents; the intents' seqs."""
        tool_calls = [{"args": args, "id": cid, "name": name} for cid, name, args in calls]
        self.event("llm_call", {"content": "", "stop_reason": "tool_use", "tool_calls": tool_calls})
        seqs = []
        for cid, name, args in calls:
            payload = {"args": args, "call_id": cid, "name": name, "response_tool_count": len(calls)}
            seqs.append(self.event("tool_call", payload, f"tool_call:{cid}"))
        return seqs

    def tool_turn(self, call_id: str, answered: bool = True) -> None:
        [intent_seq] = self.response([(call_id, "search", {"q": call_id})])
        result_seq = None
        if answered:
            payload = {"call_id": call_id, "content": {"hits": [call_id]}}
            result_seq = self.event("tool_result", payload, f"tool_result:{call_id}")
        self.bulk.add(
            "tool_intents", self.run_id, call_id, "search", intent_seq, intent_seq - 1, 1, result_seq
        )

    def checkpoint_round(self, round: int, accepted: bool) -> None:
        call_id = f"cp-{round}"
        [intent_seq] = self.response([(call_id, zincir.SUBMIT_CHECKPOINT, STATE.to_json())])
        checkpoint_id = self.bulk.next_id("checkpoints")
        proposed = {"checkpoint_id": checkpoint_id, "round": round, "state": STATE.to_json()}
        proposed_seq = self.event("checkpoint_proposed", proposed, f"checkpoint:{checkpoint_id}:proposed")
        status = "accepted" if accepted else "rejected"
        verification = VERIFIED if accepted else {"evidence": "not yet", "passed": False}
        decision = {"checkpoint_id": checkpoint_id, "verification": verification}
        decision_seq = self.event(f"checkpoint_{status}", decision, f"checkpoint:{checkpoint_id}:{status}")
        content = {"accepted": accepted, "verification": verification}
        result_seq = self.event(
            "tool_result",
            {"call_id": call_id, "content": content},
            f"checkpoint:{checkpoint_id}:tool_result",
        )
        self.bulk.add(
            "tool_intents",
            self.run_id,
            call_id,
            zincir.SUBMIT_CHECKPOINT,
            intent_seq,
            intent_seq - 1,
            1,
            result_seq,
        )
        self.bulk.add(
            "checkpoints",
            checkpoint_id,
            self.run_id,
            round,
            call_id,
            proposed_seq - 1,
            decision_seq,
            status,
            _json(STATE.to_json()),
            _json(verification),
            self.bulk.now,
            self.bulk.now,
        )

    def signal(self, topic: str, payload: object, consumed_by: str | None = None) -> None:
        """A signal in the inbox; with ``consumed_by``, received by that wait and logged."""
        signal_id = self.bulk.next_id("signals")
        now = self.bulk.now
        consumed_at = None if consumed_by is None else now
        self.bulk.add(
            "signals", signal_id, self.run_id, topic, _json(payload), None, now, consumed_by, consumed_at
        )
        if consumed_by is not None:
            self.bulk.add("waits", self.run_id, consumed_by, "signal", topic, None, now, now, signal_id, 0)
            event = {"name": consumed_by, "payload": payload, "signal": topic, "signal_id": signal_id}
            self.event("signal_received", event, f"wait:{consumed_by}")

    def step(self, name: str, epoch: int = 1) -> None:
        self.bulk.add(
            "steps",
            self.run_id,
            name,
            "completed",
            epoch,
            _json({"step": name}),
            self.bulk.now,
            self.bulk.now,
        )


_COLUMNS = {
    "agent_runs": "id, role, provider, status, config, created_at, updated_at, last_seq, lease_owner,"
    " lease_epoch, lease_expires_at, attempts, next_attempt_at",
    "events": "run_id, seq, type, payload, idempotency_key, created_at",
    "tool_intents": "run_id, call_id, name, intent_seq, response_seq, response_tool_count, result_seq",
    "checkpoints": "id, run_id, round, tool_call_id, based_on_event_seq, decision_event_seq, status,"
    " state, verification, created_at, decided_at",
    "steps": "run_id, name, status, epoch, result, started_at, completed_at",
    "signals": "id, run_id, topic, payload, key, created_at, consumed_by, consumed_at",
    "waits": "run_id, name, kind, topic, deadline, created_at, completed_at, signal_id, timed_out",
}


def _bulk_history(url: str, big_id: str) -> None:
    """Append the big run's long history, and write the other runs, in one transaction."""
    with psycopg.connect(url) as conn:
        (now,) = conn.execute("SELECT zincir_now_ms()").fetchone() or (0,)
        first: dict[str, Iterator[int]] = {}
        for table in ("checkpoints", "signals"):
            (top,) = conn.execute(f"SELECT coalesce(max(id), 0) FROM {table}").fetchone() or (0,)
            first[table] = itertools.count(int(top) + 1)
        (last_seq,) = conn.execute(
            "SELECT last_seq FROM agent_runs WHERE id = %s FOR NO KEY UPDATE", (big_id,)
        ).fetchone() or (0,)
        bulk = _Bulk(int(now), first)

        big = _Log(bulk, big_id, int(last_seq))
        rounds = itertools.count(1)
        for turn in range(BIG_TURNS):
            if turn % 50 == 49:
                round = next(rounds)
                big.checkpoint_round(round, accepted=round % 5 == 0)
            elif turn % 10 == 9:
                big.signal("go", {"turn": turn}, consumed_by=f"wait-{turn}")
            else:
                big.tool_turn(f"call-{turn}")
        for n in range(STEP_COUNT):
            big.step(f"step-{n}")

        for n in range(OTHER_RUNS):
            run_id = str(uuid.UUID(int=n + 1, version=4))
            # 70% finished; 10% pending; 10% running, released; 10% running, leased elsewhere.
            kind = "completed" if n % 10 < 7 else ("pending", "released", "leased")[n % 10 - 7]
            created = bulk.now - 3_600_000 + n
            log = _Log(bulk, run_id, -1)
            if kind != "pending":
                log.event("state_transition", {"from": "pending", "to": "running"})
                for t in range(2):
                    log.tool_turn(f"call-{t}")
                log.checkpoint_round(1, accepted=True)
                log.signal("go", {"n": n}, consumed_by="first")
                log.step("fetch")
                log.step("parse")
            if kind == "completed":
                log.event("state_transition", {"from": "running", "to": "completed"})
            elif kind != "pending":
                log.tool_turn("call-open", answered=False)
                log.signal("go", {"n": n, "again": True})
            status = {"completed": "completed", "pending": "pending"}.get(kind, "running")
            owner, expires = ("elsewhere", bulk.now + 3_600_000) if kind == "leased" else (None, None)
            epoch = 0 if kind == "pending" else 1
            bulk.add(
                "agent_runs",
                run_id,
                "bulk",
                "",
                status,
                "{}",
                created,
                created,
                log.seq,
                owner,
                epoch,
                expires,
                epoch,
                created,  # due long ago: claimed before the big run, released just now
            )

        for table in ("agent_runs", "events", "tool_intents", "checkpoints", "steps", "signals", "waits"):
            with conn.cursor().copy(f"COPY {table} ({_COLUMNS[table]}) FROM STDIN") as copy:
                for row in bulk.rows.get(table, []):
                    copy.write_row(row)
        for table in ("checkpoints", "signals"):
            conn.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"
            )
        conn.execute(
            "UPDATE agent_runs SET last_seq = %s, updated_at = %s WHERE id = %s", (big.seq, bulk.now, big_id)
        )


async def _accept(state: zincir.CheckpointState) -> zincir.Verification:
    return zincir.Verification(passed=True, evidence=None)


async def _fetch() -> dict[str, int]:
    return {"rows": 3}


@attrs.frozen
class Populated:
    url: str
    big: str
    tail: int  # how many events durable_state returns after the last accepted checkpoint


async def _populate(url: str) -> Populated:
    async with zincir.open_database(url) as db:
        async with zincir.open_run(db, role="big") as big:
            await big.record_response("start", [{"id": "first", "name": "search"}], "tool_use")
            await big.record_tool_result("first", "ok")
            await trio.to_thread.run_sync(_bulk_history, url, big.id)
            # The last accepted checkpoint, then a short tail: what recovery must read.
            await big.record_response("", [{"id": "cp-last", "name": zincir.SUBMIT_CHECKPOINT}], "tool_use")
            checkpoint = await big.checkpoint("cp-last", STATE, _accept)
            await big.step("after-checkpoint", _fetch)
            await big.record_response(
                "two", [{"id": "open-1", "name": "a"}, {"id": "open-2", "name": "b"}], "x"
            )
            await big.record_tool_result("open-1", "done")  # open-2 stays pending
            tail = (await big.state()).events
            assert checkpoint.decision_event_seq is not None
            assert [e.seq for e in tail] == list(range(checkpoint.decision_event_seq + 2, tail[-1].seq + 1))
        # The big run is left running and released; a signal waits in its inbox, behind the
        # ~1,000 it already received on that topic.
        await zincir.send_signal(db, big.id, "other", "not this one")
        await zincir.send_signal(db, big.id, "go", {"next": True})
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("VACUUM ANALYZE")  # as autovacuum keeps the append-only tables
        (events,) = admin.execute("SELECT count(*) FROM events WHERE run_id = %s", (big.id,)).fetchone() or (
            0,
        )
    assert events > 25_000
    return Populated(url, big.id, len(tail))


@pytest.fixture(scope="module")
def populated(postgres_admin_url: str) -> Iterator[Populated]:
    """One database for the module: writing it takes seconds; the tests only add a little."""
    with fresh_database(postgres_admin_url) as url:
        yield trio.run(_populate, url)


# --------------------------------------------------------------------------- plans


@attrs.frozen
class Plan:
    sql: str
    params: tuple[Any, ...]
    plan: dict[str, Any]  # the custom plan, for these parameters
    generic: dict[str, Any] | None  # the generic plan (PostgreSQL 16+), for a prepared statement

    def __str__(self) -> str:
        shown = {"custom": self.plan, "generic": self.generic}
        return f"{self.sql}\n  params {self.params!r}\n{json.dumps(shown, indent=1)}"


def _placeholders(sql: str) -> str:
    """psycopg's %s placeholders as the server's $1, $2, ... (what a prepared statement holds)."""
    numbers = itertools.count(1)
    return re.sub(r"%[s%]", lambda m: f"${next(numbers)}" if m.group() == "%s" else "%", sql)


class PlanTx(Tx):
    """A Tx that EXPLAINs each statement with its parameters, then runs it as the store does."""

    def __init__(self, tx: Tx, plans: list[Plan], generic: psycopg.Connection[Any] | None) -> None:
        super().__init__(tx._session, read_only=tx._read_only)
        self._now = tx._now
        self.plans = plans
        self._generic = generic if generic is not None and generic.info.server_version >= 160000 else None

    def _explain(self, sql: str, params: Any) -> None:
        assert isinstance(params, tuple), (sql, params)
        [(custom,)] = self._session.send(f"EXPLAIN (FORMAT JSON) {sql}", params, prepare=False).all()
        generic = None
        if self._generic is not None and params:
            explain = f"EXPLAIN (GENERIC_PLAN, FORMAT JSON) {_placeholders(sql)}"
            [(generic,)] = self._generic.execute(explain, prepare=False).fetchall()
        self.plans.append(Plan(sql, params, _top(custom), None if generic is None else _top(generic)))

    def _send(self, sql: str, params: Any) -> Pending:  # every statement of an operation leaves here
        text, args = self._rendered(sql, params)
        self._explain(text, tuple(args))
        return self._session.send(text, args)


def _top(explained: Any) -> dict[str, Any]:
    if isinstance(explained, str):
        explained = json.loads(explained)
    plan: dict[str, Any] = explained[0]["Plan"]
    return plan


async def plans_of(db: zincir.Database, fn: Any, *args: Any, write: bool = False) -> tuple[Any, list[Plan]]:
    """Run store operation ``fn`` (a read, or a write in the group commit) and its statements' plans."""

    def run(tx: Tx) -> tuple[Any, list[Plan]]:
        plans: list[Plan] = []
        with psycopg.connect(db.path, autocommit=True) as generic:
            planned = PlanTx(tx, plans, generic)
            result = fn(planned, *args)
            planned.close()  # a fence not read yet is judged
            return result, plans

    result: tuple[Any, list[Plan]] = await (db._write if write else db._read)(run)
    return result


def _nodes(plan: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
    if plan is not None:
        yield plan
        for child in plan.get("Plans", ()):
            yield from _nodes(child)


def _both(plan: Plan) -> Iterator[dict[str, Any]]:
    yield from _nodes(plan.plan)
    yield from _nodes(plan.generic)


def assert_indexed(plans: list[Plan]) -> None:
    """No plan, custom or generic, scans a zincir table sequentially or sorts."""
    assert plans
    for plan in plans:
        for node in _both(plan):
            kind = node["Node Type"]
            assert not (kind == "Seq Scan" and node.get("Relation Name") in TABLES), f"scans:\n{plan}"
            assert kind not in ("Sort", "Incremental Sort"), f"sorts:\n{plan}"


def the(plans: list[Plan], fragment: str) -> Plan:
    [found] = [plan for plan in plans if fragment in plan.sql]
    return found


def uses_index(plan: Plan, index: str) -> bool:
    """Both plans (the generic one where there is one) read through ``index``."""
    tops = [plan.plan] if plan.generic is None else [plan.plan, plan.generic]
    return all(any(node.get("Index Name") == index for node in _nodes(top)) for top in tops)


def seeks(plan: Plan, index: str, condition: str) -> bool:
    """Both plans (the generic one where there is one) read ``index`` once, with ``condition``
    in its index condition."""
    tops = [plan.plan] if plan.generic is None else [plan.plan, plan.generic]
    scans = [[node for node in _nodes(top) if node.get("Index Name") == index] for top in tops]
    return all(len(found) == 1 and condition in found[0].get("Index Cond", "") for found in scans)


# --------------------------------------------------------------------------- the reads


async def test_state_after_a_checkpoint_reads_by_index(populated: Populated) -> None:
    async with zincir.open_database(populated.url) as db:
        (run, checkpoint, events), plans = await plans_of(db, db._store.durable_state, populated.big)
    assert checkpoint is not None and checkpoint.tool_call_id == "cp-last"
    assert run.id == populated.big and len(events) == populated.tail
    assert_indexed(plans)
    assert uses_index(the(plans, "FROM agent_runs"), "agent_runs_pkey")
    # The newest accepted round of ~40 accepted and ~160 rejected ones: the index, backwards.
    assert uses_index(the(plans, "FROM checkpoints"), "idx_checkpoints_status")
    # The events after the checkpoint are a range of the (run_id, seq) key, not the whole log.
    after = the(plans, "FROM events")
    assert uses_index(after, "events_run_id_seq_key")
    [scan] = [node for node in _nodes(after.plan) if node.get("Index Name") == "events_run_id_seq_key"]
    assert "seq >" in scan["Index Cond"], after


async def test_pending_tools_read_by_index(populated: Populated) -> None:
    async with zincir.open_database(populated.url) as db, zincir.open_run(db, populated.big) as run:
        pending, plans = await plans_of(db, db._store.pending_tools, run._lease)
    assert [json.loads(payload)["call_id"] for payload, *_ in pending] == ["open-2"]
    assert_indexed(plans)
    # Only the intents without a result are visited (the partial index), not ~9,000 answered ones.
    join = the(plans, "FROM tool_intents")
    assert uses_index(join, "idx_tool_intents_pending"), join
    assert uses_index(join, "events_run_id_seq_key"), join


async def test_steps_read_by_index(populated: Populated) -> None:
    async with zincir.open_database(populated.url) as db:
        names, listed = await plans_of(db, db._store.completed_step_names, populated.big)
        result, looked_up = await plans_of(db, db._store.step_result, populated.big, "step-123")
    assert len(names) == STEP_COUNT + 1 and json.loads(result) == {"step": "step-123"}
    assert_indexed(listed + looked_up)
    assert uses_index(the(looked_up, "FROM steps"), "steps_pkey")


async def test_the_oldest_unconsumed_signal_is_found_by_index(populated: Populated) -> None:
    async with zincir.open_database(populated.url) as db, zincir.open_run(db, populated.big) as run:
        outcome, plans = await plans_of(
            db, db._store.await_signal, run._lease, "next", "go", None, write=True
        )
    assert outcome == WaitOutcome.received('{"next":true}')
    assert_indexed(plans)
    # Past the ~1,000 signals of "go" it already received, by the partial index, oldest first.
    lookup = the(plans, "FROM signals WHERE run_id = %s AND topic = %s AND consumed_by IS NULL")
    assert uses_index(lookup, "idx_signals_unconsumed"), lookup


async def test_claiming_reads_by_index(populated: Populated) -> None:
    async with zincir.open_database(populated.url) as db:
        claimed, plans = await plans_of(db, db._store.claim_due, "probe", 30_000, None, 8, write=True)
    assert len(claimed.leased) == 8 and populated.big not in [lease.run_id for lease, _ in claimed.leased]
    assert_indexed(plans)
    # ~1,000 claimable runs of 5,000, the oldest due first, by the claimable index's order.
    [claim] = [plan for plan in plans if "SKIP LOCKED" in plan.sql and "next_attempt_at" in plan.sql]
    assert uses_index(claim, "idx_agent_runs_claimable"), claim
    # Dead owners of this host are looked for among the leases held, not among every run.
    dead = [plan for plan in plans if plan.sql.startswith("SELECT") and "WHERE lease_host" in plan.sql]
    assert dead and all(uses_index(plan, "idx_agent_runs_leased") for plan in dead), dead
    # Taking each lease updates one row by its key.
    for plan in plans:
        if plan.sql.startswith("UPDATE agent_runs"):
            assert uses_index(plan, "agent_runs_pkey"), plan


async def test_suspending_spawning_joining_and_cascading_read_by_index(populated: Populated) -> None:
    async with zincir.open_database(populated.url) as db:
        _, due = await plans_of(db, db._store.next_due_in)
        with pytest.raises(zincir.LeaseLost, match="gone"):  # the last probe suspends the parent
            async with zincir.open_run(db) as parent:
                kids = [await parent.spawn(f"kid-{i}") for i in range(5)]
                again = [NewChild("kid-0", str(uuid.uuid4()), "agent", "", "{}")]
                _, spawn = await plans_of(db, db._store.spawn_children, parent._lease, again, write=True)
                _, join = await plans_of(db, db._store.await_child, parent._lease, kids[0], None, write=True)
                _, joins = await plans_of(db, db._store.join_children, parent._lease, kids[:3], write=True)
                _, ended = await plans_of(db, db._store.ended_children, kids)
                _, cascade = await plans_of(db, cancel_descendants, parent.id, "probe", write=True)
                with trio.move_on_after(0.05):
                    await parent.wait_for_signal("w", "nobody-sends-this")
                _, suspend = await plans_of(
                    db, db._store.suspend, parent._lease, [("signal", "w")], write=True
                )
    reads = [
        plan
        for plan in spawn + join + joins + ended + cascade + suspend
        if plan.sql.lstrip().startswith(("SELECT", "WITH"))
    ]
    assert_indexed(due + reads)
    # Among ~5,000 runs: the next due time is the claimable index's first entry past now, and the
    # family is walked through the parent index.
    assert all(uses_index(p, "idx_agent_runs_claimable") for p in due), due
    walks = [p for p in cascade if "parent_run_id = ANY" in p.sql]  # one statement per level
    assert walks and all(uses_index(p, "idx_agent_runs_parent") for p in walks), walks


async def test_streams_are_written_and_read_by_their_keys(populated: Populated) -> None:
    async with zincir.open_database(populated.url) as db:
        with pytest.raises(zincir.LeaseLost, match="gone"):  # the probe did end the run
            async with zincir.open_run(db) as run:
                for k in range(30):  # 60,000 chunks: a scan of them would show
                    async with run.stream(f"s{k}", flush_interval=60.0, flush_bytes=10**9) as out:
                        for i in range(2_000):
                            await out.send(i)
                with psycopg.connect(populated.url, autocommit=True) as conn:
                    # A finished stream of each of the 5,000 other runs: the attempts are many too.
                    conn.execute(
                        "INSERT INTO streams SELECT id, 'answer', 1, 1, 0, 1, 'closed', 'x', 0, 0"
                        " FROM agent_runs WHERE id <> %s",
                        (run.id,),
                    )
                    conn.execute("ANALYZE streams")
                    conn.execute("ANALYZE stream_chunks")
                _, flush = await plans_of(
                    db, db._store.flush_stream, run._lease, "s7", "probe", ["1"], False, write=True
                )
                page, read = await plans_of(db, db._store.stream_page, run.id, "s7", 1_000, 20)
                _, ended = await plans_of(
                    db, db._store.finish, run._lease, zincir.RunStatus.COMPLETED, "{}", None, write=True
                )
    assert [at for at, _, _ in page.chunks] == list(range(1_001, 1_021))
    assert_indexed(flush + read + ended)
    for plan in flush + read + ended:
        for node in _both(plan):
            assert not (node["Node Type"] == "Seq Scan" and "stream" in node.get("Relation Name", "")), plan
    # The chunks after an offset are a range of their key, not the stream's 2,000 or all 60,000.
    chunks = the(read, "FROM stream_chunks")
    assert uses_index(chunks, "stream_chunks_pkey"), chunks
    [scan] = [node for node in _nodes(chunks.plan) if node.get("Index Name") == "stream_chunks_pkey"]
    assert "chunk_offset >" in scan["Index Cond"], chunks
    assert uses_index(the(flush, "FROM streams"), "streams_pkey")
    assert uses_index(the(ended, "FROM streams"), "streams_pkey")


class _RolledBack(Exception):
    pass


async def rolled_back_plans_of(db: zincir.Database, fn: Any, *args: Any) -> tuple[Any, list[Plan]]:
    """:func:`plans_of` for a write whose effects are undone after: its result and plans."""
    found: list[tuple[Any, list[Plan]]] = []

    def run(tx: Tx) -> None:
        plans: list[Plan] = []
        with psycopg.connect(db.path, autocommit=True) as generic:
            result = fn(PlanTx(tx, plans, generic), *args)
        found.append((result, plans))
        raise _RolledBack

    with pytest.raises(_RolledBack):
        await db._write(run)
    return found[0]


async def test_claiming_by_version_reads_each_versions_range_of_its_index(populated: Populated) -> None:
    with psycopg.connect(populated.url, autocommit=True) as admin:  # the bulk runs in 3 versions and none
        admin.execute(
            "UPDATE agent_runs SET version = (ARRAY['v1', 'v2', 'v3'])[1 + abs(hashtext(id)) % 4]"
            " WHERE role = 'bulk' AND version IS NULL"
        )
        admin.execute("ANALYZE agent_runs")
    async with zincir.open_database(populated.url) as db:
        # A worker's claim (as many as it has room for) of its version, or of the first of its
        # versions that has due runs after one that has none (v9): each a range of the index.
        for versions in (("v2",), ("v9", None), ("v9", "v1")):
            claimed, plans = await rolled_back_plans_of(
                db, db._store.claim_due, "probe", 30_000, None, 8, versions
            )
            assert [lease.version for lease, _ in claimed.leased] == [versions[-1]] * 8
            assert_indexed(plans)
            claims = [plan for plan in plans if "SKIP LOCKED" in plan.sql and "next_attempt_at" in plan.sql]
            assert len(claims) == len(versions)
            for claim in claims:  # each one version's range, in order, bounded by now
                assert uses_index(claim, "idx_agent_runs_version_claimable"), f"{claim}"
                for top in (claim.plan, claim.generic):
                    [scan] = [
                        n for n in _nodes(top) if n.get("Index Name") == "idx_agent_runs_version_claimable"
                    ]
                    assert "version" in scan["Index Cond"] and "next_attempt_at <=" in scan["Index Cond"], (
                        claim
                    )
        _, looked = await plans_of(db, db._store.next_due_in, (None, "v1"))
        assert_indexed(looked)
        assert len(looked) == 2 and all(uses_index(p, "idx_agent_runs_version_claimable") for p in looked)
        skipped, counted = await plans_of(db, db._store.skipped_for_version, ("v1",))
        assert skipped > 0
        assert_indexed(counted)
        assert uses_index(the(counted, "count(*)"), "idx_agent_runs_claimable")


# What a completing run's lease check and open work are read by: its own row, the one-candidate
# index, the pending intents and the parent index.
_OPEN_WORK_INDEXES = (
    "agent_runs_pkey",
    "idx_checkpoints_one_candidate",
    "idx_tool_intents_pending",
    "idx_agent_runs_parent",
)


async def test_ending_a_run_reads_by_index(populated: Populated) -> None:
    parent_id, child_id = str(uuid.uuid4()), str(uuid.uuid4())
    async with zincir.open_database(populated.url) as db:
        parent = await db._write(db._store.create_run, parent_id, None, "agent", "", "{}", "probe", 30_000)
        child = await db._write(db._store.create_run, child_id, parent_id, "agent", "", "{}", "probe", 30_000)
        completed = '{"from":"running","to":"completed"}'
        _, completing = await plans_of(
            db, db._store.finish, child, zincir.RunStatus.COMPLETED, completed, "1", write=True
        )
        failed = '{"from":"running","to":"failed"}'
        _, failing = await plans_of(
            db, db._store.finish, parent, zincir.RunStatus.FAILED, failed, None, write=True
        )
    assert_indexed(completing + failing)
    # The lease and the open work, read in one statement by their indexes, among ~5,000 runs
    # and ~29,000 events.
    [fence] = [
        plan
        for plan in completing
        if "FOR NO KEY UPDATE NOWAIT" in plan.sql and "ARRAY" in plan.sql and "run_waiters" not in plan.sql
    ]
    for index in _OPEN_WORK_INDEXES:
        assert uses_index(fence, index), (index, fence)
    # The end: the run and its parent by their key.
    [end] = [plan for plan in completing if "run_waiters" in plan.sql]
    assert uses_index(end, "agent_runs_pkey"), end


async def test_ending_runs_in_one_batch_probes_each_runs_open_work_by_index(populated: Populated) -> None:
    ids = [str(uuid.uuid4()) for _ in range(3)]
    async with zincir.open_database(populated.url) as db:
        leases = [
            await db._write(db._store.create_run, run_id, None, "agent", "", "{}", "probe", 30_000)
            for run_id in ids
        ]
        completed = '{"from":"running","to":"completed"}'
        calls = [(lease, zincir.RunStatus.COMPLETED, completed, "1") for lease in leases]
        _, plans = await plans_of(db, finish_runs, calls, write=True)
    assert_indexed(plans)
    # Each run's open work by its own index entries, as the end of one run reads it (above).
    [end] = [plan for plan in plans if "run_waiters" in plan.sql]
    for index in _OPEN_WORK_INDEXES:
        assert uses_index(end, index), (index, end)


async def test_a_prune_batch_finds_its_runs_by_a_seek_past_the_cursor(populated: Populated) -> None:
    """~3,500 runs that ended in the same millisecond: the next ten after a cursor among them
    are an index range, not all of them sorted (schema 19)."""
    spec = PruneSpec(("completed",), (2**62, ""), 10)
    with psycopg.connect(populated.url, autocommit=True) as admin:
        ended = admin.execute(
            "SELECT updated_at, id FROM agent_runs WHERE status = 'completed' ORDER BY updated_at, id"
        ).fetchall()
    cursor = (ended[1000][0], ended[1000][1])
    async with zincir.open_database(populated.url) as db:
        (found, exhausted), plans = await plans_of(db, _candidates, spec, cursor)
    assert found == [(row[0], row[1]) for row in ended[1001:1011]] and not exhausted
    assert_indexed(plans)
    [plan] = plans
    assert seeks(plan, "idx_agent_runs_status_activity", "ROW(status, updated_at, id) >"), plan


async def test_the_look_for_dead_owners_passes_over_what_earlier_claims_left(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every claim looks for dead lease holders of its host. Each claim and end of a run leaves
    a row version behind until a vacuum, with an entry in the index of leases held: a look read
    as a bitmap visits every one of them each time, a plain index scan marks them dead as it
    passes and then skips them. A young database (not analyzed yet) made the planner AND a
    bitmap of the host's leases with one of the running runs (schema 19)."""
    async with zincir.open_database(pg_url) as db:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE agent_runs SET (autovacuum_enabled = false)")  # no analyze
            async with zincir.open_run(db) as template:
                pass
            # 3,000 due runs, then each claimed by a worker of this host and ended: two dead
            # versions of each row, one of them in the index of leases held.
            conn.execute(
                "INSERT INTO agent_runs SELECT (jsonb_populate_record(NULL::agent_runs,"
                " to_jsonb(r) || jsonb_build_object('id', gen_random_uuid()::text))).*"
                " FROM agent_runs AS r, generate_series(1, 3000) WHERE r.id = %s",
                (template.id,),
            )
            host, pid, started = this_process().as_row()
            conn.execute(
                "UPDATE agent_runs SET lease_owner = 'gone', lease_host = %s, lease_pid = %s,"
                " lease_process_start = %s, lease_expires_at = zincir_now_ms() + 3600000",
                (host, pid, started),
            )
            conn.execute(
                "UPDATE agent_runs SET status = 'completed', lease_owner = NULL, lease_expires_at = NULL"
            )
            async with zincir.open_run(db):  # one lease held here
                _, [look] = await plans_of(db, _dead_owners_here)
                explain = f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {look.sql}"
                conn.execute(explain, look.params)
                (explained,) = conn.execute(explain, look.params).fetchone() or ()
            # A run still leased by a process of this host that has exited: its leases are read
            # by their holder's key (the look's answer is given: whether they may be taken at
            # once depends on what else runs on this host).
            async with zincir.open_run(db) as held:
                pass
            dead = (a_dead_pid(), 1)
            conn.execute(
                "UPDATE agent_runs SET lease_owner = 'gone', lease_expires_at = zincir_now_ms() + 3600000,"
                " lease_host = %s, lease_pid = %s, lease_process_start = %s WHERE id = %s",
                (host, *dead, held.id),
            )
            monkeypatch.setattr(_leases, "_dead_owners_here", lambda tx: [dead])
            claims = Claims()
            _, taken = await plans_of(db, _take_from_the_dead, "probe", 1000, None, 8, claims, write=True)
    assert [lease.run_id for lease, _ in claims.leased] == [held.id]
    [by_holder] = [plan for plan in taken if plan.sql.startswith("SELECT") and "lease_pid = %s" in plan.sql]
    assert seeks(by_holder, "idx_agent_runs_leased", "lease_pid"), by_holder
    again = explained[0]["Plan"]
    assert again["Actual Rows"] == 1, look
    assert (again["Node Type"], again.get("Index Name")) == ("Index Scan", "idx_agent_runs_leased"), look
    # The index's leaf pages, with the entries marked dead, not the 140 pages of row versions.
    pages = again["Shared Hit Blocks"] + again.get("Shared Read Blocks", 0)
    assert pages <= 20, json.dumps(again, indent=1)
