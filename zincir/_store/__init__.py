"""Every storage operation, written once over the transaction interface (:class:`Tx`)."""

from __future__ import annotations

from typing import Any

from ._tx import LIVE, Dialect, Reply, Tx, judge_lease
from ._types import *  # noqa: F403
from ._types import __all__ as _types

__all__ = ["LIVE", "Dialect", "Reply", "Store", "Tx", "judge_lease", *_types]


class Store:
    """Every storage operation: each takes the backend's transaction first, and its docstring
    is its contract. A backend's store is an instance (of a subclass, where the backend's own
    way of an operation is measurably faster)."""

    def __getattr__(self, name: str) -> Any:  # transitional: each backend's own, until moved
        raise AttributeError(name)
