"""A small Chrome DevTools Protocol client, to drive a real headless Chromium through a flow
(open a URL, submit a form, read the DOM, take a screenshot) over its remote-debugging
WebSocket: trio + wsproto, which the inspector's dependencies already bring.

Starting Chromium takes a second or two, so a test session starts one (on first use, see
``session``) and each test talks to it in a browser context of its own: no cookie, cache or
storage is shared between tests.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import functools
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Message, Ping, Request, TextMessage

CHROMIUM = Path("/usr/bin/chromium")
_LISTENING = re.compile(rb"DevTools listening on (ws://127\.0\.0\.1:([0-9]+)(/devtools/browser/[^\s]+))")
_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--remote-debugging-port=0",
)  # fmt: skip
# The shared browser resolves this made-up name to the loopback address, as a DNS-rebinding
# attack would make a victim's browser do (see test_a_rebinding_host_is_refused_in_the_browser).
REBINDING_HOST = "rebind.example"


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

    async def load(self, url: str, budget_ms: int = 2000) -> None:
        """Open ``url`` and let the page run as ``chromium --virtual-time-budget`` does: until
        ``budget_ms`` of virtual time have passed, counted only while no fetch is pending, so
        that its scripts, error handlers, timers and refreshes of up to that delay have run."""
        await self.send("Emulation.setVirtualTimePolicy", policy="pause")
        await self.send("Page.navigate", url=url)
        expired = self._browser.expect("Emulation.virtualTimeBudgetExpired", self._session)
        await self.send(
            "Emulation.setVirtualTimePolicy", policy="pauseIfNetworkFetchesPending", budget=budget_ms
        )
        with trio.fail_after(30):
            await expired.wait()

    async def dom(self) -> str:
        """The document as Chromium serialises it (what ``chromium --dump-dom`` prints)."""
        return str(await self.evaluate("document.documentElement.outerHTML"))

    async def screenshot(self, width: int, height: int) -> bytes:
        """A PNG of the top ``width`` x ``height`` pixels of the page."""
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        await self.send("Emulation.setDeviceMetricsOverride", **metrics)
        shot = await self.send("Page.captureScreenshot", format="png")
        return base64.b64decode(shot["data"])

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
        self._expected: dict[tuple[str, str | None], trio.Event] = {}
        self._lock = trio.Lock()
        self._context: str | None = None  # the browser context new pages open in

    def expect(self, method: str, session_id: str | None = None) -> trio.Event:
        """An event set when the next ``method`` event (of that page) arrives: ask before
        sending the command that causes it."""
        return self._expected.setdefault((method, session_id), trio.Event())

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
        in_context = {} if self._context is None else {"browserContextId": self._context}
        target = await self.send("Target.createTarget", url=url, **in_context)
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
                        elif "method" in message:
                            key = (message["method"], message.get("sessionId"))
                            expected = self._expected.pop(key, None)
                            if expected is not None:
                                expected.set()
                elif isinstance(event, Ping):
                    await self._write(self._ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    return


@contextlib.asynccontextmanager
async def session() -> AsyncIterator[Browser]:
    """A connection to this test session's Chromium (started on first use, stopped when the
    session ends) whose pages open in a new browser context, thrown away afterwards: as
    private as a browser of the test's own, without the start-up."""
    endpoint = await trio.to_thread.run_sync(_shared_endpoint)
    async with _connected(endpoint) as browser:
        browser._context = (await browser.send("Target.createBrowserContext"))["browserContextId"]
        try:
            yield browser
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await browser.send("Target.disposeBrowserContext", browserContextId=browser._context)


@contextlib.asynccontextmanager
async def chromium(profile: Path, *flags: str) -> AsyncIterator[Browser]:
    """A headless Chromium of the caller's own, with its own profile (and command-line flags),
    and a DevTools connection to it: for a test that needs what ``session`` cannot give."""
    command = [str(CHROMIUM), *_FLAGS, *flags, f"--user-data-dir={profile}", "about:blank"]
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
        try:
            async with _connected(found.group(1).decode()) as browser:
                yield browser
        finally:
            nursery.cancel_scope.cancel()  # kills chromium if it is still there


@contextlib.asynccontextmanager
async def _connected(endpoint: str) -> AsyncIterator[Browser]:
    """A DevTools connection to the browser at ``endpoint`` (ws://127.0.0.1:PORT/PATH)."""
    found = re.fullmatch(r"ws://127\.0\.0\.1:([0-9]+)(/.*)", endpoint)
    assert found is not None, endpoint
    port, path = int(found.group(1)), found.group(2)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        ws = WSConnection(ConnectionType.CLIENT)
        await stream.send_all(ws.send(Request(host=f"127.0.0.1:{port}", target=path)))
        with trio.fail_after(15):
            while True:
                ws.receive_data(await stream.receive_some(1 << 16))
                if any(isinstance(event, AcceptConnection) for event in ws.events()):
                    break
        browser = Browser(stream, ws)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(browser._pump)
            try:
                yield browser
            finally:
                nursery.cancel_scope.cancel()
    finally:
        await stream.aclose()


async def _drain(stream: trio.abc.ReceiveStream) -> None:
    while await stream.receive_some(4096):
        pass


class _SharedChromium:
    """The session's browser: a plain child process, so that it outlives each test's Trio run."""

    def __init__(self) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="zincir-chromium-"))
        self.log = (self.profile.parent / f"{self.profile.name}.log").open("wb")
        command = [
            str(CHROMIUM), *_FLAGS, f"--host-resolver-rules=MAP {REBINDING_HOST} 127.0.0.1",
            f"--user-data-dir={self.profile}", "about:blank",
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None
        try:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log
            )
            self.endpoint = self._wait_for_endpoint(self.process)
        except BaseException:
            self.stop()
            raise

    def _wait_for_endpoint(self, process: subprocess.Popen[bytes]) -> str:
        # Chromium writes the port and path it listens on into the profile once it is ready.
        ready = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise AssertionError(f"chromium exited with {process.returncode}:\n{self._log_tail()}")
            lines = ready.read_text().split() if ready.exists() else []
            if len(lines) == 2:
                return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
            time.sleep(0.02)
        raise AssertionError(f"chromium did not start within 30 s:\n{self._log_tail()}")

    def _log_tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_bytes()[-2000:].decode(errors="replace")

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)
        Path(self.log.name).unlink(missing_ok=True)


_shared: _SharedChromium | None = None
_shared_lock = threading.Lock()


def _shared_endpoint() -> str:
    global _shared
    with _shared_lock:
        if _shared is None or not _shared.running():
            _shared = _SharedChromium()
            atexit.register(_shared.stop)
        return _shared.endpoint
