"""The durable nursery of :meth:`Run.children <zincir._run.Run.children>`: :class:`Children`.

Kept out of :mod:`zincir._run` because it is its own concern (spawning in batches, joining in
batches, riding out an outage); it reaches the run only through the run it was made for, so
:class:`~zincir._run.Run` is imported here for type checking alone (``_run`` imports this
module, not the other way round).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, Unpack, final

import trio

from ._errors import (
    DatabaseBusy,
    DatabaseUnavailable,
    InvalidArgument,
    LeaseLost,
    RunTerminal,
    only_budget_exceeded,
)
from ._run_support import ChildOptions, _after_transient
from ._store import NewChild
from ._types import RunRecord

if TYPE_CHECKING:
    from ._run import Run

__all__ = ["Children"]


@final
class Children:
    """The durable nursery of :meth:`Run.children`: spawn through it, and its block joins the
    children on a clean exit and cancels them when it raises. No public constructor."""

    spawned: list[str]
    """The ids of the children spawned through this nursery, in the order they were created."""
    records: dict[str, RunRecord]
    """The joined children's records by name, in :attr:`spawned`'s order, once the block has
    ended cleanly (empty until then)."""
    _run: Run
    _background: trio.Nursery
    _names: dict[str, str]  # child id -> name
    _queued: list[NewChild]  # spawn_soon's, not created yet (the batch in flight included)
    _sender: trio.CancelScope | None  # the task sending _queued, while there is one
    _sent: trio.Event  # set while no task sends
    _closed: bool
    _error: Exception | None  # what sending a batch raised: the block's end raises it

    def __init__(self, *_: object, **__: object) -> None:
        raise TypeError("nurseries come from run.children()")

    @classmethod
    def _create(cls, run: Run, background: trio.Nursery) -> Children:
        self = object.__new__(cls)
        self._run = run
        self._background = background
        self.spawned = []
        self.records = {}
        self._names = {}
        self._queued = []
        self._sender = None
        self._sent = trio.Event()
        self._sent.set()
        self._closed = False
        self._error = None
        run._nurseries.add(self)
        return self

    async def spawn(self, name: str, **options: Unpack[ChildOptions]) -> str:
        """:meth:`Run.spawn`, with the child joined (or cancelled) when the block ends."""
        child_id = await self._run.spawn(name, **options)
        self._add(child_id, name)
        return child_id

    def spawn_soon(self, name: str, **options: Unpack[ChildOptions]) -> None:
        """Spawn the child ``name`` in the background, as :meth:`spawn` would, and return at
        once: the children queued together are created in one transaction (a fan-out of many
        costs a few commits, not one each). It returns no id because none exists before that
        commit; :attr:`spawned` lists the created ones and :attr:`records` the joined ones. Bad
        arguments raise here; a failure to create raises from the block's end (and from here,
        afterwards), which then cancels the children created."""
        if self._closed:
            raise InvalidArgument(f"run {self._run.id}: the nursery's block has ended; spawn_soon is closed")
        self._run._check_usable()  # a run that has ended (or was lost) spawns nothing
        if self._error is not None:
            raise self._error
        self._queued.append(self._run._new_child(name, **options))
        if self._sender is None:
            self._sender = trio.CancelScope()
            self._sent = trio.Event()
            self._background.start_soon(self._send_queued, self._sender, self._sent)

    async def _send_queued(self, scope: trio.CancelScope, sent: trio.Event) -> None:
        try:
            with scope:  # cancelled by _close
                while self._queued:
                    batch = self._queued[:_SPAWN_BATCH]
                    ids = await self._ride_out(
                        "spawning children", self._write_shielded, self._run._store.spawn_children, batch
                    )
                    del self._queued[: len(batch)]  # (already empty if _close dropped them)
                    for child_id, child in zip(ids, batch, strict=True):
                        self._add(child_id, child.name)
                    await trio.lowlevel.checkpoint()
        except trio.Cancelled:
            # The block's surroundings are cancelled, so is the body, which raises it: what is
            # still queued is not created. Raised here, it would reach the body in a group.
            self._queued.clear()
        except Exception as exc:
            self._error = exc
            self._queued.clear()
        finally:
            self._sender = None
            sent.set()

    async def _write_shielded(self, fn: Any, *args: Any) -> Any:
        with trio.CancelScope(shield=True):  # a batch is stopped between batches, not inside one
            return await self._run._write(fn, *args)

    def _add(self, child_id: str, name: str) -> None:
        if child_id not in self._names:
            self._names[child_id] = name
            self.spawned.append(child_id)

    async def _close(self, error: BaseException | None) -> BaseException | None:
        """The block has ended (with ``error``, if it raised): no more spawn_soon. Cleanly, wait
        until what is queued is created; otherwise, or if that wait is cancelled, drop what is
        queued and wait only for the batch in flight. Returns the block's error, or the wait's."""
        self._closed = True
        if error is None:
            try:
                await self._sent.wait()
            except BaseException as exc:
                error = exc
        if error is not None:
            self._queued.clear()
            if self._sender is not None:
                self._sender.cancel()
            with trio.CancelScope(shield=True):
                await self._sent.wait()
        self._run._nurseries.discard(self)
        return error

    def _unsent(self) -> bool:
        return bool(self._queued)

    async def _join_all(self) -> None:
        """Join every child, many per transaction. A read finds those that have ended, and only
        those are joined (looking at a running child would write its join record again); the
        nursery waits (suspends, in a worker) for the first that has not."""
        store, read = self._run._store, self._run._storage.read
        joined: dict[str, RunRecord] = {}
        pending = list(self.spawned)
        while pending:
            window = pending[:_JOIN_BATCH]
            ended = await self._ride_out("joining children", read, store.ended_children, window)
            ready = [child_id for child_id in window if child_id in ended]
            if not ready:  # wait for the first (a join of it that timed out before raises)
                joined[window[0]] = await self._run.join(window[0])
                pending.remove(window[0])
                continue
            found = await self._ride_out("joining children", self._run._write, store.join_children, ready)
            for child_id, record in zip(ready, found, strict=True):
                joined[child_id] = record if record is not None else await self._run.join(child_id)
            pending = [child_id for child_id in pending if child_id not in joined]
        self.records = {self._names[child_id]: joined[child_id] for child_id in self.spawned}

    async def _ride_out(self, what: str, submit: Callable[..., Awaitable[Any]], fn: Any, *args: Any) -> Any:
        """A nursery's read or write, tried again through an outage while the lease lasts (a
        batch sent twice finds its children by name; a join twice, its record). Activity of the
        body: the run does not suspend meanwhile, nor right after (see Run._quiet_at)."""
        with self._run._active():
            while True:
                try:
                    return await submit(fn, *args)
                except (DatabaseBusy, DatabaseUnavailable) as exc:
                    await _after_transient(self._run.id, what, exc)


def _cancels_children(error: Exception) -> bool:
    """Whether a nursery's block that raised ``error`` cancels its children. Not when the run
    waits for its budget (it will go on, and so do they), nor when the lease is gone (the new
    owner's block decides; this one could not write)."""
    return only_budget_exceeded(error) is None and not isinstance(error, LeaseLost | RunTerminal)


# Children per transaction when a nursery spawns or joins in batches: large enough that a
# fan-out costs few commits, small enough that the first children start while the rest queue.
_SPAWN_BATCH: Final = 100
_JOIN_BATCH: Final = 100
