"""LISTEN on its own connection and thread: wake this process's workers when another process
(on any machine) releases a run. Notifications are hints; polling stays the fallback."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Final

import psycopg
import trio

from ._connection import (
    CHILD_ENDED_CHANNEL,
    CLAIMABLE_CHANNEL,
    INBOX_CHANNEL,
    RUN_ENDED_CHANNEL,
    Echo,
    connect,
    redact,
)

logger = logging.getLogger("zincir")

_WAIT_S: Final = 0.5  # how often the thread looks at its stop flag
_RECONNECT_S: Final = 1.0


class Listener:
    """A thread that LISTENs and calls ``wake(channel, payload)`` (in Trio) for each
    notification; ``wake(None, None)`` after (re)connecting, when anything may have been missed."""

    def __init__(
        self,
        url: str,
        token: trio.lowlevel.TrioToken,
        wake: Callable[[str | None, str | None], None],
        echo: Echo | None = None,
    ) -> None:
        self._url = url
        self._token = token
        self._wake = wake
        # This database's own writes woke this process when they committed (see Echo).
        self._echo = echo
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, name=f"zincir-listener:{redact(url)}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop and join the thread (blocks for up to about half a second)."""
        self._stopping.set()
        self._thread.join()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                conn = connect(self._url, application_name="zincir listener")
            except psycopg.Error as exc:
                logger.warning("zincir listener: cannot connect (%s); retrying", exc)
                self._stopping.wait(_RECONNECT_S)
                continue
            try:
                conn.execute(f"LISTEN {CLAIMABLE_CHANNEL}")
                conn.execute(f"LISTEN {INBOX_CHANNEL}")
                conn.execute(f"LISTEN {CHILD_ENDED_CHANNEL}")
                conn.execute(f"LISTEN {RUN_ENDED_CHANNEL}")
                # Listen first, then look: whatever was released or signalled while this
                # connection was down is found by the look this wake-up causes.
                self._announce(None, None)
                while not self._stopping.is_set():
                    for notification in conn.notifies(timeout=_WAIT_S):
                        if self._echo is None or not self._echo.sent_here(notification.pid):
                            self._announce(notification.channel, notification.payload)
            except psycopg.Error as exc:
                logger.warning("zincir listener: connection lost (%s); reconnecting", exc)
                self._stopping.wait(_RECONNECT_S)
            finally:
                conn.close()

    def _announce(self, channel: str | None, payload: str | None) -> None:
        try:
            self._token.run_sync_soon(self._wake, channel, payload)
        except trio.RunFinishedError:
            self._stopping.set()
