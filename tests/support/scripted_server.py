"""A server on loopback that answers each request with a scripted reply, sent in pieces."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial

import trio

from router.http.upstream import UpstreamPool


class Scripted:
    """A server that answers each request on a connection with the next of ``replies``, sent in pieces
    cut at ``cuts``; with ``close_after_each`` it closes the connection after each reply, with ``hold`` it
    keeps it open after the last reply until ``hold`` is set."""

    def __init__(self, replies: list[bytes], cuts: Callable[[bytes], list[bytes]] = lambda r: [r]) -> None:
        self.replies = replies
        self.cuts = cuts
        self.connections = 0
        self.requests: list[bytes] = []
        self.close_after_each = False
        self.hold: trio.Event | None = None  # when set, the last connection stays open until it is set

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        buffer = b""
        async with stream:
            while self.replies:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                self.requests.append(head)
                for piece in self.cuts(self.replies.pop(0)):
                    await stream.send_all(piece)
                    await trio.sleep(0)
                if self.close_after_each:
                    return
            if self.hold is not None:
                await self.hold.wait()


@asynccontextmanager
async def serving(script: Scripted) -> AsyncIterator[tuple[UpstreamPool, int]]:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, script.handle, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        pool = UpstreamPool(connect_timeout=5.0, read_timeout=5.0, write_timeout=5.0)
        try:
            yield pool, port
        finally:
            pool.close()
            nursery.cancel_scope.cancel()
