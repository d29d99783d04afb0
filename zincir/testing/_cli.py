"""``zincir crash-test``: the shell's way to :func:`~zincir.testing.crash_test` (zincir/_cli.py
imports this only when the command runs)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, Literal, TextIO

import click
import trio

from .._errors import ZincirError
from ._crash import crash_test
from ._report import Boundary, CrashReport

__all__ = ["run"]

_BAR = 30


def run(
    handler: str,
    config_json: str,
    *,
    role: str,
    backend: Literal["sqlite", "postgresql"],
    boundaries: str,
    labels: Sequence[str],
    seed: int,
    timeout: float,
    postgres_url: str | None,
) -> int:
    """Run the crash test, drawing progress on stderr and the table on stdout; the exit status."""
    try:
        config = json.loads(config_json)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--config") from None
    chosen: Any
    if labels:
        chosen = list(labels)
    elif boundaries == "all":
        chosen = "all"
    elif boundaries.isdigit() and int(boundaries) >= 1:
        chosen = int(boundaries)
    else:
        raise click.BadParameter(f"'all' or a number >= 1, not {boundaries!r}", param_hint="--boundaries")
    bar = _Progress(sys.stderr)

    async def test() -> CrashReport:
        return await crash_test(
            handler,
            config,
            role=role,
            backend=backend,
            boundaries=chosen,
            seed=seed,
            timeout=timeout,
            postgres_url=postgres_url,
            progress=bar.show,
        )

    bar.start(handler, backend)
    try:
        report = trio.run(test)
    except ZincirError as exc:
        bar.end()
        raise click.ClickException(str(exc)) from None
    bar.end()
    click.echo(report.table())
    return 0 if report.passed else 1


class _Progress:
    """``[#####.....] 7/16 after commit 3 of root: passed``, redrawn in place on a terminal, one
    line a boundary elsewhere (a log, CI)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._live = out.isatty()

    def start(self, handler: str, backend: str) -> None:
        self._write(
            f"crash-testing {handler} on {backend}: learning its boundaries from an uninterrupted run"
        )
        self._out.write("\n")

    def show(self, done: int, total: int, boundary: Boundary) -> None:
        filled = _BAR * done // max(total, 1)
        text = (
            f"[{'#' * filled}{'.' * (_BAR - filled)}] {done}/{total}"
            f" {boundary.description}: {boundary.outcome}"
        )
        self._write(text)
        if not self._live:
            self._out.write("\n")

    def end(self) -> None:
        if self._live:
            self._out.write("\n")
        self._out.flush()

    def _write(self, text: str) -> None:
        self._out.write(f"\r\x1b[K{text}" if self._live else text)
        self._out.flush()
