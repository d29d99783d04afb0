"""Read-only CLI commands: ``zincir ui``, ``runs``, ``tree``, ``events``, ``export``, ``versions``
(``show`` and ``checkpoints`` are in :mod:`zincir._cli_show`), and the plumbing they share.

They share :mod:`zincir._queries` with the web inspector, open the database read-only
(SQLite's ``mode=ro``; on PostgreSQL, read-only transactions), never migrate and never write.
Every failure is one line on stderr and exit status 1.
Every stored value is printed through :func:`cell` (control and bidi characters escaped), so a
hostile value cannot drive the terminal, whatever its column; JSON output is pure ASCII with
control characters escaped. Stored ``NaN``/``Infinity`` print as the strings ``"NaN"``,
``"Infinity"`` (see :func:`zincir._queries.parse_json`).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import sys
import time
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import click
import trio

from . import _queries as q
from ._cli_options import DATABASE_ENV, database_option, os_user
from ._crypto import KeyRing, keys_from_env
from ._errors import ZincirError
from ._inspector._plain import DEFAULT_ADDRESS
from ._target import parse_target

__all__ = [
    "cell",
    "clean_errors",
    "events",
    "export",
    "readonly_database",
    "register",
    "require_file",
    "runs",
    "terminal_text",
    "ui",
]

UI_ADDRESS_ENV = "ZINCIR_UI_ADDRESS"
FOLLOW_INTERVAL = 0.5
PAYLOAD_CHARS = 1000


# --------------------------------------------------------------------------- plumbing


def _leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


@contextlib.contextmanager
def clean_errors() -> Iterator[None]:
    """Turn zincir errors into a one-line ``Error: ...`` and exit status 1."""
    try:
        yield
    except ZincirError as error:
        raise click.ClickException(str(error)) from None
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, like other Unix tools.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        sys.exit(0)


def require_file(target: str, never: str = "inspection never creates one") -> None:
    """A SQLite file must exist (``never`` says why none is created); a server URL is checked
    by connecting."""
    with clean_errors():
        where = parse_target(target)
    if where.backend == "postgresql":
        return
    path = where.location
    if not os.path.isfile(path):
        raise click.ClickException(
            f"database file {path!r} does not exist (give --db PATH or set {DATABASE_ENV}); {never}"
        )


def keys_if_encrypted(path: str) -> KeyRing | None:
    """The environment's master keys for a command that writes to the database at ``path``, if
    that database is encrypted (wrong keys are refused here); None if it is not. The CLI never
    turns encryption on, only an application's ``open_database(encryption_key=...)`` does: a
    key left in the environment for another database must not lock this one (docs/cli.md)."""
    with clean_errors():
        keys = keys_from_env()
        if keys is None:
            return None
        with readonly_database(path) as conn, q.read_snapshot(conn):
            encrypted = conn.has_table("encryption_keys") and bool(
                list(conn.execute("SELECT 1 FROM encryption_keys LIMIT 1"))
            )
    return keys if encrypted else None


@contextlib.contextmanager
def readonly_database(path: str) -> Iterator[q.Reader]:
    require_file(path)
    conn = q.open_readonly(path)
    try:
        yield conn
    finally:
        conn.close()


def _terminal_safe(text: str) -> str:
    """Escape control, format (bidi) and separator characters of a stored string."""
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char.isprintable():
            out.append(char)
        elif unicodedata.category(char) == "Zs":
            out.append(" ")
        else:
            out.append(char.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def terminal_text(text: str) -> str:
    """A stored text to print as text (a streamed answer): its line breaks and tabs kept, every
    other control, format or separator character escaped."""
    return "\n".join(
        "\t".join(_terminal_safe(part) for part in line.split("\t")) for line in text.split("\n")
    )


def cell(value: object, width: int | None = None) -> str:
    """A stored value as one terminal-safe cell, cut to ``width`` characters."""
    text = _terminal_safe("—" if value is None else str(value))
    if width is not None and len(text) > width:
        text = text[: width - 1] + "…"
    return text


def _time(ms: object) -> str:
    if ms is None:
        return "—"
    if type(ms) is not int:
        return cell(ms)
    try:
        moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: frozenset[int]) -> str:
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(row) for row in rows)])


def _compact(value: Any) -> str:
    """One-line JSON for display (pass it through :func:`cell` before printing)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True)


def _json_line(value: Any) -> str:
    """A JSON Lines record: ASCII only, every control character escaped (DEL too)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return text.replace("\x7f", "\\u007f")


# --------------------------------------------------------------------------- ui


@click.command("ui")
@database_option
@click.option(
    "--address",
    envvar=UI_ADDRESS_ENV,
    default=None,
    help=f"Loopback IP:PORT to serve on, [::1]:PORT for IPv6; port 0 picks one (env {UI_ADDRESS_ENV})."
    f" Default {DEFAULT_ADDRESS}; with --allow-actions, a random 127.x.y.z and port of its own, so"
    " that no other local server receives the session cookie.",
)
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Also allow actions (approve/deny, signal, cancel, retry now, raise a budget) after a"
    " one-time login; without it the inspector opens no write connection at all.",
)
@click.option(
    "--as",
    "actor",
    default=None,
    metavar="NAME",
    help="Who the actions are recorded as (default: your OS user name). Needs --allow-actions.",
)
def ui(database_path: str, address: str | None, allow_actions: bool, actor: str | None) -> None:
    """Serve the web inspector on a loopback address until Ctrl+C or SIGTERM.

    Read-only unless --allow-actions: then it prints a one-time login URL, and a browser logged
    in with it can act on runs, each action recorded with the --as name.
    """
    if actor is not None and not allow_actions:
        raise click.UsageError("--as names who acts: it needs --allow-actions")
    require_file(database_path)
    try:
        if allow_actions:
            trio.run(_serve_ui_with_actions, database_path, address, actor or os_user())
        else:
            trio.run(_serve_ui, database_path, address or DEFAULT_ADDRESS)
    except BaseException as error:
        leaf = _leaf(error)
        if isinstance(leaf, ZincirError):
            raise click.ClickException(str(leaf)) from None
        if isinstance(leaf, OSError):
            where = address or ("a loopback address" if allow_actions else DEFAULT_ADDRESS)
            raise click.ClickException(f"cannot serve on {where}: {leaf.strerror or leaf}") from None
        if isinstance(leaf, KeyboardInterrupt):
            return  # a second Ctrl+C during the graceful shutdown
        raise


async def _serve_ui(database_path: str, address: str) -> None:
    from ._inspector._serve import serve  # the web stack: only `zincir ui` loads it

    async with trio.open_nursery() as nursery:
        url = await nursery.start(functools.partial(serve, database_path, address))
        shown = q.display_target(database_path)
        click.echo(f"zincir inspector: serving {shown} read-only at {url} (Ctrl+C to stop)")
    click.echo("zincir inspector: stopped")


async def _serve_ui_with_actions(database_path: str, address: str | None, actor: str) -> None:
    from ._inspector._actions import serve_with_actions  # only this mode imports the writes

    async with trio.open_nursery() as nursery:
        start = functools.partial(serve_with_actions, database_path, address, actor=actor)
        url, login_url = await nursery.start(start)
        shown = q.display_target(database_path)
        click.echo(f"zincir inspector: serving {shown} at {url}, actions allowed as {actor} (Ctrl+C to stop)")
        click.echo(f"zincir inspector: log in once with {login_url}")
        if address is None and url.startswith("http://127.0.0.1:"):
            click.echo(
                "zincir inspector: no loopback address of its own could be bound here, so other"
                " servers on 127.0.0.1 receive the session cookie; see docs/inspector.md"
            )
    click.echo("zincir inspector: stopped")


# --------------------------------------------------------------------------- runs


@click.command("runs")
@database_option
@click.option("--status", type=click.Choice(q.RUN_STATUSES), help="Only runs with this status.")
@click.option("--role", help="Only runs with this role.")
@click.option("--version", help="Only runs of this version of the agent ('' for runs without one).")
@click.option("--limit", type=click.IntRange(1, q.MAX_PAGE), default=20, show_default=True)
@click.option("--before", "cursor", metavar="CURSOR", help="Continue after this cursor (printed below).")
def runs(
    database_path: str,
    status: str | None,
    role: str | None,
    version: str | None,
    limit: int,
    cursor: str | None,
) -> None:
    """List runs, most recent activity first, with counts per status."""
    with clean_errors(), readonly_database(database_path) as conn, q.read_snapshot(conn):
        before = None if cursor is None else q.parse_cursor(cursor)
        page = q.list_runs(conn, status=status, role=role, limit=limit, before=before, version=version)
        awaiting = q.list_awaiting(conn, [r.id for r in page.runs if r.status in ("running", "waiting")])
        budgets = q.budgets_of(conn, [r.id for r in page.runs], time.time_ns() // 1_000_000)
        _print_runs(page, awaiting, budgets)


def _awaits_text(items: Sequence[q.Awaiting]) -> str:
    """The soonest thing a run awaits, and until when; "+N" more."""
    if not items:
        return "—"
    first = items[0]
    text = f"{first.describe()} {'for ever' if first.until is None else 'until ' + _time(first.until)}"
    return text + (f" (+{len(items) - 1})" if len(items) > 1 else "")


def _print_runs(
    page: q.RunPage, awaiting: Mapping[str, Sequence[q.Awaiting]], budgets: Mapping[str, q.Usage]
) -> None:
    counts = ", ".join(f"{s} {page.counts[s]}{'+' if s in page.capped else ''}" for s in q.RUN_STATUSES)
    if not page.runs:
        click.echo(f"No runs. ({counts})")
        return
    rows = [
        [
            cell(run.id),
            cell(run.status),
            cell(run.role, 24),
            cell(run.provider, 16),
            cell(run.event_count),
            cell(run.attempts),
            _time(run.updated_at),
            cell(q.spend_text(budgets[run.id]) if run.id in budgets else None, 48),
            cell(_awaits_text(awaiting.get(run.id, ())), 72),
        ]
        for run in page.runs
    ]
    headers = ["RUN", "STATUS", "ROLE", "PROVIDER", "EVENTS", "ATTEMPTS", "LAST ACTIVITY", "BUDGET", "AWAITS"]
    if any(run.version is not None for run in page.runs):  # a column only where versions are used
        headers.insert(3, "VERSION")
        for row, run in zip(rows, page.runs, strict=True):
            row.insert(3, cell(run.version, 24))
    click.echo(_table(headers, rows, frozenset({5, 6} if "VERSION" in headers else {4, 5})))
    total = f"{page.total}+" if page.capped else f"{page.total}"
    click.echo(f"\n{len(page.runs)} shown; {total} in all ({counts})")
    if page.has_older:
        click.echo(f"more: --before {cell(page.runs[-1].cursor.encode())}")


@click.command("events")
@database_option
@click.argument("run_id")
@click.option(
    "--after",
    type=click.IntRange(min=-1, max=q.MAX_INT),
    default=-1,
    show_default=True,
    help="Start after this seq.",
)
@click.option("--type", "event_type", help="Only events of this type.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events until the run ends or Ctrl+C.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON Lines with whole payloads.")
@click.option("--full", is_flag=True, help=f"Do not cut payloads at {PAYLOAD_CHARS} characters.")
def events(
    database_path: str,
    run_id: str,
    after: int,
    event_type: str | None,
    follow: bool,
    as_json: bool,
    full: bool,
) -> None:
    """Print a run's events in seq order, page by page (never the whole log in memory)."""
    with clean_errors(), readonly_database(database_path) as conn:
        with q.read_snapshot(conn):
            run_id = q.resolve_run_id(conn, run_id)
        printer = functools.partial(_print_event, run_id, as_json=as_json, full=full)
        try:
            _stream_events(conn, run_id, after, event_type, follow, printer)
        except KeyboardInterrupt:
            return


def _stream_events(
    conn: q.Reader,
    run_id: str,
    after: object,
    event_type: str | None,
    follow: bool,
    printer: Any,
) -> None:
    while True:
        with q.read_snapshot(conn):
            status = q.get_run(conn, run_id, children_limit=0).status
            page = q.list_events(conn, run_id, after=after, type=event_type)
        for event in page.events:
            printer(event)
        if page.has_after and page.next_after is not None and page.next_after != after:
            after = page.next_after  # after the last event, or past a type filter's scan window
            continue
        if page.events:
            after = q.raw_value(page.events[-1].seq)
        if not follow or status in ("completed", "failed", "cancelled"):
            return
        time.sleep(FOLLOW_INTERVAL)


def _print_event(run_id: str, event: q.EventRow, *, as_json: bool, full: bool) -> None:
    if as_json:
        click.echo(_json_line(q.event_to_json(run_id, event)))
        return
    payload = cell(_compact(q.json_value(event.payload)))
    if not full and len(payload) > PAYLOAD_CHARS:
        payload = f"{payload[:PAYLOAD_CHARS]}… ({len(payload)} chars; --full shows all)"
    click.echo(f"#{cell(event.seq):<6} {_time(event.created_at)}  {cell(event.type):<20} {payload}")


# --------------------------------------------------------------------------- export


@click.command("export")
@database_option
@click.argument("run_id")
def export(database_path: str, run_id: str) -> None:
    """Write one run as JSON Lines: the run, then its events, checkpoints, steps, timers,
    outsiders' actions and its streams' chunks.

    Every line has a "kind" (run, event, checkpoint, step, timer, outsider_action,
    stream_chunk); all are read from one consistent snapshot, events and chunks page by page.
    """
    with clean_errors(), readonly_database(database_path) as conn, q.read_snapshot(conn):
        run = q.get_run(conn, q.resolve_run_id(conn, run_id), children_limit=1000)
        _emit("run", {**q.run_to_json(run), "children_total": run.children_total})
        for event in q.iter_events(conn, run.id):
            _emit("event", q.event_to_json(run.id, event))
        for checkpoint in q.list_checkpoints(conn, run.id):
            _emit("checkpoint", q.checkpoint_to_json(run.id, checkpoint))
        for step in q.list_steps(conn, run.id):
            _emit("step", q.step_to_json(run.id, step))
        for timer in q.list_timers(conn, run.id):
            _emit("timer", q.timer_to_json(run.id, timer))
        for action in reversed(q.list_outsider_actions(conn, run.id, max_chars=None)):
            _emit("outsider_action", q.outsider_action_to_json(action))
        for chunk in q.iter_stream_chunks(conn, run.id):
            _emit("stream_chunk", q.stream_chunk_to_json(run.id, chunk))


def _emit(kind: str, data: dict[str, Any]) -> None:
    click.echo(_json_line({"kind": kind, **data}))


# --------------------------------------------------------------------------- registration


@click.command("tree")
@database_option
@click.argument("run_id")
@click.option("--depth", type=click.IntRange(1, 100), default=20, show_default=True, help="Levels shown.")
@click.option(
    "--width", type=click.IntRange(1, 1000), default=50, show_default=True, help="Children per run."
)
def tree(database_path: str, run_id: str, depth: int, width: int) -> None:
    """Show a run's family: its ancestors, then it and its descendants with their statuses."""
    with clean_errors(), readonly_database(database_path) as conn, q.read_snapshot(conn):
        ancestors, node = q.family_tree(conn, q.resolve_run_id(conn, run_id), depth=depth, per_node=width)
    for ancestor in ancestors:
        click.echo(f"{_family_line(ancestor)}  (ancestor)")
    for line in _tree_lines(node, ""):
        click.echo(line)


def _family_line(run: q.RunSummary) -> str:
    return f"{cell(run.id)}  {cell(run.status)}  {cell(run.role, 40)}"


def _tree_lines(node: q.FamilyNode, indent: str) -> Iterator[str]:
    yield _family_line(node.run)
    entries: list[q.FamilyNode | int] = [*node.children, *([node.more] if node.more else [])]
    for i, entry in enumerate(entries):
        last = i == len(entries) - 1
        branch, below = ("└─ ", "   ") if last else ("├─ ", "│  ")
        if isinstance(entry, int):
            yield f"{indent}{branch}… {entry} more"
            continue
        lines = _tree_lines(entry, indent + below)
        yield f"{indent}{branch}{next(lines)}"
        yield from lines


# --------------------------------------------------------------------------- versions


@click.command("versions")
@database_option
def versions(database_path: str) -> None:
    """How many runs each version of the agent has, per status: a version with pending, running
    or waiting runs is still draining (a worker serving it must stay up). See docs/versions.md."""
    with clean_errors(), readonly_database(database_path) as conn, q.read_snapshot(conn):
        found, more = q.count_versions(conn)
    if not found:
        click.echo("No runs.")
        return
    statuses = [*q.RUN_STATUSES, *(["other"] if any("other" in v.counts for v in found) else [])]
    rows = [
        [
            "(none)" if v.version is None else cell(v.version, 40),
            *(str(v.counts.get(status, 0)) for status in statuses),
            f"draining ({v.live} left)" if v.live else "drained",
        ]
        for v in found
    ]
    headers = ["VERSION", *(status.upper() for status in statuses), "STATE"]
    click.echo(_table(headers, rows, frozenset(range(1, len(statuses) + 1))))
    if more:
        click.echo(f"\n(the first {q.MAX_VERSIONS} versions by name are shown)")


def register(group: click.Group) -> None:
    """Add the inspection commands to the ``zincir`` group."""
    for command in (ui, runs, tree, events, export, versions):
        group.add_command(command)
