"""Fixes and one limit for hypercorn's HTTP/1.1 connections under Trio, applied when the router starts.

End of an exchange
    When a response ends, hypercorn tells the application the exchange is over (``http.disconnect``) and
    then, on the same task, either closes the connection (``Connection: close``, HTTP/1.0) or re-arms the
    idle keep-alive timer. quart-trio cancels that task as soon as it sees the disconnect, so the close or
    the re-arming is cancelled half-way: a client that asked for ``Connection: close`` (or spoke HTTP/1.0,
    whose bodies may be delimited by the close) never sees the connection end, and idle keep-alive
    connections are never reaped. That step now runs shielded from cancellation; it is a handful of
    non-blocking socket calls (shutdown, close, timer restart), so shielding never holds anything up.

Clients that stop reading
    hypercorn writes to a client inside a scope shielded from cancellation, with no time limit: a client
    that keeps its connection open but stops reading blocks that write forever, holds its request's slot,
    and keeps the process from exiting even after shutdown. Every write now has a deadline
    (``send_timeout`` seconds without the kernel taking the bytes); a client that misses it is cut — the
    socket closed, the application told the client left, the slot freed. :func:`cut_stalled_writes` ends
    every pending write at once, for the last moments of a shutdown.

Writes that go at once
    A write first hands the kernel what it takes right away, without yielding to Trio's run loop (one
    system call; a relayed chunk nearly always goes whole); only the rest waits, as above. hypercorn's
    own path yields twice per write (its lock and the socket's checkpoint), each a pass through the run
    loop and its ``epoll_wait``, for every relayed chunk.

Clients that close an idle connection
    When a client closes a kept-alive connection, hypercorn stops reading but leaves the idle keep-alive
    timer running, and the connection's task waits for that timer: the socket stays open (CLOSE-WAIT) for
    ``keep_alive_timeout`` seconds after the client left — one descriptor for each short-lived client, a
    pile of them under a crowd. The timer is now stopped as soon as the reading ends.

Malformed requests
    A request hypercorn cannot parse (a bad request line, raw bytes in the target, a duplicate
    Content-Length, a head over 64 KiB) never reaches the application; hypercorn answered it with an empty
    body. It is now answered in the OpenAI error shape too, saying what was wrong in general terms.

A budget of open connections
    Every client connection holds a file descriptor (two while its request is relayed). Past
    ``max_connections`` open connections, a new one is answered at once with a 503 in the OpenAI error
    shape and closed, without reading its request, so idle or slow clients (slowloris) can never exhaust
    the process's descriptors and take the router down.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import trio
from hypercorn.events import Closed, RawData, Updated
from hypercorn.protocol.events import StreamClosed
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer

from router.http.nonblocking import write_now_to

log = logging.getLogger("router")

_MARK = "_llama_router_fixed"
_READING_DONE = "_llama_router_reading_done"
_writes: set[trio.CancelScope] = set()
_send_timeout = 60.0
_max_connections: int | None = None
_open_connections = 0
_REFUSE_WITHIN = 1.0  # seconds to hand the 503 to a connection over the budget before closing it
Front = Callable[[TCPServer], Awaitable[bool]]
_front: Front | None = None


def apply(send_timeout: float = 60.0, max_connections: int | None = None, front: Front | None = None) -> None:
    """Install the fixes (idempotent); ``send_timeout`` bounds every write to a client and
    ``max_connections`` the client connections open at once (None: no limit). ``front``: serves each new
    connection first and says whether hypercorn is to take it over (``router.serve.front``)."""
    global _send_timeout, _max_connections, _front
    _send_timeout = send_timeout
    _max_connections = max_connections
    _front = front
    if not getattr(TCPServer.run, _MARK, False):
        TCPServer.run = _budgeted_connections(TCPServer.run)  # type: ignore[method-assign]
    if not getattr(TCPServer._close, _MARK, False):
        TCPServer._close = _close_after_writes(TCPServer._close)  # type: ignore[method-assign]
    if not getattr(H11Protocol._send_error_response, _MARK, False):
        H11Protocol._send_error_response = _shaped_protocol_error  # type: ignore[method-assign]
    if not getattr(H11Protocol.stream_send, _MARK, False):
        H11Protocol.stream_send = _shield_end_of_exchange(H11Protocol.stream_send)  # type: ignore[method-assign]
    if not getattr(TCPServer._read_data, _MARK, False):
        TCPServer._read_data = _stop_idle_timer_when_reading_ends(TCPServer._read_data)  # type: ignore[method-assign]
    if not getattr(TCPServer.protocol_send, _MARK, False):
        TCPServer.protocol_send = _bounded_writes(TCPServer.protocol_send)  # type: ignore[method-assign]


def open_connections() -> int:
    """Client connections open right now."""
    return _open_connections


def _over_budget_reply(limit: int) -> bytes:
    message = (
        f"the router has {limit} client connections open, its limit (max_connections); close idle "
        "connections or raise max_connections (and the open-file limit), then try again"
    )
    body = json.dumps({"error": {"message": message, "type": "server_error", "code": "too_many_connections"}})
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body.encode()


def _budgeted_connections(original: Any) -> Any:
    @functools.wraps(original)
    async def run(self: TCPServer) -> None:
        global _open_connections
        limit = _max_connections
        if limit is not None and _open_connections >= limit:
            gone = (trio.BrokenResourceError, trio.ClosedResourceError, AttributeError)
            with trio.move_on_after(_REFUSE_WITHIN), contextlib.suppress(*gone):
                await self.stream.send_all(_over_budget_reply(limit))
                # Lingering close: end our side, then read what the client sent until it closes too;
                # closing with its request unread would reset the connection and lose the 503.
                await self.stream.send_eof()
                while await self.stream.receive_some(MAX_RECV):
                    pass
            with trio.CancelScope(shield=True):
                await self.stream.aclose()
            return
        _open_connections += 1
        try:
            if _front is None or await _front(self):
                await original(self)
        finally:
            _open_connections -= 1

    setattr(run, _MARK, True)
    return run


_PROTOCOL_ERRORS = {
    400: (
        "invalid_http",
        "the request is not valid HTTP/1.1 (request line, headers or framing); send a well-formed request",
    ),
    431: ("headers_too_large", "the request head is larger than 64 KiB; send fewer or shorter headers"),
}


def protocol_error_body(status: int) -> bytes:
    code, message = _PROTOCOL_ERRORS.get(status, ("invalid_http", f"the request was refused ({status})"))
    kind = "invalid_request_error" if status < 500 else "server_error"
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()


async def _shaped_protocol_error(self: H11Protocol, status_code: int) -> None:
    body = protocol_error_body(status_code)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *self.config.response_headers("h11"),
    ]
    events = (h11.Response(status_code=status_code, headers=headers), h11.Data(data=body), h11.EndOfMessage())
    try:
        data = b"".join(self.connection.send(event) or b"" for event in events)
    except h11.LocalProtocolError:
        if self.connection.their_state != h11.ERROR:
            raise
        return
    await self.send(RawData(data=data))  # one write: the connection's close cannot come in between


setattr(_shaped_protocol_error, _MARK, True)


def _close_after_writes(original: Any) -> Any:
    """Closing waits for a write in progress (bounded by ``send_timeout``): shutting the socket down in the
    middle of one would cut a reply short, or fail the write."""

    @functools.wraps(original)
    async def close(self: TCPServer) -> None:
        async with self.send_lock:
            await original(self)

    setattr(close, _MARK, True)
    return close


def cut_stalled_writes() -> int:
    """End every write still waiting for a client to read; returns how many there were."""
    for scope in list(_writes):
        scope.deadline = -math.inf
    return len(_writes)


def _shield_end_of_exchange(original: Any) -> Any:
    @functools.wraps(original)
    async def stream_send(self: H11Protocol, event: Any) -> None:
        if isinstance(event, StreamClosed):
            with trio.CancelScope(shield=True):
                await original(self, event)
        else:
            await original(self, event)

    setattr(stream_send, _MARK, True)
    return stream_send


def _stop_idle_timer_when_reading_ends(original: Any) -> Any:
    """Once the client has closed (or reading failed), nothing can arrive on the connection: the idle
    keep-alive timer must not hold it open until it runs out."""

    @functools.wraps(original)
    async def read_data(self: TCPServer) -> None:
        try:
            await original(self)
        finally:
            setattr(self, _READING_DONE, True)  # a reply ending later must not start the timer again
            with trio.CancelScope(shield=True):
                await self.idle_task.stop()

    setattr(read_data, _MARK, True)
    return read_data


def write_now(server: TCPServer, data: bytes) -> bytes:
    """Write what the kernel takes of ``data`` at once, without yielding: one system call and no pass
    through Trio's run loop (a relayed chunk usually goes whole). The rest, for a write that waits."""
    sock = getattr(server.stream, "socket", None)  # a plain TCP stream (the router serves no TLS itself)
    if sock is None:
        return data
    return write_now_to(sock, data)


async def bounded_send(stream: trio.abc.SendStream, data: bytes) -> str | None:
    """Send ``data`` to a client, waiting at most ``send_timeout`` seconds for the kernel to take it,
    shielded from cancellation (a response is not torn by an unrelated cancellation). None when it went;
    else why not: "broken" (the client is gone) or "stalled" (it stopped reading: the stream is closed)."""
    scope = trio.CancelScope(shield=True, deadline=trio.current_time() + _send_timeout)
    _writes.add(scope)
    broken = False
    try:
        with scope:
            try:
                await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                broken = True
    finally:
        _writes.discard(scope)
    if scope.cancelled_caught:
        log.info("a client stopped reading its reply; its connection is closed and its request ended")
        with trio.CancelScope(shield=True):
            await stream.aclose()
        return "stalled"
    return "broken" if broken else None


async def write_in_turn(
    lock: trio.Lock, sock: trio.socket.SocketType | None, stream: trio.abc.SendStream, data: bytes
) -> str | None:
    """One write to a client under its connection's ``lock``: what the kernel takes at once goes without
    yielding (when no other write holds the lock), the rest by ``bounded_send``; its answer."""
    try:
        lock.acquire_nowait()
    except trio.WouldBlock:
        await lock.acquire()
        rest = data
    else:
        rest = data if sock is None else write_now_to(sock, data)
    try:
        return await bounded_send(stream, rest) if rest else None
    finally:
        lock.release()


def _bounded_writes(original: Any) -> Any:
    @functools.wraps(original)
    async def protocol_send(self: TCPServer, event: Any) -> None:
        if not isinstance(event, RawData):
            if isinstance(event, Updated) and event.idle and getattr(self, _READING_DONE, False):
                return  # the client has closed: no idle keep-alive timer for a connection that is over
            await original(self, event)
            return
        sock = getattr(self.stream, "socket", None)  # a plain TCP stream (the router serves no TLS itself)
        if await write_in_turn(self.send_lock, sock, self.stream, event.data) is not None:
            await self.protocol.handle(Closed())

    setattr(protocol_send, _MARK, True)
    return protocol_send
