"""The client's side of a response being sent by hypercorn, for the relay pump (``router.http.relay_pump``).

A streamed body is written straight to the client's socket: framed as HTTP/1.1 chunked transfer (or as it
is, to an HTTP/1.0 client, whose body the close ends), which is what hypercorn's h11 would write, since
neither framing keeps any state between pieces. The head before and the end after still go through
hypercorn, and so does any write that must wait (``write``: the bounded write of
``router.serve.hypercorn_fixes``, which cuts a client that stops reading). A response with a
Content-Length, whose remaining length h11 counts, gets no writer.

A response on the router's own HTTP/1.1 front (``router.serve.front``) has its exchange as its writer
(``router.serve.front_exchange.Exchange.writer``), with the same framing and the same bounded writes.

Pinned to hypercorn 0.18 like the fixes beside it: the ASGI ``send`` it is given is hypercorn's
``HTTPStream.app_send``, whose stream sends through ``H11Protocol``, which sends through ``TCPServer``.
"""

from __future__ import annotations

from typing import Any

import h11
from h11._writers import ChunkedWriter, Http10Writer
from hypercorn.events import RawData
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import HTTPStream
from hypercorn.trio.tcp_server import TCPServer

from router.http.relay_pump import framed
from router.serve.front_exchange import Exchange
from router.serve.hypercorn_fixes import write_now


class ClientWriter:
    """Writes a response's body pieces to its client (see ``router.http.relay_pump.ClientWriter``)."""

    __slots__ = ("_chunked", "_lock", "_server")

    def __init__(self, server: TCPServer, chunked: bool) -> None:
        self._server = server
        self._lock = server.send_lock
        self._chunked = chunked

    def frame(self, chunk: bytes) -> bytes:
        return framed(chunk, self._chunked)

    def write_now(self, data: bytes) -> int:
        if self._lock.locked():  # a waiting write holds the connection: what follows must queue behind it
            return 0
        return len(data) - len(write_now(self._server, data))

    async def write(self, data: bytes) -> None:
        await self._server.protocol_send(RawData(data=data))


def client_writer(send: Any) -> ClientWriter | Exchange | None:
    """The writer for the body of the response ``send`` (an ASGI send callable) has started, or None where
    the body must go through ``send``: not hypercorn's HTTP/1.1 path, no plain socket (TLS), a framing that
    counts (Content-Length), or no response started."""
    stream = getattr(send, "__self__", None)
    if isinstance(stream, Exchange):  # the router's own front
        return stream.writer()
    if not isinstance(stream, HTTPStream):
        return None
    protocol = getattr(stream.send, "__self__", None)
    if not isinstance(protocol, H11Protocol):
        return None
    server = getattr(protocol.send, "__self__", None)
    if not isinstance(server, TCPServer) or getattr(server.stream, "socket", None) is None:
        return None
    connection = protocol.connection
    if connection.our_state is not h11.SEND_BODY:
        return None
    writer = type(connection._writer)
    if writer is not ChunkedWriter and writer is not Http10Writer:
        return None
    return ClientWriter(server, chunked=writer is ChunkedWriter)
