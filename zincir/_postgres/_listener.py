"""LISTEN on its own connection and thread: wake this process's workers when another process
(on any machine) releases a run. Notifications are hints; polling stays the fallback."""

from __future__ import annotations

import logging
from typing import Any, Final

import psycopg
import trio

from .._wakes import Hear, Hearing
from ._connection import (
    CHILD_ENDED_CHANNEL,
    CLAIMABLE_CHANNEL,
    INBOX_CHANNEL,
    RUN_ENDED_CHANNEL,
    STREAM_CHANNEL,
    Echo,
    connect,
    redact,
)

logger = logging.getLogger("zincir")

_WAIT_S: Final = 0.5  # how often the thread looks at its stop flag


class Listener(Hearing[psycopg.Connection[Any]]):
    """LISTENs to every channel zincir notifies on (stopping takes up to about half a second)."""

    def __init__(
        self, url: str, token: trio.lowlevel.TrioToken, hear: Hear, echo: Echo | None = None
    ) -> None:
        self._url = url
        # This database's own writes woke this process when they committed (see Echo).
        self._echo = echo
        super().__init__(f"zincir-listener:{redact(url)}", token, hear)

    errors = (psycopg.Error,)

    def _connect(self) -> psycopg.Connection[Any]:
        return connect(self._url, application_name="zincir listener")

    def _listen(self, conn: psycopg.Connection[Any]) -> None:
        channels = (CLAIMABLE_CHANNEL, INBOX_CHANNEL, CHILD_ENDED_CHANNEL, RUN_ENDED_CHANNEL, STREAM_CHANNEL)
        for channel in channels:
            conn.execute(f"LISTEN {channel}")
        # Listen first, then look: whatever was released or signalled while this connection
        # was down is found by the look this wake-up causes.
        self._announce(None, None)
        while not self._stopping.is_set():
            for notification in conn.notifies(timeout=_WAIT_S):
                if self._echo is None or not self._echo.sent_here(notification.pid):
                    self._announce(notification.channel, notification.payload)
