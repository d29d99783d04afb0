"""What the parent and every child of ``python -m bench.recovery`` share: the ledger file and the
tool's shape.

The ledger is a plain text file, one per trial. The non-idempotent tool appends one line to it
(``open(path, "a")``, one ``write``, no key, no check): ``<step>\\t<call id>\\n``. The call id is on
the line only so that a reconciler can *look* for it afterwards; nothing dedupes on it.
"""

from __future__ import annotations

from pathlib import Path

TOOL_BEFORE_S = 0.010  # the request on its way: the effect has not happened yet
TOOL_AFTER_S = 0.010  # the effect happened; its answer is on its way back


def is_tool_step(i: int, every: int) -> bool:
    return i % every == every - 1


def tool_steps(steps: int, every: int) -> list[int]:
    return [i for i in range(steps) if is_tool_step(i, every)]


def append_line(path: str, step: int, call_id: str) -> None:
    """The effect: a plain append, as a tool writing to a log, a file, a chat would."""
    with open(path, "a", encoding="utf-8") as out:
        out.write(f"{step}\t{call_id}\n")


def ledger_has(path: str, call_id: str) -> bool:
    """The reconciler's probe: did a line for this call land?"""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    return any(line.split("\t", 1)[-1] == call_id for line in text.splitlines())


def ledger_counts(path: str, expected: list[int]) -> dict[str, int]:
    """Lines, duplicated lines and missing effects of one trial's ledger."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        lines = []
    steps = [int(line.split("\t", 1)[0]) for line in lines if line]
    distinct = set(steps)
    return {
        "lines": len(steps),
        "duplicates": len(steps) - len(distinct),
        "missing": len(set(expected) - distinct),
        "unexpected": len(distinct - set(expected)),
    }
