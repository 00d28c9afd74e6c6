"""HTTP/1.1 to the router's own replicas: llhttp (through httptools) over Trio sockets, with kept-alive
connections per port.

This is the forwarding path's client; it does only what that path needs and keeps each step cheap. A
request goes out in one write (head and body together). A reply's body is read as it arrives, and every
decoded piece of one network read is handed on as one chunk, so a burst of small server-sent events costs
one relay write, not one per event. Replies are parsed by llhttp, the C parser Node.js uses, through
httptools: decoding a chunked stream is the one cost paid per relayed chunk, and a parser written in
Python costs several times the rest of the relay.

Connections: after a reply that was read to its end (and that did not ask to close), the connection is
kept for the next request to the same port, at most ``IDLE_PER_PORT`` of them and for at most
``IDLE_SECONDS`` (llama-server closes an idle one after five seconds; ``sweep`` closes ours first, so idle
descriptors do not pile up). A kept connection that turns out to be closed when it is reused — nothing of
the reply arrived — is replaced by a new one and the request sent again: the replica processed nothing.
llama-server closes the connection after every chunked (streamed) reply, so the pool closes it too and
connects a spare to that port at once, in the background (``want_spare``, ``run_spares``; one at a time per
port): the next request finds a connection ready instead of waiting for a connect.

Failures are typed: :class:`ConnectFailed` (nothing listens on the port: the replica is gone),
:class:`ReplyTimeout` (the replica sent nothing for ``read_timeout`` seconds), :class:`UpstreamBroken`
(the connection broke or the replica spoke broken HTTP).
"""

from __future__ import annotations

import math
import os
import re
import socket
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httptools
import trio

from router.http.nonblocking import write_now_to

IDLE_PER_PORT = 16
IDLE_SECONDS = 4.0
RECEIVE_SIZE = 256 * 1024
HOST = "127.0.0.1"
_BREAKS = re.compile(rb"[\r\n\0]")  # bytes that would break a request's framing


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
    """A kept-alive connection was found closed before any byte of the reply arrived: send again."""


class _Conn:
    __slots__ = ("idle_since", "port", "stream")

    def __init__(self, stream: trio.SocketStream, port: int) -> None:
        self.stream = stream
        self.idle_since = 0.0
        self.port = port


class _Reader:
    """One reply's parse: llhttp's callbacks turned into the head, the body pieces not yet handed on, and
    whether the reply ended. A 1xx interim reply is skipped; a reply to HEAD ends with its head."""

    __slots__ = ("body", "done", "final", "head_done", "headers", "keep_alive", "no_body", "parser", "status")

    def __init__(self, *, no_body: bool) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.status = 0
        self.head_done = False
        self.done = False
        self.final = False  # the reply's last byte was parsed and nothing followed it
        self.keep_alive = False
        self.no_body = no_body

    # llhttp's callbacks (httptools calls on_header once per whole header)
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # an interim reply (100 Continue): its head is not the reply's
            self.headers = []
            return
        self.status = status
        self.head_done = True
        if self.no_body:  # llhttp cannot be told that a reply has no body; HEAD's connection is not kept
            self.done = True

    def on_body(self, body: bytes) -> None:
        if not self.done:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if self.head_done and not self.done:
            self.done = self.final = True
            self.keep_alive = self.parser.should_keep_alive()

    def on_message_begin(self) -> None:
        if self.done:  # bytes after the reply's end: the connection's state is unknown, do not keep it
            self.final = False

    def feed(self, data: bytes) -> None:
        """Parse one network read; b"" is the end of the connection."""
        if not data:
            if self.head_done and not self.done and self._until_close():
                self.done = True  # a body without framing ends with the connection (never kept)
                return
            if not self.done:
                raise UpstreamBroken("the replica closed the connection before the reply ended")
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            raise UpstreamBroken("the replica switched protocols") from None
        except httptools.HttpParserError as exc:
            if not self.done:
                raise UpstreamBroken(f"the replica's reply is not valid HTTP: {exc}") from None
            self.final = False  # garbage after a whole reply: the reply stands, the connection goes

    def _until_close(self) -> bool:
        names = {name for name, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    def take(self) -> bytes:
        body, self.body = self.body, []
        return body[0] if len(body) == 1 else b"".join(body)


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

    def __init__(self, pool: UpstreamPool, conn: _Conn, reader: _Reader) -> None:
        self._pool = pool
        self._conn: _Conn | None = conn
        self._reader = reader
        self.status_code = reader.status
        self.raw_headers = reader.headers

    @property
    def complete(self) -> bool:
        """Whether the whole reply has been parsed (its body may have come with the head)."""
        return self._reader.done

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, one chunk per network read (empty reads are skipped); raises UpstreamError."""
        conn = self._conn
        if conn is None:
            return
        reader = self._reader
        while True:
            if reader.body:
                yield reader.take()
            if reader.done:
                return
            reader.feed(await self._pool.receive(conn))

    # For router.http.relay_pump, which reads the body in its own task.
    def fileno(self) -> int:
        """The connection's descriptor (-1 once closed)."""
        return -1 if self._conn is None else self._conn.stream.socket.fileno()

    def take_body(self) -> bytes:
        """The body parsed so far and not yet handed on (b"" if none)."""
        return self._reader.take() if self._reader.body else b""

    def feed_read(self, data: bytes) -> bytes:
        """Parse one network read (b"": the connection ended); the body it brings. Raises UpstreamBroken."""
        self._reader.feed(data)
        return self.take_body()

    async def aclose(self) -> None:
        """Give the connection back for the next request when the whole reply was parsed and nothing followed
        it (and it did not ask to close), else close it."""
        conn, self._conn = self._conn, None
        if conn is not None:
            reader = self._reader
            reusable = reader.final and reader.keep_alive
            if reusable and self.header(b"transfer-encoding") is not None:
                # llama-server closes a connection after a chunked (streamed) reply: close it here, and
                # connect the next request's connection now rather than when that request comes.
                self._pool.release(conn, reusable=False)
                self._pool.want_spare(conn.port)
            else:
                self._pool.release(conn, reusable=reusable)


def request_head(method: str, target: str, headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The request line and headers, ready to send; UpstreamBroken when one would break the framing."""
    if any(c in target for c in " \r\n\0") or not target:
        raise UpstreamBroken(f"the request target {target!r} cannot be sent: it would break HTTP's framing")
    lines = [f"{method} {target} HTTP/1.1".encode("ascii")]
    for name, value in headers:
        if not name or b":" in name or _BREAKS.search(name) or _BREAKS.search(value):
            raise UpstreamBroken(f"the request header {name!r} cannot be sent: it would break HTTP's framing")
        lines.append(name + b": " + value)
    lines.append(b"\r\n")
    return b"\r\n".join(lines)


class UpstreamPool:
    """Kept-alive connections to replicas on ``HOST``, by port, and the timeouts of every exchange."""

    def __init__(self, *, connect_timeout: float, read_timeout: float, write_timeout: float) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self._idle: dict[int, list[_Conn]] = {}
        self.closed = False
        self._spares_send, self._spares = trio.open_memory_channel[tuple[int, int]](math.inf)
        self._spare_pending: set[int] = set()  # ports a spare connection is being made to
        self._generation: dict[int, int] = {}  # ports forgotten (replicas stopped) count up here

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
        data = request_head(method, target, head) + body
        while True:
            conn = self._take(port)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(port)
            try:
                return await self._exchange(conn, data, reused, no_body=method == "HEAD")
            except _Stale:
                continue

    async def _exchange(self, conn: _Conn, data: bytes, reused: bool, *, no_body: bool) -> UpstreamResponse:
        reader = _Reader(no_body=no_body)
        received = False
        try:
            rest = write_now_to(conn.stream.socket, data)  # a request usually goes whole, without a yield
            if rest:
                with trio.fail_after(self.write_timeout):
                    await conn.stream.send_all(rest)
            while not reader.head_done:
                chunk = await self.receive(conn)
                if not chunk and not received:
                    raise UpstreamBroken("the replica closed the connection without answering")
                received = True
                reader.feed(chunk)
            return UpstreamResponse(self, conn, reader)
        except trio.TooSlowError:
            self._close(conn)
            raise UpstreamBroken(f"the replica took no request bytes for {self.write_timeout:g} s") from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, UpstreamBroken) as exc:
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
        # One socket to a numeric loopback address: open_tcp_stream's name lookup and its concurrent attempts
        # (a task and a nursery each) are for names with several addresses, and cost more than the connect.
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            with trio.fail_after(self.connect_timeout):
                await sock.connect((HOST, port))
        except trio.TooSlowError:
            sock.close()
            raise ConnectFailed(f"no connection to port {port} within {self.connect_timeout:g} s") from None
        except OSError as exc:
            sock.close()
            raise ConnectFailed(f"connection to port {port} refused: {exc.strerror or exc}") from None
        except BaseException:
            sock.close()
            raise
        return _Conn(trio.SocketStream(sock), port)

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
        if reusable and not self.closed:
            idle = self._idle.setdefault(conn.port, [])
            if len(idle) < IDLE_PER_PORT:
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
        self._generation[port] = self._generation.get(port, 0) + 1  # a spare being made is not kept
        for conn in self._idle.pop(port, []):
            self._close(conn)

    def want_spare(self, port: int) -> None:
        """Connect to ``port`` ahead of its next request, unless a connection is kept or being made there:
        one spare, so that a client's next request does not wait for a connection."""
        if self.closed or self._idle.get(port) or port in self._spare_pending:
            return
        self._spare_pending.add(port)
        self._spares_send.send_nowait((port, self._generation.get(port, 0)))

    async def run_spares(self) -> None:
        """Make the spare connections ``want_spare`` asks for (a task beside the requests)."""
        async for port, generation in self._spares:
            try:
                conn = await self._connect(port)
            except UpstreamError:
                continue  # the replica is going away: its next request finds out and answers for it
            finally:
                self._spare_pending.discard(port)
            if self._generation.get(port, 0) == generation:
                self.release(conn, reusable=True)
            else:
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
