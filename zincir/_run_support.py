"""Small helpers shared by :class:`~zincir._run.Run`, its durable nurseries
(:mod:`zincir._children`) and the ownership of its lease (:mod:`zincir._ownership`).

They live apart so that those modules can use them without importing one another at import
time: :mod:`zincir._run` imports :mod:`zincir._children`, never the other way round.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

import trio

from ._budget import Budget
from ._errors import InvalidArgument
from ._json import JSONValue
from ._store import Store
from ._tracing import RunTrace
from ._validation import check_text

logger = logging.getLogger("zincir")

# How often a waiting owner looks for a signal another process sent (a read), when nothing
# wakes it sooner: a send in this process, or a PostgreSQL notification, wakes it at once.
_INBOX_POLL_S = 0.25


class ChildOptions(TypedDict, total=False):
    """The options of a child run, as :meth:`Run.spawn <zincir._run.Run.spawn>` and a durable
    nursery's spawns take them (keywords, each optional; left out, it is what is said here)."""

    role: str
    """What the child is (``"agent"``)."""
    provider: str
    """Whose model it calls (``""``)."""
    config: JSONValue
    """Its config, JSON (``{}``)."""
    budget: Budget | None
    """Its own budget: what it spends is not its parent's (none)."""
    version: str | None
    """The version of the agent it belongs to (its parent's: docs/versions.md)."""
    fingerprints: Mapping[str, str] | None
    """What its version is made of (its parent's)."""


def _budget_row(budget: object) -> tuple[Any, ...] | None:
    if budget is None:
        return None
    if not isinstance(budget, Budget):
        raise InvalidArgument(f"budget must be a zincir.Budget, not {budget!r}")
    return budget.to_row()


async def _after_transient(run_id: str, what: str, exc: Exception) -> None:
    # While the lease lasts, a wait rides out an outage (the heartbeat gives up at expiry).
    logger.warning("run %s: %s failed, retrying: %s", run_id, what, exc)
    await trio.sleep(_INBOX_POLL_S)


def _check_provider(provider: object) -> str:
    return check_text(provider, "provider", allow_empty=True)


class _RunCore:
    """What every part of a :class:`~zincir._run.Run` calls: its id, store and trace, and its
    guarded writes and reads. The run defines them; the base classes that hold its parts
    (:mod:`zincir._tool_calls`, :mod:`zincir._checkpointing`) inherit these declarations, for
    type checking, instead of each repeating them."""

    id: str
    _store: Store
    _trace: RunTrace | None

    if TYPE_CHECKING:

        def _check_usable(self) -> None:
            raise NotImplementedError

        async def _write(self, fn: Any, *args: Any) -> Any:
            raise NotImplementedError

        async def _read(self, fn: Any, *args: Any) -> Any:
            raise NotImplementedError

        def _encode(self, value: JSONValue, what: str) -> str:
            raise NotImplementedError
