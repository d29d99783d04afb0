"""Wake-ups: what a committed write may have changed for someone waiting, and who is told.

A storage operation notes, with ``tx.wake(...)``, what its writes may wake (see
:class:`Wakes`). The database thread gathers the notes of the operations a transaction
committed and, once the COMMIT is done, hands them to this process's :class:`WakeHub` on the
Trio thread, before the writers' callers resume; PostgreSQL also sends them to every other
process as notifications, inside the transaction. An operation rolled back (to its savepoint,
or with its transaction) wakes nobody. Other processes' writes reach the hub through
:meth:`WakeHub.hear` (PostgreSQL's listener, SQLite's watcher). Wake-ups are hints: everyone
who waits also polls, so a wake-up lost with a connection costs time, never correctness.
"""

from __future__ import annotations

import abc
import collections
import logging
import math
import threading
from collections.abc import Callable
from typing import Final, Generic, Protocol, TypeVar

import attrs
import trio

__all__ = ["Hearing", "Listen", "Listening", "WakeHub", "Wakes"]


@attrs.define(eq=False)
class Wakes:
    """What a transaction's writes may wake."""

    claimable: bool = False
    """A run became due and free: workers should claim."""
    inbox: set[str] = attrs.Factory(set)
    """Runs whose inbox an outsider wrote (a signal, a decision, a cancellation, a budget): their
    waits and their owner's heartbeat should look."""
    waits: set[str] = attrs.Factory(set)
    """Runs whose waits should look, though their owner has nothing to read (a child ended, or
    one wait of a run could complete when it meant to suspend)."""
    ended: set[str] = attrs.Factory(set)
    """Runs that ended while somebody waited for their end (``wait_for_end``)."""
    streams: set[str] = attrs.Factory(set)
    """Runs with new chunks in one of their streams: their followers should read."""

    def __bool__(self) -> bool:
        return bool(self.claimable or self.inbox or self.waits or self.ended or self.streams)

    def add(self, other: Wakes) -> None:
        self.claimable = self.claimable or other.claimable
        self.inbox |= other.inbox
        self.waits |= other.waits
        self.ended |= other.ended
        self.streams |= other.streams

    def copy(self) -> Wakes:
        return Wakes(self.claimable, set(self.inbox), set(self.waits), set(self.ended), set(self.streams))


Hear = Callable[[str | None, str | None], None]


class _Connection(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Connection)
T = TypeVar("T")

# How many runs' latest news a WakeHub remembers for owners about to sign up: the gap it covers
# (a lease taken, then the owner signing up) is a few scheduler passes, far fewer writes.
_RECENT_NEWS: Final = 1024

logger = logging.getLogger("zincir")
_RECONNECT_S: Final = 1.0


class Listening(Protocol):
    def stop(self) -> None:
        """Stop listening; may block briefly (it runs in a thread)."""


class Hearing(abc.ABC, Generic[C]):
    """A thread that hears other processes' writes and calls ``hear(channel, payload)`` (in Trio)
    for each, ``hear(None, None)`` after (re)connecting, when anything may have been missed: a
    backend's :class:`Listening`. Subclasses set what they need, then call this ``__init__``,
    which starts the thread; a lost connection is opened again after a second."""

    errors: tuple[type[Exception], ...]
    """What the driver raises for a failed connection."""

    def __init__(self, name: str, token: trio.lowlevel.TrioToken, hear: Hear) -> None:
        self._token = token
        self._hear = hear
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and join the thread (it notices within its polling interval)."""
        self._stopping.set()
        self._thread.join()

    @abc.abstractmethod
    def _connect(self) -> C: ...

    @abc.abstractmethod
    def _listen(self, conn: C) -> None:
        """Until :attr:`_stopping` is set, :meth:`_announce` what is heard on ``conn``."""

    def _serve(self) -> None:
        name = self._thread.name
        while not self._stopping.is_set():
            try:
                conn = self._connect()
            except self.errors as exc:
                logger.warning("%s: cannot connect (%s); retrying", name, exc)
                self._stopping.wait(_RECONNECT_S)
                continue
            try:
                self._listen(conn)
            except self.errors as exc:
                logger.warning("%s: %s; connecting again", name, exc)
                self._stopping.wait(_RECONNECT_S)
            finally:
                conn.close()

    def _announce(self, channel: str | None, payload: str | None) -> None:
        try:
            self._token.run_sync_soon(self._hear, channel, payload)
        except trio.RunFinishedError:
            self._stopping.set()


Listen = Callable[[Hear, Callable[[], frozenset[str]]], Listening]
"""Start hearing other processes' writes (a thread): the first argument is called with
("claimable", None), ("inbox", run id), ("child_ended", run id), ("run_ended", run id), ("stream", run id)
(each channel name may carry a prefix), or (None, None) when anything may have been missed; the
second says which runs this process waits to see end, or follows a stream of (a follower waits
for both)."""


class WakeHub:
    """Who waits for what in this process, and their wake-ups: the workers' claims, a run's
    waits, its owner's heartbeat, ``wait_for_end``, and streams' followers. Only used on the
    Trio thread."""

    def __init__(self, listen: Listen) -> None:
        self._listen = listen
        self._listening: Listening | None = None
        self._closed = False
        self._claim_listeners: set[Callable[[], None]] = set()
        self._inbox_waiters: dict[str, set[trio.Event]] = {}  # a run's waits
        self._owners: dict[str, set[Callable[[], None]]] = {}  # a run's owner, told of its news
        # When (Trio time) the latest inboxes had news, for an owner that signs up just after it
        # (see add_owner); and when everyone last had to look again.
        self._recent_news: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._forgotten_news_at = -math.inf  # the latest of what fell out of it: maybe anyone's
        self._everyone_looked_at = -math.inf
        self._end_waiters: dict[str, set[trio.Event]] = {}  # wait_for_end's, by the run awaited
        self._stream_waiters: dict[str, set[trio.Event]] = {}  # streams' followers, by run
        # Their keys, for the listener's thread to read (replaced whole, never changed in place).
        self._awaited_ends: frozenset[str] = frozenset()

    # -- what this process's writes woke -----------------------------------------------------

    def deliver(self, wakes: Wakes) -> None:
        """Wake whoever waits here for what ``wakes`` says (after the COMMIT that made it so)."""
        if wakes.claimable:
            for listener in list(self._claim_listeners):
                listener()
        for run_id in wakes.inbox:
            self._set(self._inbox_waiters, run_id)
            self._note_news(run_id)
            for tell in list(self._owners.get(run_id, ())):
                tell()
        for run_id in wakes.waits:
            self._set(self._inbox_waiters, run_id)
        for run_id in wakes.ended:
            self._set(self._end_waiters, run_id)
        for run_id in wakes.streams:
            self._set(self._stream_waiters, run_id)

    @staticmethod
    def _set(waiters: dict[str, set[trio.Event]], run_id: str) -> None:
        for event in waiters.get(run_id, ()):
            event.set()

    # -- other processes' writes -------------------------------------------------------------

    def hear_others(self) -> None:
        """Make sure other processes' writes wake this one (workers and waits call this)."""
        if self._listening is None and not self._closed:
            self._listening = self._listen(self.hear, lambda: self._awaited_ends)

    def hear(self, channel: str | None, payload: str | None) -> None:
        """Word of another process's write (a PostgreSQL notification, a SQLite commit seen)."""
        if channel is None:  # anything may have been missed: everyone looks again
            for listener in list(self._claim_listeners):
                listener()
            everyone = (self._inbox_waiters, self._end_waiters, self._stream_waiters)
            for waiters in everyone:
                for events in waiters.values():
                    for event in events:
                        event.set()
            self._everyone_looked_at = trio.current_time()
            for tells in list(self._owners.values()):  # each owned run's heartbeat looks (starts)
                for tell in list(tells):
                    tell()
            return
        wakes = Wakes(claimable=channel.endswith("claimable"))
        if payload is not None:
            if channel.endswith("inbox"):
                wakes.inbox.add(payload)
            elif channel.endswith("child_ended"):
                wakes.waits.add(payload)
            elif channel.endswith("run_ended"):
                wakes.ended.add(payload)
            elif channel.endswith("stream"):
                wakes.streams.add(payload)
        self.deliver(wakes)

    def close(self) -> Listening | None:
        """No more listening; the listener to stop, if one was started."""
        self._closed = True
        listening, self._listening = self._listening, None
        return listening

    # -- who waits ---------------------------------------------------------------------------

    def add_claim_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever a run may have become claimable (here or elsewhere)."""
        self.hear_others()
        self._claim_listeners.add(listener)

    def remove_claim_listener(self, listener: Callable[[], None]) -> None:
        self._claim_listeners.discard(listener)

    def inbox_event(self, run_id: str, *, hear_others: bool = True) -> trio.Event:
        """An event set when the inbox of ``run_id`` may hold news (a signal, a decision, an
        ended child, a cancellation); forget it with :meth:`forget_inbox_event`.
        ``hear_others`` starts listening to other processes' writes, if nothing has yet."""
        if hear_others:
            self.hear_others()
        event = trio.Event()
        self._inbox_waiters.setdefault(run_id, set()).add(event)
        return event

    def forget_inbox_event(self, run_id: str, event: trio.Event) -> None:
        _forget(self._inbox_waiters, run_id, event)

    def add_owner(self, run_id: str, tell: Callable[[], None], since: float) -> None:
        """Call ``tell()`` (on the Trio thread) whenever the inbox of ``run_id`` may hold news
        for its owner: a cancellation, a raised budget (not an ended child: see
        :class:`Wakes`). It does not start listening to other processes: the owner's renewals
        read the same news. ``since``: when (Trio time) the owner's lease was submitted; news
        that came after that, before this call (a cancellation committed with the lease, or
        just after it), is told at once. (Strictly after: a clock that moves tells them apart;
        a test's clock that stands still counts news at that instant as before.)"""
        self._owners.setdefault(run_id, set()).add(tell)
        news_at = self._recent_news.get(run_id, self._forgotten_news_at)
        if max(news_at, self._everyone_looked_at) > since:
            tell()

    def remove_owner(self, run_id: str, tell: Callable[[], None]) -> None:
        _forget(self._owners, run_id, tell)

    def _note_news(self, run_id: str) -> None:
        recent = self._recent_news
        recent[run_id] = trio.current_time()
        recent.move_to_end(run_id)
        if len(recent) > _RECENT_NEWS:
            _, self._forgotten_news_at = recent.popitem(last=False)

    def end_event(self, run_id: str) -> trio.Event:
        """An event set when run ``run_id`` may have ended (here or in another process); forget
        it with :meth:`forget_end_event`. Starts listening to other processes' writes."""
        event = trio.Event()
        self._end_waiters.setdefault(run_id, set()).add(event)
        self._awaited_ends = frozenset(self._end_waiters)
        self.hear_others()
        return event

    def forget_end_event(self, run_id: str, event: trio.Event) -> None:
        if _forget(self._end_waiters, run_id, event):
            self._awaited_ends = frozenset(self._end_waiters)

    def stream_event(self, run_id: str) -> trio.Event:
        """An event set when a stream of run ``run_id`` may have new chunks, or the run may have
        ended (here or in another process): a follower's. Forget it with
        :meth:`forget_stream_event`. Starts listening to other processes' writes."""
        event = self.end_event(run_id)
        self._stream_waiters.setdefault(run_id, set()).add(event)
        return event

    def forget_stream_event(self, run_id: str, event: trio.Event) -> None:
        _forget(self._stream_waiters, run_id, event)
        self.forget_end_event(run_id, event)


def _forget(waiters: dict[str, set[T]], run_id: str, event: T) -> bool:
    """Drop ``event``; whether that left ``run_id`` with no waiter (its key went)."""
    events = waiters.get(run_id)
    if events is None:
        return False
    events.discard(event)
    if events:
        return False
    del waiters[run_id]
    return True
