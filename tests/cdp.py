"""A small Chrome DevTools Protocol client, to drive a real headless Chromium through a flow
(open a URL, submit a form, read the DOM) over its remote-debugging WebSocket: trio + wsproto,
which the inspector's dependencies already bring."""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Message, Ping, Request, TextMessage

CHROMIUM = Path("/usr/bin/chromium")
_LISTENING = re.compile(rb"DevTools listening on (ws://127\.0\.0\.1:([0-9]+)(/devtools/browser/[^\s]+))")


class Page:
    """One tab of the browser, attached in flat mode: commands carry its session id."""

    def __init__(self, browser: Browser, session_id: str) -> None:
        self._browser, self._session = browser, session_id

    async def send(self, method: str, **params: Any) -> Any:
        return await self._browser.send(method, session_id=self._session, **params)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (DevTools is not bound by its CSP)."""
        reply = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in reply:
            raise AssertionError(f"{expression!r} threw: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", url=url)
        await self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete'")

    async def wait_for(self, condition: str, seconds: float = 15) -> None:
        with trio.fail_after(seconds):
            while True:
                with contextlib.suppress(AssertionError):  # mid-navigation, the context is gone
                    if await self.evaluate(f"!!({condition})"):
                        return
                await trio.sleep(0.05)


class Browser:
    def __init__(self, stream: trio.SocketStream, ws: WSConnection) -> None:
        self._stream, self._ws = stream, ws
        self._ids = itertools.count(1)
        self._replies: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        self._lock = trio.Lock()

    async def _write(self, data: bytes) -> None:
        async with self._lock:
            await self._stream.send_all(data)

    async def send(self, method: str, *, session_id: str | None = None, **params: Any) -> Any:
        message_id = next(self._ids)
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self._replies[message_id] = send
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params}
        if session_id is not None:
            message["sessionId"] = session_id
        await self._write(self._ws.send(Message(data=json.dumps(message))))
        with trio.fail_after(15):
            reply = await receive.receive()
        if "error" in reply:
            raise AssertionError(f"{method} failed: {reply['error']}")
        return reply.get("result", {})

    async def new_page(self, url: str = "about:blank") -> Page:
        target = await self.send("Target.createTarget", url=url)
        attached = await self.send("Target.attachToTarget", targetId=target["targetId"], flatten=True)
        return Page(self, attached["sessionId"])

    async def _pump(self) -> None:
        text = ""
        while True:
            data = await self._stream.receive_some(1 << 16)
            if not data:
                return
            self._ws.receive_data(data)
            for event in self._ws.events():
                if isinstance(event, TextMessage):
                    text += event.data
                    if event.message_finished:
                        message, text = json.loads(text), ""
                        channel = self._replies.pop(message.get("id", -1), None)
                        if channel is not None:
                            channel.send_nowait(message)
                elif isinstance(event, Ping):
                    await self._write(self._ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    return


@contextlib.asynccontextmanager
async def chromium(profile: Path) -> AsyncIterator[Browser]:
    """A headless Chromium with its own profile, and a DevTools connection to it."""
    command = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank",
    ]  # fmt: skip
    async with trio.open_nursery() as nursery:
        run = functools.partial(
            trio.run_process, command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
        )
        process: trio.Process = await nursery.start(run)
        assert process.stderr is not None
        seen = b""
        with trio.fail_after(30):
            while (found := _LISTENING.search(seen)) is None:
                chunk = await process.stderr.receive_some(4096)
                assert chunk, f"chromium exited: {seen.decode(errors='replace')[-2000:]}"
                seen += chunk
        nursery.start_soon(_drain, process.stderr)
        port, path = int(found.group(2)), found.group(3).decode()
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        ws = WSConnection(ConnectionType.CLIENT)
        await stream.send_all(ws.send(Request(host=f"127.0.0.1:{port}", target=path)))
        with trio.fail_after(15):
            while True:
                ws.receive_data(await stream.receive_some(1 << 16))
                if any(isinstance(event, AcceptConnection) for event in ws.events()):
                    break
        browser = Browser(stream, ws)
        nursery.start_soon(browser._pump)
        try:
            yield browser
        finally:
            with contextlib.suppress(Exception), trio.move_on_after(5):
                await browser.send("Browser.close")
            nursery.cancel_scope.cancel()  # stops the pump, and kills chromium if it is still there
    await stream.aclose()


async def _drain(stream: trio.abc.ReceiveStream) -> None:
    while await stream.receive_some(4096):
        pass
