"""The relay pump against a scripted replica on loopback: bodies arrive whole and framed, a client that takes
part of a write gets the rest the slow way, and every way out of the pump leaves nothing in it."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from router.http.relay_pump import RelayPump
from router.http.upstream import ReplyTimeout, UpstreamBroken, UpstreamPool, UpstreamResponse
from tests.support.scripted_server import Scripted, serving
from tests.unit.test_upstream_client import CHUNKED, CHUNKED_BODY, EVENTS

pytestmark = pytest.mark.unit


class Client:
    """A client connection that takes at most ``take`` bytes of each write made without waiting."""

    def __init__(self, take: int | None = None) -> None:
        self.take = take
        self.wire = bytearray()
        self.waited = 0

    def frame(self, chunk: bytes) -> bytes:
        return b"%x\r\n%b\r\n" % (len(chunk), chunk)

    def write_now(self, data: bytes) -> int:
        taken = len(data) if self.take is None else min(self.take, len(data))
        self.wire += data[:taken]
        return taken

    async def write(self, data: bytes) -> None:
        self.waited += 1
        self.wire += data


def unchunked(wire: bytes) -> bytes:
    body, rest = b"", bytes(wire)
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        body, rest = body + rest[:n], rest[n + 2 :]
    return body


async def open_reply(pool: UpstreamPool, port: int) -> UpstreamResponse:
    return await pool.send(port, "POST", "/v1/chat/completions", [], b"{}")


@pytest.mark.parametrize("take", [None, 7])
async def test_a_body_is_relayed_whole_and_read_to_its_end(take: int | None) -> None:
    pump = RelayPump()
    seen: list[bytes] = []
    # each event in a read of its own, as a replica streams them
    head, _, body = CHUNKED.partition(b"\r\n\r\n")
    pieces = [head + b"\r\n\r\n"] + [p + b"\r\n" for p in body.split(b"\r\n") if p] + [b"\r\n"]
    script = Scripted([CHUNKED], cuts=lambda r: pieces)
    async with serving(script) as (pool, port), trio.open_nursery() as nursery:
        await nursery.start(pump.run)
        reply = await open_reply(pool, port)
        client = Client(take)
        await pump.relay(reply, client, seen.append, read_timeout=10.0)
        await reply.aclose()
        assert unchunked(client.wire) == CHUNKED_BODY == b"".join(seen)
        assert (
            reply.complete and len(pump) == 0
        )  # read to its end (a chunked reply's connection is then closed)
        assert (client.waited > 0) == (take is not None)  # what the client did not take went the slow way
        nursery.cancel_scope.cancel()


async def test_a_body_that_came_whole_with_the_head_ends_at_once() -> None:
    pump = RelayPump()
    script = Scripted([CHUNKED])  # head and body in one read; the connection stays open after it
    script.hold = trio.Event()
    seen: list[bytes] = []
    async with serving(script) as (pool, port), trio.open_nursery() as nursery:
        await nursery.start(pump.run)
        reply = await open_reply(pool, port)
        client = Client()
        await pump.relay(reply, client, seen.append, read_timeout=5.0)  # no wait for bytes that never come
        await reply.aclose()
        assert unchunked(client.wire) == CHUNKED_BODY == b"".join(seen)
        assert (
            reply.complete and len(pump) == 0
        )  # read to its end (a chunked reply's connection is then closed)
        script.hold.set()
        nursery.cancel_scope.cancel()


async def test_a_cut_body_raises_and_a_silent_replica_times_out_leaving_the_pump_empty() -> None:
    pump = RelayPump()
    partial = CHUNKED[: CHUNKED.index(b"%x" % len(EVENTS[1]) + b"\r\n")]  # the first event, then nothing
    cut = Scripted([partial])
    cut.close_after_each = True
    silent = Scripted([partial])
    silent.hold = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(pump.run)
        async with serving(cut) as (pool, port):
            reply = await open_reply(pool, port)
            with pytest.raises(UpstreamBroken):
                await pump.relay(reply, Client(), lambda chunk: None, read_timeout=10.0)
            await reply.aclose()
            assert len(pump) == 0 and pool.idle_count() == 0
        async with serving(silent) as (pool, port):
            reply = await open_reply(pool, port)
            client = Client()
            with pytest.raises(ReplyTimeout):
                await pump.relay(reply, client, lambda chunk: None, read_timeout=0.2)
            await reply.aclose()
            assert len(pump) == 0 and unchunked(client.wire) == EVENTS[0]
            silent.hold.set()
        nursery.cancel_scope.cancel()


async def test_a_relay_cancelled_while_it_waits_leaves_the_pump() -> None:
    pump = RelayPump()
    script = Scripted([CHUNKED[: CHUNKED.index(b"%x" % len(EVENTS[1]) + b"\r\n")]])
    script.hold = trio.Event()
    async with serving(script) as (pool, port), trio.open_nursery() as nursery:
        await nursery.start(pump.run)
        reply = await open_reply(pool, port)
        async with trio.open_nursery() as inner:
            inner.start_soon(pump.relay, reply, Client(), lambda chunk: None, 30.0)
            await trio.testing.wait_all_tasks_blocked()
            assert len(pump) == 1
            inner.cancel_scope.cancel()
        assert len(pump) == 0
        await reply.aclose()
        script.hold.set()
        nursery.cancel_scope.cancel()
