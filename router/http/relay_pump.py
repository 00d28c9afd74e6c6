"""One task relays the streamed bodies of every request: the relay's cost per chunk, not per request task.

Waking a request's own task for each chunk a replica sends (Trio's run loop, the task switch, the socket's
registration with epoll, one ``epoll_wait`` per pass) costs several times what reading, decoding and writing
the chunk does. So a streamed reply whose client connection takes raw bytes (``ClientWriter``) is relayed by
:class:`RelayPump`: one task waits on an epoll set of its own holding every such replica connection, and for
each that is readable reads what arrived, decodes it, shows it to the usage sniffer and writes it to the
client, framed, in one non-blocking call. Chunks that arrive together are relayed in one pass.

The request's task keeps its request's life: it waits while its body is pumped and takes it out of the pump
when it is cancelled (the client left), when the replica sent nothing for ``read_timeout`` seconds, when
the reply ended or broke, and when the client does not take a write whole. Then the request's task writes
the rest itself, the slow and bounded way (a client that stops reading is cut after ``send_timeout``), and
puts the body back in the pump.
"""

from __future__ import annotations

import contextlib
import os
import select
from collections.abc import Callable
from typing import Protocol

import trio

from router.http.upstream import RECEIVE_SIZE, ReplyTimeout, UpstreamBroken, UpstreamResponse


def framed(chunk: bytes, chunked: bool) -> bytes:
    """``chunk`` as HTTP/1.1 chunked transfer puts it on the wire, or as it is (a body the close ends)."""
    return b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk


async def serve_epoll(
    epoll: select.epoll, ready: Callable[[list[tuple[int, int]]], None], task_status: trio.TaskStatus[None]
) -> None:
    """Hand ``ready`` what ``epoll`` finds each time it has something, until cancelled; then close it. One
    task serves a whole set of descriptors this way: Trio waits on the set's own descriptor alone."""
    fd = epoll.fileno()
    task_status.started()
    try:
        while True:
            await trio.lowlevel.wait_readable(fd)
            ready(epoll.poll(0))
    finally:
        epoll.close()


class ClientWriter(Protocol):
    """The client's side of one response whose body is being sent, as the HTTP server hands it out."""

    def frame(self, chunk: bytes) -> bytes:
        """``chunk`` as the response's framing puts it on the wire."""
        ...

    def write_now(self, data: bytes) -> int:
        """Write what the kernel takes of ``data`` at once, without waiting; the number of bytes taken (0
        when another write is under way or the connection is closed)."""
        ...

    async def write(self, data: bytes) -> None:
        """Write ``data``, waiting as long as the server allows a client to take it."""
        ...


class PumpedBody:
    """One reply in the pump: where it comes from, where it goes, and why it left the pump."""

    __slots__ = ("error", "fd", "last", "on_chunk", "rest", "upstream", "wake", "writer")

    def __init__(
        self, upstream: UpstreamResponse, writer: ClientWriter, on_chunk: Callable[[bytes], None]
    ) -> None:
        self.upstream = upstream
        self.writer = writer
        self.on_chunk = on_chunk
        self.fd = upstream.fileno()
        self.wake = trio.Event()
        self.last = 0.0  # when the replica last sent something
        self.rest = b""  # framed bytes the client did not take at once
        self.error: UpstreamBroken | None = None

    def move(self, now: float) -> bool:
        """Relay what arrived; whether the body leaves the pump (ended, broke, or a write must wait)."""
        try:
            data = os.read(self.fd, RECEIVE_SIZE)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            self.error = UpstreamBroken(f"the connection to the replica broke: {exc!r}")
            return True
        self.last = now
        try:
            chunk = self.upstream.feed_read(data)
        except UpstreamBroken as exc:
            self.error = exc
            return True
        if chunk:
            wire = self.writer.frame(chunk)
            taken = self.writer.write_now(wire)
            self.on_chunk(chunk)  # after the write: the client's token does not wait for the sniffing
            if taken < len(wire):
                self.rest = wire[taken:]
                return True
        return self.upstream.complete


class RelayPump:
    """The task that relays every pumped body; run it with ``run`` in a nursery that outlives the requests."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._bodies: dict[int, PumpedBody] = {}

    def __len__(self) -> int:
        return len(self._bodies)

    def add(self, body: PumpedBody) -> None:
        self._bodies[body.fd] = body
        try:
            self._epoll.register(body.fd, select.EPOLLIN)
        except FileExistsError:  # a descriptor closed while registered and reused: the kernel forgot it late
            self._epoll.modify(body.fd, select.EPOLLIN)

    def drop(self, body: PumpedBody) -> None:
        if self._bodies.get(body.fd) is body:
            del self._bodies[body.fd]
            with contextlib.suppress(OSError, ValueError):  # closed already: the kernel removed it
                self._epoll.unregister(body.fd)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await serve_epoll(self._epoll, self._ready, task_status)

    def _ready(self, fds: list[tuple[int, int]]) -> None:
        now = trio.current_time()
        for ready, _ in fds:
            body = self._bodies.get(ready)
            if body is not None and body.move(now):
                self.drop(body)
                body.wake.set()

    async def relay(
        self,
        upstream: UpstreamResponse,
        writer: ClientWriter,
        on_chunk: Callable[[bytes], None],
        read_timeout: float,
    ) -> None:
        """Relay ``upstream``'s body to ``writer`` until it ends; raises UpstreamError as
        ``UpstreamResponse.chunks`` does (ReplyTimeout after ``read_timeout`` seconds without a byte)."""
        first = upstream.take_body()  # what came with the head
        if first:
            await writer.write(writer.frame(first))
            on_chunk(first)
        body = PumpedBody(upstream, writer, on_chunk)
        while not upstream.complete:
            body.wake = trio.Event()
            body.last = trio.current_time()
            self.add(body)
            try:
                while not body.wake.is_set():
                    with trio.move_on_at(body.last + read_timeout):
                        await body.wake.wait()
                    if not body.wake.is_set() and trio.current_time() >= body.last + read_timeout:
                        raise ReplyTimeout(read_timeout)
            finally:
                self.drop(body)
            if body.rest:
                rest, body.rest = body.rest, b""
                await writer.write(rest)
            if body.error is not None:
                raise body.error
