"""Requests of the benchmarks: generated prompts, chat bodies, streamed chats timed chunk by chunk, and the
models a router lists."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import httpx

# Word list for generated prompts: plain English words, most of them one or two tokens.
_WORD_TEXT = """
time person year way day thing man world life hand part child eye woman place work week case point
government company number group problem fact river garden window letter market table story music color
light water paper stone train cloud field night morning winter summer city house road bridge forest
mountain island ocean animal bird tree flower apple bread cheese coffee dinner friend family teacher
doctor student question answer reason idea system program network signal engine plane ship wheel
"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


def prompt_text(words: int, seed: int) -> str:
    """``words`` random words from a seeded generator: the same seed gives the same text."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def chat_body(
    model: str,
    tokens: int,
    text: str = "Hello",
    *,
    stream: bool = False,
    cache_prompt: bool | None = None,
    messages: Sequence[Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """A chat request that generates exactly ``tokens`` tokens (end-of-sequence ignored, greedy)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": list(messages) if messages is not None else [{"role": "user", "content": text}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": stream,
    }
    if cache_prompt is not None:
        body["cache_prompt"] = cache_prompt
    return body


def async_client(url: str, timeout: float = 300.0) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    return httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits)


@attrs.frozen
class StreamResult:
    """One streamed request: status, seconds to the first content chunk and to the end, chunk count."""

    status: int
    ttft: float | None
    total: float
    chunks: int
    first_chunk_at: float | None
    last_chunk_at: float | None

    @property
    def chunk_rate(self) -> float | None:
        """Content chunks per second after the first one."""
        if self.first_chunk_at is None or self.last_chunk_at is None or self.chunks < 2:
            return None
        span = self.last_chunk_at - self.first_chunk_at
        return (self.chunks - 1) / span if span > 0 else None


def _has_content(event: Mapping[str, Any]) -> bool:
    for choice in event.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content"):
            return True
    return False


async def stream_chat(client: httpx.AsyncClient, body: Mapping[str, Any], path: str) -> StreamResult:
    """Send a streaming chat request and time its content chunks (SSE ``data:`` lines with text)."""
    started = time.perf_counter()
    first: float | None = None
    last: float | None = None
    chunks = 0
    async with client.stream("POST", path, json=dict(body)) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                continue
            try:
                event = json.loads(data)
            except json.JSONDecodeError:
                continue
            if _has_content(event):
                now = time.perf_counter()
                chunks += 1
                if first is None:
                    first = now
                last = now
        status = response.status_code
    total = time.perf_counter() - started
    return StreamResult(
        status=status,
        ttft=None if first is None else first - started,
        total=total,
        chunks=chunks,
        first_chunk_at=first,
        last_chunk_at=last,
    )


async def fetch_json(client: httpx.AsyncClient, path: str) -> Any:
    response = await client.get(path)
    response.raise_for_status()
    return response.json()


async def router_models(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    """The models (not pools) a router lists in /v1/models, in its order."""
    document = await fetch_json(client, "/v1/models")
    return [entry for entry in document.get("data", []) if "pool" not in entry]
