"""A client that stops reading (without closing) cannot hold a slot or the process."""

from __future__ import annotations

import json
import logging
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.client import post_chat
from tests.support.harness import inflight_of, running_router
from tests.support.routerproc import router_process
from tests.support.tcp import queues
from tests.support.waiting import until

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


def window_shut(server_port: int, client: socket.socket) -> bool:
    """Whether the router's end of ``client``'s connection holds bytes the client's kernel has not taken:
    on loopback, its window is shut."""
    held = queues(server_port, client.getsockname()[1])
    return held is not None and held.unacked > 0


async def test_a_stalled_reader_is_cut_after_send_timeout_and_its_slot_freed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="router")
    async with running_router(tmp_path, FLOOD, router={"send_timeout": 1.0}) as h:
        with stalled_stream(h.config.router.port) as sock:
            await h.wait_state(lambda s: inflight_of(s, "m") > 0)
            await h.wait_state(lambda s: inflight_of(s, "m") == 0, timeout=15)
            # Cut by the bound on a write (send_timeout), nothing else.
            assert "a client stopped reading its reply" in caplog.text
            # The slot serves the next client at once (the model has one slot).
            assert (await post_chat(h.client, "m", max_tokens=2)).status_code == 200
            sock.settimeout(5)
            received = 0
            while chunk := sock.recv(1 << 20):  # what was buffered, then the close
                received += len(chunk)
            assert received > 0


@pytest.mark.parametrize("second_signal", [False, True], ids=["grace", "second-signal"])
async def test_shutdown_and_the_second_signal_are_not_held_by_a_stalled_reader(
    tmp_path: Path, second_signal: bool
) -> None:
    async with router_process(
        tmp_path, FLOOD, router={"shutdown_grace": 30.0 if second_signal else 1.0}
    ) as rp:
        port = int(rp.url.rsplit(":", 1)[1])
        with stalled_stream(port) as sock:
            await rp.wait_status(lambda s: in_flight(s) == 1)
            # The buffers fill: the router's write to the client now blocks.
            await until(lambda: window_shut(port, sock), what="the client's window shut")
            rp.signal(signal.SIGTERM)
            if second_signal:
                await until(lambda: "draining" in rp.log_text(), what="the first signal taken")
                # A repeat within a second of the first is the same request, and the router says so: repeat
                # until it counts as the second (one more after that would kill the router outright).
                while True:
                    seen = rp.log_text().count("the same request")
                    rp.signal(signal.SIGTERM)
                    await until(
                        lambda seen=seen: (
                            "second signal" in rp.log_text() or rp.log_text().count("the same request") > seen
                        ),
                        what="the repeated signal taken",
                    )
                    if "second signal" in rp.log_text():
                        break
            # A deadline far short of what the stalled write alone would hold it (send_timeout, 60 s).
            assert await rp.wait_exit(timeout=12) == 0, rp.log_text()
            assert "cut 1 connection(s) whose clients stopped reading" in rp.log_text()
