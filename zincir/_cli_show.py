"""``zincir show`` and ``zincir checkpoints``: one run in full, and its checkpoint lineage.

Read-only like the other inspection commands (see :mod:`zincir._cli_inspect`, whose plumbing
they use): every stored value goes through :func:`~zincir._cli_inspect.cell`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import click

from . import _queries as q
from ._cli_inspect import _json_line, _table, _time, cell, clean_errors, readonly_database
from ._cli_options import database_option
from ._inspector._plain import human_delta

__all__ = ["checkpoints", "show"]


@click.command("show")
@database_option
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead.")
def show(database_path: str, run_id: str, as_json: bool) -> None:
    """Show one run: lease, attempts, why it failed or was cancelled, family, configuration,
    result, waits, tool calls, outsiders' actions, checkpoints, steps, timers."""
    with clean_errors(), readonly_database(database_path) as conn, q.read_snapshot(conn):
        run = q.get_run(conn, q.resolve_run_id(conn, run_id))
        checkpoints = q.list_checkpoints(conn, run.id)
        steps = q.list_steps(conn, run.id)
        timers = q.list_timers(conn, run.id)
        awaiting = q.list_awaiting(conn, [run.id]).get(run.id, ())
        budget = q.budgets_of(conn, [run.id], time.time_ns() // 1_000_000).get(run.id)
        intents = q.list_intents(conn, run.id)
        calls = q.model_calls(conn, run.id)
        actions = q.list_outsider_actions(conn, run.id, max_chars=None)
        reason = q.end_reason(conn, run.id, run.status)
        if as_json:
            data = _show_json(run, checkpoints, steps, timers, awaiting)
            data["run"]["reason"] = reason
            data["model_calls"] = {
                "in_flight": None if calls.open is None else q.model_call_to_json(calls.open),
                "lost": [q.model_call_to_json(c) for c in calls.lost],
            }
            data["tool_calls"] = [q.intent_to_json(i) for i in intents]
            data["outsider_actions"] = [q.outsider_action_to_json(a) for a in actions]
            click.echo(_json_line(data))
        else:
            _print_run(run, time.time_ns() // 1_000_000, reason)
            click.echo(f"{'budget':<13}{cell(q.spend_text(budget)) if budget else 'none'}")
            _print_awaiting(run, awaiting)
            _print_model_calls(run, calls, time.time_ns() // 1_000_000)
            _print_intents(intents)
            _print_outsider_actions(actions)
            _print_lineage(checkpoints)
            _print_steps(steps)
            _print_timers(timers)


@click.command("checkpoints")
@database_option
@click.argument("run_id")
def checkpoints(database_path: str, run_id: str) -> None:
    """Show a run's checkpoint lineage: round, status, based-on and decision seqs, verdict;
    then each round's whole verification (the verifier's evidence)."""
    with clean_errors(), readonly_database(database_path) as conn, q.read_snapshot(conn):
        run = q.get_run(conn, q.resolve_run_id(conn, run_id), children_limit=0)
        _print_lineage(q.list_checkpoints(conn, run.id))


def _show_json(
    run: q.RunDetail,
    checkpoints: Sequence[q.CheckpointRow],
    steps: Sequence[q.StepRow],
    timers: Sequence[q.TimerRow],
    awaiting: Sequence[q.Awaiting],
) -> dict[str, Any]:
    return {
        "run": q.run_to_json(run),
        "awaiting": [q.awaiting_to_json(a) for a in awaiting],
        "children_total": run.children_total,
        "checkpoints": [q.checkpoint_to_json(run.id, c) for c in checkpoints],
        "steps": [q.step_to_json(run.id, s) for s in steps],
        "timers": [q.timer_to_json(run.id, t) for t in timers],
    }


def _lease_text(run: q.RunDetail, now: int) -> str:
    epoch = cell(run.lease_epoch)
    if run.lease_owner is None:
        return f"free (epoch {epoch})"
    expires = run.lease_expires_at
    if type(expires) is not int:
        return f"{cell(run.lease_owner)}, epoch {epoch}, until {_time(expires)}"
    state = f"active, expires {human_delta(expires - now)}" if expires > now else "expired"
    return f"{cell(run.lease_owner)}, epoch {epoch}, until {_time(expires)} ({state})"


def _next_attempt_text(next_attempt: object, status: str) -> str:
    if status in ("completed", "failed", "cancelled"):
        return "none (the run has ended)"
    if next_attempt is None:
        return "when what it awaits arrives"
    return "any time" if type(next_attempt) is int and next_attempt <= 0 else _time(next_attempt)


def _fork_fields(run: q.RunDetail) -> list[tuple[str, str]]:
    """Where a fork came from, and the forks of a run (docs/forks.md): only when there are."""
    fields = []
    if run.forked_from is not None:
        fields.append(("forked from", f"{cell(run.forked_from)} at seq {cell(run.fork_seq)}"))
    if run.forks:
        listed = ", ".join(
            f"{cell(f.run.id)} at seq {cell(f.fork_seq)} ({cell(f.run.status)})" for f in run.forks
        )
        fields.append((f"forks ({len(run.forks)}{'+' if run.forks_more else ''})", listed))
    if run.erased_at is not None:  # zincir erase: its payloads can never be read again
        fields.append(("erased", f"{_time(run.erased_at)}: its payloads are gone"))
    return fields


def _print_run(run: q.RunDetail, now: int, reason: str | None) -> None:
    children = ", ".join(f"{cell(c.id)} ({cell(c.status)})" for c in run.children) or "none"
    if run.children_total > len(run.children):
        more = run.children_total - len(run.children)
        children += f", and {more}{'+' if run.children_capped else ''} more"
    next_attempt = run.next_attempt_at
    fields = [
        ("run", cell(run.id)),
        ("status", cell(run.status)),
        ("role", cell(run.role)),
        ("provider", cell(run.provider) or "—"),
        ("version", cell(run.version)),
        ("parent", cell(run.parent_run_id)),
        ("children", children),
        *_fork_fields(run),
        ("created", _time(run.created_at)),
        ("activity", _time(run.updated_at)),
        ("events", cell(run.event_count)),
        ("lease", _lease_text(run, now)),
        ("attempts", cell(run.attempts)),
        ("next attempt", _next_attempt_text(next_attempt, run.status)),
    ]
    if reason is not None:  # why it failed, or was cancelled
        fields.append(("reason", cell(reason)))
    for name, value in fields:
        click.echo(f"{name:<13}{value}")
    _print_json_block("config", run.config)
    if run.fingerprints is not None:
        _print_json_block("fingerprints", run.fingerprints)
    if run.result is not None:
        _print_json_block("result", run.result)
    elif run.status == "completed":
        click.echo(f"{'result':<13}none (completed without a result)")


def _print_json_block(name: str, stored: str) -> None:
    """A stored JSON value, pretty-printed and indented under its name."""
    text = json.dumps(q.json_value(stored), indent=2, ensure_ascii=True)
    indent = " " * (len(name) - len(name.lstrip()) + 2)
    click.echo(name)
    click.echo("\n".join(f"{indent}{cell(line)}" for line in text.splitlines()))


def _print_awaiting(run: q.RunDetail, awaiting: Sequence[q.Awaiting]) -> None:
    rows = [
        [
            cell(a.kind),
            cell(a.name, 40),
            cell(a.target, 40),
            _time(a.since),
            _time(a.until),
            "yes" if a.wakes else "",
        ]
        for a in awaiting
    ]
    _print_section("awaiting", ["KIND", "NAME", "FOR", "SINCE", "UNTIL", "WAKES IT"], rows, frozenset())
    if run.status == "waiting":
        due = run.next_attempt_at
        first = "when the first of the waits that wake it arrives"
        when = first if due is None else f"at {_time(due)}, or sooner {first}"
        click.echo(f"  suspended: no process holds it; a worker resumes it {when}")


def _print_model_calls(run: q.RunDetail, calls: q.ModelCalls, now: int) -> None:
    """The call in flight (a mark no reply closed yet) and the calls lost, newest first."""
    rows = []
    if calls.open is not None:
        rows.append([*_call_cells(calls.open), _open_call_state(run, now), _time(calls.open.at)])
    for c in calls.lost:
        state = f"lost, charged at seq {cell(c.lost_seq)} (found by the {cell(c.found_by).replace('_', ' ')})"
        rows.append([*_call_cells(c), state, _time(c.at)])
    headers = ["MARK", "MODEL", "REQUEST TOKENS", "COST", "EPOCH", "STATE", "SINCE"]
    _print_section("model calls without a recorded reply", headers, rows, frozenset({0, 2, 3, 4}))


def _call_cells(call: q.ModelCall) -> list[str]:
    return [
        cell(call.mark_seq),
        cell(call.model, 40),
        cell(call.request_tokens),
        cell(call.cost),
        cell(call.epoch),
    ]


def _open_call_state(run: q.RunDetail, now: int) -> str:
    if run.status in ("completed", "failed", "cancelled"):
        return "never answered (the run ended)"
    if run.lease_owner is not None and type(run.lease_expires_at) is int and run.lease_expires_at > now:
        return "in flight (or lost with its owner: charged when the run is taken again)"
    return "lost in flight: charged when the run is taken again"


def _print_intents(intents: Sequence[q.IntentRow]) -> None:
    rows = [
        [cell(i.call_id, 40), cell(i.name, 32), cell(i.state), cell(i.started), _time(i.last_started_at)]
        for i in intents
    ]
    headers = ["CALL", "TOOL", "STATE", "STARTS", "LAST START"]
    _print_section("tool calls", headers, rows, frozenset({3}))


def _print_outsider_actions(actions: Sequence[q.OutsiderAction]) -> None:
    rows = [[_time(a.created_at), cell(a.action), cell(a.by), cell(a.detail, 72)] for a in actions]
    _print_section("outsiders' actions, newest first", ["WHEN", "ACTION", "BY", "DETAIL"], rows, frozenset())


def _print_section(title: str, headers: list[str], rows: list[list[str]], numeric: frozenset[int]) -> None:
    click.echo(f"\n{title} ({len(rows)})")
    if rows:
        click.echo("\n".join(f"  {line}" for line in _table(headers, rows, numeric).splitlines()))


def _verdict(verification: str | None) -> str:
    """``passed`` or ``failed`` from a stored verification; ``—`` for none, ``?`` if unreadable."""
    if verification is None:
        return "—"
    value = q.json_value(verification)
    passed = value.get("passed") if isinstance(value, dict) else None
    if not isinstance(passed, bool):
        return "?"
    return "passed" if passed else "failed"


def _print_lineage(checkpoints: Sequence[q.CheckpointRow]) -> None:
    rows, baseline = [], "goal"
    for c in checkpoints:
        rows.append(
            [
                cell(c.round),
                cell(c.id),
                cell(c.status),
                cell(baseline),
                cell(c.based_on_event_seq),
                cell(c.decision_event_seq),
                cell(c.tool_call_id, 24),
                _time(c.created_at),
                _verdict(c.verification),
            ]
        )
        if c.status == "accepted":
            baseline = f"round {c.round}"
    headers = [
        "ROUND",
        "ID",
        "STATUS",
        "BUILDS ON",
        "BASED ON",
        "DECISION",
        "TOOL CALL",
        "PROPOSED",
        "VERDICT",
    ]
    _print_section("checkpoints", headers, rows, frozenset({0, 1, 4, 5}))
    # The verifier's evidence, whole: it is what a person reads to trust a round.
    for c in checkpoints:
        if c.verification is not None:
            _print_json_block(f"  verification of round {cell(c.round)} ({cell(c.status)})", c.verification)


def _print_steps(steps: Sequence[q.StepRow]) -> None:
    rows = [
        [cell(s.name, 40), cell(s.status), cell(s.epoch), _time(s.started_at), _time(s.completed_at)]
        for s in steps
    ]
    _print_section("steps", ["NAME", "STATUS", "EPOCH", "STARTED", "COMPLETED"], rows, frozenset({2}))


def _print_timers(timers: Sequence[q.TimerRow]) -> None:
    rows = [[cell(t.name, 40), _time(t.wake_at), _time(t.completed_at)] for t in timers]
    _print_section("timers", ["NAME", "WAKES AT", "COMPLETED"], rows, frozenset())


# --------------------------------------------------------------------------- events
