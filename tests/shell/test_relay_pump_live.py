"""Which bodies the relay pump carries in a running router, and that what it carries arrives whole with its
usage recorded: a stream to an HTTP/1.1 or HTTP/1.0 client goes through it; a body with a Content-Length and
an Ollama stream (translated piece by piece) go through ASGI as before."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from router.http.relay_pump import RelayPump
from tests.shell.test_connections import exchange, post
from tests.shell.test_history import final_usage, wait_rows
from tests.shell.test_ollama_api import ollama_chat
from tests.support.client import chat_body, stream
from tests.support.harness import running_router

pytestmark = pytest.mark.shell


def counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the bodies the pump relays (the pump itself runs as it is)."""
    calls: list[int] = []
    original: Callable[..., Any] = RelayPump.relay

    async def relay(self: RelayPump, *args: Any, **kwargs: Any) -> None:
        calls.append(1)
        await original(self, *args, **kwargs)

    monkeypatch.setattr(RelayPump, "relay", relay)
    return calls


async def test_streams_go_through_the_pump_and_other_bodies_do_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = counting(monkeypatch)
    async with running_router(tmp_path, {"m": {"sim": {"tokens": 12}}}) as h:
        body = chat_body("m", "one two", stream_options={"include_usage": True})
        streamed = await stream(h.client, "/v1/chat/completions", body)
        assert streamed.status == 200 and final_usage(streamed.events)["completion_tokens"] == 12
        assert streamed.body.rstrip().endswith(b"data: [DONE]")
        assert len(calls) == 1

        rows = await wait_rows(h.client, 1)
        assert (rows[-1]["generated_tokens"], rows[-1]["status"]) == (12, 200) and rows[-1][
            "ttft"
        ] is not None

        plain = await h.client.post("/v1/chat/completions", json=chat_body("m"))
        assert plain.status_code == 200 and plain.json()["usage"]["completion_tokens"] == 12
        async with h.client.stream("POST", "/api/chat", json=ollama_chat("m", stream=True)) as reply:
            lines = [line async for line in reply.aiter_lines() if line]
        assert reply.status_code == 200 and '"done":true' in lines[-1].replace(" ", "")
        assert len(calls) == 1

        # HTTP/1.0: no chunked framing, the close ends the body
        data = json.dumps(chat_body("m", stream=True)).encode()
        got = await exchange(h, post("/v1/chat/completions", data, "1.0"), data)
        head, rest = got.split(b"\r\n\r\n", 1)
        assert b"transfer-encoding" not in head.lower() and rest.count(b"data: {") >= 12
        assert rest.rstrip().endswith(b"data: [DONE]") and len(calls) == 2
