"""Two fixes to hypercorn's HTTP/1.1 connections under Trio, applied when the router starts.

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
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

import trio
from hypercorn.events import Closed, RawData
from hypercorn.protocol.events import StreamClosed
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer

log = logging.getLogger("router")

_MARK = "_llama_router_fixed"
_writes: set[trio.CancelScope] = set()
_send_timeout = 60.0


def apply(send_timeout: float = 60.0) -> None:
    """Install both fixes (idempotent); ``send_timeout`` bounds every write to a client."""
    global _send_timeout
    _send_timeout = send_timeout
    if not getattr(H11Protocol.stream_send, _MARK, False):
        H11Protocol.stream_send = _shield_end_of_exchange(H11Protocol.stream_send)  # type: ignore[method-assign]
    if not getattr(TCPServer.protocol_send, _MARK, False):
        TCPServer.protocol_send = _bounded_writes(TCPServer.protocol_send)  # type: ignore[method-assign]


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


def _bounded_writes(original: Any) -> Any:
    @functools.wraps(original)
    async def protocol_send(self: TCPServer, event: Any) -> None:
        if not isinstance(event, RawData):
            await original(self, event)
            return
        broken = False
        async with self.send_lock:
            # Shielded as before (a response is not torn by an unrelated cancellation), but bounded.
            scope = trio.CancelScope(shield=True, deadline=trio.current_time() + _send_timeout)
            _writes.add(scope)
            try:
                with scope:
                    try:
                        await self.stream.send_all(event.data)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        broken = True
            finally:
                _writes.discard(scope)
        if scope.cancelled_caught:
            log.info("a client stopped reading its reply; its connection is closed and its request ended")
            with trio.CancelScope(shield=True):
                await self.stream.aclose()
        if broken or scope.cancelled_caught:
            await self.protocol.handle(Closed())

    setattr(protocol_send, _MARK, True)
    return protocol_send
