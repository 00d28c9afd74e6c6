"""One request and its response on the front's connection (``router.serve.front``), as ASGI ``receive``
and ``send``.

``receive`` hands out the body as it arrives (after ``100 Continue`` where the client waits for it), then
waits for the client to leave (``http.disconnect``); ``send`` writes the head together with the first piece
of the body, frames the body (Content-Length as given, else chunked to an HTTP/1.1 client, else ended by
the close; none to HEAD or for 204 and 304) and every write goes at once where the
kernel takes it, else waits at most ``send_timeout`` (``router.serve.hypercorn_fixes.bounded_send``): a
client that stops reading is cut, and the application learns it left. :meth:`Exchange.writer` hands the
relay pump (``router.http.relay_pump``) the client's side of a started chunked or close-delimited body.
"""

from __future__ import annotations

import email.utils
import http
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

import trio
from hypercorn.trio.tcp_server import MAX_RECV

from router.http.nonblocking import write_now_to
from router.http.relay_pump import framed
from router.serve.front_head import RequestHead
from router.serve.hypercorn_fixes import write_in_turn

PIPELINE_LIMIT = 64 * 1024  # bytes of a next request read ahead while a response is under way
_DISCONNECT = {"type": "http.disconnect"}
_date: tuple[int, bytes] = (0, b"")


def _date_header() -> bytes:
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, b"date: " + email.utils.formatdate(now, usegmt=True).encode() + b"\r\n")
    return _date[1]


def _reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


class Connection(Protocol):
    """The front's client connection, as an exchange uses it (``router.serve.front.FrontConnection``)."""

    buffer: bytearray  # bytes read and not yet taken
    closed: trio.Event
    socket: trio.socket.SocketType
    stream: trio.SocketStream

    async def read(self) -> bool: ...

    async def close(self) -> None: ...


class Exchange:
    """The ASGI side of one request the front serves (see the module's docstring)."""

    def __init__(self, connection: Connection, head: RequestHead) -> None:
        self.connection = connection
        self.head = head
        self.body_left = head.length
        self.body_asked = False  # the first receive() gives the body even when it is empty
        self.keep_alive = head.keep_alive
        self.started = False  # the response's head is written
        self.ended = False  # the response's last byte is written
        self.gone = False  # the client left, or a write to it failed: the connection is over
        self._start: dict[str, Any] | None = None
        self._chunked = False
        self._continued = False  # 100 Continue sent
        self._suppressed = False  # a reply without a body: to HEAD, or 1xx, 204, 304
        self._counted: int | None = None  # the body bytes a Content-Length still expects
        self._lock = trio.Lock()  # a write that waits holds it
        self.on_leave: Callable[[], None] | None = None  # set by the leave watch while it watches

    async def receive(self) -> dict[str, Any]:
        connection = self.connection
        if not self.body_asked or self.body_left > 0:
            self.body_asked = True
            if not connection.buffer and self.body_left > 0:
                if self.head.expects and not self.started and not self._continued:
                    self._continued = True  # the client waits for this before it sends the body
                    await self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                if not await connection.read():
                    self.gone = True
                    return _DISCONNECT
            size = min(self.body_left, len(connection.buffer))
            chunk = bytes(connection.buffer[:size])
            del connection.buffer[:size]
            self.body_left -= size
            return {"type": "http.request", "body": chunk, "more_body": self.body_left > 0}
        while not (self.ended or self.gone):
            if self.read_ahead_full():  # read no further ahead; the end wakes us
                await connection.closed.wait()
                break
            if not await connection.read():
                self.gone = True
        return _DISCONNECT

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self._start = message
            if not any(name.lower() == b"content-length" for name, _ in message["headers"]):
                # A body of unknown length may come late (a followed log): its head goes out now. A counted
                # body follows at once, and its head goes with it in one write.
                await self.write(self._head())
            return
        if kind != "http.response.body" or self.gone or self.ended:
            return
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        data = self._head() if not self.started else b""
        if self._suppressed:
            body = b""
        data += self.frame(body) if body else b""
        if self._counted is not None:
            self._counted -= len(body)
        if not more:
            self.ended = True
            if self._chunked:
                data += b"0\r\n\r\n"
            if self._counted:  # the body ended short of its Content-Length: the framing is broken
                self.keep_alive = False
        if data:
            await self.write(data)

    def _head(self) -> bytes:
        self.started = True
        start = self._start or {"status": 500, "headers": []}
        status: int = start["status"]
        self._suppressed = self.head.method == "HEAD" or status < 200 or status in (204, 304)
        lines = [b"HTTP/1.1 %d %b\r\n" % (status, _reason(status))]
        for name, value in start["headers"]:
            name = name.lower()
            if name == b"content-length":
                self._counted = int(value)
            elif name == b"connection":
                if b"close" in value.lower():
                    self.keep_alive = False
                continue
            lines.append(b"%b: %b\r\n" % (name, value))
        if self._suppressed:
            self._counted = None  # a Content-Length given describes the body not sent
        elif self._counted is None:
            if self.head.version == "1.1":
                self._chunked = True
                lines.append(b"transfer-encoding: chunked\r\n")
            else:
                self.keep_alive = False  # the close ends the body
        if self.body_left > 0:  # the application answered without reading the whole body
            self.keep_alive = False
        if not self.keep_alive:
            lines.append(b"connection: close\r\n")
        lines.append(_date_header())
        lines.append(b"\r\n")
        return b"".join(lines)

    # The client's side of the connection while the response is under way, for the leave watch.

    def fileno(self) -> int:
        """The client connection's descriptor (-1 once closed)."""
        return self.connection.socket.fileno()

    def read_ahead_full(self) -> bool:
        """Whether as much of a next request waits as the exchange reads ahead (``PIPELINE_LIMIT``)."""
        return len(self.connection.buffer) >= PIPELINE_LIMIT

    def read_waiting(self) -> bool | None:
        """Read what the client sent, without waiting: True when it closed the connection (the exchange is
        gone), False when a next request's bytes fill the read-ahead (read no further), None otherwise."""
        try:
            data = os.read(self.fileno(), MAX_RECV)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:  # reset, or closed under us
            data = b""
        if not data:
            self.gone = True
            return True
        self.connection.buffer += data
        return False if self.read_ahead_full() else None

    # The client's side of a started body, for the relay pump.

    def frame(self, chunk: bytes) -> bytes:
        return framed(chunk, self._chunked)

    def write_now(self, data: bytes) -> int:
        if self.gone or self._lock.locked():  # what follows queues behind a waiting write
            return 0
        return len(data) - len(write_now_to(self.connection.socket, data))

    async def write(self, data: bytes) -> None:
        if self.gone:
            return
        connection = self.connection
        if await write_in_turn(self._lock, connection.socket, connection.stream, data) is not None:
            self.gone = True
            if self.on_leave is not None:  # the leave watch loses sight of a closed connection: tell it
                self.on_leave()
            await self.connection.close()

    def writer(self) -> Exchange | None:
        """This exchange as the relay pump's ClientWriter, once its response has started with a body it can
        frame alone (chunked, or ended by the close: such a head goes out with ``http.response.start``)."""
        if not self.started or self.ended or self.gone or self._counted is not None or self._suppressed:
            return None
        return self
