"""How the studies write their reports: the Markdown, the figures as JSON beside it and a chart,
all in ``bench/reports/`` unless ``--out`` says otherwise; and the number formats they share.

Every number in a report comes from the run that wrote it; ``--render JSON`` redraws a report
and its chart from a run's figures without measuring anything.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .charts import Chart, write_chart

REPORTS = Path(__file__).resolve().parents[1] / "reports"  # every study's default --out


def write_outputs(
    out: Path,
    results: dict[str, Any],
    render: Callable[[dict[str, Any], str], str],
    chart: Callable[[dict[str, Any]], Chart] | None = None,
    *,
    json_too: bool = True,
) -> None:
    """``out`` (Markdown, from ``render(results, the chart's file name)``), the chart that
    ``chart(results)`` describes beside it (``.svg``) and, with ``json_too``, the figures
    (``.json``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    svg = out.with_suffix(".svg")
    if chart is not None:
        write_chart(svg, chart(results))
    out.write_text(render(results, svg.name), encoding="utf-8")
    if json_too:
        out.with_suffix(".json").write_text(
            json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8"
        )


def read_results(path: str) -> dict[str, Any]:
    """A run's figures, for ``--render``."""
    results: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    return results


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


# -- numbers --------------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    """The median; NaN for no values (a system that was not measured)."""
    return statistics.median(values) if values else math.nan


def fmt(value: float, digits: int = 0) -> str:
    return "n/a" if math.isnan(value) else f"{value:,.{digits}f}"


def ratio(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}x"


def met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**met**" if ok else "**MISSED**")
