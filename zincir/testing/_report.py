"""What a crash test found: :class:`Boundary` and :class:`CrashReport`."""

from __future__ import annotations

from typing import Final, Literal

import attrs

__all__ = ["Boundary", "CrashReport", "Outcome"]

Outcome = Literal["passed", "failed", "not reached"]

_WRITE_CHARS: Final = 60  # of a write's description in the table


@attrs.frozen
class Boundary:
    """One boundary a crash test killed the handler's process at, and what came of it."""

    index: int
    """Its place among the boundaries the uninterrupted run passed, from 1."""
    run: str
    """The run whose write it is: ``root``, or a child's key (``root/research:leases``)."""
    when: Literal["before", "after"]
    commit: int
    """The write's number among that run's writes in the process, from 1."""
    operation: str
    """The write, as the uninterrupted run made it (``start_tool call_1``)."""
    outcome: Outcome = "passed"
    """``passed``; ``failed`` (see :attr:`problems`); or ``not reached``: the process ended
    without making that write (a handler that writes differently from run to run)."""
    problems: tuple[str, ...] = ()
    seconds: float = 0.0
    kept: str | None = None
    """The directory kept for inspection (a failed boundary's): its database, the handler's
    files, the effect ledger and both processes' logs."""
    database: str | None = None
    """The kept database: a SQLite file, or a PostgreSQL URL."""
    replay: str | None = None
    """A command line that runs this boundary alone again."""

    @property
    def label(self) -> str:
        """``when:commit:run``, as ``ZINCIR_CRASH_AT`` and ``zincir crash-test --boundary`` take it."""
        return f"{self.when}:{self.commit}:{self.run}"

    @property
    def description(self) -> str:
        return f"{self.when} commit {self.commit} of {self.run}"


@attrs.frozen
class CrashReport:
    """What :func:`crash_test` found. ``str(report)`` is :meth:`table`."""

    handler: str
    backend: str
    boundaries: tuple[Boundary, ...]
    """Every boundary crashed at, in order."""
    total: int
    """How many boundaries the uninterrupted run passed (more than :attr:`boundaries` when sampled)."""
    seconds: float

    @property
    def failures(self) -> tuple[Boundary, ...]:
        """The boundaries where something went wrong."""
        return tuple(b for b in self.boundaries if b.outcome == "failed")

    @property
    def passed(self) -> bool:
        """No boundary failed."""
        return not self.failures

    def table(self) -> str:
        """A table of boundaries and outcomes, the failures' problems under them, and how to look
        at and replay each failure."""
        rows = [("#", "boundary", "write", "outcome", "time")]
        for b in self.boundaries:
            operation = (
                b.operation if len(b.operation) <= _WRITE_CHARS else b.operation[: _WRITE_CHARS - 1] + "…"
            )
            rows.append((str(b.index), b.description, operation, b.outcome, f"{b.seconds:.2f} s"))
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = []
        for row, boundary in zip(rows, (None, *self.boundaries), strict=True):
            cells = [
                row[0].rjust(widths[0]),
                *(cell.ljust(w) for cell, w in zip(row[1:4], widths[1:], strict=True)),
            ]
            lines.append("  ".join([*cells, row[4]]).rstrip())
            if boundary is not None:
                lines += [f"{'':>{widths[0]}}  - {problem}" for problem in boundary.problems]
        counts = {
            o: sum(b.outcome == o for b in self.boundaries) for o in ("passed", "failed", "not reached")
        }
        sample = "" if len(self.boundaries) == self.total else f" (a sample of {self.total})"
        head = (
            f"crash test of {self.handler} on {self.backend}: {len(self.boundaries)} boundaries{sample},"
            f" {counts['passed']} passed, {counts['failed']} failed, {counts['not reached']} not reached,"
            f" {self.seconds:.1f} s"
        )
        tail = []
        for b in self.failures:
            if b.kept is not None:
                tail.append(f"boundary {b.index} kept in {b.kept} (database {b.database})")
            if b.replay is not None:
                tail.append(f"  replay: {b.replay}")
        return "\n".join([head, *lines, *tail])

    def __str__(self) -> str:
        return self.table()
