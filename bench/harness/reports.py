"""Where the studies write their reports, and how."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

REPORTS = Path(__file__).resolve().parents[1] / "reports"  # every study's default --out


def shown_command(program: str, argv: Sequence[str]) -> str:
    """The command line as a reader would rerun it: without the paths and the server this run
    was given (``--dir``, ``--out``, ``--url``), which would make a report noisy."""
    hidden = ("--dir", "--out", "--url")
    shown: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in hidden:
            skip = True
        elif not arg.startswith(tuple(f"{option}=" for option in hidden)):
            shown.append(arg)
    return " ".join([program, *shown])
