"""PostgreSQL faults: connections the server drops, a killed listener, a server restart.

Real servers, real connections: backends are ended with ``pg_terminate_backend`` or by
restarting the server (an immediate stop, like a crash), never by mocking psycopg.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import trio
import trio.testing

import zincir
from zincir._errors import TransientConflict
from zincir._threads import submit

from .postgres_server import restartable_server
from .test_database import Gate


@pytest.fixture
async def pg_db(pg_url: str) -> AsyncIterator[zincir.Database]:
    async with zincir.open_database(pg_url) as db:
        yield db


def terminate(url: str, application_name: str) -> int:
    """End every backend of this database whose application_name starts with the given one."""
    with psycopg.connect(url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE %s AND pid <> pg_backend_pid()",
            (application_name + "%",),
        ).fetchall()
    return len(rows)


async def wait_for_backend(url: str, application_name: str) -> None:
    """Wait (bounded) until a backend with that application_name is connected again."""
    with trio.fail_after(15):
        while True:
            with psycopg.connect(url, autocommit=True) as admin:
                (count,) = admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name = %s",
                    (application_name,),
                ).fetchone() or (0,)
            if count:
                return
            await trio.sleep(0.05)  # another process's state: there is no event to await


async def noop() -> None:
    return None


async def test_writes_after_the_server_dropped_idle_connections_reconnect(
    pg_db: zincir.Database, pg_url: str
) -> None:
    async with zincir.open_run(pg_db, lease_ttl=5) as run:
        await run.step("before", noop)
        assert terminate(pg_url, "zincir ") >= 2  # the writer this run uses and the reader, at least
        # Nothing was in flight: the next operations open new connections and succeed.
        await run.step("after", noop)
        assert [e.seq for e in (await run.state()).events] == [0]
        await run.complete()
    assert (await pg_db.state(run.id)).run.status is zincir.RunStatus.COMPLETED


async def test_a_write_whose_connection_dies_in_flight_is_an_error_never_a_false_success(
    pg_db: zincir.Database, pg_url: str
) -> None:
    async with zincir.open_run(pg_db, lease_ttl=5) as run:
        killed = trio.Event()

        def dies_mid_operation(tx: object, lease: object, *args: object) -> None:
            terminate(pg_url, "zincir writer")  # this very connection, inside the transaction
            killed.set()
            tx.one("SELECT 1")  # type: ignore[attr-defined]

        with pytest.raises(zincir.DatabaseUnavailable, match="connection"):
            await pg_db._write(dies_mid_operation, run._lease, route=run.id)
        assert killed.is_set()
        # The run goes on over a new connection; nothing of the failed operation was written.
        assert await run.record_response("still the owner", [], "end") == 1
        await run.complete()


async def test_a_group_commit_whose_connection_dies_after_its_commit_is_unknown_never_run_again(
    pg_db: zincir.Database, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two writes share a transaction; its COMMIT reaches the server and commits, then the
    # connection dies before the answers are read. zincir cannot know that it committed: both
    # writes get DatabaseUnavailable, and neither runs again (that would apply it twice).
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("CREATE TABLE probe (n INT)")
    route = "probe"
    session: Any = pg_db._writers[hash(route) % len(pg_db._writers)]._session
    settle = session.settle
    inserted: list[int] = []
    ended: list[int] = []

    def the_commit_lands_then_the_connection_dies(**kwargs: Any) -> None:
        # The inserts' COMMIT (not the gate's), sent and not yet answered.
        if not ended and inserted and session._commit_sent:
            conn = session._conn
            ended.append(conn.info.backend_pid)
            conn.pgconn.flush()  # the COMMIT is on its way
            with psycopg.connect(pg_url, autocommit=True) as admin:
                while admin.execute("SELECT count(*) FROM probe").fetchone() != (2,):
                    time.sleep(0.005)  # another process's commit: there is no event to await
                admin.execute("SELECT pg_terminate_backend(%s)", (ended[0],))
                while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (ended[0],)).fetchone():
                    time.sleep(0.005)
        settle(**kwargs)  # reading the answers meets the dead connection

    monkeypatch.setattr(session, "settle", the_commit_lands_then_the_connection_dies)

    def insert(tx: Any, n: int) -> None:
        tx.execute("INSERT INTO probe VALUES (%s)", (n,))
        tx.wake(claimable=True)
        inserted.append(n)

    gate = Gate()
    outcomes: list[str] = []

    async def write(n: int) -> None:
        try:
            await pg_db._write(insert, n, route=route)
            outcomes.append("committed")
        except zincir.DatabaseUnavailable as exc:
            outcomes.append("unknown" if "whether it committed is unknown" in str(exc) else str(exc))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(pg_db._write, gate.pause, route=route))
        await gate.wait_entered()
        nursery.start_soon(write, 1)
        nursery.start_soon(write, 2)
        await trio.testing.wait_all_tasks_blocked()  # both queued behind the gate: one batch
        gate.opened.set()
    assert ended and outcomes == ["unknown", "unknown"]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        assert admin.execute("SELECT n FROM probe ORDER BY n").fetchall() == [(1,), (2,)]
    await pg_db._write(insert, 3, route=route)  # a new connection, and on it goes


async def test_the_heartbeat_rides_out_a_short_outage(pg_db: zincir.Database, pg_url: str) -> None:
    async with zincir.open_run(pg_db, lease_ttl=0.9) as run:  # renews every 0.3 s
        for _ in range(5):
            terminate(pg_url, "zincir writer")
            await trio.sleep(0.3)
        assert run._lifecycle.lost is None
        assert await run.record_response("still the owner", [], "end") == 1
        await run.complete()


async def test_a_killed_listener_reconnects_and_wakes_workers_again(pg_url: str) -> None:
    handled: list[str] = []
    wake = trio.Event()

    async def handler(run: zincir.Run) -> None:
        handled.append(run.id)
        await run.complete()
        wake.set()

    async def release_one_elsewhere() -> str:
        # Another Database (as another machine would): only NOTIFY can reach the worker's.
        async with zincir.open_database(pg_url) as other, zincir.open_run(other) as run:
            return run.id

    async with zincir.open_database(pg_url) as db, trio.open_nursery() as nursery:
        # A poll far longer than the test: only a notification can make the worker claim.
        worker = zincir.ResumeWorker(db, handler, poll_interval=600)
        await nursery.start(worker.run)
        await wait_for_backend(pg_url, "zincir listener")
        for round_ in range(2):
            wake = trio.Event()
            released = await release_one_elsewhere()
            with trio.fail_after(10):
                await wake.wait()
            assert handled[-1] == released
            if round_ == 0:
                assert terminate(pg_url, "zincir listener") == 1
                await wait_for_backend(pg_url, "zincir listener")
        worker.stop()
    assert len(handled) == 2


async def test_a_server_restart_during_a_workers_life_loses_no_run() -> None:
    with restartable_server() as (url, restart):
        async with zincir.open_database(url) as setup:
            ids = []
            for _ in range(20):
                async with zincir.open_run(setup) as run:
                    ids.append(run.id)
        done: set[str] = set()
        halfway = trio.Event()

        async def handler(run: zincir.Run) -> None:
            await run.step("work", trio.sleep, 0.05)
            await run.complete()
            done.add(run.id)
            if len(done) == 5:
                halfway.set()

        async with zincir.open_database(url) as db, trio.open_nursery() as nursery:
            worker = zincir.ResumeWorker(
                db, handler, lease_ttl=2, poll_interval=0.2, max_concurrency=4,
                backoff=zincir.Backoff(initial=0.1, maximum=0.5),
            )  # fmt: skip
            await nursery.start(worker.run)
            with trio.fail_after(20):
                await halfway.wait()
            await trio.to_thread.run_sync(restart)
            with trio.fail_after(60):
                while len(done) < len(ids):
                    await trio.sleep(0.1)  # the worker's progress; there is no event to await
            worker.stop()
            records = await db.runs(limit=100)
        assert sorted(done) == sorted(ids)
        assert all(r.status is zincir.RunStatus.COMPLETED for r in records)
        for run_id in ids:  # each ended exactly once
            async with zincir.open_database(url) as check:
                events = await check.events(run_id)
            ends = [
                e
                for e in events
                if e.type is zincir.EventType.STATE_TRANSITION and e.payload["to"] == "completed"
            ]
            assert len(ends) == 1


async def test_a_deadlock_fails_only_its_victim_and_keeps_the_connections(pg_url: str) -> None:
    # Two writers' batches lock two runs in opposite order: PostgreSQL aborts one statement.
    # A victim alone in its transaction gets DatabaseBusy. A victim in a group commit rolls its
    # batch back, which runs again with a savepoint each: the victim, with its partner gone,
    # then gets its locks. Either way the batch neighbour commits, and neither writer's
    # connection is thrown away (a deadlock is not a lost connection). Each holds its first
    # lock before either asks for its second: a deadlock, every time (on a first try: an
    # operation run again would find no partner at the barrier).
    both_hold_one = threading.Barrier(2, timeout=10)
    tried: set[str] = set()
    deadlocked: list[str] = []

    def lock_both(tx: Any, first: str, second: str) -> None:
        # zincir's own operations never wait for a row (the writers' lock_timeout is short);
        # this one waits, long enough for the server to find the deadlock.
        tx.execute("SET LOCAL lock_timeout = '10s'")
        tx.one("SELECT 1 FROM agent_runs WHERE id = %s FOR NO KEY UPDATE", (first,))
        if first not in tried:
            tried.add(first)
            both_hold_one.wait()
        try:
            tx.one("SELECT 1 FROM agent_runs WHERE id = %s FOR NO KEY UPDATE", (second,))
        except Exception:
            deadlocked.append(first)
            raise

    def backend_pid(tx: Any) -> int:
        return int(tx.one("SELECT pg_backend_pid()")[0])

    async with zincir.open_database(pg_url, writers=2) as db:
        first, second = db._writers
        ids = []
        for _ in range(3):
            async with zincir.open_run(db, lease_ttl=60) as run:
                ids.append(run.id)
        async with zincir.open_run(db, ids[2], lease_ttl=60) as neighbour:
            pids_before = [await submit(w, backend_pid, ()) for w in (first, second)]
            outcomes: dict[str, object] = {}

            async def put(name: str, thread: Any, fn: Any, *args: Any) -> None:
                try:
                    outcomes[name] = await submit(thread, fn, args)
                except zincir.ZincirError as exc:
                    outcomes[name] = exc

            gates = {first: Gate(), second: Gate()}
            async with trio.open_nursery() as nursery:
                for thread, gate in gates.items():  # hold both threads ...
                    nursery.start_soon(put, "pause", thread, gate.pause)
                    await gate.wait_entered()
                nursery.start_soon(
                    put, "step", first, db._store.complete_step, neighbour._lease, "s", '"x"', 0
                )
                nursery.start_soon(put, "a", first, lock_both, ids[0], ids[1])
                nursery.start_soon(put, "b", second, lock_both, ids[1], ids[0])
                await trio.testing.wait_all_tasks_blocked()  # ... until all three are queued:
                for gate in gates.values():  # the step and "a" are then one batch
                    gate.opened.set()
            assert len(deadlocked) == 1
            if deadlocked == [ids[1]]:  # "b", alone: the error is its answer
                assert isinstance(outcomes["b"], zincir.DatabaseBusy) and "deadlock" in str(outcomes["b"])
                assert outcomes["a"] is None
            else:  # "a", in the batch with the step: run again, it got both locks
                assert outcomes["a"] is None and outcomes["b"] is None
            assert outcomes["step"] == '"x"'
            assert [await submit(w, backend_pid, ()) for w in (first, second)] == pids_before
            assert await neighbour.step("s", noop) == "x"  # committed, so it does not run again
            await neighbour.complete()


async def test_a_busy_descendant_does_not_keep_a_claim_from_other_due_runs(
    pg_db: zincir.Database, pg_url: str
) -> None:
    import psycopg

    # A run whose dead owner left a cancellation request, with a child its owner is writing now.
    async with zincir.open_run(pg_db, lease_ttl=30) as parent:
        child = await parent.spawn("kid")
    async with zincir.open_run(pg_db) as other:
        pass
    with psycopg.connect(pg_url) as conn:
        conn.execute("UPDATE agent_runs SET cancel_requested_at = 1, cancel_reason = 'stop' WHERE id = %s",
                     (parent.id,))  # fmt: skip
        conn.execute("UPDATE agent_runs SET next_attempt_at = NULL WHERE id = %s", (child,))  # not due
        conn.commit()
        conn.execute("SELECT 1 FROM agent_runs WHERE id = %s FOR NO KEY UPDATE", (child,))  # held
        claimed = await pg_db._write(pg_db._store.claim_due, "probe", 30_000, None, 8)
        # The parent waits for its child's row; the unrelated due run is claimed all the same.
        assert [lease.run_id for lease, _ in claimed.leased] == [other.id]
        conn.rollback()
    claimed = await pg_db._write(pg_db._store.claim_due, "probe", 30_000, None, 8)
    assert claimed.leased == []  # the parent was cancelled this time, with its child
    assert (await pg_db.state(parent.id)).run.status is zincir.RunStatus.CANCELLED
    assert (await pg_db.state(child)).run.status is zincir.RunStatus.CANCELLED


async def test_a_row_held_by_another_session_costs_no_other_run_its_lease(pg_url: str) -> None:
    # Another session holds one run's row (FOR UPDATE) for more than two TTLs, and another's for a
    # moment. Before, an operation of the run waited for the row (up to the 10 s lock_timeout)
    # inside its writer's group commit, and the renewals of every other run on that writer waited
    # behind it: their leases expired. Now the held run's operations fail at once and are tried
    # again alone: the briefly held run's write goes through once the row is free, the long-held
    # run loses its own lease, and no other run loses anything.
    ttl = 2.0
    hold_long, hold_short = 2.5 * ttl, 0.3  # time is the thing tested: how long a row is held

    async def noop() -> None:
        return None

    async with zincir.open_database(pg_url, writers=2) as db:
        writer_of = {}  # run id -> the writer its operations go to (by id, as Database._write routes)
        while True:
            async with zincir.open_run(db) as run:
                writer_of[run.id] = hash(run.id) % 2
            if len(writer_of) < 2:
                continue
            held_long, held_short, *others = writer_of
            beside = [o for o in others if writer_of[o] == writer_of[held_long]]
            if len(others) >= 12 and len(beside) >= 4 and len(others) - len(beside) >= 4:
                break  # unrelated runs on the held run's writer, and on the other one
        outcomes: dict[str, Any] = {}
        owning = trio.Semaphore(0)
        row_held, long_hold_over = trio.Event(), trio.Event()

        async def own(run_id: str) -> None:
            try:
                async with zincir.open_run(db, run_id, lease_ttl=ttl) as run:
                    owning.release()
                    if run_id in (held_long, held_short):
                        await row_held.wait()
                        await run.step("under the lock", noop)  # tried again until the row is free
                        outcomes[run_id] = "wrote"
                    await long_hold_over.wait()
                    await run.record_response("still the owner", [], "end")
                    await run.complete()
                outcomes[run_id] = "kept"
            except zincir.LeaseLost as exc:
                outcomes[run_id] = exc

        with psycopg.connect(pg_url) as long_holder, psycopg.connect(pg_url) as short_holder:
            async with trio.open_nursery() as nursery:
                for run_id in writer_of:
                    nursery.start_soon(own, run_id)
                for _ in writer_of:
                    await owning.acquire()  # every lease taken
                for holder, run_id in ((long_holder, held_long), (short_holder, held_short)):
                    holder.execute("SELECT 1 FROM agent_runs WHERE id = %s FOR UPDATE", (run_id,))
                row_held.set()
                await trio.sleep(hold_short)
                short_holder.rollback()
                await trio.sleep(hold_long - hold_short)
                long_holder.rollback()
                long_hold_over.set()
    assert {run_id: outcomes[run_id] for run_id in others} == dict.fromkeys(others, "kept")
    assert outcomes[held_short] == "kept"  # its write went through once the row was free
    assert stored_steps(pg_url, held_short) == ["under the lock"]
    lost = outcomes[held_long]
    assert isinstance(lost, zincir.LeaseLost) and "no renewal was confirmed" in str(lost)
    # Said as it was: the server answered every renewal, with a refusal for the lock held.
    assert "another transaction held a lock on the run's row" in str(lost)
    assert "did not answer" not in str(lost)
    assert stored_steps(pg_url, held_long) == []


def stored_steps(url: str, run_id: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as admin:
        return [name for (name,) in admin.execute("SELECT name FROM steps WHERE run_id = %s", (run_id,))]


def tcp_settings(tx: Any) -> dict[str, int]:
    """The kernel's TCP settings of the connection an operation runs on (on its thread)."""
    with socket.socket(fileno=os.dup(tx._session._conn.fileno())) as sock:
        return {
            "keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            "idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            "user_timeout_ms": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        }


async def test_connections_notice_a_dead_peer_by_keepalives_and_a_user_timeout(pg_url: str) -> None:
    # A stopped server process is still answered for by its kernel; a dead host or a cut network
    # is not, and without these a read waits for the kernel's own (hours-long) give-up.
    expected = {"keepalive": 1, "idle": 10, "interval": 5, "count": 3, "user_timeout_ms": 30_000}
    async with zincir.open_database(pg_url) as db:
        for thread in (*db._writers, db._reader):
            assert await submit(thread, tcp_settings, ()) == expected
    # A URL that chooses its own keeps it.
    async with zincir.open_database(pg_url + "?keepalives_idle=42&tcp_user_timeout=9000") as db:
        own = await submit(db._writers[0], tcp_settings, ())
    assert own == {**expected, "idle": 42, "user_timeout_ms": 9000}


def lock_timeout_lifted(tx: Any, operation: Any, *args: Any) -> Any:
    """``operation``, in a transaction without the writers' lock_timeout: it must stop waiting
    for a row by itself (NOWAIT), not by that bound, which holds up its whole batch meanwhile."""
    tx.execute("SET LOCAL lock_timeout = 0")
    return operation(tx, *args)


async def while_the_approval_row_is_held(url: str, run_id: str, write: Any) -> object:
    """What ``write()`` returns or raises while another session holds the approval row of
    ``run_id``'s call "c1"; a write still waiting after 10 s has the row let go, and then ends."""
    outcome: list[object] = []
    ended = trio.Event()

    async def attempt() -> None:
        try:
            outcome.append(await write())
        except zincir.ZincirError as exc:
            outcome.append(exc)
        ended.set()

    with psycopg.connect(url) as holder:
        holder.execute("SELECT 1 FROM approvals WHERE run_id = %s AND call_id = 'c1' FOR UPDATE", (run_id,))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(attempt)
            # 10 s only bounds a write that waits for the row (the test's failure); one that
            # refuses to wait ends within milliseconds.
            with trio.move_on_after(10):
                await ended.wait()
            holder.rollback()
    return outcome[0]


async def test_an_approval_row_held_elsewhere_is_a_transient_conflict_at_once(
    pg_db: zincir.Database, pg_url: str
) -> None:
    # The owner's look at its approval and an outsider's decision lock the approval row; like
    # every row lock of a writer, that lock must not wait for another session (it would hold up
    # the writer's group commit, the renewals of other runs in it included): it fails at once,
    # TransientConflict, which both callers try again, and nothing is written.
    store = pg_db._store
    async with zincir.open_run(pg_db) as run:
        await run.record_response(
            "Refund?", [zincir.ToolCall("c1", "send_refund", {"amount": 1})], "tool_use"
        )
        requested = await pg_db._write(store.await_approval, run._lease, "c1", None, route=run.id)
        assert requested.state == "pending"
        before = await pg_db.events(run.id)
        writes = {
            "decide_approval": (store.decide_approval, run.id, "c1", True, "ada", "ok", None),
            "await_approval": (store.await_approval, run._lease, "c1", None),
        }
        for name, operation in writes.items():
            write = functools.partial(pg_db._write, lock_timeout_lifted, *operation, route=run.id)
            outcome = await while_the_approval_row_is_held(pg_url, run.id, write)
            assert isinstance(outcome, TransientConflict), (name, outcome)
        assert await pg_db.events(run.id) == before
        # With the row free again, the decision goes through, and the owner sees it.
        await zincir.decide_approval(pg_db, run.id, "c1", approved=True, by="ada")
        decided = await pg_db._write(store.await_approval, run._lease, "c1", None, route=run.id)
        assert decided.state == "decided" and decided.approval.approved is True
