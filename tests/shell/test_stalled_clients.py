"""A client that stops reading (without closing) cannot hold a slot or the process."""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

from tests.support.client import post_chat
from tests.support.harness import running_router
from tests.support.routerproc import router_process

# A long, fast stream: far more bytes than the socket buffers on both sides hold.
FLOOD = {"m": {"ctx": 100000, "sim": {"tokens": 90000, "token_rate": None, "n_ctx_train": 100000}}}
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 90000}


@contextmanager
def stalled_stream(port: int) -> Iterator[socket.socket]:
    """Start a stream request and never read its reply."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    body = json.dumps(BODY).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    try:
        yield sock
    finally:
        sock.close()


def in_flight(status: dict[str, Any]) -> int:
    return sum(r["in_flight"] for r in status["replicas"])


async def test_a_stalled_reader_is_cut_after_send_timeout_and_its_slot_freed(tmp_path: Path) -> None:
    async with running_router(tmp_path, FLOOD, router={"send_timeout": 1.0}) as h:
        with stalled_stream(h.config.router.port) as sock:
            with trio.fail_after(10):
                while not in_flight(await h.status()):
                    await trio.sleep(0.05)
            stalled_at = trio.current_time()
            with trio.fail_after(15):
                while in_flight(await h.status()):
                    await trio.sleep(0.1)
            assert trio.current_time() - stalled_at >= 0.5
            # The slot serves the next client at once (the model has one slot).
            assert (await post_chat(h.client, "m", max_tokens=2)).status_code == 200
            sock.settimeout(5)
            received = 0
            while chunk := sock.recv(1 << 20):  # what was buffered, then the close
                received += len(chunk)
            assert received > 0


async def test_shutdown_and_the_second_signal_are_not_held_by_a_stalled_reader(tmp_path: Path) -> None:
    for second_signal in (False, True):
        where = tmp_path / ("second" if second_signal else "first")
        async with router_process(
            where, FLOOD, router={"shutdown_grace": 30.0 if second_signal else 1.0}
        ) as rp:
            with stalled_stream(int(rp.url.rsplit(":", 1)[1])):
                await rp.wait_status(lambda s: in_flight(s) == 1)
                await trio.sleep(1.0)  # the buffers fill; the router's write to the client now blocks
                started = trio.current_time()
                rp.signal(signal.SIGTERM)
                if second_signal:
                    await trio.sleep(1.5)
                    rp.signal(signal.SIGTERM)
                assert await rp.wait_exit(timeout=12) == 0, rp.log_text()
                took = trio.current_time() - started
                # grace (1 s) or the second signal (1.5 s), the server's last second, the cut: well under 10 s
                assert took < 8, (took, rp.log_text())
                assert "cut 1 connection(s) whose clients stopped reading" in rp.log_text()
