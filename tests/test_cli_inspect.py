"""The read-only CLI commands: runs, show, events, export and ui."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner, Result

import zincir as zc
from tests.helpers import ZINCIR_CLI, reap
from tests.inspect_fixtures import Sample, add_event, add_run, build_sample, create_database, file_digests
from zincir._cli import main

UNKNOWN = "00000000-0000-4000-8000-000000000000"


@pytest.fixture
def sample(tmp_path: Path) -> Iterator[tuple[sqlite3.Connection, Sample]]:
    conn, ids = build_sample(tmp_path / "cli.db", plain_runs=5)
    yield conn, ids
    conn.close()


@pytest.fixture
def ids(sample: tuple[sqlite3.Connection, Sample]) -> Sample:
    return sample[1]


def zincir(*args: str | Path) -> Result:
    env = {"ZINCIR_DATABASE_PATH": None, "ZINCIR_UI_ADDRESS": None}
    return CliRunner().invoke(main, [str(a) for a in args], env=env, catch_exceptions=False)


def assert_clean_failure(result: Result, message: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.stderr


def test_runs_table(ids: Sample) -> None:
    result = zincir("runs", "--db", ids.path, "--limit", "3")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "RUN", "STATUS", "ROLE", "PROVIDER", "EVENTS", "ATTEMPTS", "LAST", "ACTIVITY", "BUDGET", "AWAITS"
    ]  # fmt: skip
    assert [line.split()[0] for line in lines[1:4]] == [ids.hostile, ids.main, ids.children[1]]
    counts = "pending 5, running 2, waiting 0, completed 2, failed 1, cancelled 0"
    assert f"3 shown; 10 in all ({counts})" in result.stdout
    cursor = re.search(r"more: --before (\S+)", result.stdout)
    assert cursor is not None
    more = zincir("runs", "--db", ids.path, "--limit", "3", "--before", cursor.group(1))
    assert more.stdout.splitlines()[1].split()[0] == ids.children[0]
    failed = zincir("runs", "--db", ids.path, "--status", "failed")
    assert [line.split()[0] for line in failed.stdout.splitlines()[1:2]] == [ids.children[1]]
    coder = zincir("runs", "--db", ids.path, "--role", "coder")
    assert coder.stdout.splitlines()[1].split()[0] == ids.main
    assert zincir("runs", "--db", ids.path, "--status", "bogus").exit_code == 2
    assert_clean_failure(zincir("runs", "--db", ids.path, "--before", "junk"), "malformed runs cursor")


def test_runs_on_empty_database(tmp_path: Path) -> None:
    create_database(tmp_path / "empty.db").close()
    result = zincir("runs", "--db", tmp_path / "empty.db")
    assert result.exit_code == 0
    assert result.stdout.startswith("No runs.")


def test_show(ids: Sample) -> None:
    result = zincir("show", "--db", ids.path, ids.main.upper())
    assert result.exit_code == 0
    text = result.stdout
    for expected in (
        f"run          {ids.main}",
        "lease        worker-7f3a, epoch 3, until",
        "attempts     2",
        "next attempt 2023-11-14T22:14:20.000Z",
        f"{ids.children[0]} (completed)",
        '"goal": "fix the flaky test"',
        "checkpoints (3)",
        "steps (2)",
        "timers (2)",
    ):
        assert expected in text, expected
    rows = {line.split()[0]: line.split() for line in text.splitlines() if re.match(r"\s+[123]\s", line)}
    assert rows["1"][:6] == ["1", "1", "rejected", "goal", "4", "6"]  # round, then the checkpoint id
    assert rows["3"][:7] == ["3", "3", "candidate", "round", "2", "12", "—"]
    data = json.loads(zincir("show", "--db", ids.path, ids.main, "--json").stdout)
    assert data["run"]["lease_epoch"] == 3
    assert [c["round"] for c in data["checkpoints"]] == [1, 2, 3]
    assert data["steps"][0]["result"] == {"rows": 1200}


async def test_show_says_why_a_run_failed_or_was_cancelled(db_target: str) -> None:
    async def broken(run: zc.Run) -> None:
        raise RuntimeError("the model endpoint returned 500\ntwice")

    async with zc.open_database(db_target) as db:
        async with zc.open_run(db) as run:
            await run.fail("the tests still fail after three tries")
        failed = run.id
        async with zc.open_run(db, role="exhausting") as run:
            pass  # released: the worker below claims it and its one attempt fails
        exhausted = run.id
        async with zc.open_run(db) as run:
            pass
        cancelled = run.id
        await zc.cancel_run(db, cancelled, "not needed any more")
        worker = zc.ResumeWorker(db, broken, max_attempts=1, poll_interval=0.05, until_idle=True)
        with trio.fail_after(30):
            await worker.run()
        async with zc.open_run(db) as run:
            await run.complete()
        completed = run.id
    reasons = {}
    for run_id in (failed, exhausted, cancelled, completed):
        shown = zincir("show", "--db", db_target, run_id)
        assert shown.exit_code == 0, shown.output
        lines = [line for line in shown.stdout.splitlines() if line.startswith("reason ")]
        as_json = json.loads(zincir("show", "--db", db_target, run_id, "--json").stdout)["run"]["reason"]
        reasons[run_id] = (lines, as_json)
    assert reasons[failed] == (
        ["reason       the tests still fail after three tries"],
        "the tests still fail after three tries",
    )
    [line], as_json = reasons[exhausted]
    assert as_json.startswith("attempts exhausted") and "the model endpoint returned 500\ntwice" in as_json
    assert line == f"reason       {as_json}".replace("\n", "\\n")  # one line: the newline escaped
    assert reasons[cancelled] == (["reason       not needed any more"], "not needed any more")
    assert reasons[completed] == ([], None)


def test_show_escapes_terminal_control_characters(sample: tuple[sqlite3.Connection, Sample]) -> None:
    writer, ids = sample
    run = add_run(
        writer, role="evil\x1b[2J\x1b]0;pwned\x07", provider="rtl\u202eexe.txt", config={"k": "\x9b31m"}
    )
    result = zincir("show", "--db", ids.path, run)
    assert result.exit_code == 0
    assert "\x1b" not in result.stdout
    assert "\u202e" not in result.stdout
    assert "\x9b" not in result.stdout
    assert "\x07" not in result.stdout
    assert "evil\\x1b[2J" in result.stdout
    listed = zincir("runs", "--db", ids.path, "--role", "evil\x1b[2J\x1b]0;pwned\x07")
    assert "\x1b" not in listed.stdout
    assert run in listed.stdout


def test_events(sample: tuple[sqlite3.Connection, Sample]) -> None:
    writer, ids = sample
    result = zincir("events", "--db", ids.path, ids.long)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert len(lines) == 250  # all pages, not just the first
    assert lines[0].startswith("#0 ")
    assert lines[-1].startswith("#249 ")
    after = zincir("events", "--db", ids.path, ids.long, "--after", "247").stdout.splitlines()
    assert [line.split()[0] for line in after] == ["#248", "#249"]
    typed = zincir("events", "--db", ids.path, ids.main, "--type", "checkpoint_accepted").stdout.splitlines()
    assert len(typed) == 1
    assert '"passed":true' in typed[0]
    as_json = [
        json.loads(line)
        for line in zincir("events", "--db", ids.path, ids.main, "--json").stdout.splitlines()
    ]
    assert [e["seq"] for e in as_json] == list(range(14))
    assert as_json[0]["payload"] == {"from": "pending", "to": "running"}
    seq = add_event(writer, ids.long, "llm_call", {"content": "y" * 5000})
    short = zincir("events", "--db", ids.path, ids.long, "--after", str(seq - 1)).stdout
    assert "--full shows all" in short
    assert len(short) < 1200
    full = zincir("events", "--db", ids.path, ids.long, "--after", str(seq - 1), "--full").stdout
    assert "y" * 5000 in full


def test_events_follow_until_the_run_ends(sample: tuple[sqlite3.Connection, Sample]) -> None:
    writer, ids = sample
    writer.close()

    def append_later() -> None:
        conn = sqlite3.connect(ids.path, isolation_level=None)
        for i in range(3):
            time.sleep(0.2)
            add_event(conn, ids.main, "llm_call", {"content": f"late {i}"})
        conn.execute("UPDATE agent_runs SET status = 'completed' WHERE id = ?", (ids.main,))
        conn.close()

    thread = threading.Thread(target=append_later)
    thread.start()
    started = time.monotonic()
    result = zincir("events", "--db", ids.path, ids.main, "--after", "12", "--follow")
    thread.join()
    assert result.exit_code == 0
    assert [line.split()[0] for line in result.stdout.splitlines()] == ["#13", "#14", "#15", "#16"]
    assert "late 2" in result.stdout
    assert time.monotonic() - started < 5


def test_events_follow_stops_on_sigint(ids: Sample) -> None:
    command = [*_zincir_command(), "events", "--db", str(ids.path), ids.main, "--follow"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.startswith("#0 ")
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=10)
    finally:
        reap(process)
    assert process.returncode == 0, err
    assert "Traceback" not in err


def test_export(sample: tuple[sqlite3.Connection, Sample]) -> None:
    _, ids = sample
    result = zincir("export", "--db", ids.path, ids.main)
    assert result.exit_code == 0
    records = [json.loads(line) for line in result.stdout.splitlines()]
    kinds = [r["kind"] for r in records]
    assert kinds == ["run"] + ["event"] * 14 + ["checkpoint"] * 3 + ["step"] * 2 + ["timer"] * 2
    assert records[0]["id"] == ids.main
    assert records[0]["config"] == {"goal": "fix the flaky test", "max_rounds": 5}
    assert records[0]["children"] == list(ids.children)
    assert [r["seq"] for r in records if r["kind"] == "event"] == list(range(14))
    checkpoint = next(r for r in records if r["kind"] == "checkpoint" and r["round"] == 2)
    assert checkpoint["verification"] == {"passed": True, "evidence": ["pytest exit 1"]}
    assert checkpoint["based_on_event_seq"] == 8
    long = zincir("export", "--db", ids.path, ids.long).stdout.splitlines()
    assert len(long) == 251  # paged through all events


def test_errors_are_one_clean_line(tmp_path: Path, ids: Sample) -> None:
    for command in ("show", "events", "export"):
        assert_clean_failure(zincir(command, "--db", ids.path, UNKNOWN), f"run {UNKNOWN} not found")
        assert_clean_failure(zincir(command, "--db", ids.path, "not-a-run"), "malformed run id")
    missing = tmp_path / "missing.db"
    for args in (["runs"], ["show", UNKNOWN], ["events", UNKNOWN], ["export", UNKNOWN], ["ui"]):
        assert_clean_failure(zincir(*args, "--db", missing), "does not exist")
    assert not missing.exists()
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite at all" * 64)
    assert_clean_failure(zincir("runs", "--db", junk), "not a zincir database")


def test_ui_refuses_bad_addresses(ids: Sample) -> None:
    for address, message in [
        ("0.0.0.0:8787", "loopback only"),
        ("[::]:8787", "loopback only"),
        ("localhost:8787", "hostnames"),
        ("192.168.0.1:8787", "loopback only"),
    ]:
        assert_clean_failure(zincir("ui", "--db", ids.path, "--address", address), message)
    env_result = CliRunner().invoke(
        main, ["ui", "--db", str(ids.path)], env={"ZINCIR_UI_ADDRESS": "0.0.0.0:1"}, catch_exceptions=False
    )
    assert_clean_failure(env_result, "loopback only")


def test_commands_never_write(sample: tuple[sqlite3.Connection, Sample]) -> None:
    _, ids = sample
    before = file_digests(ids.path)
    # Each command must succeed and print what it is for: a failing command also "never
    # writes", so the digests alone would prove nothing.
    listed = zincir("runs", "--db", ids.path)
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.splitlines()[0].split()[:2] == ["RUN", "STATUS"]
    assert ids.main in listed.stdout and ids.long in listed.stdout
    shown = zincir("show", "--db", ids.path, ids.main)
    assert shown.exit_code == 0, shown.output
    assert f"run          {ids.main}" in shown.stdout and "checkpoints (3)" in shown.stdout
    as_json = zincir("show", "--db", ids.path, ids.main, "--json")
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout)["run"]["id"] == ids.main
    events = zincir("events", "--db", ids.path, ids.long)
    assert events.exit_code == 0, events.output
    assert [line.split()[0] for line in events.stdout.splitlines()] == [f"#{i}" for i in range(250)]
    exported = zincir("export", "--db", ids.path, ids.main)
    assert exported.exit_code == 0, exported.output
    records = [json.loads(line) for line in exported.stdout.splitlines()]
    assert records[0] == {**records[0], "kind": "run", "id": ids.main}
    assert sum(r["kind"] == "event" for r in records) == 14
    lineage = zincir("checkpoints", "--db", ids.path, ids.main)
    assert lineage.exit_code == 0, lineage.output
    assert [line.split()[:3] for line in lineage.stdout.splitlines() if re.match(r"\s+[123]\s", line)] == [
        ["1", "1", "rejected"],
        ["2", "2", "accepted"],
        ["3", "3", "candidate"],
    ]
    for result in (listed, shown, as_json, events, exported, lineage):
        assert result.stderr == ""
    assert file_digests(ids.path) == before


def _zincir_command() -> list[str]:
    return list(ZINCIR_CLI)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ui_serves_and_exits_cleanly_on_signal(ids: Sample, signum: int) -> None:
    command = [*_zincir_command(), "ui", "--db", str(ids.path), "--address", "127.0.0.1:0"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"at (http://127\.0\.0\.1:[0-9]+/) ", line)
        assert match is not None, line
        with urllib.request.urlopen(match.group(1), timeout=5) as response:
            assert response.status == 200
            assert ids.main in response.read().decode()
        process.send_signal(signum)
        out, err = process.communicate(timeout=10)
    finally:
        reap(process)
    assert process.returncode == 0, err
    assert "stopped" in out
    assert "Traceback" not in err


async def test_checkpoints_command_prints_the_lineage(tmp_path: Path) -> None:
    path = tmp_path / "zc.db"

    async def verify(state: zc.CheckpointState) -> zc.Verification:
        return zc.Verification(bool(state.completed), {"seen": state.completed})

    async with zc.open_database(path) as db, zc.open_run(db) as run:
        for round, completed in enumerate([[], ["all of it"]], start=1):
            state = zc.CheckpointState(completed=completed)
            call = zc.ToolCall(f"cp-{round}", zc.SUBMIT_CHECKPOINT, state.to_json())
            await run.record_response("", [call], "tool_use")
            await run.checkpoint(call.id, state, verify)
        await run.complete()
    result = CliRunner().invoke(main, ["checkpoints", "--db", str(path), run.id])
    assert result.exit_code == 0, result.output
    header, rejected, accepted = result.output.strip().splitlines()[1:4]
    assert header.split()[:5] == ["ROUND", "ID", "STATUS", "BUILDS", "ON"]
    assert header.split()[-1] == "VERDICT"
    assert rejected.split()[:7] == ["1", "1", "rejected", "goal", "2", "4", "cp-1"]
    assert rejected.endswith("failed")
    # A rejected round is no baseline: the next round builds on the goal too.
    assert accepted.split()[:7] == ["2", "2", "accepted", "goal", "7", "9", "cp-2"]
    assert accepted.endswith("passed")
    evidence = result.output.partition("  verification of round 2 (accepted)\n")[2]
    assert json.loads(evidence) == {"evidence": {"seen": ["all of it"]}, "passed": True}
    missing = CliRunner().invoke(
        main, ["checkpoints", "--db", str(path), "00000000-0000-0000-0000-000000000000"]
    )
    assert missing.exit_code == 1


ESCAPES = "\x1b]0;pwned\x07\x1b[2J\u202e\x9b31m\x7f"


def assert_terminal_safe(result: Result) -> None:
    assert result.exit_code == 0, result.output
    for char in ("\x1b", "\x07", "\u202e", "\x9b", "\x7f"):
        assert char not in result.stdout, (char, result.stdout[:2000])


def test_every_printed_stored_value_is_escaped(sample: tuple[sqlite3.Connection, Sample]) -> None:
    writer, ids = sample
    writer.execute("PRAGMA ignore_check_constraints = ON")  # a hostile writer can skip CHECKs too
    for columns in (
        "attempts, lease_epoch, created_at, next_attempt_at",
        "updated_at, lease_expires_at, last_seq, status",
    ):
        assignments = ", ".join(f"{column} = ?" for column in columns.split(", "))
        writer.execute(f"UPDATE agent_runs SET {assignments} WHERE id = ?", (ESCAPES,) * 4 + (ids.main,))
    writer.execute(
        "UPDATE events SET seq = ?, created_at = ? WHERE run_id = ? AND seq = 3", (ESCAPES, ESCAPES, ids.main)
    )
    writer.execute(
        "UPDATE events SET payload = ? WHERE run_id = ? AND seq = 2", (json.dumps({"k": ESCAPES}), ids.main)
    )
    writer.execute(
        "UPDATE checkpoints SET round = ?, based_on_event_seq = ?, decision_event_seq = ?, status = ?"
        " WHERE run_id = ? AND round = 2",
        (ESCAPES, ESCAPES, ESCAPES.encode(), ESCAPES, ids.main),
    )
    writer.execute(
        "UPDATE steps SET epoch = ?, status = ?, started_at = ? WHERE run_id = ?",
        (ESCAPES,) * 3 + (ids.main,),
    )
    writer.execute(
        "UPDATE timers SET wake_at = ?, completed_at = ? WHERE run_id = ?", (ESCAPES, ESCAPES, ids.main)
    )
    child = f"child{ESCAPES}"
    add_run(writer, run_id=child, parent_run_id=ids.main, role="escaper", status="completed")
    add_run(writer, run_id=f"other{ESCAPES}", role="escaper", status="completed")
    for args in (
        ["runs"],
        ["runs", "--role", "escaper", "--limit", "1"],
        ["show", ids.main],
        ["checkpoints", ids.main],
        ["events", ids.main],
        ["events", ids.main, "--full"],
        ["events", ids.main, "--json"],
        ["show", ids.main, "--json"],
        ["export", ids.main],
    ):
        result = zincir(*args, "--db", ids.path)
        assert_terminal_safe(result)
    shown = zincir("show", "--db", ids.path, ids.main).stdout
    assert "child\\x1b]0;pwned\\x07" in shown
    assert "attempts     (malformed text: " in shown
    listed = zincir("runs", "--db", ids.path, "--role", "escaper", "--limit", "1").stdout
    cursor = re.search(r"more: --before (\S+)", listed)
    assert cursor is not None
    more = zincir("runs", "--db", ids.path, "--role", "escaper", "--limit", "1", "--before", cursor.group(1))
    assert_terminal_safe(more)
    assert len(more.stdout.splitlines()) == 4  # header, the other run, blank line, summary


def test_nan_and_infinity_payloads_print_as_strings(sample: tuple[sqlite3.Connection, Sample]) -> None:
    writer, ids = sample
    stored = '{"a": NaN, "b": [Infinity, -Infinity], "c": 1e999, "d": 1.5}'
    decoded = {"a": "NaN", "b": ["Infinity", "-Infinity"], "c": "1e999", "d": 1.5}
    writer.execute("UPDATE events SET payload = ? WHERE run_id = ? AND seq = 2", (stored, ids.main))
    writer.execute("UPDATE steps SET result = ? WHERE run_id = ?", (stored, ids.main))
    writer.execute("UPDATE agent_runs SET config = ? WHERE id = ?", (stored, ids.main))
    writer.execute(
        "UPDATE events SET payload = ? WHERE run_id = ? AND seq = 4", ("[" * 5000 + "]" * 5000, ids.main)
    )

    def strict(line: str) -> Any:
        return json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} printed"))

    lines = zincir("events", "--db", ids.path, ids.main, "--json").stdout.splitlines()
    assert strict(lines[2])["payload"] == decoded
    assert strict(lines[4])["payload"] == "[" * 5000 + "]" * 5000
    records = [strict(line) for line in zincir("export", "--db", ids.path, ids.main).stdout.splitlines()]
    assert records[0]["config"] == decoded
    assert next(r for r in records if r["kind"] == "step")["result"] == decoded
    assert strict(zincir("show", "--db", ids.path, ids.main, "--json").stdout)["run"]["config"] == decoded
    text = zincir("events", "--db", ids.path, ids.main)
    assert text.exit_code == 0
    assert '{"a":"NaN","b":["Infinity","-Infinity"],"c":"1e999","d":1.5}' in text.stdout


def test_out_of_range_numbers_are_clean_errors(ids: Sample) -> None:
    result = zincir("events", "--db", ids.path, ids.main, "--after", "9" * 20)
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert_clean_failure(zincir("runs", "--db", ids.path, "--before", f"{'9' * 19}_{ids.main}"), "outside")


# -- start-up: only `zincir ui` loads the web stack -------------------------------------------

WEB_STACK = ("quart", "quart_trio", "hypercorn", "jinja2", "werkzeug", "flask")

_LOADED = """
import sys
from zincir._cli import main
try:
    main({args!r})
except SystemExit:
    pass
print("LOADED", sorted(m for m in {stack!r} if m in sys.modules))
"""


def _loaded_by(*args: str) -> list[str]:
    """The web-stack modules a fresh interpreter has loaded after running ``zincir ARGS``."""
    code = _LOADED.format(args=list(args), stack=WEB_STACK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZINCIR_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    [line] = [line for line in done.stdout.splitlines() if line.startswith("LOADED ")]
    loaded: list[str] = json.loads(line.removeprefix("LOADED ").replace("'", '"'))
    return loaded


REPORTER = """
import sys
import zincir

async def handler(run: zincir.Run) -> None:
    await run.complete(sorted(m for m in {stack!r} if m in sys.modules))
"""


async def test_commands_and_the_worker_start_without_the_web_stack(tmp_path: Path) -> None:
    # Importing Quart and Hypercorn made every command take half a second longer, and the
    # worker a second: only `zincir ui` may load them.
    target = str(tmp_path / "startup.db")
    async with zc.open_database(target) as db:
        async with zc.open_run(db) as run:
            shown = run.id
        async with zc.open_run(db) as run:
            handled = run.id  # released, due: the worker below claims it
        for args in (["--help"], ["show", "--db", target, shown], ["runs", "--db", target]):
            assert await trio.to_thread.run_sync(lambda a=args: _loaded_by(*a)) == [], args
        # The oracle: serving does load them (the check above would see them).
        assert "quart" in _loaded_by("ui", "--db", target, "--address", "not-an-address")
        (tmp_path / "startup_reporter.py").write_text(REPORTER.format(stack=WEB_STACK))
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("ZINCIR_")}}
        env["PYTHONPATH"] = str(tmp_path)
        command = [sys.executable, "-m", "zincir", "worker", "startup_reporter:handler", "--db", target,
                   "--poll-interval", "0.05"]  # fmt: skip
        worker = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            with trio.fail_after(60):
                while (record := (await db.state(handled)).run).status is not zc.RunStatus.COMPLETED:
                    assert worker.poll() is None, worker.communicate()
                    await trio.sleep(0.05)  # polling another process's write to the database
        finally:
            worker.send_signal(signal.SIGTERM)
            _, err = await trio.to_thread.run_sync(lambda: worker.communicate(timeout=30))
    assert worker.returncode == 0, err
    assert record.result == []
