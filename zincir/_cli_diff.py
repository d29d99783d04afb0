"""``zincir diff``: two runs' trajectories side by side (a run and its fork, most often)."""

from __future__ import annotations

import json

import click

from . import _queries as q
from ._cli_inspect import cell, clean_errors, readonly_database
from ._cli_options import database_option

__all__ = ["diff_command"]

_WIDTH = 48


@click.command("diff")
@click.argument("run_a", metavar="RUN_A")
@click.argument("run_b", metavar="RUN_B")
@click.option("--limit", type=click.IntRange(1, 10_000), default=q.DEFAULT_PAGE, show_default=True,
              help="Events shown per side after the divergence.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead.")
@database_option
def diff_command(run_a: str, run_b: str, limit: int, as_json: bool, database_path: str) -> None:
    """Compare two runs: how many events they share from the start, where they part, then each
    side's responses, tool calls and results side by side, and what each spent after."""
    with clean_errors(), readonly_database(database_path) as conn, q.read_snapshot(conn):
        diff = q.diff_runs(conn, q.resolve_run_id(conn, run_a), q.resolve_run_id(conn, run_b), limit=limit)
    if as_json:
        click.echo(json.dumps(diff.to_json(), sort_keys=True, ensure_ascii=True))
        return
    for name, side in (("A", diff.a), ("B", diff.b)):
        lineage = (
            ""
            if side.run.forked_from is None
            else f", forked from {side.run.forked_from} at seq {side.run.fork_seq}"
        )
        click.echo(f"{name}: {side.run.id} ({cell(side.run.status)}{lineage})")
    if diff.a.run.config != diff.b.run.config:
        click.echo(f"config A: {cell(diff.a.run.config, 100)}")
        click.echo(f"config B: {cell(diff.b.run.config, 100)}")
    click.echo(
        f"common prefix: {diff.common} events" + (f" (seq 0..{diff.common - 1})" if diff.common else "")
    )
    if diff.identical:
        click.echo("the two logs are the same")
        return
    click.echo(f"first divergence at seq {diff.common}:")
    for name, first in (("A", diff.first_a), ("B", diff.first_b)):
        click.echo(
            f"  {name}: " + ("(ends here)" if first is None else f"{first.type} {cell(first.payload, 90)}")
        )
    click.echo("")
    click.echo(f"{'A':<{_WIDTH}} | B")
    for left, right in q.side_by_side(diff, _WIDTH):
        click.echo(f"{cell(left):<{_WIDTH}} | {cell(right)}")
    for name, side in (("A", diff.a), ("B", diff.b)):
        if side.more:
            click.echo(f"({name} has more: {side.events_after} events after the divergence; see --limit)")
    click.echo("")
    click.echo("spent after the divergence:")
    for name, side in (("A", diff.a), ("B", diff.b)):
        s = side.spend
        click.echo(
            f"  {name}: {s.model_calls} model calls, {s.tool_calls} tool calls, {s.input_tokens} input"
            f" tokens, {s.output_tokens} output tokens, cost {s.cost:g}"
        )
