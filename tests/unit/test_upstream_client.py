"""The forwarding path's HTTP client against a scripted server on loopback: framing, cut replies, bad
HTTP, and which connections are kept for the next request."""

from __future__ import annotations

import pytest
import trio

from router.http.upstream import UpstreamBroken, UpstreamPool, request_head
from tests.support.scripted_server import Scripted, serving
from tests.support.waiting import until

pytestmark = pytest.mark.unit

EVENTS = [b'data: {"a":1}\n\n', b'data: {"bb":22}\n\n', b"data: [DONE]\n\n"]
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS)
    + b"0\r\n\r\n"
)
CHUNKED_BODY = b"".join(EVENTS)
SIZED = b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\nX-Replica: One\r\n\r\n{"ok":true}'


async def fetch(pool: UpstreamPool, port: int, method: str = "POST") -> tuple[int, dict[bytes, bytes], bytes]:
    reply = await pool.send(
        port, method, "/v1/chat/completions", [(b"content-type", b"application/json")], b"{}"
    )
    body = b""
    try:
        async for chunk in reply.chunks():
            assert chunk, "empty chunks are never handed on"
            body += chunk
    finally:
        await reply.aclose()
    return reply.status_code, dict(reply.raw_headers), body


@pytest.mark.parametrize(
    "reply,expected,connections", [(CHUNKED, CHUNKED_BODY, 2), (SIZED, b'{"ok":true}', 1)]
)
async def test_a_reply_cut_at_every_byte_reads_whole_and_a_sized_ones_connection_is_kept(
    reply: bytes, expected: bytes, connections: int
) -> None:
    for cut in range(1, len(reply)):
        script = Scripted([reply, reply], cuts=lambda r, k=cut: [r[:k], r[k:]])
        async with serving(script) as (pool, port):
            for _ in range(2):
                status, headers, body = await fetch(pool, port)
                assert (status, body) == (200, expected), cut
            # a chunked reply's connection is closed after it, as llama-server closes it
            assert script.connections == connections, cut
    assert b"x-replica" in headers or b"content-type" in headers  # names in lower case


async def test_every_byte_in_its_own_read_still_reads_whole() -> None:
    script = Scripted([CHUNKED], cuts=lambda r: [r[i : i + 1] for i in range(len(r))])
    async with serving(script) as (pool, port):
        assert (await fetch(pool, port))[2] == CHUNKED_BODY


@pytest.mark.parametrize(
    "reply",
    [
        CHUNKED[: CHUNKED.index(b"0\r\n\r\n")],  # the last chunk never comes
        SIZED[:-3],  # fewer bytes than Content-Length
        CHUNKED.replace(b"11\r\n", b"zz\r\n"),  # a chunk size that is not hex
    ],
)
async def test_a_cut_or_broken_body_raises_and_the_connection_is_not_kept(reply: bytes) -> None:
    script = Scripted([reply])
    script.close_after_each = True
    async with serving(script) as (pool, port):
        with pytest.raises(UpstreamBroken):
            await fetch(pool, port)
        assert pool.idle_count() == 0


async def test_a_head_that_is_not_http_raises() -> None:
    script = Scripted([b"SSH-2.0-OpenSSH_9.6\r\n\r\n"])
    async with serving(script) as (pool, port):
        with pytest.raises(UpstreamBroken, match="not valid HTTP"):
            await fetch(pool, port)


async def test_a_reply_that_asks_to_close_or_has_no_framing_is_not_kept() -> None:
    closing = SIZED.replace(b"X-Replica: One", b"Connection: close")
    unframed = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it"
    script = Scripted([closing, unframed])
    script.close_after_each = True
    async with serving(script) as (pool, port):
        assert (await fetch(pool, port))[2] == b'{"ok":true}'
        assert pool.idle_count() == 0
        assert (await fetch(pool, port))[2] == b"all of it"
        assert pool.idle_count() == 0
        assert script.connections == 2


async def test_an_interim_reply_is_skipped_and_head_has_no_body() -> None:
    script = Scripted([b"HTTP/1.1 100 Continue\r\n\r\n" + SIZED, SIZED])
    async with serving(script) as (pool, port):
        status, headers, body = await fetch(pool, port)
        assert (status, body, headers[b"x-replica"]) == (200, b'{"ok":true}', b"One")
        assert (await fetch(pool, port, "HEAD"))[2] == b""
        assert pool.idle_count() == 0  # what follows a reply to HEAD is unknown to the parser


async def test_a_kept_connection_found_closed_is_replaced_and_the_request_sent_again() -> None:
    script = Scripted([SIZED, SIZED])
    script.close_after_each = True  # the server closes each connection after its reply...
    async with serving(script) as (pool, port):
        assert (await fetch(pool, port))[2] == b'{"ok":true}'
        assert pool.idle_count() == 1  # ...which the reply did not say
        assert (await fetch(pool, port))[2] == b'{"ok":true}'
        assert script.connections == 2 and len(script.requests) == 2


async def test_after_a_chunked_reply_a_spare_connection_waits_for_the_next_request() -> None:
    script = Scripted([CHUNKED, CHUNKED, CHUNKED])
    async with serving(script) as (pool, port), trio.open_nursery() as nursery:
        nursery.start_soon(pool.run_spares)
        assert (await fetch(pool, port))[2] == CHUNKED_BODY
        await until(lambda: pool.idle_count() == 1, what="the spare connection")
        assert script.connections == 2 and len(script.requests) == 1
        assert (await fetch(pool, port))[2] == CHUNKED_BODY
        await until(lambda: pool.idle_count() == 1, what="the next spare")
        assert script.connections == 3 and len(script.requests) == 2  # each request found one ready
        pool.forget_port(port)  # the replica stopped: its spares are closed, none is made for it
        assert pool.idle_count() == 0
        nursery.cancel_scope.cancel()


def test_a_header_that_would_break_the_framing_is_refused() -> None:
    assert request_head("GET", "/x", [(b"a", b"b")]) == b"GET /x HTTP/1.1\r\na: b\r\n\r\n"
    for name, value in [(b"a", b"b\r\nx: y"), (b"a\n", b"b"), (b"a:b", b"c"), (b"", b"c"), (b"a", b"\0")]:
        with pytest.raises(UpstreamBroken, match="framing"):
            request_head("GET", "/x", [(name, value)])
    for target in ("/x y", "/x\r\nHost: z", ""):
        with pytest.raises(UpstreamBroken, match="framing"):
            request_head("GET", target, [])
