"""The router's own HTTP/1.1 front: plain requests served without hypercorn's layers.

Every API request used to cross hypercorn's h11 state machines, its per-request tasks and stream objects
and its ASGI translation, both ways: a third of the router's processor time per small request, and most of
what it added to a request's latency besides the scheduler. The front takes each new client connection
first. While the connection sends plain requests (``router.serve.front_head``: HTTP/1.1 or 1.0, a body
with one Content-Length or none), it parses each head with llhttp (httptools), runs the application (the
data path: the API's forwarding, then the quart app) over a lean ASGI exchange
(``router.serve.front_exchange``) and keeps the connection alive between requests, pipelined ones included.
At the first request it does not serve — a chunked body, an upgrade, anything malformed — it hands the
connection to hypercorn with the bytes it has read so far, and hypercorn serves the connection from there
on exactly as it serves any other (and answers a malformed request as before).

Limits are hypercorn's: ``read_timeout`` for a request's head, ``keep_alive_timeout`` between requests, the
head's size (``h11_max_incomplete_size``; a larger one is handed over and refused there), and
``send_timeout`` on every write (``router.serve.hypercorn_fixes``). Connections count against
``max_connections`` like any other.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any

import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer

from router.http.reply import internal_error_reply, send_reply
from router.serve.front_exchange import Exchange
from router.serve.front_head import HEAD_END, request_head

log = logging.getLogger("router")


class Replayed:
    """A client stream handed to hypercorn: its first read returns the bytes the front had read already."""

    def __init__(self, stream: trio.SocketStream, read: bytes) -> None:
        self._stream = stream
        self._read = read
        self.socket = stream.socket

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._read:
            data, self._read = self._read, b""
            await trio.lowlevel.checkpoint()
            return data
        return await self._stream.receive_some(max_bytes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class FrontConnection:
    """One client connection while the front serves it."""

    def __init__(self, stream: trio.SocketStream, app: Any, server: TCPServer) -> None:
        self.stream = stream
        self.socket = stream.socket
        self.app = app
        self.buffer = bytearray()
        self.closed = trio.Event()
        config = server.config
        self.read_timeout = config.read_timeout or math.inf
        self.idle_timeout = config.keep_alive_timeout
        self.head_limit = config.h11_max_incomplete_size
        self.terminated = server.context.terminated
        self.client = _address(stream.socket.getpeername())
        self.server = _address(stream.socket.getsockname())

    async def read(self) -> bool:
        """Read what the client sent into ``buffer``; False when it closed (or the connection is over)."""
        try:
            data = await self.stream.receive_some(MAX_RECV)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        self.buffer += data
        return bool(data)

    async def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        with trio.CancelScope(shield=True):
            with contextlib.suppress(
                trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError
            ):
                await self.stream.send_eof()
            await self.stream.aclose()

    async def serve(self) -> bytes | None:
        """Serve requests until the connection ends (None) or one is not the front's: then the bytes read
        of it so far, for hypercorn."""
        while True:
            end = await self._next_head()
            if end is None:
                return None
            head = request_head(bytes(self.buffer[:end])) if end else None
            if head is None:
                return bytes(self.buffer)
            del self.buffer[:end]
            if not await self._exchange(Exchange(self, head)) or self.terminated.is_set():
                return None

    async def _next_head(self) -> int | None:
        """Where the next head ends in ``buffer`` (0: too large, or not a head the front can find), or None
        when the client closed or went quiet: ``keep_alive_timeout`` before a request's first byte, then
        ``read_timeout`` for each read, as hypercorn times them."""
        searched = 0
        with trio.move_on_after(self.read_timeout if self.buffer else self.idle_timeout) as scope:
            while True:
                found = self.buffer.find(HEAD_END, searched)
                if found >= 0:
                    return found + len(HEAD_END)
                if len(self.buffer) > self.head_limit:
                    return 0
                searched = max(0, len(self.buffer) - len(HEAD_END) + 1)
                if self.terminated.is_set() and not self.buffer:
                    return None
                if not await self.read():
                    return None
                scope.deadline = trio.current_time() + self.read_timeout
        return None

    async def _exchange(self, exchange: Exchange) -> bool:
        """Run one request; whether the connection may carry another."""
        head = exchange.head
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": head.version,
            "method": head.method,
            "scheme": "http",
            "path": head.path,
            "raw_path": head.raw_path,
            "query_string": head.query,
            "root_path": "",
            "headers": head.headers,
            "client": self.client,
            "server": self.server,
            "extensions": {},
        }
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except Exception as exc:
            log.exception("the application failed on %s %s", head.method, head.path)
            if not exchange.started:
                exchange.keep_alive = False
                await send_reply(exchange.send, internal_error_reply(exc, head.method, head.path), [])
        if not exchange.ended:
            exchange.keep_alive = False
        return exchange.keep_alive and not exchange.gone


def _address(name: Any) -> tuple[str, int] | None:
    return (str(name[0]), int(name[1])) if isinstance(name, tuple) and len(name) >= 2 else None


async def take_connection(server: TCPServer) -> bool:
    """Serve a new connection's requests (``router.serve.hypercorn_fixes.apply``'s ``front``); whether
    hypercorn is to take the connection over."""
    app = server.app.app if isinstance(server.app, ASGIWrapper) else None
    stream = server.stream
    if getattr(stream, "socket", None) is None or app is None:
        return True
    try:
        connection = FrontConnection(stream, app, server)
    except OSError:  # the client is gone already
        with trio.CancelScope(shield=True):
            await stream.aclose()
        return False
    try:
        read = await connection.serve()
    except Exception:
        log.exception("the HTTP front failed on a connection; it is closed")
        read = None
    except BaseException:
        await connection.close()
        raise
    if read is None:
        await connection.close()
        return False
    server.stream = Replayed(stream, read)  # type: ignore[assignment]
    return True
