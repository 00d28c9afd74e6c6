"""Client connections end when HTTP says they end: Connection: close, HTTP/1.0, idle keep-alive."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import h11
import pytest
import trio

from router.serve.hypercorn_fixes import open_connections
from router.serve.server import LISTEN_BACKLOG
from tests.support.harness import RouterHandle, running_router
from tests.support.waiting import until

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


async def exchange(h: RouterHandle, head: str, body: bytes = b"", *, within: float = 10.0) -> bytes:
    """Send one raw request; read until the router closes the connection; the bytes (fails when it does
    not close within ``within`` seconds)."""
    stream = await trio.open_tcp_stream("127.0.0.1", h.config.router.port)
    data = b""
    async with stream:
        await stream.send_all(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        with trio.fail_after(within):
            while chunk := await stream.receive_some(65536):
                data += chunk
    return data


def post(path: str, body: bytes, version: str, extra: str = "") -> str:
    return (
        f"POST {path} HTTP/{version}\nHost: 127.0.0.1\nContent-Type: application/json\n"
        f"Content-Length: {len(body)}\n{extra}"
    )


async def test_connection_close_and_http_10_end_the_connection_after_the_reply(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"m": {}}) as h:
        data = await exchange(h, "GET /health HTTP/1.0\n")
        assert (
            data.startswith(b"HTTP/1.1 200") and json.loads(data.split(b"\r\n\r\n", 1)[1])["status"] == "ok"
        )

        data = await exchange(h, "GET /v1/models HTTP/1.1\nHost: 127.0.0.1\nConnection: close\n")
        assert json.loads(data.split(b"\r\n\r\n", 1)[1])["data"][0]["id"] == "m"

        body = json.dumps(CHAT).encode()
        data = await exchange(h, post("/v1/chat/completions", body, "1.0"), body)
        assert json.loads(data.split(b"\r\n\r\n", 1)[1])["choices"][0]["finish_reason"] == "length"

        # A stream to an HTTP/1.0 client has no chunked framing: the close is what ends it.
        streamed = json.dumps({**CHAT, "stream": True}).encode()
        data = await exchange(h, post("/v1/chat/completions", streamed, "1.0"), streamed)
        head, rest = data.split(b"\r\n\r\n", 1)
        assert b"transfer-encoding" not in head.lower() and rest.rstrip().endswith(b"data: [DONE]")

        data = await exchange(
            h, post("/v1/chat/completions", streamed, "1.1", "Connection: close\n"), streamed
        )
        assert b"data: [DONE]" in data and data.endswith(b"0\r\n\r\n")  # the last chunk, then the close


async def test_idle_keep_alive_connections_are_closed_after_the_timeout(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"m": {}}, router={"keep_alive_timeout": 1.0}) as h:
        stream = await trio.open_tcp_stream("127.0.0.1", h.config.router.port)
        async with stream:
            for _ in range(2):  # the timer is re-armed after every response, not only the first
                await stream.send_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                reply = b""
                with trio.fail_after(5):
                    while not (b'"status": "ok"' in reply and reply.endswith(b"}")):
                        reply += await stream.receive_some(65536)
                assert reply.startswith(b"HTTP/1.1 200")  # the connection outlived the response before
            with trio.fail_after(10):
                assert await stream.receive_some(65536) == b""


async def test_connections_past_the_budget_get_503_at_once_and_slow_clients_cannot_starve_it(
    tmp_path: Path,
) -> None:
    """Slowloris: clients that trickle a request line keep their connections; past max_connections a
    new connection is answered 503 in the OpenAI shape without being read; when they go, service resumes."""
    async with running_router(tmp_path, {"m": {}}, router={"max_connections": 6}) as h:
        port = h.config.router.port
        slow = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(6)]
        for conn in slow:
            # A request line and one header, never finished.
            await conn.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        await until(lambda: open_connections() >= 6, what="the budget taken")
        # Answered while the six still hold their connections: it waits for none of them to go.
        data = await exchange(h, "GET /v1/models HTTP/1.1\nHost: 127.0.0.1\n", within=5)
        head, body = data.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head.lower()
        error = json.loads(body)["error"]
        assert error["code"] == "too_many_connections" and "max_connections" in error["message"]
        for conn in slow:
            await conn.aclose()

        async def served() -> bool:
            return (await h.client.get("/v1/models")).status_code == 200  # on a new pooled connection

        await until(served, timeout=5)


async def test_requests_hypercorn_cannot_parse_get_the_openai_error_shape(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"m": {}}) as h:
        cases = {
            "NONSENSE\n": 400,
            "GET /health HTTP/1.1\nHost: 127.0.0.1\nContent-Length: 1\nContent-Length: 2\n": 400,
            "GET /health HTTP/1.1\nHost: 127.0.0.1\nX-Big: " + "a" * 70_000 + "\n": 431,
        }
        for head, status in cases.items():
            data = await exchange(h, head)
            top, body = data.split(b"\r\n\r\n", 1)
            assert top.startswith(f"HTTP/1.1 {status}".encode()), top
            error = json.loads(body)["error"]
            assert error["type"] == "invalid_request_error" and error["message"]


async def test_a_connection_the_client_closes_is_let_go_at_once_not_after_the_keep_alive_timeout(
    tmp_path: Path,
) -> None:
    """A client that closes its kept-alive connection after a streamed or a plain reply: the router's side
    closes too (its connection count drops back) well before keep_alive_timeout, so short-lived clients
    cannot pile up descriptors."""
    async with running_router(tmp_path, {"m": {"parallel": 4}}) as h:
        before = open_connections()
        for stream in (True, False, True, False):
            body = json.dumps({**CHAT, "stream": stream}).encode()
            wire = h11.Connection(h11.CLIENT)
            head = [
                ("host", "127.0.0.1"),
                ("content-type", "application/json"),
                ("content-length", str(len(body))),
            ]
            conn = await trio.open_tcp_stream("127.0.0.1", h.config.router.port)
            async with conn:
                request = h11.Request(method="POST", target="/v1/chat/completions", headers=head)
                await conn.send_all(
                    wire.send(request) + wire.send(h11.Data(data=body)) + wire.send(h11.EndOfMessage())
                )
                status = None
                with trio.fail_after(10):
                    while True:
                        event = wire.next_event()
                        if event is h11.NEED_DATA:
                            wire.receive_data(await conn.receive_some(65536))
                        elif isinstance(event, h11.Response):
                            status = event.status_code
                        elif isinstance(event, h11.EndOfMessage):
                            break
                assert status == 200
            # The client has closed its side (kept alive until now: no Connection: close was asked for).
        # keep_alive_timeout is 75 s: a deadline far short of it.
        await until(lambda: open_connections() <= before, timeout=5)


async def test_the_listening_socket_queues_a_crowd_of_connections(tmp_path: Path) -> None:
    """The kernel's queue of connections not yet accepted holds LISTEN_BACKLOG (capped by somaxconn):
    with hypercorn's 100, a crowd of clients connecting at once overflows it and some are reset."""
    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) is not installed")
    cap = int(Path("/proc/sys/net/core/somaxconn").read_text())
    async with running_router(tmp_path, {"m": {}}) as h:
        port = h.config.router.port
        listing = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout
    (row,) = [line.split() for line in listing.splitlines() if line.strip()]
    assert int(row[2]) == min(LISTEN_BACKLOG, cap) > 100, row  # LISTEN rows: Send-Q is the backlog
