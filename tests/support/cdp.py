"""Driving headless Chromium from a test: the DevTools protocol over ``--remote-debugging-pipe`` (no
sockets, no extra packages). A :class:`Page` evaluates JavaScript in the page, waits for conditions,
resizes the viewport and takes screenshots; the test clicks and types through the DOM.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

from tests.support.waiting import until

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--no-first-run",
    "--mute-audio",
    "--remote-debugging-pipe",
)


class ProtocolError(RuntimeError):
    pass


# What the browser answers an evaluation that met the page between two documents.
_BETWEEN_DOCUMENTS = ("navigated or closed", "context was destroyed", "Cannot find context")


class _Pipe:
    """Null-terminated JSON messages to and from the browser; one command at a time."""

    def __init__(self, send: trio.lowlevel.FdStream, receive: trio.lowlevel.FdStream) -> None:
        self.send_stream = send
        self.receive_stream = receive
        self.buffer = b""
        self.next_id = 0

    async def call(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> Any:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        await self.send_stream.send_all(json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") != self.next_id:
                    continue  # an event, or the answer to nothing we wait for
                if "error" in reply:
                    raise ProtocolError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            chunk = await self.receive_stream.receive_some(1 << 16)
            if not chunk:
                raise ProtocolError(f"{method}: the browser closed its pipe")
            self.buffer += chunk


class Page:
    def __init__(self, pipe: _Pipe, session: str) -> None:
        self.pipe = pipe
        self.session = session

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        return await self.pipe.call(method, params, self.session)

    async def goto(self, url: str) -> None:
        await self.call("Page.navigate", {"url": url})
        await self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    async def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` (awaited when it is a promise), as JSON brings it back."""
        result = await self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise ProtocolError(f"{expression!r} threw: {text}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        """Evaluate ``expression`` until it is truthy; its value. An evaluation that meets the page between
        two documents (a navigation or reload under way) counts as not yet."""

        async def check() -> Any:
            try:
                return await self.evaluate(expression)
            except ProtocolError as exc:
                if not any(words in str(exc) for words in _BETWEEN_DOCUMENTS):
                    raise
                return None

        return await until(check, timeout=timeout, what=expression)

    async def viewport(self, width: int, height: int, *, mobile: bool = False) -> None:
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
        )

    async def screenshot(self, path: Path, *, full_page: bool = True) -> None:
        result = await self.call(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": full_page}
        )
        path.write_bytes(base64.b64decode(result["data"]))


@contextlib.asynccontextmanager
async def open_page(browser: str, url: str, *, width: int = 1280, height: int = 900) -> AsyncIterator[Page]:
    """A fresh headless browser showing ``url``; closed on the way out."""
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()
    with tempfile.TemporaryDirectory(prefix="cdp-profile-") as profile:
        # The browser reads commands on fd 3 and writes answers on fd 4.
        command = [  # bash, not sh: dash redirects only single-digit descriptors
            "bash",
            "-c",
            f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w}',
            browser,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "about:blank",
        ]
        process = await trio.lowlevel.open_process(
            command,
            pass_fds=(to_browser_r, from_browser_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        pipe = _Pipe(trio.lowlevel.FdStream(to_browser_w), trio.lowlevel.FdStream(from_browser_r))
        try:
            with trio.fail_after(60):
                target = (await pipe.call("Target.createTarget", {"url": "about:blank"}))["targetId"]
                attached = await pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})
            page = Page(pipe, attached["sessionId"])
            await page.call("Page.enable")
            await page.call("Runtime.enable")
            await page.viewport(width, height)
            await page.goto(url)
            yield page
        finally:
            closing = contextlib.suppress(ProtocolError, trio.BrokenResourceError)
            with trio.move_on_after(5) as cleanup, closing:
                cleanup.shield = True
                await pipe.call("Browser.close")
                await process.wait()
            if process.returncode is None:
                process.kill()
                with trio.CancelScope(shield=True):
                    await process.wait()
            await pipe.send_stream.aclose()
            await pipe.receive_stream.aclose()
