"""Encryption at rest and erasure (docs/payloads.md#encryption-and-erasure), on both backends:
every payload kind round-trips and is stored as ciphertext while ids, types, seqs and times stay
readable; a missing or wrong key is refused with the database unchanged; an erased run keeps
its shape and loses its payloads for good (the SQLite file and its WAL keep neither the
plaintext nor the key); rotation; recovery after a SIGKILL, forks and the read-only side."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio
from click.testing import CliRunner, Result

import zincir
from zincir import _queries as q
from zincir._cli import main
from zincir._inspector import create_app

from .helpers import dump, rows
from .test_inspector import HOST

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))
SECRET = "TOP-SECRET"
"""Put into every payload: it must never be found in the database's own bytes."""


def secret(what: str) -> str:
    return f"{SECRET} {what}"


async def full_run(db: zincir.Database) -> str:
    """A run that writes every payload kind: config, response and tool call, tool result, step,
    checkpoint (state and verification), signal, stream chunk, result."""
    async with zincir.open_run(db, config={"prompt": secret("config")}) as run:
        call = zincir.ToolCall("c1", "search", {"q": secret("args")})
        await run.record_response(secret("response"), [call], "tool_use")
        await run.record_tool_result("c1", {"hits": secret("result")})

        async def work() -> str:
            return secret("step")

        assert await run.step("s1", work) == secret("step")
        await run.record_response("", [zincir.ToolCall("cp", zincir.SUBMIT_CHECKPOINT, {})], "tool_use")

        async def verdict(candidate: zincir.Checkpoint) -> zincir.Verification:
            return zincir.Verification(True, {"why": secret("evidence")})

        state = zincir.CheckpointState(completed=[secret("state")])
        await run.checkpoint("cp", state, verdict)
        await zincir.send_signal(db, run.id, "go", {"note": secret("signal")})
        assert await run.wait_for_signal("w", "go") == {"note": secret("signal")}
        async with run.stream("out") as out:
            await out.send(secret("chunk"))
        await run.complete({"answer": secret("final")})
        return run.id


def payload_columns(db: zincir.Database, run_id: str) -> list[str]:
    """Every payload value of the run as stored."""
    queries = [
        ("SELECT config FROM agent_runs WHERE id = ?", 1),
        ("SELECT result FROM agent_runs WHERE id = ?", 1),
        ("SELECT payload FROM events WHERE run_id = ?", 1),
        ("SELECT result FROM steps WHERE run_id = ?", 1),
        ("SELECT state FROM checkpoints WHERE run_id = ? UNION ALL"
         " SELECT verification FROM checkpoints WHERE run_id = ?", 2),
        ("SELECT payload FROM signals WHERE run_id = ?", 1),
        ("SELECT data FROM stream_chunks WHERE run_id = ?", 1),
    ]  # fmt: skip
    return [str(row[0]) for sql, n in queries for row in rows(db, sql, (run_id,) * n)]


async def test_every_payload_kind_round_trips_and_only_ciphertext_is_stored(db_target: str) -> None:
    async with zincir.open_database(db_target, encryption_key=KEY) as db:
        run_id = await full_run(db)
        state = await db.state(run_id)
        assert state.run.config == {"prompt": secret("config")}
        assert state.run.result == {"answer": secret("final")}
        events = await db.events(run_id)
        payloads = json.dumps([e.payload for e in events])
        for what in ("response", "args", "result", "state", "evidence", "signal"):
            assert secret(what) in payloads, what
        chunks = [c.data async for c in zincir.read_stream(db, run_id, "out")]
        assert chunks == [secret("chunk")]

        # The shape is in clear: ids, types, seqs and times, as a raw query reads them.
        shape = rows(db, "SELECT seq, type, created_at FROM events WHERE run_id = ? ORDER BY seq", (run_id,))
        assert [(s, t) for s, t, _ in shape] == [(e.seq, e.type.value) for e in events]
        assert all(isinstance(at, int) and at > 0 for _, _, at in shape)
        stored = payload_columns(db, run_id)
        assert len(stored) >= len(events) + 7
        assert all(value.startswith(f"zc1:{run_id}:") for value in stored)
        assert SECRET not in dump(db)


async def test_without_its_key_or_with_another_an_encrypted_database_is_refused_unchanged(
    db_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with zincir.open_database(db_target, encryption_key=KEY) as db:
        async with zincir.open_run(db, config={"prompt": secret("config")}) as run:
            await run.record_response(secret("response"), [], "end_turn")
        run_id = run.id
        before = dump(db)
    with pytest.raises(zincir.EncryptionKeyMissing, match="encrypted"):
        async with zincir.open_database(db_target):
            pass
    with pytest.raises(zincir.EncryptionKeyInvalid, match="not one this database"):
        async with zincir.open_database(db_target, encryption_key=OTHER):
            pass
    ring = zincir.KeyRing(OTHER)
    with pytest.raises(zincir.EncryptionKeyInvalid):
        async with zincir.open_database(db_target, keys=ring):
            pass
    assert dump_of(db_target) == before

    # The read-only side (CLI, inspector): the shape without a key, a clear error at the payloads.
    monkeypatch.delenv("ZINCIR_ENCRYPTION_KEY", raising=False)
    conn = q.open_readonly(db_target)
    try:
        with q.read_snapshot(conn):
            (summary,) = q.list_runs(conn).runs
            assert (summary.id, summary.event_count) == (run_id, 2)
            with pytest.raises(zincir.EncryptionKeyMissing, match="ZINCIR_ENCRYPTION_KEY"):
                q.list_events(conn, run_id)
    finally:
        conn.close()
    with pytest.raises(zincir.EncryptionKeyInvalid):
        q.open_readonly(db_target, keys=ring)
    monkeypatch.setenv("ZINCIR_ENCRYPTION_KEY", KEY.hex())
    shown = await cli(db_target, "events", run_id, "--json")
    assert shown.exit_code == 0, shown.output
    assert secret("response") in shown.output


def dump_of(target: str) -> str:
    return dump(Path(target)) if "://" not in target else _dump_url(target)


def _dump_url(url: str) -> str:
    from .helpers import _dump_postgres

    return _dump_postgres(url)


async def cli(target: str, *args: str) -> Result:
    return await trio.to_thread.run_sync(lambda: CliRunner().invoke(main, [*args, "--db", target]))


async def test_an_erased_run_keeps_its_shape_and_its_payloads_are_gone(
    db_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with zincir.open_database(db_target, encryption_key=KEY) as db:
        async with zincir.open_run(db, config={"prompt": secret("config")}) as run:
            await run.record_response(secret("response"), [], "end_turn")
            with pytest.raises(zincir.RunNotEnded, match="running"):
                await zincir.erase_run(db, run.id)
            await run.complete({"answer": secret("final")})
        run_id = run.id
        kept = await full_run(db)  # another run: untouched by the erasure
        shape = [(e.seq, e.type, e.created_at) for e in await db.events(run_id)]

        erased_at = await zincir.erase_run(db, run_id, by="dpo")
        assert await zincir.erase_run(db, run_id) == erased_at  # once erased, erased
        events = await db.events(run_id)
        assert [(e.seq, e.type, e.created_at) for e in events] == shape
        assert all(e.payload is zincir.ERASED for e in events)
        record = (await db.state(run_id)).run
        assert record.config is zincir.ERASED and record.result is zincir.ERASED
        assert (await db.state(kept)).run.result == {"answer": secret("final")}
        assert rows(db, "SELECT key_id, wrapped_dek FROM run_keys WHERE run_id = ?", (run_id,)) == [
            (None, None)
        ]
        audit = rows(db, "SELECT action, done_by FROM outsider_actions WHERE run_id = ?", (run_id,))
        assert audit == [("erase", "dpo")]
        with pytest.raises(zincir.RunErased):
            await zincir.fork_run(db, run_id, 1)

    # With the key or without, the CLI and the inspector's JSON show the shape, marked erased.
    monkeypatch.setenv("ZINCIR_ENCRYPTION_KEY", KEY.hex())
    shown = await cli(db_target, "show", run_id, "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["run"]["erased_at"] == erased_at
    events_out = await cli(db_target, "events", run_id, "--json")
    lines = [json.loads(line) for line in events_out.stdout.splitlines()]
    assert [line["payload"] for line in lines] == [{"erased": True}] * len(shape)
    assert [line["type"] for line in lines] == [t.value for _, t, _ in shape]
    text = await cli(db_target, "show", run_id)
    assert "erased" in text.output and SECRET not in text.output

    app = create_app(db_target, HOST)
    answer = await app.test_client().open(f"/api/runs/{run_id}", method="GET", headers={"Host": HOST})
    assert answer.status_code == 200
    assert json.loads(await answer.get_data(as_text=True))["run"]["erased_at"] == erased_at
    page = await app.test_client().open(f"/runs/{run_id}", method="GET", headers={"Host": HOST})
    body = await page.get_data(as_text=True)
    assert page.status_code == 200 and 'id="erased"' in body and SECRET not in body
    # A run that was not erased reads in full through the key from the environment.
    kept_page = await app.test_client().open(
        f"/runs/{kept}?view=events", method="GET", headers={"Host": HOST}
    )
    kept_body = await kept_page.get_data(as_text=True)
    assert kept_page.status_code == 200 and secret("response") in kept_body and 'id="erased"' not in kept_body


async def test_erasure_leaves_neither_the_key_nor_the_plaintext_in_the_file_or_the_wal(db_path: Path) -> None:
    async with zincir.open_database(db_path, encryption_key=KEY) as db:
        run_id = await full_run(db)
        (wrapped,) = rows(db, "SELECT wrapped_dek FROM run_keys WHERE run_id = ?", (run_id,))[0]
        files = [db_path, Path(f"{db_path}-wal")]
        assert any(wrapped.encode() in f.read_bytes() for f in files if f.exists())
        await zincir.erase_run(db, run_id)
        for file in files:
            data = file.read_bytes() if file.exists() else b""
            assert wrapped.encode() not in data, file
            assert SECRET.encode() not in data, file
        assert all(e.payload is zincir.ERASED for e in await db.events(run_id))


async def test_no_copy_of_an_erased_key_outlives_it_where_pages_were_split(db_path: Path) -> None:
    # A page of run_keys that splits as runs are added leaves copies of the keys it moved in
    # free space unless the writer zeroes what it frees: every later erasure must still hold.
    async with zincir.open_database(db_path, encryption_key=KEY) as db:
        await zincir.erase_run(db, await full_run(db))
        ids = []
        for _ in range(600):
            async with zincir.open_run(db, config={"p": SECRET}) as run:
                await run.complete()
            ids.append(run.id)
        wrapped = dict(rows(db, "SELECT run_id, wrapped_dek FROM run_keys WHERE wrapped_dek IS NOT NULL"))
        for run_id in ids:
            await zincir.erase_run(db, run_id)
        data = b"".join(f.read_bytes() for f in (db_path, Path(f"{db_path}-wal")) if f.exists())
        assert [run_id for run_id in ids if wrapped[run_id].encode() in data] == []


async def test_rotation_rewraps_every_key_and_then_the_old_key_can_go(db_target: str) -> None:
    async with zincir.open_database(db_target, encryption_key=KEY) as db:
        first = await full_run(db)
        async with zincir.open_run(db, config={"n": 2}) as run:
            await run.complete()
    events = None
    async with zincir.open_database(db_target, keys=zincir.KeyRing(OTHER, [KEY])) as db:
        events = await db.events(first)  # both keys: the old one still opens the old runs
        assert await zincir.rotate_keys(db, batch=1) == 2
        assert await zincir.rotate_keys(db) == 0
        assert (
            rows(
                db, "SELECT count(*) FROM run_keys WHERE key_id = ?", (zincir.KeyRing(OTHER).current_key_id,)
            )[0][0]
            == 2
        )
    async with zincir.open_database(db_target, encryption_key=OTHER) as db:  # the old key dropped
        assert await db.events(first) == events
        assert (await db.state(run.id)).run.config == {"n": 2}
    with pytest.raises(zincir.EncryptionKeyMissing, match="still wraps"):  # the new key is needed
        async with zincir.open_database(db_target, encryption_key=KEY):
            pass


_CRASHING = textwrap.dedent(
    """
    import os, signal, sys, trio, zincir

    async def main():
        async with zincir.open_database(sys.argv[1], encryption_key=bytes(range(32))) as db:
            async with zincir.open_run(db, config={"prompt": "TOP-SECRET config"}) as run:
                call = zincir.ToolCall("c1", "charge", {"cents": 500, "memo": "TOP-SECRET args"})
                await run.record_response("TOP-SECRET response", [call], "tool_use")
                print(run.id, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)  # in the middle of the tool call

    trio.run(main)
    """
)


async def test_a_run_killed_mid_tool_recovers_on_an_encrypted_database(db_target: str) -> None:
    async with zincir.open_database(db_target, encryption_key=KEY):
        pass  # created and migrated here, so the child only writes
    done = await trio.to_thread.run_sync(
        lambda: subprocess.run([sys.executable, "-c", _CRASHING, db_target], capture_output=True, text=True)
    )
    assert done.returncode == -9, done.stderr
    run_id = done.stdout.strip()
    async with zincir.open_database(db_target, encryption_key=KEY) as db:
        # The dead owner was of this host: the lease is taken at once, the intent handed out again.
        async with zincir.open_run(db, run_id) as run:
            assert run.config == {"prompt": secret("config")}
            (pending,) = await run.pending_tools()
            assert pending.call.args == {"cents": 500, "memo": secret("args")}
            await run.record_tool_result("c1", {"charged": True})
            state = await run.state()
            assert [e.type.value for e in state.events][-3:] == [
                "attempt_lost",
                "lease_taken_over",
                "tool_result",
            ]
            assert state.events[1].payload["content"] == secret("response")
            await run.complete()
        assert SECRET not in dump(db)


async def test_forks_and_children_read_through_their_own_keys(db_target: str) -> None:
    async with zincir.open_database(db_target, encryption_key=KEY) as db:
        async with zincir.open_run(db, config={"p": secret("parent")}) as run:
            await run.record_response(secret("response"), [], "end_turn")
            child_id = await run.spawn("c", config={"p": secret("child")})
        assert (await db.state(child_id)).run.config == {"p": secret("child")}
        fork = await zincir.fork_run(db, run.id, 1, config={"p": secret("fork")})
        await zincir.cancel_run(db, run.id, "enough")  # and its child
        fork_events = await db.events(fork)
        assert fork_events[1].payload["content"] == secret("response")  # copied: the source's key
        assert (await db.state(fork)).run.config == {"p": secret("fork")}
        with pytest.raises(zincir.RunNotEnded, match="fork"):
            await zincir.erase_run(db, run.id)  # the fork (pending) still reads the copy
        await zincir.cancel_run(db, fork, "done with it")
        await zincir.erase_run(db, run.id)
        assert (await db.events(fork))[1].payload is zincir.ERASED  # the copy went with the source
        assert (await db.state(fork)).run.config == {"p": secret("fork")}  # the fork's own stays
        assert (await db.state(child_id)).run.config == {"p": secret("child")}  # the child's own key
        with pytest.raises(zincir.RunErased, match="whose history it copied"):
            await zincir.fork_run(db, fork, 1)  # a fork of the fork would be made of erased values


def test_keys_are_checked_before_anything_is_opened() -> None:
    with pytest.raises(zincir.InvalidArgument, match="32 bytes"):
        zincir.KeyRing(b"short")
    ring = zincir.KeyRing(KEY, [OTHER])
    assert ring.key(ring.current_key_id) == KEY
    assert ring.key(zincir.KeyRing(OTHER).current_key_id) == OTHER
    assert KEY.hex() not in repr(ring) and ring.key("nope") is None

    async def both() -> None:
        async with zincir.open_database("unused.db", encryption_key=KEY, keys=ring):
            pass

    with pytest.raises(zincir.InvalidArgument, match="not both"):
        trio.run(both)


async def test_without_the_cryptography_package_encryption_fails_clearly(
    db_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)
    with pytest.raises(zincir.EncryptionUnavailable, match=r"zincir\[crypto\]"):
        async with zincir.open_database(db_target, encryption_key=KEY):
            pass


async def test_a_large_result_repeated_in_a_run_is_stored_once_encrypted_and_erased_with_it(
    db_target: str,
) -> None:
    big = {"text": secret("file") + " x" * 6000}
    async with zincir.open_database(db_target, encryption_key=KEY) as db:
        ids = []
        for _ in range(2):
            async with zincir.open_run(db) as run:
                for n in range(3):  # the same file read three times
                    await run.record_response("read", [zincir.ToolCall(f"r{n}", "read", {})], "tool_use")
                    await run.record_tool_result(f"r{n}", big)
                await run.complete()
            ids.append(run.id)
        parts = rows(db, "SELECT r.run_id, c.body FROM payload_refs AS r JOIN payload_content AS c"
                         " ON c.digest = r.digest ORDER BY r.run_id")  # fmt: skip
        assert sorted(run_id for run_id, _ in parts) == sorted(ids)  # once per run, not per read
        assert all(body.startswith(f"zc1:{run_id}:") for run_id, body in parts)
        results = [e.payload["content"] for e in await db.events(ids[0]) if e.type.value == "tool_result"]
        assert results == [big] * 3
        await zincir.erase_run(db, ids[0])
        erased = [e.payload for e in await db.events(ids[0]) if e.type.value == "tool_result"]
        assert erased == [zincir.ERASED] * 3
        assert [e.payload["content"] for e in await db.events(ids[1]) if e.type.value == "tool_result"] == [
            big
        ] * 3
        assert SECRET not in dump(db)


async def test_turning_encryption_on_keeps_older_runs_readable_and_refuses_to_erase_them(
    db_target: str,
) -> None:
    async with zincir.open_database(db_target) as db, zincir.open_run(db, config={"p": "clear"}) as old:
        await old.complete({"r": "clear"})
    async with zincir.open_database(db_target, encryption_key=KEY) as db:
        assert (await db.state(old.id)).run.result == {"r": "clear"}
        with pytest.raises(zincir.EncryptionError, match="before the database was encrypted"):
            await zincir.erase_run(db, old.id)
        async with zincir.open_run(db, config={"p": secret("new")}) as new:
            await new.complete()
        assert (await db.state(new.id)).run.config == {"p": secret("new")}
        assert SECRET not in dump(db)
    with pytest.raises(zincir.EncryptionKeyMissing):  # from now on, only with its key
        async with zincir.open_database(db_target):
            pass


async def test_zincir_erase_and_rotate_keys_take_the_keys_from_the_environment(
    db_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        zincir.open_database(db_target, encryption_key=KEY) as db,
        zincir.open_run(db, config={"p": secret("config")}) as run,
    ):
        await run.complete()
    monkeypatch.delenv("ZINCIR_ENCRYPTION_KEY", raising=False)
    refused = await cli(db_target, "erase", run.id)
    assert refused.exit_code == 1 and "ZINCIR_ENCRYPTION_KEY" in refused.output
    key_file = tmp_path / "keys.txt"
    key_file.write_text(f"{OTHER.hex()}\n{KEY.hex()}\n")  # the new key first, the old one after
    monkeypatch.setenv("ZINCIR_ENCRYPTION_KEY_FILE", str(key_file))
    rotated = await cli(db_target, "rotate-keys")
    assert rotated.exit_code == 0, rotated.output
    assert rotated.output.startswith("re-wrapped 1 run keys")
    monkeypatch.setenv("ZINCIR_ENCRYPTION_KEY", OTHER.hex())  # the old key dropped
    erased = await cli(db_target, "erase", run.id[:8], "--by", "dpo")
    assert erased.exit_code == 0 and erased.output == f"erased {run.id}\n", erased.output
    async with zincir.open_database(db_target, encryption_key=OTHER) as db:
        assert (await db.state(run.id)).run.config is zincir.ERASED


async def test_a_key_in_the_environment_never_turns_encryption_on_from_the_cli(
    db_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with zincir.open_database(db_target) as db, zincir.open_run(db) as run:
        await run.complete()
    monkeypatch.setenv("ZINCIR_ENCRYPTION_KEY", KEY.hex())  # meant for another database
    for args, code in (
        (("erase", run.id), 1),
        (("rotate-keys",), 1),
        (("prune", "--older-than", "1s", "--dry-run"), 0),
        (("cancel", run.id, "--reason", "done"), 1),  # ended already: refused, after opening it
    ):
        result = await cli(db_target, *args)
        assert result.exit_code == code, (args, result.output)
    assert "is not encrypted" in (await cli(db_target, "erase", run.id)).output
    async with zincir.open_database(db_target) as db:  # still opens without a key
        assert (await db.state(run.id)).run.status is zincir.RunStatus.COMPLETED


async def test_another_key_is_refused_even_when_no_run_key_is_left(db_target: str) -> None:
    async with zincir.open_database(db_target, encryption_key=KEY) as db:
        async with zincir.open_run(db) as run:
            await run.complete()
        await zincir.erase_run(db, run.id)  # no run's key is wrapped by KEY any more
    with pytest.raises(zincir.EncryptionKeyInvalid, match="not one this database"):
        async with zincir.open_database(db_target, encryption_key=OTHER):
            pass
    async with zincir.open_database(db_target, encryption_key=KEY) as db:  # KEY still opens it
        assert rows(db, "SELECT count(*) FROM encryption_keys")[0][0] == 1


async def test_a_process_opened_before_encryption_was_turned_on_reads_a_missing_key(db_target: str) -> None:
    async with zincir.open_database(db_target) as plain:
        async with (
            zincir.open_database(db_target, encryption_key=KEY) as keyed,
            zincir.open_run(keyed, config={"p": secret("config")}) as run,
        ):
            await run.record_response(secret("response"), [], "end_turn")
            await run.complete()
        with pytest.raises(zincir.EncryptionKeyMissing):
            await plain.events(run.id)
        with pytest.raises(zincir.EncryptionKeyMissing):
            await plain.state(run.id)


async def test_erasure_and_rotation_refuse_what_is_not_a_database(db_path: Path) -> None:
    with pytest.raises(zincir.InvalidArgument, match="needs a Database"):
        await zincir.erase_run(str(db_path), "00000000-0000-4000-8000-000000000000")  # type: ignore[arg-type]
    with pytest.raises(zincir.InvalidArgument, match="needs a Database"):
        await zincir.rotate_keys(str(db_path))  # type: ignore[arg-type]
    assert not db_path.exists()
