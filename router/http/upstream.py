"""HTTP/1.1 to the router's own replicas: h11 over Trio sockets, with kept-alive connections per port.

This is the forwarding path's client; it does only what that path needs and keeps each step cheap. A
request goes out in one write (head and body together). A reply's body is read as it arrives, and every
decoded piece of one network read is handed on as one chunk, so a burst of small server-sent events costs
one relay write, not one per event.

Connections: after a reply that both sides finished (and that did not ask to close), the connection is
kept for the next request to the same port, at most ``IDLE_PER_PORT`` of them and for at most
``IDLE_SECONDS`` (llama-server closes an idle one after five seconds; ``sweep`` closes ours first, so idle
descriptors do not pile up). A kept connection that turns out to be closed when it is reused — nothing of
the reply arrived — is replaced by a new one and the request sent again: the replica processed nothing.

Failures are typed: :class:`ConnectFailed` (nothing listens on the port: the replica is gone),
:class:`ReplyTimeout` (the replica sent nothing for ``read_timeout`` seconds), :class:`UpstreamBroken`
(the connection broke or the replica spoke broken HTTP).
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import h11
import trio

IDLE_PER_PORT = 16
IDLE_SECONDS = 4.0
RECEIVE_SIZE = 256 * 1024
HOST = "127.0.0.1"


class UpstreamError(Exception):
    """The exchange with a replica failed; ``str()`` says how."""


class ConnectFailed(UpstreamError):
    pass


class ReplyTimeout(UpstreamError):
    def __init__(self, seconds: float) -> None:
        super().__init__(f"it sent nothing for {seconds:g} s (reply_timeout)")
        self.seconds = seconds


class UpstreamBroken(UpstreamError):
    pass


class _Stale(Exception):
    """A kept-alive connection was found closed before any byte of the reply: send again."""


class _Conn:
    __slots__ = ("idle_since", "port", "stream", "wire")

    def __init__(self, stream: trio.SocketStream, port: int) -> None:
        self.stream = stream
        self.wire = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0
        self.port = port


class UpstreamReply:
    """What the proxy reads of an upstream's reply, whoever sent it: status, headers (names in lower case),
    the body as it arrives (``chunks``, raising UpstreamError), and ``aclose``."""

    status_code: int
    raw_headers: list[tuple[bytes, bytes]]
    _done: bool = False

    def header(self, name: bytes) -> str | None:
        """The first value of header ``name`` (lower case), or None."""
        for key, value in self.raw_headers:
            if key == name:
                return value.decode("latin-1")
        return None

    @property
    def complete(self) -> bool:
        return self._done

    def chunks(self) -> AsyncIterator[bytes]:
        raise NotImplementedError

    async def read(self, limit: int) -> tuple[bytes, bool]:
        """Up to ``limit`` bytes of the body, and whether that was all of it (no error, not cut)."""
        body = bytearray()
        try:
            async for chunk in self.chunks():
                body += chunk
                if len(body) > limit:
                    return bytes(body[:limit]), False
        except UpstreamError:
            return bytes(body[:limit]), False
        return bytes(body), True

    async def aclose(self) -> None:
        raise NotImplementedError


class UpstreamResponse(UpstreamReply):
    """A replica's reply: status and headers at once, the body as it arrives. Close it with ``aclose``."""

    def __init__(self, pool: UpstreamPool, conn: _Conn, head: h11.Response) -> None:
        self._pool = pool
        self._conn: _Conn | None = conn
        self.status_code = head.status_code
        self.reason = head.reason.decode("latin-1", "replace")
        self.raw_headers = list(head.headers)
        self._done = False

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, one chunk per network read (empty reads are skipped); raises UpstreamError."""
        conn = self._conn
        if conn is None or self._done:
            return
        wire = conn.wire
        while True:
            parts: list[bytes] = []
            try:
                while True:
                    event = wire.next_event()
                    if event is h11.NEED_DATA:
                        break
                    if type(event) is h11.Data:
                        parts.append(event.data)
                    elif type(event) is h11.EndOfMessage:
                        self._done = True
                        break
                    else:  # ConnectionClosed before the end, or a PAUSED state: the reply is cut
                        raise UpstreamBroken("the replica closed the connection before the reply ended")
            except h11.RemoteProtocolError as exc:
                raise UpstreamBroken(f"the replica's reply is not valid HTTP: {exc}") from None
            if parts:
                yield parts[0] if len(parts) == 1 else b"".join(parts)
            if self._done:
                return
            wire.receive_data(await self._pool.receive(conn))

    async def aclose(self) -> None:
        """Give the connection back for the next request when the reply was read to its end, else close it."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.release(conn, reusable=self._done)


class UpstreamPool:
    """Kept-alive connections to replicas on ``HOST``, by port, and the timeouts of every exchange."""

    def __init__(self, *, connect_timeout: float, read_timeout: float, write_timeout: float) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self._idle: dict[int, list[_Conn]] = {}
        self.closed = False

    # ------------------------------------------------------------------------------------------ requests
    async def send(
        self,
        port: int,
        method: str,
        target: str,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes = b"",
    ) -> UpstreamResponse:
        """Send one request and wait for the reply's head. ``headers``: the caller's, without Host and
        Content-Length (set here)."""
        head = [(b"host", f"{HOST}:{port}".encode())]
        if body or method not in ("GET", "HEAD"):
            head.append((b"content-length", str(len(body)).encode()))
        head.extend(headers)
        request = h11.Request(method=method, target=target, headers=head)
        while True:
            conn = self._take(port)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(port)
            try:
                return await self._exchange(conn, request, body, reused)
            except _Stale:
                continue

    async def _exchange(
        self, conn: _Conn, request: h11.Request, body: bytes, reused: bool
    ) -> UpstreamResponse:
        wire = conn.wire
        received = False
        try:
            data = wire.send(request) or b""
            if body:
                data += wire.send(h11.Data(data=body)) or b""
            data += wire.send(h11.EndOfMessage()) or b""
            with trio.fail_after(self.write_timeout):
                await conn.stream.send_all(data)
            while True:
                event = wire.next_event()
                if event is h11.NEED_DATA:
                    chunk = await self.receive(conn)
                    received = received or bool(chunk)
                    wire.receive_data(chunk)
                    continue
                if type(event) is h11.Response:
                    return UpstreamResponse(self, conn, event)
                if type(event) is h11.InformationalResponse:
                    continue
                raise UpstreamBroken("the replica closed the connection without answering")
        except trio.TooSlowError:
            self._close(conn)
            raise UpstreamBroken(f"the replica took no request bytes for {self.write_timeout:g} s") from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError, UpstreamBroken) as exc:
            self._close(conn)
            if reused and not received:
                raise _Stale() from None
            if isinstance(exc, UpstreamBroken):
                raise
            raise UpstreamBroken(f"the connection to the replica broke: {exc!r}") from None
        except BaseException:
            self._close(conn)
            raise

    async def receive(self, conn: _Conn) -> bytes:
        """One network read (b"" at the end of the connection) within ``read_timeout``.

        The read waits until the socket is readable and then reads once, outside Trio's socket wrapper:
        a replica's next chunk is rarely there yet when the last one has been relayed, so reading first
        would cost a failed call and a second pass through the run loop for every chunk."""
        fd = conn.stream.socket.fileno()
        # A plain cancel scope rather than trio.fail_after, a generator-based context manager: this runs
        # once per relayed chunk.
        scope = trio.CancelScope(deadline=trio.current_time() + self.read_timeout)
        try:
            with scope:
                while True:
                    await trio.lowlevel.wait_readable(fd)
                    try:
                        return os.read(fd, RECEIVE_SIZE)
                    except (BlockingIOError, InterruptedError):
                        continue  # woken for nothing: wait again
        except (OSError, trio.ClosedResourceError, trio.BusyResourceError) as exc:
            raise UpstreamBroken(f"the connection to the replica broke: {exc!r}") from None
        raise ReplyTimeout(self.read_timeout)  # the scope's deadline passed

    async def _connect(self, port: int) -> _Conn:
        try:
            with trio.fail_after(self.connect_timeout):
                stream = await trio.open_tcp_stream(HOST, port)
        except trio.TooSlowError:
            raise ConnectFailed(f"no connection to port {port} within {self.connect_timeout:g} s") from None
        except OSError as exc:
            raise ConnectFailed(f"connection to port {port} refused: {exc.strerror or exc}") from None
        return _Conn(stream, port)

    # --------------------------------------------------------------------------------------- connections
    def _take(self, port: int) -> _Conn | None:
        idle = self._idle.get(port)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if now - conn.idle_since < IDLE_SECONDS:
                return conn
            self._close(conn)
        return None

    def release(self, conn: _Conn, *, reusable: bool) -> None:
        wire = conn.wire
        if reusable and not self.closed and wire.our_state is h11.DONE and wire.their_state is h11.DONE:
            idle = self._idle.setdefault(conn.port, [])
            if len(idle) < IDLE_PER_PORT:
                wire.start_next_cycle()
                conn.idle_since = time.monotonic()
                idle.append(conn)
                return
        self._close(conn)

    @staticmethod
    def _close(conn: _Conn) -> None:
        # A plain close of the socket: nothing to flush on a connection we are abandoning.
        conn.stream.socket.close()

    def sweep(self) -> int:
        """Close kept connections idle for IDLE_SECONDS or longer; the number closed."""
        now = time.monotonic()
        closed = 0
        for port, idle in list(self._idle.items()):
            fresh = [c for c in idle if now - c.idle_since < IDLE_SECONDS]
            for conn in idle:
                if now - conn.idle_since >= IDLE_SECONDS:
                    self._close(conn)
                    closed += 1
            if fresh:
                self._idle[port] = fresh
            else:
                del self._idle[port]
        return closed

    def forget_port(self, port: int) -> None:
        """Close the kept connections to ``port`` (its replica stopped)."""
        for conn in self._idle.pop(port, []):
            self._close(conn)

    async def run_sweeper(self, every: float = 1.0) -> None:
        while True:
            await trio.sleep(every)
            self.sweep()

    def close(self) -> None:
        self.closed = True
        for port in list(self._idle):
            self.forget_port(port)

    def idle_count(self) -> int:
        return sum(len(v) for v in self._idle.values())

    def describe(self) -> dict[str, Any]:
        return {"idle": self.idle_count(), "ports": sorted(self._idle)}
