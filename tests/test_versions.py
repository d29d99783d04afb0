"""Versions of an agent in flight: pinned to their runs, routed to their workers, moved on purpose."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path

import pytest
import trio
from click.testing import CliRunner, Result

import zincir
from zincir._cli import main as cli_main
from zincir._inspector import create_app

from .helpers import REPO, dump, insert_started_run, rows, scalar, until


async def released(db: zincir.Database, version: str | None = None, **kwargs: object) -> str:
    """A new run of ``version``, created and let go at once: pending, due, free."""
    async with zincir.open_run(db, version=version, **kwargs) as run:  # type: ignore[arg-type]
        return run.id


class Handled:
    """Every run a worker's handler got: (run id, run.version, the versions the worker serves)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, frozenset[str | None] | None]] = []

    def handler(self, served: Iterable[str | None] | None) -> zincir.Handler:
        versions = None if served is None else frozenset(served)

        async def handle(run: zincir.Run) -> None:
            self.seen.append((run.id, run.version, versions))
            await run.complete()

        return handle

    def by(self, served: Iterable[str | None] | None) -> list[str]:
        versions = None if served is None else frozenset(served)
        return [run_id for run_id, _, worker in self.seen if worker == versions]


async def drain(
    db: zincir.Database, handler: zincir.Handler, versions: Iterable[str | None] | None, **kwargs: object
) -> None:
    """Run a worker serving ``versions`` until nothing of theirs is or will become due by itself."""
    worker = zincir.ResumeWorker(
        db,
        handler,
        versions=versions,
        until_idle=True,
        poll_interval=0.02,
        **kwargs,  # type: ignore[arg-type]
    )
    with trio.fail_after(30):
        await worker.run()


async def attempts(db: zincir.Database, run_id: str) -> int:
    return int(scalar(db, "SELECT attempts FROM agent_runs WHERE id = ?", (run_id,)))  # type: ignore[call-overload]


# -- a run's version and fingerprints ------------------------------------------------------------


async def test_a_run_keeps_its_version_and_fingerprints_and_children_take_their_parents(
    db: zincir.Database,
) -> None:
    marks = {"tools": "t" * 64, "prompt": "p" * 64}
    async with zincir.open_run(db, version="2026-12-03.1", fingerprints=marks) as parent:
        assert parent.version == "2026-12-03.1"
        same = await parent.spawn("same")
        other = await parent.spawn("other", version="v2", fingerprints={"prompt": "q"})
        unmarked = await parent.spawn("unmarked", fingerprints={})  # none: not its parent's
        await parent.fail("its children are not run here")  # (which cancels them)
    async with zincir.open_run(db, parent_run_id=parent.id) as opened_child:
        assert opened_child.version == "2026-12-03.1"
        await opened_child.complete()
    async with zincir.open_run(db) as plain:
        assert plain.version is None
        await plain.complete()

    record = (await db.state(parent.id)).run
    assert record.version == "2026-12-03.1"
    assert record.fingerprints == marks and list(record.fingerprints) == ["prompt", "tools"]
    found = {r.id: r for r in await db.runs(limit=100)}
    assert (found[same].version, found[same].fingerprints) == ("2026-12-03.1", marks)
    assert (found[other].version, found[other].fingerprints) == ("v2", {"prompt": "q"})
    assert found[opened_child.id].fingerprints == marks
    assert (found[plain.id].version, found[plain.id].fingerprints) == (None, {})
    assert (found[unmarked].version, found[unmarked].fingerprints) == ("2026-12-03.1", {})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"version": ""}, "version must be a string of 1 to 255"),
        ({"version": 3}, "version must be a string"),
        ({"fingerprints": ["sha"]}, "fingerprints must be a mapping"),
        ({"fingerprints": {"prompt": 1}}, r"fingerprints\['prompt'\] must be a string"),
        ({"fingerprints": {"": "x"}}, "fingerprints: a name must be a string"),
        ({"fingerprints": {str(i): "x" for i in range(65)}}, "at most 64"),
    ],
)
async def test_bad_versions_and_fingerprints_are_refused_before_anything_is_written(
    db: zincir.Database, kwargs: dict[str, object], match: str
) -> None:
    before = dump(db)
    with pytest.raises(zincir.InvalidArgument, match=match):
        async with zincir.open_run(db, **kwargs):  # type: ignore[arg-type]
            pass
    assert dump(db) == before


# -- resuming under a version ------------------------------------------------------------------


async def test_resuming_under_another_version_is_refused_and_writes_nothing(db: zincir.Database) -> None:
    v1 = await released(db, "v1")
    unversioned = await released(db)
    cancelled_meanwhile = await released(db, "v1")
    # A cancellation its owner never acted on (it died): the next acquisition would end the run.
    rows(
        db,
        "UPDATE agent_runs SET cancel_reason = 'stop', cancel_requested_at = 1 WHERE id = ?",
        (cancelled_meanwhile,),
    )
    before = dump(db)
    for run_id, shown in [(v1, "'v1'"), (unversioned, r"\(none\)"), (cancelled_meanwhile, "'v1'")]:
        with pytest.raises(
            zincir.VersionMismatch, match=f"run {run_id} belongs to version {shown}, not 'v2'"
        ):
            async with zincir.open_run(db, run_id, version="v2", force=True):
                pytest.fail("the block must not run")
        assert dump(db) == before
    async with zincir.open_run(db, v1, version="v1") as same:  # its own version resumes it
        assert same.version == "v1"
        await same.complete()
    async with zincir.open_run(db, unversioned) as anyone:  # no version asked: any run
        await anyone.complete()


# -- routing: a worker claims only its versions' runs -------------------------------------------


async def test_a_worker_claims_only_runs_of_the_versions_it_serves(db: zincir.Database) -> None:
    # The other versions' runs are the most overdue: a worker that ignored versions would take them first.
    v1 = [await released(db, "v1") for _ in range(3)]
    none = [await released(db) for _ in range(2)]
    v2 = [await released(db, "v2") for _ in range(3)]
    handled = Handled()

    await drain(db, handled.handler({"v2"}), {"v2"})
    assert sorted(handled.by({"v2"})) == sorted(v2)
    assert [await attempts(db, run_id) for run_id in v1 + none] == [0] * 5

    await drain(db, handled.handler({"v1", None}), {"v1", None}, max_concurrency=1)
    assert sorted(handled.by({"v1", None})) == sorted(v1 + none)
    assert all(version in served for _, version, served in handled.seen if served is not None)
    assert scalar(db, "SELECT count(*) FROM agent_runs WHERE status = 'completed'") == 8


async def test_runs_woken_by_a_signal_and_children_of_a_v1_parent_stay_with_v1(db: zincir.Database) -> None:
    log: list[tuple[str, str | None, str]] = []

    def handler(served: str) -> zincir.Handler:
        async def handle(run: zincir.Run) -> None:
            log.append((run.id, run.version, served))
            if run.config == {"kind": "waits"}:
                await run.wait_for_signal("w", "go")
            elif run.config == {"kind": "parent"}:
                async with run.children() as nursery:
                    nursery.spawn_soon("child", config={"kind": "child"})
                await run.join(await run.spawn("moved", config={"kind": "child"}, version="v2"))
            await run.complete()

        return handle

    waits = await released(db, "v1", config={"kind": "waits"})
    parent = await released(db, "v1", config={"kind": "parent"})
    # v1's worker: the waiting run suspends on its signal; the parent's child is v1's, so this
    # worker runs it too, and the parent goes on to wait for the child spawned as v2.
    await drain(db, handler("v1"), {"v1"}, suspend_after=0)
    [(child, child_version)] = rows(db, "SELECT id, version FROM agent_runs WHERE spawn_name = 'child'")
    [(moved, moved_version)] = rows(db, "SELECT id, version FROM agent_runs WHERE spawn_name = 'moved'")
    assert (child_version, moved_version) == ("v1", "v2")
    assert {run_id for run_id, _, served in log} == {waits, parent, child}
    await zincir.send_signal(db, waits, "go")  # due now, and workers are told

    await drain(db, handler("v2"), {"v2"}, suspend_after=0)
    assert [entry for entry in log if entry[2] == "v2"] == [(moved, "v2", "v2")]
    assert (await db.state(waits)).run.status is zincir.RunStatus.WAITING  # due, but v1's

    await drain(db, handler("v1"), {"v1"}, suspend_after=0)  # the signal's run, then the parent
    for run_id in (waits, child, moved, parent):
        assert (await db.state(run_id)).run.status is zincir.RunStatus.COMPLETED
    assert all(version == served for _, version, served in log), log


async def test_an_idle_worker_says_how_many_due_runs_it_left_for_other_versions(
    db: zincir.Database, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="zincir.worker")
    for version in ("v1", "v1", None):
        await released(db, version)
    await drain(db, Handled().handler({"v2"}), {"v2", "v3"})
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert skipped == ["worker serving version(s) 'v2', 'v3': skipped 3 due run(s) of other versions"]


@pytest.mark.parametrize(
    ("versions", "match"),
    [
        (set(), "versions is empty"),
        ("v1", "versions must be a set of versions"),
        ({"v1", ""}, "a version in versions must be a string of 1 to 255"),
        ({1}, "a version in versions must be a string"),
    ],
)
async def test_bad_worker_versions_are_refused(db: zincir.Database, versions: object, match: str) -> None:
    with pytest.raises(zincir.InvalidArgument, match=match):
        zincir.ResumeWorker(db, Handled().handler(None), versions=versions)  # type: ignore[arg-type]


# -- moving a run on purpose ---------------------------------------------------------------------


async def test_set_version_moves_a_free_run_logs_it_audits_it_and_routes_it(db: zincir.Database) -> None:
    run_id = await released(db, "v1")
    assert await zincir.set_version(db, run_id, "v2", by="deployer") is True
    assert await zincir.set_version(db, run_id, "v2", by="deployer") is False  # already: nothing written
    state = await db.state(run_id)
    assert state.run.version == "v2"
    [moved] = [e for e in state.events if e.type is zincir.EventType.VERSION_CHANGED]
    assert moved.payload == {"by": "deployer", "from": "v1", "to": "v2"}
    [(action, by, detail)] = rows(
        db, "SELECT action, done_by, detail FROM outsider_actions WHERE run_id = ?", (run_id,)
    )
    assert (action, by, json.loads(detail)) == ("set_version", "deployer", {"from": "v1", "to": "v2"})

    before = dump(db)
    with pytest.raises(zincir.VersionMismatch):
        async with zincir.open_run(db, run_id, version="v1"):
            pytest.fail("the block must not run")
    assert dump(db) == before
    handled = Handled()
    await drain(db, handled.handler({"v1"}), {"v1"})
    await drain(db, handled.handler({"v2"}), {"v2"})
    assert handled.seen == [(run_id, "v2", frozenset({"v2"}))]

    other = await released(db, "v1")
    assert await zincir.set_version(db, other, None) is True  # to no version
    assert (await db.state(other)).run.version is None


async def test_set_version_refuses_a_leased_run_and_an_ended_one_and_writes_nothing(
    db: zincir.Database,
) -> None:
    async with zincir.open_run(db, version="v1") as run:
        before = dump(db)
        with pytest.raises(zincir.RunLeased, match=f"run {run.id} is leased by .* running version 'v1'"):
            await zincir.set_version(db, run.id, "v2", by="deployer")
        assert dump(db) == before
        await run.record_response("still v1's", [], "end")  # its owner is untouched
        await run.complete()
    before = dump(db)
    with pytest.raises(zincir.RunTerminal, match="keeps the version it ran under"):
        await zincir.set_version(db, run.id, "v2")
    with pytest.raises(zincir.RunNotFound):
        await zincir.set_version(db, "00000000-0000-4000-8000-000000000000", "v2")
    with pytest.raises(zincir.InvalidArgument, match="version must be a string"):
        await zincir.set_version(db, run.id, "")
    assert dump(db) == before


async def test_set_version_once_the_owner_lets_go_moves_the_next_claim(db: zincir.Database) -> None:
    """The rule for a leased run: refused while the lease holds, and once its owner lets it go
    (here it backs off) the move takes effect at the next claim."""
    run_id = await released(db, "v1")
    gate = trio.Event()

    async def v1_then_back_off(run: zincir.Run) -> None:
        with pytest.raises(zincir.RunLeased):
            await zincir.set_version(db, run.id, "v2")
        gate.set()
        raise RuntimeError("let it go; it is retried after the backoff")

    worker = zincir.ResumeWorker(db, v1_then_back_off, versions={"v1"}, backoff=zincir.Backoff(initial=60))
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await gate.wait()
        worker.stop()  # returns once the handler's failure is recorded and the run let go
    assert await zincir.set_version(db, run_id, "v2", by="deployer")
    await zincir.retry_now(db, run_id)  # not a minute later
    handled = Handled()
    await drain(db, handled.handler({"v2"}), {"v2"})
    assert handled.seen == [(run_id, "v2", frozenset({"v2"}))]
    types = [e.type for e in (await db.state(run_id)).events]
    assert types.index(zincir.EventType.VERSION_CHANGED) > types.index(zincir.EventType.ATTEMPT_FAILED)


# -- two worker processes of different versions, SIGKILLed -------------------------------------


class WorkerProcess:
    """A real ``zincir worker --version V`` process, its log kept (every line, until it dies)."""

    def __init__(self, db: zincir.Database, version: str, ledger: Path) -> None:
        self.version = version
        env = {**os.environ, "LEDGER": str(ledger), "SERVES": version, "PYTHONPATH": str(REPO)}
        command = [
            sys.executable, "-m", "zincir", "worker", "tests.worker_handlers:note_version_then_complete",
            "--db", db.path, "--version", version, "--poll-interval", "0.05", "--max-concurrency", "4",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.log: list[str] = []

    async def started(self) -> None:
        assert self.proc.stderr is not None
        while not self.log or "worker started" not in self.log[-1]:
            line = await trio.to_thread.run_sync(self.proc.stderr.readline)
            assert line, f"worker exited early: {self.log}"
            self.log.append(line)

    async def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        await self._rest()

    async def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        await self._rest()
        assert self.proc.returncode == 0, self.log

    async def _rest(self) -> None:
        _, err = await trio.to_thread.run_sync(lambda: self.proc.communicate(timeout=60))
        self.log += err.splitlines(keepends=True)

    def claimed_versions(self) -> set[str]:
        """The version of every run this worker's log says it claimed."""
        claims = [re.search(r"claimed run \S+ \(.*version '([^']*)'\)", line) for line in self.log]
        return {found.group(1) for found in claims if found is not None}


def ledger_lines(ledger: Path) -> list[list[str]]:
    return [line.split() for line in ledger.read_text().splitlines()] if ledger.exists() else []


async def test_two_worker_processes_of_two_versions_each_run_completes_on_its_own_version_through_sigkills(
    db: zincir.Database, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.txt"
    # Two runs of each version hang until a worker of theirs is killed; they are the most overdue,
    # so each worker holds them when it is killed. Then 196 more, v1 and v2 interleaved (200 in all).
    hanging = {
        version: [await released(db, version, config={"hang": True}) for _ in range(2)]
        for version in ("v1", "v2")
    }
    ids = [await released(db, "v1" if i % 2 else "v2") for i in range(196)]
    ids += [run_id for runs in hanging.values() for run_id in runs]
    workers = {version: WorkerProcess(db, version, ledger) for version in ("v1", "v2")}
    everyone = list(workers.values())
    try:
        for worker in everyone:
            await worker.started()
        for version in ("v1", "v2"):  # kill each once it holds its hanging runs; a new one takes over

            async def holds(version: str = version) -> bool:
                return {line[0] for line in ledger_lines(ledger)} >= set(hanging[version])

            await until(holds, within=60)
            await workers[version].kill()
            workers[version] = WorkerProcess(db, version, ledger)
            everyone.append(workers[version])
            await workers[version].started()

        async def all_completed() -> bool:
            done = await trio.to_thread.run_sync(
                scalar, db, "SELECT count(*) FROM agent_runs WHERE status = 'completed'"
            )
            return done == len(ids)

        await until(all_completed, within=120, every=0.05)
    finally:
        for worker in everyone:
            if worker.proc.returncode is None:
                await worker.stop()
    for run_id, run_version, served, _ in ledger_lines(ledger):
        assert run_version == served, f"run {run_id} of {run_version} was handled by a worker of {served}"
    assert {line[0] for line in ledger_lines(ledger)} == set(ids)
    for worker in everyone:
        assert worker.claimed_versions() == {worker.version}, worker.log
    # Each hanging run (and any other the kill caught in flight) was taken over from its killed
    # worker by the new worker of its version, on this host at once.
    lost = rows(db, "SELECT run_id FROM events WHERE type = 'attempt_lost'")
    assert {run_id for (run_id,) in lost} >= {r for runs in hanging.values() for r in runs}


# -- the shell ------------------------------------------------------------------------------------


def shell(*args: str) -> Result:
    env = {"ZINCIR_DATABASE_PATH": None, "ZINCIR_UI_ADDRESS": None}
    return CliRunner().invoke(cli_main, list(args), env=env, catch_exceptions=False)


async def test_zincir_runs_by_version_versions_and_show_from_the_shell(db: zincir.Database) -> None:
    async with zincir.open_run(db, version="v1", fingerprints={"prompt": "abc"}) as done:
        await done.complete()
    pending_v1, pending_none = await released(db, "v1"), await released(db)

    def cli(*args: str) -> Result:
        return shell(*args, "--db", db.path)

    listed = await trio.to_thread.run_sync(cli, "runs", "--version", "v1")
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:4] == ["RUN", "STATUS", "ROLE", "VERSION"]
    assert {line.split()[0] for line in lines[1:3]} == {done.id, pending_v1} and lines[3] == ""
    assert "2 shown; 2 in all (pending 0, running 1, waiting 0, completed 1" in listed.stdout
    unversioned = await trio.to_thread.run_sync(cli, "runs", "--version", "")
    assert unversioned.stdout.splitlines()[0].split()[3] == "PROVIDER"  # no version on the page
    assert unversioned.stdout.splitlines()[1].split()[0] == pending_none

    counted = await trio.to_thread.run_sync(cli, "versions")
    assert counted.exit_code == 0, counted.output
    assert [line.split() for line in counted.stdout.splitlines()] == [
        ["VERSION", "PENDING", "RUNNING", "WAITING", "COMPLETED", "FAILED", "CANCELLED", "STATE"],
        ["(none)", "0", "1", "0", "0", "0", "0", "draining", "(1", "left)"],
        ["v1", "0", "1", "0", "1", "0", "0", "draining", "(1", "left)"],
    ]
    shown = await trio.to_thread.run_sync(cli, "show", done.id)
    assert "version      v1" in shown.stdout and '"prompt": "abc"' in shown.stdout
    exported = json.loads((await trio.to_thread.run_sync(cli, "show", done.id, "--json")).stdout)
    assert (exported["run"]["version"], exported["run"]["fingerprints"]) == ("v1", {"prompt": "abc"})


async def test_zincir_set_version_from_the_shell(db: zincir.Database) -> None:
    run_id = await released(db, "v1")

    def cli(*args: str) -> Result:
        return shell(*args, "--db", db.path)

    moved = await trio.to_thread.run_sync(cli, "set-version", run_id[:8], "v2", "--by", "ada")
    assert moved.exit_code == 0, moved.output
    assert moved.stdout.strip() == f"moved {run_id} to version 'v2'; workers serving it claim it from now on"
    again = await trio.to_thread.run_sync(cli, "set-version", run_id, "v2")
    assert again.stdout.strip() == f"{run_id} has version 'v2' already; nothing changed"
    assert rows(db, "SELECT done_by FROM outsider_actions WHERE run_id = ?", (run_id,)) == [("ada",)]
    async with zincir.open_run(db, run_id, version="v2") as run:
        before = dump(db)
        refused = await trio.to_thread.run_sync(cli, "set-version", run_id, "v3")
        assert refused.exit_code == 1 and "is leased by" in refused.stderr, refused.output
        assert dump(db) == before
        await run.complete()
    drained = await trio.to_thread.run_sync(cli, "versions")
    assert [line.split() for line in drained.stdout.splitlines()][1] == [
        "v2",
        "0",
        "0",
        "0",
        "1",
        "0",
        "0",
        "drained",
    ]


async def test_the_shell_reads_versions_of_a_database_from_before_versions(
    db_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zincir import _schema

    every = _schema.load
    with monkeypatch.context() as patch:
        before_versions = lambda backend: [  # noqa: E731 - every migration before versions'
            m for m in itertools.takewhile(lambda m: not m.name.endswith("_versions"), every(backend))
        ]
        patch.setattr(_schema, "load", before_versions)
        async with zincir.open_database(db_target) as old:
            run_id = str(uuid.uuid4())
            insert_started_run(old, run_id)  # (this code writes the columns the old schema lacks)
            columns = _COLUMNS[old.backend]
            assert "version" not in {column for (column,) in rows(old, columns)}

        def cli(*args: str) -> Result:
            return shell(*args, "--db", db_target)

        assert (await trio.to_thread.run_sync(cli, "runs", "--version", "v1")).stdout.startswith("No runs.")
        unversioned = await trio.to_thread.run_sync(cli, "runs", "--version", "")
        assert unversioned.stdout.splitlines()[1].split()[0] == run_id
        counted = await trio.to_thread.run_sync(cli, "versions")
        assert counted.stdout.splitlines()[1].split()[:3] == ["(none)", "0", "1"]
        assert "version      —" in (await trio.to_thread.run_sync(cli, "show", run_id)).stdout


_COLUMNS = {
    "sqlite": "SELECT name FROM pragma_table_info('agent_runs')",
    "postgresql": "SELECT column_name FROM information_schema.columns WHERE table_name = 'agent_runs'",
}


# -- the inspector --------------------------------------------------------------------------------


async def inspect(db: zincir.Database, url: str) -> tuple[int, str]:
    client = create_app(db.path, "127.0.0.1:8787").test_client()
    response = await client.get(url, headers={"Host": "127.0.0.1:8787"})
    return response.status_code, await response.get_data(as_text=True)


async def test_the_inspector_filters_runs_by_version_and_shows_what_is_draining(db: zincir.Database) -> None:
    status, page = await inspect(db, "/")
    assert status == 200 and "Versions still draining" not in page  # no versions: no panel
    v1 = [await released(db, "v1") for _ in range(2)]
    async with zincir.open_run(db, version="v1") as done:
        await done.complete()
    v2, none = await released(db, "v2"), await released(db)

    status, page = await inspect(db, "/")
    assert status == 200 and "<th>Version</th>" in page
    panel = page[
        page.index("Versions still draining") : page.index("</nav>", page.index("Versions still draining"))
    ]
    tabs = re.findall(r'href="([^"]*)">([^<]*) <span class="count">([^<]*)</span>', panel)
    assert [(label.strip(), count) for _, label, count in tabs] == [("(none)", "1"), ("v1", "2"), ("v2", "1")]
    assert [url for url, *_ in tabs] == ["/?unversioned=1", "/?version=v1", "/?version=v2"]

    def listed(page: str) -> set[str]:
        return set(re.findall(r'<a href="/runs/([0-9a-f-]{36})"', page))

    assert listed((await inspect(db, "/?version=v1"))[1]) == {*v1, done.id}
    assert listed((await inspect(db, "/?unversioned=1"))[1]) == {none}
    status, answer = await inspect(db, "/api/runs?version=v2")
    assert status == 200 and [(r["id"], r["version"]) for r in json.loads(answer)["runs"]] == [(v2, "v2")]
    assert (await inspect(db, "/?version=v1&unversioned=1"))[0] == 400

    await zincir.set_version(db, v1[0], "v2", by="ada")
    status, page = await inspect(db, f"/runs/{v1[0]}")
    assert status == 200 and "Moved from version v1 to v2 by ada" in page
