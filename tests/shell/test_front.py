"""The router's HTTP/1.1 front in a running router: it serves the API and the pages on kept-alive
connections, pipelined requests included, and hands a connection to hypercorn at its first request it
does not serve (a chunked body, a malformed head), with the bytes already read; while a request runs, its
client's connection is watched (the next request's bytes kept, the end of the connection cancelling it)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import h11
import pytest
import trio

from router.journal.records import CLIENT_CLOSED, RequestRecord
from router.serve.front import FrontConnection
from statemachine.state import INFLIGHT
from tests.support.client import chat_body
from tests.support.harness import RouterHandle, running_router

pytestmark = pytest.mark.shell

CHAT = json.dumps(chat_body("m", max_tokens=3)).encode()


def counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the exchanges the front serves from now on (it serves them as it is)."""
    seen: list[str] = []
    original = FrontConnection._exchange

    async def exchange(self: FrontConnection, lean: Any) -> bool:
        seen.append(lean.head.path)
        return await original(self, lean)

    monkeypatch.setattr(FrontConnection, "_exchange", exchange)
    return seen


def post(path: str = "/v1/chat/completions", body: bytes = CHAT, extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}"
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


GET_MODELS = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


class Conversation:
    """One client connection, its replies read with h11."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    async def reply(self, sent: bool = False) -> tuple[int, dict[str, str], bytes]:
        status, headers, body = 0, {}, b""
        if not sent:  # h11 reads replies to requests it sent: the bytes went raw, these events stand for them
            request = h11.Request(method="POST", target="/", headers=[("host", "x"), ("content-length", "0")])
            self.h11.send(request)
            self.h11.send(h11.EndOfMessage())
        with trio.fail_after(10):
            while True:
                event = self.h11.next_event()
                if event is h11.NEED_DATA:
                    self.h11.receive_data(await self.stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    headers = {k.decode(): v.decode() for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    if self.h11.states == {h11.CLIENT: h11.DONE, h11.SERVER: h11.DONE}:
                        self.h11.start_next_cycle()
                    return status, headers, body
                elif isinstance(event, h11.ConnectionClosed):
                    return status, headers, body

    async def closed(self) -> bool:
        with trio.fail_after(10):
            return await self.stream.receive_some(65536) == b""


async def conversation(h: RouterHandle) -> Conversation:
    return Conversation(await trio.open_tcp_stream("127.0.0.1", h.config.router.port))


@asynccontextmanager
async def talking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[RouterHandle, Conversation, list[str]]]:
    """A router serving ``m``, one client connection to it, and the paths the front serves from now on."""
    async with running_router(tmp_path, {"m": {"sim": {"tokens": 3}}}) as h:
        seen = counting(monkeypatch)
        talk = await conversation(h)
        async with talk.stream:
            yield h, talk, seen


async def test_one_connection_carries_api_requests_and_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with talking(tmp_path, monkeypatch) as (_, talk, seen):
        for _ in range(2):
            await talk.stream.send_all(post())
            status, headers, body = await talk.reply()
            assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
            assert "date" in headers and headers.get("connection") != "close"
        await talk.stream.send_all(GET_MODELS)
        status, _, body = await talk.reply()
        assert status == 200 and json.loads(body)["data"][0]["id"] == "m"
        await talk.stream.send_all(b"HEAD /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        talk.h11.send(h11.Request(method="HEAD", target="/", headers=[("host", "x")]))
        talk.h11.send(h11.EndOfMessage())
        status, headers, body = await talk.reply(sent=True)
        assert status == 200 and body == b"" and int(headers["content-length"]) > 0
        await talk.stream.send_all(post())
        status, _, body = await talk.reply()
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
        assert seen == ["/v1/chat/completions"] * 2 + ["/v1/models"] * 2 + ["/v1/chat/completions"]


async def test_pipelined_requests_are_answered_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with talking(tmp_path, monkeypatch) as (_, talk, seen):
        tokenize = post("/tokenize", json.dumps({"model": "m", "content": "a b c"}).encode())
        await talk.stream.send_all(post() + tokenize + GET_MODELS + post())
        replies = [await talk.reply() for _ in range(4)]
        assert [status for status, _, _ in replies] == [200] * 4
        assert "choices" in json.loads(replies[0][2]) and "tokens" in json.loads(replies[1][2])
        assert json.loads(replies[2][2])["object"] == "list" and "choices" in json.loads(replies[3][2])
        assert seen == ["/v1/chat/completions", "/tokenize", "/v1/models", "/v1/chat/completions"]


async def test_a_body_in_pieces_and_a_closing_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with talking(tmp_path, monkeypatch) as (_, talk, seen):
        data = post(extra="Connection: close\r\n")
        for start in range(0, len(data), 7):
            await talk.stream.send_all(data[start : start + 7])
            await trio.sleep(0)
        status, headers, body = await talk.reply()
        assert status == 200 and headers["connection"] == "close"
        assert json.loads(body)["usage"]["completion_tokens"] == 3
        assert await talk.closed()
        assert seen == ["/v1/chat/completions"]


async def test_a_stream_is_chunked_and_the_connection_kept(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"m": {"sim": {"tokens": 5}}}) as h:
        talk = await conversation(h)
        async with talk.stream:
            for _ in range(2):
                await talk.stream.send_all(post(body=json.dumps(chat_body("m", stream=True)).encode()))
                status, headers, body = await talk.reply()
                assert status == 200 and headers["transfer-encoding"] == "chunked"
                assert body.count(b"data: {") >= 5 and body.rstrip().endswith(b"data: [DONE]")


async def test_the_client_waiting_for_100_continue_gets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with talking(tmp_path, monkeypatch) as (_, talk, seen):
        data = post(extra="Expect: 100-continue\r\n")
        head, body = data.split(b"\r\n\r\n", 1)
        await talk.stream.send_all(head + b"\r\n\r\n")
        with trio.fail_after(10):
            assert await talk.stream.receive_some(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        await talk.stream.send_all(body)
        status, _, reply = await talk.reply()
        assert status == 200 and json.loads(reply)["usage"]["completion_tokens"] == 3
        assert seen == ["/v1/chat/completions"]


async def test_what_the_front_does_not_serve_hypercorn_still_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with talking(tmp_path, monkeypatch) as (h, talk, seen):
        chunked = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%b\r\n0\r\n\r\n" % (len(CHAT), CHAT)
        )
        await talk.stream.send_all(chunked)
        status, _, body = await talk.reply()
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
        await talk.stream.send_all(post())  # the connection is hypercorn's from there on
        status, _, body = await talk.reply()
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
        bad = await conversation(h)
        async with bad.stream:
            await bad.stream.send_all(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header: 1\r\n\r\n"
            )
            status, _, body = await bad.reply()
            assert status == 400 and json.loads(body)["error"]["code"] == "invalid_http"
        assert seen == []


async def test_a_client_that_leaves_mid_body_loses_nothing_for_the_next(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"m": {"sim": {"tokens": 3}}}) as h:
        talk = await conversation(h)
        async with talk.stream:
            await talk.stream.send_all(post()[:-5])
        talk = await conversation(h)
        async with talk.stream:
            await talk.stream.send_all(post())
            status, _, _ = await talk.reply()
            assert status == 200
        await h.wait_idle()


async def test_a_client_is_watched_while_its_request_runs(tmp_path: Path) -> None:
    # 40 tokens at 100 a second: the next request's bytes come while the first one is answered; 2,000: a
    # request whose client leaves long before its end.
    async with running_router(tmp_path, {"m": {"sim": {"tokens": 40, "token_rate": 100.0}}}) as h:
        talk = await conversation(h)
        async with talk.stream:
            await talk.stream.send_all(post(body=json.dumps(chat_body("m", max_tokens=40)).encode()))
            await h.router.wait_until(lambda s: any(r.phase == INFLIGHT for r in s.requests.values()))
            await talk.stream.send_all(GET_MODELS)  # pipelined, read by the watch: not a leaving client
            status, _, body = await talk.reply()
            assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 40
            status, _, body = await talk.reply()
            assert status == 200 and json.loads(body)["object"] == "list"
        records: list[RequestRecord] = []
        h.router.record_listeners.append(records.append)
        long = json.dumps(chat_body("m", max_tokens=2000)).encode()
        talk = await conversation(h)
        async with talk.stream:
            await talk.stream.send_all(post(body=long))
            await h.router.wait_until(lambda s: any(r.phase == INFLIGHT for r in s.requests.values()))
        await h.wait_idle()  # the client left: its request ended at once, not after 20 s
        assert [r.status for r in records] == [CLIENT_CLOSED]
